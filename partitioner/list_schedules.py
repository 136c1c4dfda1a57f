"""Placements several algorithms start from or compare with: the fastest single
device, m-ETF's earliest-task-first list schedule with memory limits, m-TOPO's
memory-filling topological order and the even topological split.

Algorithms call these rather than each other (the import-linter contract in
``pyproject.toml`` keeps the algorithm modules independent).

m-ETF (Baechi, SoCC 2020): at every step, among all ready ops and all devices with
room, the pair with the earliest start time is scheduled (ties: the op with the longer
path to the end). A colocation group follows its first op. Unlike the greedy
(HEFT-like), ETF looks at start rather than finish times and ignores how fast a device
is. References: Hwang et al., SIAM J. Comput. 18(2), 1989 (ETF); Jeon et al., SoCC 2020
(``placer/m_etf.py`` in Baechi).

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph()
>>> for i in range(2): g.add_op(f"op{i}", op_type="MatMul", flops=1e10)
>>> cost = CostModel(g, cluster_of_devices(["cpu", "V100"]))
>>> fastest_single_device(cost)[0]  # the V100
1
>>> sorted(earliest_task_first(cost).tolist())  # both start at once, one per device
[0, 1]
"""
from __future__ import annotations

import numpy as np

from costmodel.memory import device_memory
from costmodel.simulate import data_ready_time, upward_rank
from partitioner.units import MemoryLedger, expand, no_device_error, placement_units
from partitioner.validate import check_memory


def fastest_single_device(cost):
    """The fastest device that can run and hold the whole graph.

    Alone on one device a work-conserving executor never idles, so the step time is
    the sum of the op times (plus the step overhead).

    Parameters
    ----------
    cost : costmodel.CostModel

    Returns
    -------
    tuple of (int, float) or None
        ``(device index, step time)``, or ``None`` if no device can.
    """
    graph, cluster = cost.graph, cost.cluster
    names = cluster.device_names
    totals = cost.compute.sum(axis=0) + cluster.step_overhead
    for d in np.argsort(totals, kind="stable"):
        if not np.isfinite(totals[d]):
            break
        device = cluster.devices[d]
        if device_memory(graph, dict.fromkeys(cost.ops, device.name), names)[device.name] \
                <= device.memory:
            return int(d), float(totals[d])
    return None


def earliest_task_first(cost):
    """m-ETF's placement: the device index of every op of ``cost.ops``.

    Parameters
    ----------
    cost : costmodel.CostModel

    Returns
    -------
    numpy.ndarray of int

    Raises
    ------
    tfpart.errors.PlacementError
        If some colocation group fits or runs on no device that has room left, or the
        result breaks a device's memory bound (the bound counts tensors received from
        other devices, which the schedule's ledger cannot know in advance).
    """
    graph, cluster = cost.graph, cost.cluster
    units = placement_units(graph, cost)
    unit_of = {i: k for k, u in enumerate(units) for i in u.members}
    ledger = MemoryLedger(cluster)
    level = upward_rank(cost)
    n_ops = len(cost.ops)
    device_of, end = np.full(n_ops, -1), np.zeros(n_ops)
    free = np.zeros(len(cluster))
    unit_device = {}
    waiting = {i: graph.in_degree(cost.ops[i]) for i in range(n_ops)}
    ready = {i for i, count in waiting.items() if count == 0}
    while ready:
        best = None
        for i in ready:
            k = unit_of[i]
            devices = [unit_device[k]] if k in unit_device else \
                [d for d in range(len(cluster)) if ledger.fits(units[k], d)]
            for d in devices:
                start = max(free[d], data_ready_time(cost, i, d, end, device_of))
                key = (start, -level[i], graph.structural_key(cost.ops[i]), d)
                if best is None or key < best[0]:
                    best = (key, i, d)
        if best is None:
            raise no_device_error(units[unit_of[min(ready)]], cost)
        (start, _, _, d), i, _ = best
        k = unit_of[i]
        if k not in unit_device:
            unit_device[k] = d
            ledger.take(units[k], d)
        device_of[i], end[i] = d, start + cost.compute[i, d]
        free[d] = end[i]
        ready.remove(i)
        for succ in graph.successors(cost.ops[i]):
            j = cost.index[succ]
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.add(j)
    names = cluster.device_names
    check_memory(graph, {op: names[d] for op, d in zip(cost.ops, device_of)}, cluster)
    return device_of


def memory_topological(cost):
    """m-TOPO's placement (Baechi, SoCC 2020; ``placer/m_topo.py`` in their code): the
    topological order of the placement units, filling one device up to its share of
    the model's memory before moving to the next.

    Raises
    ------
    tfpart.errors.PlacementError
        If some unit fits or runs on no device that has room left.
    """
    graph, cluster = cost.graph, cost.cluster
    units = placement_units(graph, cost)
    ledger = MemoryLedger(cluster)
    n = len(cluster)
    share = sum(u.footprint for u in units) / n
    cursor, chosen = 0, []
    for unit in units:
        d = cursor
        while d < n and not (ledger.fits(unit, d) and (
                d == n - 1 or ledger.used[d] == 0 or
                ledger.used[d] + unit.footprint <= share * 1.0001)):
            d += 1
        if d == n:  # no device from the cursor on has room: the first that does
            fits = [k for k in range(n) if ledger.fits(unit, k)]
            if not fits:
                raise no_device_error(unit, cost)
            d = fits[0]
        else:
            cursor = d
        ledger.take(unit, d)
        chosen.append(d)
    return expand(units, chosen, len(cost.ops))


def topological_split(cost):
    """One contiguous piece of the topological order per device, in cluster order,
    balanced by mean op time; a colocation group goes with its first op (the split a
    person makes by hand). Memory is not checked."""
    graph, cluster = cost.graph, cost.cluster
    n_dev = len(cluster)
    mean_time = cost.mean_time()
    total = mean_time.sum()
    device_of = np.zeros(len(cost.ops), dtype=int)
    group_device, done = {}, 0.0
    for name in graph.topological_order():
        i = cost.index[name]
        group = graph.ops[name]["colocation"]
        if group not in group_device:
            group_device[group] = min(int(done / total * n_dev), n_dev - 1) \
                if total > 0 else 0
        device_of[i] = group_device[group]
        done += mean_time[i]
    return device_of
