"""Baseline: cut the topological order into one contiguous piece per device.

Pieces are balanced by mean op time (each device gets about an equal share, in
cluster order); a colocation group goes with its first op. This is the split a person
makes by hand ("first half of the layers here, second half there"), and the shape of a
pipeline stage partition.

Examples
--------
>>> g = OpGraph()
>>> for i in range(4): g.add_op(f"l{i}", op_type="Relu", bytes_accessed=1e9)
>>> for i in range(3): g.add_edge(f"l{i}", f"l{i + 1}", bytes=1e3)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> plan = partition(CostModel(g, cluster))
>>> [plan.assignment[f"l{i}"][-1] for i in range(4)]
['0', '0', '1', '1']
"""
from __future__ import annotations

from dataclasses import dataclass

from partitioner.finish import make_plan
from partitioner.list_schedules import topological_split


@dataclass(frozen=True)
class TopoSplitOptions:
    pass


def partition(cost, options=TopoSplitOptions()):
    """The even topological split
    (:func:`partitioner.list_schedules.topological_split`) as a checked Plan."""
    return make_plan(cost, topological_split(cost), "topo_split", options)
