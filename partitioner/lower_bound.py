"""Lower bounds on the step time of any placement.

Examples
--------
>>> import numpy as np
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph()
>>> for n in "abcd": g.add_op(n, op_type="Relu", bytes_accessed=2e10)
>>> g.add_edge("a", "b"); g.add_edge("a", "c"); g.add_edge("b", "d"); g.add_edge("c", "d")
>>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
>>> round(critical_path_bound(cost), 3), round(work_bound(cost), 3)
(3.0, 2.0)
"""
from __future__ import annotations

import numpy as np


def critical_path_bound(cost):
    """Longest path with every op on its fastest device and free transfers."""
    fastest = cost.compute.min(axis=1)
    finish = np.zeros(len(cost.ops))
    graph = cost.graph.nx_graph
    for name in cost.graph.topological_order():
        i = cost.index[name]
        ready = max((finish[cost.index[p]] for p in graph.predecessors(name)), default=0.0)
        finish[i] = ready + fastest[i]
    return float(finish.max()) if len(finish) else 0.0


def work_bound(cost):
    """All work spread perfectly: the sum of each op's time on its fastest device over
    the number of executors (devices sharing a core group count once)."""
    fastest = cost.compute.min(axis=1)
    return float(fastest.sum() / len(set(cost.cluster.executor_of)))


def lower_bound(cost):
    """The tighter of the critical-path and work bounds, plus the cluster's fixed
    per-step overhead."""
    return max(critical_path_bound(cost), work_bound(cost)) + cost.cluster.step_overhead
