"""Placement units (colocation groups) for the algorithms that place groups whole.

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph(); g.add_op("v", param_bytes=8); g.add_op("r", colocation="v"); g.add_op("y")
>>> g.add_edge("v", "r"); g.add_edge("r", "y")
>>> units = placement_units(g, CostModel(g, cluster_of_devices(["cpu", "cpu"])))
>>> [(u.group, u.params) for u in units]
[('v', 8), ('y', 0)]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import graph_arrays
from costmodel.memory import new_output_bytes
from tfpart.errors import PlacementError


@dataclass
class Unit:
    group: str
    members: list  # op indices
    params: float  # variable bytes
    footprint: float  # variables plus the unit's own outputs (its memory bound share)
    runnable: np.ndarray  # bool per device
    time: np.ndarray  # seconds per device (inf where it cannot run)


def placement_units(graph, cost):
    """Colocation groups as units, in topological order of their first op."""
    first_seen, members = {}, {}
    for position, i in enumerate(graph_arrays(cost).topological.tolist()):
        group = graph.ops[cost.ops[i]]["colocation"]
        first_seen.setdefault(group, position)
        members.setdefault(group, []).append(i)
    units = []
    for group in sorted(members, key=first_seen.get):
        idx = members[group]
        attrs = [graph.ops[cost.ops[i]] for i in idx]
        time = cost.compute[idx].sum(axis=0)
        units.append(Unit(group=group, members=idx,
                          params=sum(a["param_bytes"] for a in attrs),
                          footprint=sum(a["param_bytes"] + new_output_bytes(a) for a in attrs),
                          runnable=np.isfinite(time), time=time))
    return units


def expand(units, unit_device, n_ops):
    """Device per op from a device per unit."""
    device_of = np.full(n_ops, -1)
    for unit, d in zip(units, unit_device):
        device_of[unit.members] = d
    return device_of


def no_device_error(unit, cost):
    return PlacementError("", f"no device can run and hold the ops colocated with "
                          f"{cost.ops[unit.members[0]]} ({unit.footprint / 1e6:.1f} MB)")


class MemoryLedger:
    """Bytes committed per device against its capacity (footprints only; check_plan
    has the final word, counting received copies too)."""

    def __init__(self, cluster):
        self.capacity = np.array([d.memory for d in cluster.devices], dtype=float)
        self.used = np.zeros(len(cluster))

    def fits(self, unit, d):
        return unit.runnable[d] and self.used[d] + unit.footprint <= self.capacity[d]

    def take(self, unit, d):
        self.used[d] += unit.footprint
