"""Placement algorithms. Each module exposes ``partition(graph, cost, cluster, *, options)``."""
from partitioner import greedy, single_device

ALGORITHMS = {"greedy": greedy, "single": single_device}

__all__ = ["ALGORITHMS", "greedy", "single_device"]
