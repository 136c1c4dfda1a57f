"""Placements several algorithms start from or compare with: the fastest single
device, one home device with the variables it has no room for spilled to others,
m-ETF's earliest-task-first list schedule with memory limits, m-TOPO's
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
>>> g = OpGraph()
>>> for i in range(2): g.add_op(f"op{i}", op_type="MatMul", flops=1e10)
>>> cost = CostModel(g, cluster_of_devices(["cpu", "V100"]))
>>> fastest_single_device(cost)[0]  # the V100
1
>>> sorted(earliest_task_first(cost).tolist())  # both start at once, one per device
[0, 1]
"""
from __future__ import annotations

import numba
import numpy as np

from costmodel.arrays import edge_times, graph_arrays, keyed_heap_pop, keyed_heap_push
from costmodel.simulate import fits_memory, live_peak, simulated_step, upward_rank
from partitioner.units import (MemoryLedger, expand, no_device_error, placement_units,
                               variable_room)
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
    cluster = cost.cluster
    totals = cost.compute.sum(axis=0) + cluster.step_overhead
    for d in np.argsort(totals, kind="stable"):
        if not np.isfinite(totals[d]):
            break
        if fits_memory(cost, np.full(len(cost.ops), d)):
            return int(d), float(totals[d])
    return None


def home_device_with_spills(cost):
    """Every op on one home device but the variables it has no room for: the largest
    placement units holding variables move, largest first, to the device with the most
    room left that can run them, until the home device's variables fit. Tried from each
    device as home (fastest first); the fastest by simulation that fits in memory is
    kept. A table cut into row shards, with the gathers welded to each shard, becomes
    one shard at home and the others beside their gathers: the plan a user would write.

    Parameters
    ----------
    cost : costmodel.CostModel

    Returns
    -------
    numpy.ndarray of int or None
        The device index of every op, or ``None`` if no such placement fits.

    Examples
    --------
    >>> g = OpGraph()
    >>> g.add_op("x", op_type="Placeholder")
    >>> for name in ("a", "b"):
    ...     g.add_op(name, op_type="VarHandleOp", param_bytes=6e9)
    ...     g.add_op(f"{name}/read", op_type="ResourceGather", colocation=name)
    ...     g.add_edge(name, f"{name}/read"); g.add_edge("x", f"{name}/read", bytes=8)
    >>> g.add_op("sum", op_type="AddV2")
    >>> for name in ("a", "b"): g.add_edge(f"{name}/read", "sum", bytes=8)
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"], memory=10e9))
    >>> fastest_single_device(cost) is None, home_device_with_spills(cost).tolist()
    (True, [0, 1, 1, 0, 0, 0])
    """
    units, priority = placement_units(cost), upward_rank(cost)
    room = np.array([device.memory for device in cost.cluster.devices], dtype=float)
    totals = cost.compute.sum(axis=0)
    holding = sorted((k for k, unit in enumerate(units) if unit.params),
                     key=lambda k: -units[k].params)
    best = None
    for home in np.argsort(totals, kind="stable").tolist():
        if not np.isfinite(totals[home]):
            break
        unit_device = np.full(len(units), home)
        left = room.copy()
        left[home] -= sum(unit.params for unit in units)
        for k in holding:
            if left[home] >= 0:
                break
            others = [d for d in np.argsort(-left, kind="stable").tolist()
                      if d != home and units[k].runnable[d]]
            if not others:
                break
            unit_device[k] = others[0]
            left[home] += units[k].params
            left[others[0]] -= units[k].params
        placement = expand(units, unit_device, len(cost.ops))
        if left[home] < 0 or not fits_memory(cost, placement):
            continue
        step = simulated_step(cost, placement, priority)[0]
        if best is None or step < best[0]:
            best = (step, placement)
    return None if best is None else best[1]


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
    tfpart.core.errors.PlacementError
        If some colocation group fits or runs on no device that has room left, or the
        result breaks a device's memory bound (the bound counts tensors received from
        other devices, which the schedule's ledger cannot know in advance).
    """
    cluster = cost.cluster
    a = graph_arrays(cost)
    units = placement_units(cost)
    unit_of = expand(units, np.arange(len(units)), len(cost.ops))
    capacity = variable_room(cost)
    device_of, failed = _earliest_task_first(
        upward_rank(cost), a.tie, cost.compute, a.pred_ptr, a.pred_op, a.pred_edge,
        a.succ_ptr, a.succ_op, a.edge_bytes, a.comm_row, a.comm, cost.latency,
        cost.inverse_bandwidth, unit_of, np.array([u.params for u in units], dtype=float),
        np.array([u.runnable for u in units], dtype=np.bool_).reshape(len(units), -1),
        capacity)
    if failed >= 0:
        raise no_device_error(units[unit_of[failed]], cost)
    check_memory(cluster, dict(zip(cluster.device_names, live_peak(cost, device_of))))
    return device_of


@numba.njit(cache=True)
def _earliest_task_first(level, tie, compute, pred_ptr, pred_op, pred_edge, succ_ptr,
                         succ_op, edge_bytes, comm_row, comm, latency, inverse_bandwidth,
                         unit_of, params, runnable, capacity):
    """m-ETF's loop: of all (ready op, device) pairs, start the one that can start
    first (ties: higher level, then lower ``tie``, then lower device), its unit within
    the device's memory. Returns the device per op, and the lowest ready op if some
    unit fits nowhere (else -1).

    Per device two heaps of the ready ops that may run there: those whose inputs are
    there by the time it is free (``waiting_for_device``: they all start when it is
    free; best level first) and the others (``waiting_for_data``: earliest data first).
    Whether an op may run on a device only ever turns false (its unit placed
    elsewhere, the device filling up), so invalid entries are dropped when they
    surface; the best pair is the best of each device's two heap tops."""
    n_ops, n_dev = compute.shape
    device_of, end = np.full(n_ops, -1, dtype=np.int64), np.zeros(n_ops)
    free, used = np.zeros(n_dev), np.zeros(n_dev)
    unit_device = np.full(len(params), -1, dtype=np.int64)
    data_ready = np.zeros((n_ops, n_dev))  # fixed once an op is ready: its inputs are placed
    waiting = np.diff(pred_ptr)
    is_ready = np.zeros(n_ops, dtype=np.bool_)
    for_device = np.empty((n_dev, n_ops), dtype=np.int64)
    for_data = np.empty((n_dev, n_ops), dtype=np.int64)
    n_device, n_data = np.zeros(n_dev, dtype=np.int64), np.zeros(n_dev, dtype=np.int64)
    pending = np.empty(n_ops, dtype=np.int64)  # ops that just became ready
    n_pending = 0
    for i in range(n_ops):
        if waiting[i] == 0:
            pending[n_pending] = i
            n_pending += 1
    for _ in range(n_ops):
        for r in range(n_pending):
            j = pending[r]
            is_ready[j] = True
            for e in range(n_dev):
                for q in range(pred_ptr[j], pred_ptr[j + 1]):
                    p = pred_op[q]
                    _, total = edge_times(pred_edge[q], device_of[p], e, edge_bytes, comm_row,
                                          comm, latency, inverse_bandwidth)
                    data_ready[j, e] = max(data_ready[j, e], end[p] + total)
                if data_ready[j, e] <= free[e]:
                    keyed_heap_push(for_device, n_device, e, j, data_ready, -1, level, tie)
                else:
                    keyed_heap_push(for_data, n_data, e, j, data_ready, e, level, tie)
        n_pending = 0
        best, best_d, best_start = -1, -1, 0.0
        for d in range(n_dev):
            while n_data[d] > 0 and data_ready[for_data[d, 0], d] <= free[d]:
                moved = keyed_heap_pop(for_data, n_data, d, data_ready, d, level, tie)
                keyed_heap_push(for_device, n_device, d, moved, data_ready, -1, level, tie)
            candidate, start = -1, 0.0
            for heap, size, key in ((for_device, n_device, -1), (for_data, n_data, d)):
                while size[d] > 0:
                    i = heap[d, 0]
                    k = unit_of[i]
                    if device_of[i] < 0 and (unit_device[k] == d or (
                            unit_device[k] < 0 and runnable[k, d] and
                            used[d] + params[k] <= capacity[d])):
                        break
                    # never valid here again: drop it
                    keyed_heap_pop(heap, size, d, data_ready, key, level, tie)
                if size[d] > 0:
                    candidate = heap[d, 0]
                    start = max(free[d], data_ready[candidate, d])
                    break
            if candidate < 0:
                continue
            if best < 0 or start < best_start or (start == best_start and (
                    level[candidate] > level[best] or (level[candidate] == level[best] and
                                                       tie[candidate] < tie[best]))):
                best, best_d, best_start = candidate, d, start
        if best < 0:
            return device_of, np.flatnonzero(is_ready & (device_of < 0)).min()
        i, d = best, best_d
        k = unit_of[i]
        if unit_device[k] < 0:
            unit_device[k] = d
            used[d] += params[k]
        device_of[i], end[i] = d, best_start + compute[i, d]
        free[d] = end[i]
        for s in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_op[s]
            waiting[j] -= 1
            if waiting[j] == 0:
                pending[n_pending] = j
                n_pending += 1
    return device_of, -1


def memory_topological(cost):
    """m-TOPO's placement (Baechi, SoCC 2020; ``placer/m_topo.py`` in their code): the
    topological order of the placement units, filling one device up to its share of
    the model's memory before moving to the next.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If some unit fits or runs on no device that has room left.
    """
    cluster = cost.cluster
    units = placement_units(cost)
    ledger = MemoryLedger(cost)
    n = len(cluster)
    share = sum(u.params for u in units) / n
    cursor, chosen = 0, []
    for unit in units:
        d = cursor
        while d < n and not (ledger.fits(unit, d) and (
                d == n - 1 or ledger.used[d] == 0 or
                ledger.used[d] + unit.params <= share * 1.0001)):
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
    cluster = cost.cluster
    n_dev = len(cluster)
    mean_time = cost.mean_time()
    total = mean_time.sum()
    device_of = np.zeros(len(cost.ops), dtype=int)
    group_device, done = {}, 0.0
    group_of = graph_arrays(cost).group_of
    for i in graph_arrays(cost).topological.tolist():
        group = group_of[i]
        if group not in group_device:
            group_device[group] = min(int(done / total * n_dev), n_dev - 1) \
                if total > 0 else 0
        device_of[i] = group_device[group]
        done += mean_time[i]
    return device_of
