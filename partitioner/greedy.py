"""Greedy placement: earliest-finish list scheduling with link queues and memory
limits, a local search, and a final judgement by simulation against the baselines
(:mod:`partitioner.greedy_placement`), as a checked Plan.

Examples
--------
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> for n in ("left", "right"): g.add_op(n, op_type="MatMul", flops=1e11)
>>> g.add_op("sum", op_type="AddV2", bytes_accessed=1e3)
>>> for n in ("left", "right"): g.add_edge("x", n, bytes=1e3); g.add_edge(n, "sum", bytes=1e3)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> len(partition(CostModel(g, cluster)).devices_used())  # the branches run in parallel
2
"""
from __future__ import annotations

from partitioner.greedy_placement import GreedyOptions, greedy_placement
from partitioner.finish import make_plan
from tfpart.core.collector import with_collector_paused

__all__ = ["GreedyOptions", "partition"]


@with_collector_paused
def partition(cost, options=GreedyOptions()):
    """The greedy's placement of every op of ``cost.graph`` as a checked Plan.

    Parameters
    ----------
    cost : costmodel.CostModel
    options : GreedyOptions

    Returns
    -------
    tfpart.core.plan.Plan
    """
    device_of, priority = greedy_placement(cost, options)
    return make_plan(cost, device_of, "greedy", options, priority)
