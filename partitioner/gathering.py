"""The greedy's last step (:mod:`partitioner.greedy_placement`): its placement judged
by simulation against gathered variants of itself (the groups of its least busy
devices, then single groups, moved to the devices they exchange the most bytes with)
and the baselines: the fastest single device (when none holds the model, one home
device with the variables it has no room for spilled to others), m-ETF, m-TOPO and the
topological split. The fastest wins; among placements within 1% of it and no slower
than any baseline, the one moving the fewest bytes between devices, then using the
fewest devices (a transfer off the critical path is not free in TensorFlow: each is a
Send/Recv pair). So the greedy is never slower than a baseline by simulation.

Examples
--------
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> g.add_op("y", op_type="MatMul", flops=1e11); g.add_edge("x", "y", bytes=1e3)
>>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
>>> sorted(baseline_placements(cost))
['m-ETF', 'm-TOPO', 'single device', 'topological split']
"""
from __future__ import annotations

import numpy as np

from costmodel.arrays import graph_arrays
from costmodel.simulate import fits_memory
from partitioner.list_schedules import (earliest_task_first, fastest_single_device,
                                        home_device_with_spills, memory_topological,
                                        topological_split)
from partitioner.units import expand, placement_units
from tfpart.core.errors import PlacementError

GATHER_TOLERANCE = 0.01  # placements this close in simulated step count as equal


def no_worse_than_baselines(cost, device_of, judge, baselines, gather):
    """The placement to keep, judged by simulated steps (the measure a plan is judged
    by): the fastest of this placement, its gathered variants (:func:`_gathered`) and
    the baselines (the fastest single device, m-ETF, m-TOPO, the topological split), or
    among those within 1% of the fastest and no slower than any baseline, the one that
    moves the fewest bytes between devices and uses the fewest devices."""
    own = [device_of, *_gathered(cost, device_of, judge, *gather)]
    judged = [(judge(p), p) for p in own]
    baselines = [(judge(p), p) for p in baselines]
    fastest = min(j[0] for j, _ in judged + baselines)
    limit = min([fastest * (1 + GATHER_TOLERANCE)] + [j[0] for j, _ in baselines])
    eligible = [(j, p) for j, p in judged + baselines if j[0] <= limit]
    return min(eligible, key=lambda item: (item[0][1], item[0][2], item[0][0]))[1]


def baseline_placements(cost):
    """The baselines' placements that fit in memory, by name: the fastest single
    device (or, when no device holds the model, one home device with the variables it
    has no room for spilled to others), m-ETF, m-TOPO and the topological split."""
    found = {}
    alone = fastest_single_device(cost)
    if alone is not None:
        found["single device"] = np.full(len(cost.ops), alone[0])
    else:
        home = home_device_with_spills(cost)
        if home is not None:
            found["home device"] = home
    places = {"m-ETF": earliest_task_first, "m-TOPO": memory_topological,
              "topological split": topological_split}
    for name, place in places.items():
        try:
            placement = place(cost)
        except PlacementError:
            continue
        if fits_memory(cost, placement):
            found[name] = placement
    return found


def _gathered(cost, device_of, judge, device_moves, group_moves):
    """Variants of ``device_of`` with fewer cross-device bytes whose simulated step stays
    within 1% of its own: each device's groups in turn (least busy device first; at most
    ``device_moves`` tries) moved to the device they exchange the most bytes with, then
    single groups (cheapest first; at most ``group_moves`` tries) moved to their
    neighbours' device. Each try is a simulation."""
    if not device_moves and not group_moves:
        return []
    cluster = cost.cluster
    units = placement_units(cost)
    members = [unit.members for unit in units]
    runnable = np.array([unit.runnable for unit in units])
    unit_of = expand(units, np.arange(len(units)), len(cost.ops))
    current = device_of.copy()
    best = judge(current)
    limit = best[0] * (1 + GATHER_TOLERANCE)
    busy = np.bincount(current, weights=cost.compute[np.arange(len(current)), current],
                       minlength=len(cluster))
    exchanged = _exchanged_bytes(cost, unit_of, current, len(units))

    def try_move(moves):
        nonlocal current, best, exchanged
        trial = current.copy()
        for k, target in moves:
            trial[members[k]] = target
        if not fits_memory(cost, trial):
            return
        judged = judge(trial)
        if judged[0] <= limit and judged[1:] < best[1:]:
            current, best = trial, judged
            exchanged = _exchanged_bytes(cost, unit_of, current, len(units))

    for d in sorted(set(current.tolist()), key=lambda d: busy[d])[:device_moves]:
        if len(set(current.tolist())) == 1:
            break
        on_d = [k for k, m in enumerate(members) if current[m[0]] == d]
        targets = _neighbour_devices(exchanged, runnable, on_d, exclude=d)
        if on_d and (targets >= 0).all():
            try_move(list(zip(on_d, targets.tolist())))
    mean_time = np.bincount(unit_of, cost.mean_time(), minlength=len(units))
    for k in np.argsort(mean_time, kind="stable").tolist():
        if group_moves <= 0:
            break
        target = int(_neighbour_devices(exchanged, runnable, [k])[0])
        if target >= 0 and target != current[members[k][0]]:
            group_moves -= 1
            try_move([(k, target)])
    return [current] if (current != device_of).any() else []


def _exchanged_bytes(cost, unit_of, device_of, n_units):
    """Bytes each unit exchanges with each device over its edges to other units, and
    the number of those edges (a neighbour counts even if its edges carry 0 bytes)."""
    a = graph_arrays(cost)
    n_dev = len(cost.cluster)
    producer = np.repeat(np.arange(len(device_of)), np.diff(a.succ_ptr))
    consumer = a.succ_op
    apart = unit_of[producer] != unit_of[consumer]
    nbytes = a.edge_bytes[a.succ_edge][apart]
    rows = np.concatenate([unit_of[producer[apart]], unit_of[consumer[apart]]])
    columns = np.concatenate([device_of[consumer[apart]], device_of[producer[apart]]])
    flat = rows * n_dev + columns
    size = n_units * n_dev
    total = np.bincount(flat, np.concatenate([nbytes, nbytes]), minlength=size)
    edges = np.bincount(flat, minlength=size)
    return total.reshape(n_units, n_dev), edges.reshape(n_units, n_dev)


def _neighbour_devices(exchanged, runnable, units, exclude=None):
    """For each of ``units``, the device other than ``exclude`` that it exchanges the
    most bytes with and that can run it (lowest index on ties; -1 if none)."""
    total, edges = exchanged
    units = np.asarray(units, dtype=np.int64)
    allowed = runnable[units] & (edges[units] > 0)
    if exclude is not None:
        allowed[:, exclude] = False
    score = np.where(allowed, total[units], -1.0)
    return np.where(allowed.any(axis=1), score.argmax(axis=1), -1)
