"""Placement algorithms. Each module exposes ``partition(graph, cost, cluster, *, options)``."""
from partitioner import (greedy, ilp, m_etf, m_topo, min_cut, random_placement, round_robin,
                         single_device, topo_split)

ALGORITHMS = {"greedy": greedy, "ilp": ilp, "single": single_device, "random": random_placement,
              "round_robin": round_robin, "m_topo": m_topo, "m_etf": m_etf, "min_cut": min_cut,
              "topo_split": topo_split}
HEURISTICS = {name: module for name, module in ALGORITHMS.items() if name != "ilp"}

__all__ = ["ALGORITHMS", "HEURISTICS"]
