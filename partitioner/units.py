"""Placement units (colocation groups) for the algorithms that place groups whole.

Examples
--------
>>> g = OpGraph(); g.add_op("v", param_bytes=8); g.add_op("r", colocation="v"); g.add_op("y")
>>> g.add_edge("v", "r"); g.add_edge("r", "y")
>>> units = placement_units(CostModel(g, cluster_of_devices(["cpu", "cpu"])))
>>> [(u.group, u.params) for u in units]
[('v', 8.0), ('y', 0.0)]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.arrays import graph_arrays
from costmodel.memory import size_text
from costmodel.simulate import activation_peak
from tfpart.core.errors import PlacementError


@dataclass
class Unit:
    group: str
    members: list  # op indices
    params: float  # variable bytes: what a unit holds for the whole step
    runnable: np.ndarray  # bool per device
    time: np.ndarray  # seconds per device (inf where it cannot run)


def placement_units(cost):
    """Colocation groups as units, in topological order of their first op (members in
    topological order too). Cached on ``cost``: the units of one cost model never
    change."""
    return cost.derived("placement_units", lambda: _units(cost))


def _units(cost):
    a = graph_arrays(cost)
    names, group_of = a.group_names, a.group_of
    by_position = a.topological[np.argsort(group_of[a.topological], kind="stable")]
    bounds = [0, *(np.flatnonzero(np.diff(group_of[by_position])) + 1).tolist(),
              len(by_position)]
    ordered = by_position.tolist()
    members = [ordered[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    first_seen = np.empty(len(names), dtype=np.int64)
    first_seen[group_of[a.topological[::-1]]] = np.arange(len(cost.ops))[::-1]
    time = np.zeros((len(names), cost.compute.shape[1]))
    np.add.at(time, group_of, cost.compute)
    units = [Unit(group, m, p, r, t) for group, m, p, r, t in zip(
        names.tolist(), members, a.group_param_bytes.tolist(), a.group_runnable, time)]
    return [units[g] for g in np.argsort(first_seen, kind="stable")]


def expand(units, unit_device, n_ops):
    """Device per op from a device per unit."""
    device_of = np.full(n_ops, -1)
    for unit, d in zip(units, unit_device):
        device_of[unit.members] = d
    return device_of


def no_device_error(unit, cost):
    return PlacementError("", f"no device can run and hold the ops colocated with "
                          f"{cost.ops[unit.members[0]]} ({size_text(unit.params)} of "
                          f"variables, beside {size_text(activation_peak(cost))} of "
                          f"activations)")


def variable_room(cost):
    """Bytes per device for variables: its memory less the activations of the whole
    graph at their peak (:func:`costmodel.simulate.activation_peak`)."""
    memory = np.array([d.memory for d in cost.cluster.devices], dtype=float)
    return np.maximum(memory - activation_peak(cost), 0.0)


REPAIR_STEP = 0.02  # the least room taken off a device that overflowed, of its room


def less_room(capacity, excess, room):
    """``capacity`` (bytes per device an algorithm may fill) cut where a placement's
    simulated peak went ``excess`` over the device's ``room``: by the excess, and by at
    least ``REPAIR_STEP`` of the room, since an excess of a few bytes changes no
    choice.

    >>> less_room(np.array([100.0, 100.0]), np.array([1.0, -5.0]), np.array([100.0, 100.0]))
    array([ 98., 100.])
    """
    return capacity - np.where(excess > 0, np.maximum(excess, REPAIR_STEP * room), 0.0)


class MemoryLedger:
    """Variable bytes committed per device against :func:`variable_room` (the simulated
    live-range peak, which check_plan holds, has the final word)."""

    def __init__(self, cost):
        self.capacity = variable_room(cost)
        self.used = np.zeros(len(cost.cluster))

    def fits(self, unit, d):
        return unit.runnable[d] and self.used[d] + unit.params <= self.capacity[d]

    def take(self, unit, d):
        self.used[d] += unit.params
