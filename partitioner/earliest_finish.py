"""The greedy's placement (a library: the greedy plug-in and the ILP's warm start use
it): memory-aware earliest-finish-time list scheduling with insertion (the HEFT
family), then a local search on the simulated step time.

Ops are taken in list-scheduling order (ready ops first, highest upward rank first; the
rank uses each op's mean time over the devices that can run it and mean transfer
times, as HEFT does). The first op of a colocation group decides the group's device:
among the devices that have a kernel for every op of the group and room for the
group's variables and the op's tensors, and that leave room for the variables of the
groups still unplaced (a first-fit-decreasing packing must exist), the one where the op
would finish earliest, counting the transfers of its inputs and fitting it into an idle
slot of that device's executor (insertion). The schedule is made twice: with each
transfer taking its own alpha-beta time, and with transfers queued as the simulator
queues them (one copy per producer and destination device, on its directed link, in an
idle slot of the link when one is long enough); the placement that simulates faster is
kept. The rest of the group follows. Groups that cost nothing
and read nothing (variables with their reads, constants) are then moved next to their
heaviest consumer.

On graphs small enough for the local search, the search starts from the better of this
placement and m-ETF's (Baechi's earliest-start rule does better where transfers
dominate), so the result is never worse than m-ETF's.

Then a local search moves the heaviest groups, one at a time, to whichever other
device lowers the simulated step time, for at most ``refine_evaluations`` simulations
(graphs above ``refine_max_ops`` ops skip it).

Last, the plan is judged by simulation against gathered variants of itself (the groups
of its least busy devices, then single groups, moved to the devices they exchange the
most bytes with) and the baselines: the fastest single device, m-ETF, m-TOPO and the
topological split. The fastest wins; among placements within 1% of it and no slower
than any baseline, the one moving the fewest bytes between devices, then using the
fewest devices (a transfer off the critical path is not free in TensorFlow: each is a
Send/Recv pair). So the greedy is never slower than a baseline by simulation (m-ETF,
whose time grows with the square of the graph, only up to ``refine_max_ops`` ops; the
baselines but the single device up to ``compare_max_ops``).
Everything is deterministic.

References
----------
Topcuoglu, Hariri, Wu. "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002 (HEFT).
Hwang, Chow, Anger, Lee. "Scheduling precedence graphs in systems with interprocessor
communication times", SIAM J. Comput. 18(2), 1989 (ETF).

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> for n in ("left", "right"): g.add_op(n, op_type="MatMul", flops=1e11)
>>> g.add_op("sum", op_type="AddV2", bytes_accessed=1e3)
>>> for n in ("left", "right"): g.add_edge("x", n, bytes=1e3); g.add_edge(n, "sum", bytes=1e3)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> device_of, _ = greedy_placement(CostModel(g, cluster))
>>> len(set(device_of.tolist()))  # the two branches run in parallel
2
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from costmodel.memory import device_memory, new_output_bytes, output_bytes
from costmodel.simulate import data_ready_time, ready_order, simulate, upward_rank
from partitioner.list_schedules import (earliest_task_first, fastest_single_device,
                                        memory_topological, topological_split)
from partitioner.units import placement_units
from partitioner.validate import check_memory
from tfpart.errors import PlacementError


GATHER_TOLERANCE = 0.01  # placements this close in simulated step count as equal


@dataclass(frozen=True)
class GreedyOptions:
    """``memory_headroom``: fraction of each device's memory kept free;
    ``insertion``: fill idle slots; ``refine_evaluations``: simulations the local search
    (and the gathering) may spend (0 turns it off); ``refine_max_ops``: no local search,
    no m-ETF start and no m-ETF among the baselines above this size (m-ETF's time grows
    with the square of the graph); ``compare_max_ops``: above this size the plan is only
    compared with the fastest single device (each comparison is a simulation)."""

    memory_headroom: float = 0.0
    insertion: bool = True
    refine_evaluations: int = 100
    refine_max_ops: int = 1500
    compare_max_ops: int = 5000


class _Slots:
    """Busy intervals of one executor, to find the earliest idle slot for an op."""

    MAX_GAPS = 64  # gaps examined before settling for the end of the schedule

    def __init__(self):
        self.intervals = []  # sorted (start, end)

    def earliest(self, ready, duration, insertion=True):
        tail = self.intervals[-1][1] if self.intervals else 0.0
        if not insertion or not self.intervals:
            return max(ready, tail)
        k = bisect.bisect_left(self.intervals, (ready, -1.0))
        previous_end = self.intervals[k - 1][1] if k else 0.0
        for start, end in self.intervals[k:k + self.MAX_GAPS]:
            begin = max(ready, previous_end)
            if begin + duration <= start:
                return begin
            previous_end = max(previous_end, end)
        return max(ready, tail, previous_end)

    def book(self, start, end):
        bisect.insort(self.intervals, (start, end))


class _Links:
    """Transfers booked so far, as the simulator makes them: one copy of a tensor per
    producer and destination device, queued on its directed link (a copy fits an idle
    slot of the link when one is long enough)."""

    def __init__(self, contended=True):
        self.contended = contended  # else each transfer takes its own alpha-beta time
        self.slots = {}  # (src, dst) -> _Slots of the link's busy intervals
        self.arrival = {}  # (producer, dst) -> when its copy is on dst

    def ready_time(self, cost, i, d, end, device_of):
        """When all inputs of op ``i`` can be on device ``d``, and the copies that takes
        (to :meth:`book` if ``i`` goes there)."""
        if not self.contended:
            return data_ready_time(cost, i, d, end, device_of), []
        graph = cost.graph
        ready, copies, tentative = 0.0, [], {}
        inputs = sorted(((end[cost.index[p]], cost.index[p], edge)
                         for p, edge in graph.in_edges(cost.ops[i]).items()),
                        key=lambda item: item[:2])
        for finish, p, edge in inputs:
            src = device_of[p]
            if edge["control"] or src == d:
                ready = max(ready, finish)
                continue
            if (p, d) in self.arrival:
                ready = max(ready, self.arrival[(p, d)])
                continue
            on_link, total = cost.edge_link_time(edge, src, d), cost.edge_time(edge, src, d)
            booked = tentative.setdefault((src, d), [])
            begin = self._earliest((src, d), booked, finish, on_link)
            booked.append((begin, begin + on_link))
            copies.append((p, src, begin, on_link, begin + total))
            ready = max(ready, begin + total)
        return ready, copies

    def _earliest(self, link, booked, ready, duration):
        slots = self.slots.get(link)
        begin = slots.earliest(ready, duration) if slots else ready
        while True:
            clash = next((b for b in booked if b[0] < begin + duration and begin < b[1]), None)
            if clash is None:
                return begin
            begin = slots.earliest(clash[1], duration) if slots else clash[1]

    def book(self, d, copies):
        for p, src, begin, on_link, arrival in copies:
            self.slots.setdefault((src, d), _Slots()).book(begin, begin + on_link)
            self.arrival[(p, d)] = arrival


def _group_tables(graph, cost):
    """Per colocation group: member op indices, variable bytes, runnable devices."""
    params, runnable = {}, {}
    for group, names in graph.colocation_groups().items():
        members = [cost.index[name] for name in names]
        params[group] = sum(graph.ops[cost.ops[i]]["param_bytes"] for i in members)
        runnable[group] = np.all(np.isfinite(cost.compute[members]), axis=0)
    return params, runnable


def _new_activation_bytes(cost, i, d, device_of, received, out_bytes, own_bytes):
    """Bytes device ``d`` must newly hold if op ``i`` runs there."""
    extra = own_bytes[i]
    for pred, edge in cost.graph.in_edges(cost.ops[i]).items():
        p = cost.index[pred]
        if not edge["control"] and device_of[p] != d and (p, d) not in received:
            extra += out_bytes[p]
    return extra


def packable(sizes_descending, free):
    """Whether first-fit decreasing packs ``sizes_descending`` into bins ``free``.

    >>> packable([5, 4, 3], [8, 4]), packable([5, 5], [8, 4])
    (True, False)
    """
    if sum(sizes_descending) <= max(free, default=0):
        return True
    free = list(free)
    for size in sizes_descending:
        fit = next((k for k, room in enumerate(free) if room >= size), None)
        if fit is None:
            return False
        free[fit] -= size
    return True


def greedy_placement(cost, options=GreedyOptions()):
    """The device index of every op of ``cost.ops``, and the simulator priority the
    placement was judged with.

    The list schedule is made twice, with transfers queued per link and with each
    transfer alone (the simulator's queues are in time order, the list schedule's in
    placement order, so neither estimate is exact), and the one whose placement
    simulates faster is kept (graphs above ``compare_max_ops`` ops: the second only).

    Raises
    ------
    tfpart.errors.PlacementError
        If an op runs on no device, or memory runs out (naming the roomiest device).
    """
    graph, cluster = cost.graph, cost.cluster
    n_ops = len(cost.ops)
    priority = upward_rank(cost)
    device_of = _list_schedule(cost, options, priority, contended=False)
    if n_ops <= options.compare_max_ops:
        queued = _list_schedule(cost, options, priority, contended=True)
        if simulate(cost, queued, priority, memory=False).makespan < \
                simulate(cost, device_of, priority, memory=False).makespan:
            device_of = queued
    baselines = _baselines(cost, with_etf=n_ops <= options.refine_max_ops,
                           cheap_only=n_ops > options.compare_max_ops)
    if options.refine_evaluations and n_ops <= options.refine_max_ops:
        device_of = _better_start(cost, device_of, priority, baselines.get("m-ETF"))
        _refine(graph, cost, cluster, device_of, priority, options.refine_evaluations)
        # TensorFlow's placer puts a lone generator op (a constant read by one op) beside
        # its reader whatever the plan says, so the plan must too; other free groups
        # follow their readers again only if that is no slower.
        searched = device_of.copy()
        _move_free_groups_to_consumers(graph, cost, cluster, device_of)
        _move_free_groups_to_consumers(graph, cost, cluster, searched, generators_only=True)
        if simulate(cost, searched, priority, memory=False).makespan < \
                simulate(cost, device_of, priority, memory=False).makespan:
            device_of[:] = searched
    gather = (len(cluster) if n_ops <= options.compare_max_ops else 0,
              options.refine_evaluations if n_ops <= options.refine_max_ops else 0)
    device_of = _no_worse_than_baselines(cost, device_of, priority, list(baselines.values()),
                                         gather)
    return device_of, priority


def _list_schedule(cost, options, priority, contended):
    """The earliest-finish list schedule's placement, its transfers queued per link
    (``contended``) or each alone."""
    graph, cluster = cost.graph, cost.cluster
    n_ops, n_dev = cost.compute.shape
    capacity = np.array([d.memory for d in cluster.devices]) * (1 - options.memory_headroom)
    group_params, group_runnable = _group_tables(graph, cost)
    out_bytes = np.array([output_bytes(graph.ops[name]) for name in cost.ops], dtype=float)
    own_bytes = np.array([new_output_bytes(graph.ops[name]) for name in cost.ops], dtype=float)
    device_of = np.full(n_ops, -1)
    end = np.zeros(n_ops)
    executor_of = cluster.executor_of
    slots = [_Slots() for _ in range(max(executor_of) + 1)]
    used = np.zeros(n_dev)
    group_device, received = {}, set()
    links = _Links(contended)
    unplaced = _Unplaced(group_params)
    for i in ready_order(cost, priority):
        group = graph.ops[cost.ops[i]]["colocation"]
        if group in group_device:
            candidates = [group_device[group]]
            new_params = 0
        else:
            candidates = np.flatnonzero(group_runnable[group])
            new_params = group_params[group]
            if len(candidates) == 0:
                raise PlacementError("", f"no device can run every op colocated with "
                                     f"{cost.ops[i]} ({graph.ops[cost.ops[i]]['op_type']})")
        best, best_key = None, None
        for d in candidates:
            need = new_params + _new_activation_bytes(cost, i, d, device_of, received, out_bytes,
                                                      own_bytes)
            if used[d] + need > capacity[d]:
                continue
            if new_params and not unplaced.leaves_room(group, capacity - used, d, need):
                continue
            ready, copies = links.ready_time(cost, i, d, end, device_of)
            start = slots[executor_of[d]].earliest(ready, cost.compute[i, d],
                                                   options.insertion)
            key = (start + cost.compute[i, d], used[d] / capacity[d], d)
            if best_key is None or key < best_key:
                best, best_key, best_need, best_copies = d, key, need, copies
        if best is None:
            roomiest = max(candidates, key=lambda d: capacity[d] - used[d])
            free = capacity[roomiest] - used[roomiest]
            need = new_params + own_bytes[i]
            why = (f"the roomiest device that can run it, {cluster.devices[roomiest].name}, "
                   f"has {free / 1e6:.1f} MB left" if need > free else
                   "any device it fits on would leave no room for the "
                   f"{unplaced.total / 1e6:.1f} MB of variables still to place")
            raise PlacementError("", f"out of memory placing {cost.ops[i]}: it needs "
                                 f"{need / 1e6:.1f} MB, and {why}")
        if group not in group_device:
            unplaced.remove(group)
        group_device[group] = best
        device_of[i] = best
        end[i] = best_key[0]
        slots[executor_of[best]].book(end[i] - cost.compute[i, best], end[i])
        links.book(best, best_copies)
        used[best] += best_need
        for pred, edge in cost.graph.in_edges(cost.ops[i]).items():
            p = cost.index[pred]
            if not edge["control"] and device_of[p] != best:
                received.add((p, best))
    _move_free_groups_to_consumers(graph, cost, cluster, device_of)
    return device_of


def _no_worse_than_baselines(cost, device_of, priority, baselines, gather):
    """The placement to keep, judged by simulated steps (the measure a plan is judged
    by): the fastest of this placement, its gathered variants (:func:`_gathered`) and
    the baselines (the fastest single device, m-ETF, m-TOPO, the topological split), or
    among those within 1% of the fastest and no slower than any baseline, the one that
    moves the fewest bytes between devices and uses the fewest devices."""
    def judge(placement):
        schedule = simulate(cost, placement, priority, memory=False)
        return schedule.makespan, schedule.bytes_moved, len(np.unique(placement))

    own = [device_of, *_gathered(cost, device_of, judge, *gather)]
    judged = [(judge(p), p) for p in own]
    baselines = [(judge(p), p) for p in baselines]
    fastest = min(j[0] for j, _ in judged + baselines)
    limit = min([fastest * (1 + GATHER_TOLERANCE)] + [j[0] for j, _ in baselines])
    eligible = [(j, p) for j, p in judged + baselines if j[0] <= limit]
    return min(eligible, key=lambda item: (item[0][1], item[0][2], item[0][0]))[1]


def _baselines(cost, with_etf=True, cheap_only=False):
    """The baselines' placements that fit in memory, by name: the fastest single
    device, and unless ``cheap_only``, m-ETF (if ``with_etf``), m-TOPO and the
    topological split."""
    found = {}
    alone = fastest_single_device(cost)
    if alone is not None:
        found["single device"] = np.full(len(cost.ops), alone[0])
    if cheap_only:
        return found
    names = cost.cluster.device_names
    places = {"m-ETF": earliest_task_first} if with_etf else {}
    places.update({"m-TOPO": memory_topological, "topological split": topological_split})
    for name, place in places.items():
        try:
            placement = place(cost)
            check_memory(cost.graph, {op: names[d] for op, d in zip(cost.ops, placement)},
                         cost.cluster)
        except PlacementError:
            continue
        found[name] = placement
    return found


def _gathered(cost, device_of, judge, device_moves, group_moves):
    """Variants of ``device_of`` with fewer cross-device bytes whose simulated step stays
    within 1% of its own: each device's groups in turn (least busy device first; at most
    ``device_moves`` tries) moved to the device they exchange the most bytes with, then
    single groups (cheapest first; at most ``group_moves`` tries) moved to their
    neighbours' device. Each try is a simulation."""
    graph, cluster = cost.graph, cost.cluster
    units = [unit.members for unit in placement_units(graph, cost)]
    current = device_of.copy()
    best = judge(current)
    limit = best[0] * (1 + GATHER_TOLERANCE)
    runnable = [np.all(np.isfinite(cost.compute[members]), axis=0) for members in units]
    busy = np.bincount(current, weights=cost.compute[np.arange(len(current)), current],
                       minlength=len(cluster))

    def try_move(moves):
        nonlocal current, best
        trial = current.copy()
        for k, target in moves:
            trial[units[k]] = target
        names = cluster.device_names
        memory = device_memory(graph, {op: names[d] for op, d in zip(cost.ops, trial)}, names)
        if any(memory[device.name] > device.memory for device in cluster.devices):
            return
        judged = judge(trial)
        if judged[0] <= limit and judged[1:] < best[1:]:
            current, best = trial, judged

    for d in sorted(set(current.tolist()), key=lambda d: busy[d])[:device_moves]:
        if len(set(current.tolist())) == 1:
            break
        moves = [(k, _neighbour_device(cost, units[k], current, runnable[k], exclude=d))
                 for k, members in enumerate(units) if current[members[0]] == d]
        if moves and all(target is not None for _, target in moves):
            try_move(moves)
    mean_time = cost.mean_time()
    for k in sorted(range(len(units)), key=lambda k: mean_time[units[k]].sum()):
        if group_moves <= 0:
            break
        target = _neighbour_device(cost, units[k], current, runnable[k])
        if target is not None and target != current[units[k][0]]:
            group_moves -= 1
            try_move([(k, target)])
    return [current] if (current != device_of).any() else []


def _neighbour_device(cost, members, device_of, runnable, exclude=None):
    """The device, other than ``exclude``, that the group ``members`` exchanges the most
    bytes with and that can run it (None if no neighbour qualifies)."""
    graph = cost.graph
    inside = set(members)
    exchanged = {}
    for m in members:
        edges = [*graph.in_edges(cost.ops[m]).items(), *graph.out_edges(cost.ops[m]).items()]
        for other, edge in edges:
            if other in inside:
                continue
            d = device_of[cost.index[other]]
            if d != exclude and runnable[d]:
                exchanged[d] = exchanged.get(d, 0.0) + edge["bytes"]
    return max(sorted(exchanged), key=exchanged.get, default=None)


def _better_start(cost, device_of, priority, alternative):
    """For the local search, the better of this schedule and m-ETF's (earliest start
    rather than earliest finish: better when transfers dominate), if it has one."""
    if alternative is None:
        return device_of
    mine = simulate(cost, device_of, priority, memory=False).makespan
    theirs = simulate(cost, alternative, priority, memory=False).makespan
    return alternative if theirs < mine else device_of


class _Unplaced:
    """Variable bytes of the groups not placed yet, for the memory look-ahead."""

    def __init__(self, group_params):
        self.sizes = {g: size for g, size in group_params.items() if size > 0}
        self.total = float(sum(self.sizes.values()))

    def remove(self, group):
        self.total -= self.sizes.pop(group, 0.0)

    def leaves_room(self, group, free, d, need):
        """Whether the other unplaced groups still fit once ``group`` takes ``need``
        bytes of device ``d``."""
        free = free.copy()
        free[d] -= need
        rest = self.total - self.sizes.get(group, 0.0)
        if rest <= free.max():  # all of it fits on one device: no packing needed
            return True
        return packable(sorted((s for g, s in self.sizes.items() if g != group),
                               reverse=True), free)


def _refine(graph, cost, cluster, device_of, priority, evaluations):
    """First-improvement local search: move a colocation group (heaviest first) to the
    device that most lowers the simulated makespan, within memory; repeat while it
    helps and the evaluation budget lasts. Changes ``device_of`` in place."""
    names = cluster.device_names
    groups = [unit.members for unit in placement_units(graph, cost)]  # topological order
    mean_time = cost.mean_time()
    groups.sort(key=lambda members: -mean_time[members].sum())  # stable: ties keep order
    groups = [m for m in groups if mean_time[m].sum() > 0]
    capacity = {d.name: d.memory for d in cluster.devices}
    best = simulate(cost, device_of, priority, memory=False).makespan
    improved = True
    while improved and evaluations > 0:
        improved = False
        for members in groups:
            here = device_of[members[0]]
            runnable = np.all(np.isfinite(cost.compute[members]), axis=0)
            choice = None
            for d in np.flatnonzero(runnable):
                if d == here or evaluations <= 0:
                    continue
                trial = device_of.copy()
                trial[members] = d
                evaluations -= 1
                makespan = simulate(cost, trial, priority, memory=False).makespan
                if makespan < best * (1 - 1e-9) and (choice is None or makespan < choice[1]):
                    memory = device_memory(graph, {op: names[k] for op, k in
                                                   zip(cost.ops, trial)}, names)
                    if all(memory[n] <= capacity[n] for n in names):
                        choice = (d, makespan)
            if choice is not None:
                device_of[members] = choice[0]
                best = choice[1]
                improved = True
            if evaluations <= 0:
                break


def _move_free_groups_to_consumers(graph, cost, cluster, device_of, generators_only=False):
    """Put colocation groups that cost nothing anywhere and read nothing from outside
    (variables with their reads, constants) beside their heaviest outside consumer.

    A group's device is fixed by its first op, which for a variable is a free
    ``VarHandleOp`` placed before anything reads it; moving the group to where its
    value is used removes transfers without changing any op time. Kept only if every
    device stays within its memory. With ``generators_only``, only lone ops without
    inputs read by a single op move.
    """
    free = np.all(np.where(np.isfinite(cost.compute), cost.compute, 0.0) == 0, axis=1)
    position = {name: k for k, name in enumerate(graph.topological_order())}
    groups = sorted(graph.colocation_groups().values(),
                    key=lambda members: min(position[m] for m in members))
    moved = device_of.copy()
    for members in groups:
        indices = [cost.index[m] for m in members]
        if not free[indices].all():
            continue
        if generators_only and (len(members) > 1 or graph.in_degree(members[0]) or
                                graph.out_degree(members[0]) != 1):
            continue
        inside = set(members)
        if any(p not in inside for m in members for p in graph.predecessors(m)):
            continue
        uses = [(edge["bytes"], graph.structural_key(succ)) for m in members
                for succ, edge in graph.out_edges(m).items() if succ not in inside]
        if not uses:
            continue
        target = moved[cost.index[max(uses)[1][-1]]]
        if np.all(np.isfinite(cost.compute[indices, target])):
            moved[indices] = target
    names = cluster.device_names
    memory = device_memory(graph, {op: names[d] for op, d in zip(cost.ops, moved)}, names)
    if all(memory[d.name] <= d.memory for d in cluster.devices):
        device_of[:] = moved
