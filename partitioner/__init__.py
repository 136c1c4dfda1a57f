"""Placement algorithms. Each module exposes ``partition(graph, cost, cluster, *, options)``."""
from partitioner import greedy, single_device, topo_split

ALGORITHMS = {"greedy": greedy, "single": single_device, "topo_split": topo_split}

__all__ = ["ALGORITHMS", "greedy", "single_device", "topo_split"]
