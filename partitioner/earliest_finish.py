"""The greedy's placement (a library: the greedy plug-in and the ILP's warm start use
it): memory-aware earliest-finish-time list scheduling with insertion (the HEFT
family), then a local search on the simulated step time.

Ops are taken in list-scheduling order (ready ops first, highest upward rank first; the
rank uses each op's mean time over the devices that can run it and mean transfer
times, as HEFT does). The first op of a colocation group decides the group's device:
among the devices that have a kernel for every op of the group and room for the
group's variables and the op's tensors beside the tensors alive there (each freed once
all its readers are placed), and that leave room for the variables of the groups still
unplaced (a first-fit-decreasing packing must exist), the one where the op
would finish earliest, counting the transfers of its inputs and fitting it into an idle
slot of that device's executor (insertion). The schedule is made twice: with each
transfer taking its own alpha-beta time, and with transfers queued as the simulator
queues them (one copy per producer and destination device, on its directed link, in an
idle slot of the link when one is long enough); the placement that simulates faster is
kept. The rest of the group follows. Groups that cost nothing and read nothing
(variables with their reads, constants) wait for their first reader and go where it
goes; afterwards each is moved next to its heaviest consumer if that fits. A device's
memory in the list schedule is its variables beside the most tensors alive there so far
(a tensor is freed once all its readers are placed). The list schedule's order is not
the simulator's, so that is an estimate: if the simulated live-range peak of the result
breaks a device's memory, the schedule is made again with that device's room cut by the
excess (a few times at most), then groups are moved off the device that overflows most
until all fit.

The local search starts from the better of this placement and m-ETF's (Baechi's
earliest-start rule does better where transfers dominate). It moves the heaviest
groups, one at a time, to whichever other device lowers the simulated step time; once
no single move helps, it kicks the placement (two groups moved at random, seeded) and
descends again, keeping the fastest placement found (an iterated local search). It
spends at most ``refine_evaluations`` simulations, fewer on large graphs
(``search_budget``: a few simulations, and no kick, on the largest). The loops of the
list schedules, the simulator and m-ETF are compiled (numba), which is what makes this
affordable at 100,000 ops.

Last, the plan is judged by simulation against gathered variants of itself (the groups
of its least busy devices, then single groups, moved to the devices they exchange the
most bytes with) and the baselines: the fastest single device (when none holds the
model, one home device with the variables it has no room for spilled to others), m-ETF,
m-TOPO and the topological split. The fastest wins; among placements within 1% of it
and no slower than any baseline, the one moving the fewest bytes between devices, then
using the fewest devices (a transfer off the critical path is not free in TensorFlow:
each is a Send/Recv pair). So the greedy is never slower than a baseline by
simulation, on graphs of any size. Everything is deterministic.

References
----------
Topcuoglu, Hariri, Wu. "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002 (HEFT).
Hwang, Chow, Anger, Lee. "Scheduling precedence graphs in systems with interprocessor
communication times", SIAM J. Comput. 18(2), 1989 (ETF).

Examples
--------
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

from dataclasses import dataclass

import networkx as nx
import numba
import numpy as np

from costmodel.arrays import edge_times, graph_arrays, heap_pop, heap_push
from costmodel.memory import size_text
from costmodel.simulate import fits_memory, live_peak, simulated_step, upward_rank
from partitioner.list_schedules import (earliest_task_first, fastest_single_device,
                                        home_device_with_spills, memory_topological,
                                        topological_split)
from partitioner.units import expand, less_room, placement_units
from partitioner.validate import kernel_problem, memory_hint
from tfpart.core.errors import PlacementError


GATHER_TOLERANCE = 0.01  # placements this close in simulated step count as equal


@dataclass(frozen=True)
class GreedyOptions:
    """``memory_headroom``: fraction of each device's memory kept free;
    ``insertion``: fill idle slots; ``refine_evaluations``: the most simulations the
    local search (and again the gathering) may spend (0 turns both off);
    ``search_budget``: evaluations = ``search_budget`` / ops², at least 2: a
    simulation costs time in proportion to the ops, so the search's time falls as
    1 / ops (about 1 s at 500 ops, 0.1 s at 10,000) and large graphs stay fast.

    >>> [GreedyOptions().evaluations(n) for n in (20, 500, 2_000, 10_000, 100_000)]
    [20000, 4000, 250, 10, 2]
    """

    memory_headroom: float = 0.0
    insertion: bool = True
    refine_evaluations: int = 20000
    search_budget: float = 1e9

    def evaluations(self, n_ops):
        """Simulations the local search may spend on a graph of ``n_ops`` ops."""
        return int(min(self.refine_evaluations, max(2, self.search_budget / max(n_ops, 1) ** 2)))


def greedy_placement(cost, options=GreedyOptions()):
    """The device index of every op of ``cost.ops``, and the simulator priority the
    placement was judged with.

    The list schedule is made twice, with transfers queued per link and with each
    transfer alone (the simulator's queues are in time order, the list schedule's in
    placement order, so neither estimate is exact), and the one whose placement
    simulates faster is kept.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If an op runs on no device, or memory runs out (naming the roomiest device).
    """
    graph, cluster = cost.graph, cost.cluster
    priority = upward_rank(cost)
    device_of = _list_schedule(cost, options, priority, contended=False)
    queued = _list_schedule(cost, options, priority, contended=True)
    judge = _Judge(cost, priority)
    if judge(queued)[0] < judge(device_of)[0]:
        device_of = queued
    baselines = _baselines(cost)
    evaluations = options.evaluations(len(cost.ops))
    if evaluations:
        # a copy: the search changes it in place, and m-ETF's stays a baseline
        device_of = _better_start(judge, device_of, baselines.get("m-ETF")).copy()
        _refine(cost, device_of, judge, evaluations)
        # TensorFlow's placer puts a lone generator op (a constant read by one op) beside
        # its reader whatever the plan says, so the plan must too; other free groups
        # follow their readers again only if that is no slower.
        searched = device_of.copy()
        _move_free_groups_to_consumers(graph, cost, cluster, device_of)
        _move_free_groups_to_consumers(graph, cost, cluster, searched, generators_only=True)
        if judge(searched)[0] < judge(device_of)[0]:
            device_of[:] = searched
    gather = (len(cluster), evaluations)
    device_of = _no_worse_than_baselines(cost, device_of, judge, list(baselines.values()),
                                         gather)
    return device_of, priority


REPAIRS = 4  # list schedules made again with less room where the simulation overflowed


def _list_schedule(cost, options, priority, contended):
    """The earliest-finish list schedule's placement, its transfers queued per link
    (``contended``) or each alone (the loop is compiled: :func:`_earliest_finish`),
    within every device's memory by simulation."""
    graph, cluster = cost.graph, cost.cluster
    a = graph_arrays(cost)
    room = np.array([d.memory for d in cluster.devices], dtype=float) * \
        (1 - options.memory_headroom)
    capacity = room.copy()
    group_of, params = a.group_of, a.group_param_bytes
    packing = np.array(sorted(np.flatnonzero(params > 0).tolist(), key=lambda k: -params[k]),
                       dtype=np.int64)
    follower = np.zeros(len(params), dtype=np.bool_)
    follower[free_groups(cost)] = True
    members = np.argsort(group_of, kind="stable").astype(np.int64)
    member_ptr = np.concatenate([[0], np.cumsum(np.bincount(group_of, minlength=len(params)))])
    readers = data_readers(a)
    best = None  # (worst excess, placement) of the attempts
    for _ in range(REPAIRS + 1):
        device_of, failure = _earliest_finish(
            priority, a.tie, cost.compute, np.asarray(cluster.executor_of, dtype=np.int64),
            a.pred_ptr, a.pred_op, a.pred_edge, a.succ_ptr, a.succ_op, a.edge_bytes,
            a.edge_control, a.comm_row, a.comm, cost.latency, cost.inverse_bandwidth,
            group_of, params, a.group_runnable, capacity, a.out_bytes, a.own_bytes,
            a.aliasing, readers, follower, member_ptr, members, packing,
            options.insertion, contended)
        if failure[0] >= 0:
            if best is None:
                raise _list_schedule_error(cost, failure)
            break  # less room than the schedule can live with: repair the best one
        _move_free_groups_to_consumers(graph, cost, cluster, device_of)
        excess = live_peak(cost, device_of, priority) - room
        if (excess <= 0).all():
            return device_of
        if best is None or excess.max() < best[0]:
            best = (excess.max(), device_of)
        capacity = less_room(capacity, excess, room)
    repaired = _move_off_overflowing(cost, best[1].copy(), priority, room)
    if repaired is not None:
        return repaired
    excess = live_peak(cost, best[1], priority) - room
    worst = int(np.argmax(excess))
    raise PlacementError("", f"out of memory: the greedy's placements overflow "
                         f"{cluster.devices[worst].name} by {size_text(excess[worst])} in "
                         f"simulation; {memory_hint(cost)}")


MEMORY_MOVES = 40  # groups moved off overflowing devices at most
MEMORY_TRIES = 8  # groups of an overflowing device tried per move


def _move_off_overflowing(cost, device_of, priority, room):
    """Move colocation groups, one at a time, off the device that overflows its
    ``room`` most (by simulated live-range peak) to the device with the most room left
    that runs them, taking the first move (largest group first) that lowers the worst
    overflow; the placement once every device fits, None if no move helps."""
    units = placement_units(cost)
    unit_of = expand(units, np.arange(len(units)), len(cost.ops))
    a = graph_arrays(cost)
    size = np.bincount(unit_of, a.param_bytes + a.own_bytes, minlength=len(units))
    excess = live_peak(cost, device_of, priority) - room
    for _ in range(MEMORY_MOVES):
        if (excess <= 0).all():
            return device_of
        d = int(np.argmax(excess))
        mine = [k for k in np.argsort(-size, kind="stable").tolist()
                if device_of[units[k].members[0]] == d][:MEMORY_TRIES]
        for k in mine:
            targets = [t for t in np.argsort(excess, kind="stable").tolist()
                       if t != d and units[k].runnable[t]]
            if not targets:
                continue
            trial = device_of.copy()
            trial[units[k].members] = targets[0]
            after = live_peak(cost, trial, priority) - room
            if after.max() < excess.max():
                device_of, excess = trial, after
                break
        else:
            return None
    return device_of if (excess <= 0).all() else None


def _list_schedule_error(cost, failure):
    op, roomiest, free, need, unplaced = failure
    name = cost.ops[int(op)]
    if roomiest < 0:
        return PlacementError("", kernel_problem(cost, name) or
                              f"no device can run every op colocated with {name} "
                              f"({cost.graph.ops[name]['op_type']})")
    why = (f"the roomiest device that can run it, "
           f"{cost.cluster.devices[int(roomiest)].name}, has {size_text(free)} left"
           if need > free else "any device it fits on would leave no room for the "
           f"{size_text(unplaced)} of variables still to place")
    return PlacementError("", f"out of memory placing {name}: it needs "
                          f"{size_text(need)}, and {why}; {memory_hint(cost)}")


MAX_GAPS = 64  # idle slots examined before settling for the end of a schedule


@numba.njit(cache=True)
def _slot_earliest(starts, ends, count, row, ready, duration, insertion):
    """The earliest start at or after ``ready`` of ``duration`` seconds among the busy
    intervals ``starts/ends[row, :count[row]]`` (sorted), in an idle slot if
    ``insertion``."""
    n = count[row]
    if n == 0:
        return ready
    tail = ends[row, n - 1]
    if not insertion:
        return max(ready, tail)
    k = np.searchsorted(starts[row, :n], ready)
    previous_end = ends[row, k - 1] if k > 0 else 0.0
    for idx in range(k, min(k + MAX_GAPS, n)):
        begin = max(ready, previous_end)
        if begin + duration <= starts[row, idx]:
            return begin
        previous_end = max(previous_end, ends[row, idx])
    return max(ready, tail, previous_end)


@numba.njit(cache=True)
def _slot_book(starts, ends, count, row, start, end):
    """Insert the busy interval (start, end) in order."""
    n = count[row]
    pos = np.searchsorted(starts[row, :n], start)
    while pos < n and starts[row, pos] == start and ends[row, pos] <= end:
        pos += 1
    starts[row, pos + 1:n + 1] = starts[row, pos:n].copy()
    ends[row, pos + 1:n + 1] = ends[row, pos:n].copy()
    starts[row, pos], ends[row, pos] = start, end
    count[row] = n + 1


@numba.njit(cache=True)
def _leaves_room(group, free, d, need, params, packing, placed, unplaced_total):
    """Whether the unplaced groups with variables other than ``group`` (together
    ``unplaced_total`` bytes with it) still fit, by first-fit decreasing, once ``group``
    takes ``need`` bytes of device ``d``."""
    free = free.copy()
    free[d] -= need
    if unplaced_total - params[group] <= free.max():  # all fits on one device
        return True
    for g in packing:
        if placed[g] or g == group:
            continue
        fit = -1
        for k in range(len(free)):
            if free[k] >= params[g]:
                fit = k
                break
        if fit < 0:
            return False
        free[fit] -= params[g]
    return True


@numba.njit(cache=True)
def _earliest_finish(priority, tie, compute, executor_of, pred_ptr, pred_op, pred_edge,
                     succ_ptr, succ_op, edge_bytes, edge_control, comm_row, comm, latency,
                     inverse_bandwidth, group_of, params, group_runnable, capacity,
                     out_bytes, own_bytes, aliasing, readers, follower, member_ptr, members,
                     packing, insertion, contended):
    """The list schedule: ops in ready order (highest priority first), each group placed
    where its first op finishes earliest within memory: a device holds its variables
    (``held``) for the whole step beside the most tensors alive there at once so far
    (``live_peak``; a tensor is freed, with its received copies, once its last reader is
    placed, and an aliasing op keeps its input's buffer). Returns the device per op and
    a failure row (op, roomiest device or -1 if no device can run it, free bytes there,
    bytes needed, unplaced variable bytes), ``op = -1`` on success."""
    n_ops, n_dev = compute.shape
    n_exec = executor_of.max() + 1
    failure = np.full(5, -1.0)
    device_of = np.full(n_ops, -1, dtype=np.int64)
    end = np.zeros(n_ops)
    held = np.zeros(n_dev)  # variables
    live = np.zeros(n_dev)  # tensors alive now, in the list schedule's order
    live_peak = np.zeros(n_dev)  # the most tensors alive so far
    used = np.zeros(n_dev)  # held + live_peak: what the device is committed to
    group_device = np.full(len(params), -1, dtype=np.int64)
    placed = np.zeros(len(params), dtype=np.bool_)
    unplaced_total = 0.0
    for g in packing:
        unplaced_total += params[g]
    received = np.zeros((n_ops, n_dev), dtype=np.bool_)
    readers_left = readers.copy()  # data readers not yet placed, per op
    alias_of = np.full(n_ops, -1, dtype=np.int64)
    slot_start = np.empty((n_exec, n_ops))
    slot_end = np.empty((n_exec, n_ops))
    slots = np.zeros(n_exec, dtype=np.int64)
    n_links = n_dev * n_dev if contended else 0
    link_start = np.empty((n_links, n_ops if contended else 0))
    link_end = np.empty((n_links, n_ops if contended else 0))
    link_slots = np.zeros(max(n_links, 1), dtype=np.int64)
    arrival = np.full((n_ops if contended else 0, n_dev), -1.0)
    max_in = 1
    for i in range(n_ops):
        max_in = max(max_in, pred_ptr[i + 1] - pred_ptr[i])
    # this op's copies if it goes to the candidate device (tentative) or the best one
    copy_p = np.empty(max_in, dtype=np.int64)
    copy_src = np.empty(max_in, dtype=np.int64)
    copy_begin, copy_link, copy_arrival = np.empty(max_in), np.empty(max_in), np.empty(max_in)
    best_p, best_src = copy_p.copy(), copy_src.copy()
    best_begin, best_link, best_arrival = copy_begin.copy(), copy_link.copy(), copy_arrival.copy()
    # ready ops by priority: a heap of op indices (row 0 of `ready`)
    ready_heap = np.empty((1, n_ops), dtype=np.int64)
    n_ready = np.zeros(1, dtype=np.int64)
    waiting = np.zeros(n_ops, dtype=np.int64)
    for i in range(n_ops):
        waiting[i] = pred_ptr[i + 1] - pred_ptr[i]
        if waiting[i] == 0:
            heap_push(ready_heap, n_ready, 0, i, priority, tie)
    while n_ready[0] > 0:
        i = heap_pop(ready_heap, n_ready, 0, priority, tie)
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            waiting[succ_op[k]] -= 1
            if waiting[succ_op[k]] == 0:
                heap_push(ready_heap, n_ready, 0, succ_op[k], priority, tie)
        g = group_of[i]
        if follower[g] and group_device[g] < 0:
            continue  # placed with its first reader (device_of[i] stays -1 until then)
        new_params = 0.0 if group_device[g] >= 0 else params[g]
        best, best_finish, best_fill, best_copies = -1, 0.0, 0.0, 0
        best_held, best_live = 0.0, 0.0
        roomiest, roomiest_free = -1, 0.0
        for d in range(n_dev):
            if group_device[g] >= 0 and d != group_device[g]:
                continue
            if group_device[g] < 0 and not group_runnable[g, d]:
                continue
            if roomiest < 0 or capacity[d] - used[d] > roomiest_free:
                roomiest, roomiest_free = d, capacity[d] - used[d]
            need_held, need_live, followers_run = new_params, own_bytes[i], True
            for k in range(pred_ptr[i], pred_ptr[i + 1]):
                p = pred_op[k]
                if device_of[p] < 0:  # a follower group: it comes here
                    followers_run = followers_run and group_runnable[group_of[p], d]
                    need_held += params[group_of[p]]
                    need_live += own_bytes[p]
                elif not edge_control[pred_edge[k]] and device_of[p] != d and \
                        not received[p, d]:
                    need_live += out_bytes[p]
            after = held[d] + need_held + max(live_peak[d], live[d] + need_live)
            if after > capacity[d] or not followers_run:
                continue
            need = after - used[d]
            if new_params > 0 and not _leaves_room(g, capacity - used, d, need, params,
                                                   packing, placed, unplaced_total):
                continue
            ready, n_copies = 0.0, 0
            if not contended:
                for k in range(pred_ptr[i], pred_ptr[i + 1]):
                    p = pred_op[k]
                    _, total = edge_times(pred_edge[k], device_of[p] if device_of[p] >= 0 else d,
                                          d, edge_bytes, comm_row, comm, latency,
                                          inverse_bandwidth)
                    ready = max(ready, end[p] + total)
            else:
                ks = np.arange(pred_ptr[i], pred_ptr[i + 1])
                ks = ks[np.argsort(pred_op[ks], kind="mergesort")]
                ks = ks[np.argsort(end[pred_op[ks]], kind="mergesort")]
                for k in ks:
                    p = pred_op[k]
                    src = device_of[p] if device_of[p] >= 0 else d
                    if edge_control[pred_edge[k]] or src == d:
                        ready = max(ready, end[p])
                        continue
                    if arrival[p, d] >= 0:
                        ready = max(ready, arrival[p, d])
                        continue
                    on_link, total = edge_times(pred_edge[k], src, d, edge_bytes, comm_row,
                                                comm, latency, inverse_bandwidth)
                    link = src * n_dev + d
                    begin = _slot_earliest(link_start, link_end, link_slots, link, end[p],
                                           on_link, True)
                    clash = True
                    while clash:  # also clear of this op's other copies on the link
                        clash = False
                        for c in range(n_copies):
                            if copy_src[c] == src and copy_begin[c] < begin + on_link and \
                                    begin < copy_begin[c] + copy_link[c]:
                                begin = _slot_earliest(link_start, link_end, link_slots, link,
                                                       copy_begin[c] + copy_link[c], on_link,
                                                       True)
                                clash = True
                                break
                    copy_p[n_copies], copy_src[n_copies] = p, src
                    copy_begin[n_copies], copy_link[n_copies] = begin, on_link
                    copy_arrival[n_copies] = begin + total
                    n_copies += 1
                    ready = max(ready, begin + total)
            e = executor_of[d]
            finish = _slot_earliest(slot_start, slot_end, slots, e, ready, compute[i, d],
                                    insertion) + compute[i, d]
            fill = used[d] / capacity[d]
            if best < 0 or finish < best_finish or (finish == best_finish and fill < best_fill):
                best, best_finish, best_fill = d, finish, fill
                best_held, best_live = need_held, need_live
                best_copies = n_copies
                best_p[:n_copies], best_src[:n_copies] = copy_p[:n_copies], copy_src[:n_copies]
                best_begin[:n_copies] = copy_begin[:n_copies]
                best_link[:n_copies] = copy_link[:n_copies]
                best_arrival[:n_copies] = copy_arrival[:n_copies]
        if best < 0:
            failure[0], failure[1] = i, roomiest
            failure[2] = roomiest_free
            failure[3] = new_params + own_bytes[i]
            failure[4] = unplaced_total
            return device_of, failure
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            p = pred_op[k]
            if device_of[p] < 0:  # its follower group joins it
                h = group_of[p]
                for m in range(member_ptr[h], member_ptr[h + 1]):
                    device_of[members[m]] = best
                group_device[h], placed[h] = best, True
                unplaced_total -= params[h]
        if group_device[g] < 0:
            placed[g] = True
            if params[g] > 0:
                unplaced_total -= params[g]
        group_device[g] = best
        device_of[i] = best
        end[i] = best_finish
        _slot_book(slot_start, slot_end, slots, executor_of[best], best_finish - compute[i, best],
                   best_finish)
        for c in range(best_copies):
            link = best_src[c] * n_dev + best
            _slot_book(link_start, link_end, link_slots, link, best_begin[c],
                       best_begin[c] + best_link[c])
            arrival[best_p[c], best] = best_arrival[c]
        held[best] += best_held
        live[best] += best_live
        live_peak[best] = max(live_peak[best], live[best])
        used[best] = held[best] + live_peak[best]
        first = -1
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            p = pred_op[k]
            if not edge_control[pred_edge[k]]:
                first = p if first < 0 else first
                if device_of[p] != best:
                    received[p, best] = True
        if aliasing[i] and first >= 0 and device_of[first] == best:
            alias_of[i] = first  # its input's buffer lives on through it
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if not edge_control[pred_edge[k]] and pred_op[k] != alias_of[i]:
                _release(pred_op[k], readers_left, alias_of, device_of, received, live,
                         own_bytes, out_bytes)
        if readers_left[i] == 0 and succ_ptr[i + 1] > succ_ptr[i]:  # read by control only
            readers_left[i] = 1
            _release(i, readers_left, alias_of, device_of, received, live, own_bytes,
                     out_bytes)
    for h in range(len(params)):  # follower groups nothing reads: where most room is
        if follower[h] and group_device[h] < 0:
            roomiest, roomiest_free = -1, 0.0
            for d in range(n_dev):
                if group_runnable[h, d] and (roomiest < 0 or capacity[d] - used[d] >
                                             roomiest_free):
                    roomiest, roomiest_free = d, capacity[d] - used[d]
            if roomiest < 0 or roomiest_free < params[h]:
                failure[0], failure[1] = members[member_ptr[h]], roomiest
                failure[2], failure[3], failure[4] = roomiest_free, params[h], unplaced_total
                return device_of, failure
            for m in range(member_ptr[h], member_ptr[h + 1]):
                device_of[members[m]] = roomiest
            held[roomiest] += params[h]
            used[roomiest] += params[h]
    return device_of, failure


@numba.njit(cache=True)
def _release(op, readers_left, alias_of, device_of, received, live, own_bytes, out_bytes):
    """One reader of ``op``'s output is placed: when it was the last, free the output
    and its received copies (and release what an aliasing op kept alive)."""
    while op >= 0:
        readers_left[op] -= 1
        if readers_left[op] > 0:
            return
        live[device_of[op]] -= own_bytes[op]
        for d in range(len(live)):
            if received[op, d]:
                live[d] -= out_bytes[op]
        op = alias_of[op]


def data_readers(arrays):
    """How many ops read each op's outputs (data edges only), from
    :func:`~costmodel.arrays.graph_arrays`."""
    producer = np.repeat(np.arange(len(arrays.succ_ptr) - 1), np.diff(arrays.succ_ptr))
    return np.bincount(producer[~arrays.edge_control[arrays.succ_edge]],
                       minlength=len(arrays.succ_ptr) - 1).astype(np.int64)


class _Judge:
    """Simulated (step time, bytes moved, devices used) of placements, and whether they
    fit in memory, each found once: the search meets the same placements again (a
    faster move that does not fit is met again on every sweep)."""

    def __init__(self, cost, priority):
        self.cost, self.priority, self.seen, self.fitting = cost, priority, {}, {}

    def __call__(self, placement):
        return self._once(self.seen, placement, lambda p: (
            *simulated_step(self.cost, p, self.priority),
            int(np.count_nonzero(np.bincount(p)))))

    def fits(self, placement):
        """:func:`~costmodel.simulate.fits_memory` of ``placement``."""
        return self._once(self.fitting, placement, lambda p: fits_memory(self.cost, p))

    @staticmethod
    def _once(found, placement, judge):
        placement = np.asarray(placement, dtype=np.int64)
        key = placement.tobytes()
        if key not in found:
            found[key] = judge(placement)
        return found[key]


def _no_worse_than_baselines(cost, device_of, judge, baselines, gather):
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


def _baselines(cost):
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


def _better_start(judge, device_of, alternative):
    """For the local search, the better of this schedule and m-ETF's (earliest start
    rather than earliest finish: better when transfers dominate), if it has one."""
    if alternative is None:
        return device_of
    return alternative if judge(alternative)[0] < judge(device_of)[0] else device_of


def _refine(cost, device_of, judge, evaluations):
    """Iterated local search: :func:`_descend` from ``device_of``; then, while the
    budget lasts, kick a copy of the current placement (two groups moved to other
    devices at random, seeded) and descend from it, keeping the fastest placement
    found. The walk moves on to the kicked descent if it is at most ``WANDER`` slower
    than the current one, which lets it leave a basin. When the budget allows kicks,
    chains (:func:`_chains`) are moved whole too, before single groups: one op of a
    branch moved alone gains nothing, as it adds two transfers. Changes ``device_of``
    in place."""
    units = placement_units(cost)  # topological order
    sizes = [len(unit.members) for unit in units]
    mean_time = np.add.reduceat(cost.mean_time()[np.concatenate([u.members for u in units])],
                                np.cumsum([0] + sizes[:-1])) if units else np.zeros(0)
    heaviest = np.argsort(-mean_time, kind="stable")  # ties keep the topological order
    kept = heaviest[mean_time[heaviest] > 0]
    groups = [units[k].members for k in kept]
    a = graph_arrays(cost)
    runnable = a.group_runnable[a.group_of[[members[0] for members in groups]]]
    one_pass = int(runnable.sum()) - len(groups)  # evaluations of one sweep of the search
    if evaluations >= 2 * one_pass:  # room for kicks: chains move whole too
        chains, chain_runnable = _chains(cost, groups, runnable)
        groups, runnable = chains + groups, np.concatenate([chain_runnable, runnable])
        one_pass = int(runnable.sum()) - len(groups)
    choices = [np.flatnonzero(devices) for devices in runnable]
    evaluations = _descend(device_of, judge, groups, choices, evaluations)
    movable = np.flatnonzero(runnable.sum(axis=1) > 1)
    rng = np.random.default_rng(0)
    current = device_of.copy()
    best_step = current_step = judge(device_of)[0]
    while len(movable) and evaluations >= one_pass:
        trial = current.copy()
        for k in rng.choice(movable, size=min(KICK_GROUPS, len(movable)), replace=False):
            trial[groups[k]] = rng.choice(choices[k][choices[k] != trial[groups[k][0]]])
        evaluations -= 1
        if not judge.fits(trial):
            continue
        evaluations = _descend(trial, judge, groups, choices, evaluations)
        step = judge(trial)[0]
        if step < best_step * (1 - 1e-9):
            device_of[:], best_step = trial, step
        if step <= current_step * (1 + WANDER):
            current, current_step = trial, step


def _chains(cost, groups, runnable):
    """The chains of ``groups`` (ops joined along edges from an op with one successor
    to an op with one predecessor: a branch between a fork and a join), each as its
    members and the devices that can run all of them, heaviest first."""
    a = graph_arrays(cost)
    index_of = np.full(len(cost.ops), -1)
    for k, members in enumerate(groups):
        index_of[members] = k
    producer = np.repeat(np.arange(len(cost.ops)), np.diff(a.succ_ptr))
    link = (np.diff(a.succ_ptr)[producer] == 1) & (np.diff(a.pred_ptr)[a.succ_op] == 1)
    pairs = [(int(index_of[p]), int(index_of[c])) for p, c in
             zip(producer[link], a.succ_op[link]) if index_of[p] >= 0 and index_of[c] >= 0
             and index_of[p] != index_of[c]]
    chains = [sorted(component) for component in
              nx.connected_components(nx.Graph(pairs)) if len(component) > 1]
    chains.sort(key=lambda component: component[0])  # groups are heaviest first
    members = [np.concatenate([groups[k] for k in component]) for component in chains]
    allowed = np.array([runnable[component].all(axis=0) for component in chains],
                       dtype=bool).reshape(len(chains), runnable.shape[1])
    return members, allowed


KICK_GROUPS = 2  # groups moved at random before each further descent
WANDER = 0.02  # how much slower a kicked descent may be for the walk to move there


def _descend(device_of, judge, groups, choices, evaluations):
    """First-improvement local search: move a group (``groups``, heaviest first) to the
    device among its ``choices`` (device indices) that most lowers the simulated
    makespan, within memory; repeat while it helps and ``evaluations`` last. Changes
    ``device_of`` in place; returns the evaluations left."""
    best = judge(device_of)[0]
    improved = True
    while improved and evaluations > 0:
        improved = False
        for members, devices in zip(groups, choices):
            choice = None
            now = device_of[members]
            alone_on = int(now[0]) if (now == now[0]).all() else -1  # all on one device
            for d in devices:
                if evaluations <= 0 or d == alone_on:
                    continue
                trial = device_of.copy()
                trial[members] = d
                evaluations -= 1
                makespan = judge(trial)[0]
                if makespan < best * (1 - 1e-9) and (choice is None or makespan < choice[1]):
                    if judge.fits(trial):
                        choice = (d, makespan)
            if choice is not None:
                device_of[members] = choice[0]
                best = choice[1]
                improved = True
            if evaluations <= 0:
                break
    return evaluations


def free_groups(cost):
    """The colocation groups (indices into ``graph_arrays(cost).group_names``) that
    cost nothing on any device and read nothing from outside themselves: variables with
    their reads, constants."""
    a = graph_arrays(cost)
    costly = np.any(np.where(np.isfinite(cost.compute), cost.compute, 0.0) != 0, axis=1)
    n_groups = len(a.group_names)
    free = (np.bincount(a.group_of, costly, minlength=n_groups) == 0) & \
        a.group_runnable.any(axis=1)
    producer_group = a.group_of[a.pred_op]
    consumer_group = np.repeat(a.group_of, np.diff(a.pred_ptr))
    free[consumer_group[producer_group != consumer_group]] = False
    return np.flatnonzero(free)


def _move_free_groups_to_consumers(graph, cost, cluster, device_of, generators_only=False):
    """Put colocation groups that cost nothing anywhere and read nothing from outside
    (variables with their reads, constants) beside their heaviest outside consumer.

    A group's device is fixed by its first op, which for a variable is a free
    ``VarHandleOp`` placed before anything reads it; moving the group to where its
    value is used removes transfers without changing any op time. Kept only if every
    device stays within its memory. With ``generators_only``, only lone ops without
    inputs read by a single op move.
    """
    a = graph_arrays(cost)
    n_ops = len(cost.ops)
    group_of = a.group_of
    position = np.empty(n_ops, dtype=np.int64)
    position[a.topological] = np.arange(n_ops)
    first = np.full(group_of.max(initial=0) + 1, n_ops)
    np.minimum.at(first, group_of, position)
    free = free_groups(cost)
    members_of = {g: [] for g in free.tolist()}
    for i in np.flatnonzero(np.isin(group_of, free)).tolist():
        members_of[group_of[i]].append(i)
    moved = device_of.copy()
    for g in sorted(members_of, key=first.__getitem__):
        indices = members_of[g]
        if generators_only and (len(indices) > 1 or a.pred_ptr[indices[0] + 1] >
                                a.pred_ptr[indices[0]] or
                                a.succ_ptr[indices[0] + 1] - a.succ_ptr[indices[0]] != 1):
            continue
        uses = [(a.edge_bytes[a.succ_edge[k]], a.tie[a.succ_op[k]], a.succ_op[k])
                for i in indices for k in range(a.succ_ptr[i], a.succ_ptr[i + 1])
                if group_of[a.succ_op[k]] != g]
        if not uses:
            continue
        target = moved[max(uses)[2]]
        if np.all(np.isfinite(cost.compute[indices, target])):
            moved[indices] = target
    if fits_memory(cost, moved):
        device_of[:] = moved
