"""The greedy's list schedule (:mod:`partitioner.greedy_placement`): memory-aware
earliest-finish-time list scheduling with insertion (the HEFT family).

Ops are taken in list-scheduling order (ready ops first, highest upward rank first; the
rank uses each op's mean time over the devices that can run it and mean transfer
times, as HEFT does). The first op of a colocation group decides the group's device:
among the devices that have a kernel for every op of the group and room for the
group's variables and the op's tensors beside the tensors alive there (each freed once
all its readers are placed), and that leave room for the variables of the groups still
unplaced (a first-fit-decreasing packing must exist), the one where the op
would finish earliest, counting the transfers of its inputs and fitting it into an idle
slot of that device's executor (insertion). Transfers take each its own alpha-beta
time, or queue as the simulator queues them (``contended``). The rest of the group
follows. Groups that cost nothing and read nothing (variables with their reads,
constants) wait for their first reader and go where it goes; afterwards each is moved
next to its heaviest consumer if that fits (:func:`move_free_groups_to_consumers`).
If the simulated live-range peak of the result breaks a device's memory, the schedule
is made again with that device's room cut by the excess (a few times at most), then
groups are moved off the device that overflows most until all fit. The loop is
compiled (numba).

Examples
--------
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> for n in ("left", "right"): g.add_op(n, op_type="MatMul", flops=1e11)
>>> g.add_op("sum", op_type="AddV2", bytes_accessed=1e3)
>>> for n in ("left", "right"): g.add_edge("x", n, bytes=1e3); g.add_edge(n, "sum", bytes=1e3)
>>> from costmodel.simulate import upward_rank
>>> from partitioner.greedy_placement import GreedyOptions
>>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
>>> device_of = list_schedule(cost, GreedyOptions(), upward_rank(cost), contended=False)
>>> len(set(device_of.tolist()))  # the two branches run in parallel
2
"""
from __future__ import annotations

import numba
import numpy as np

from costmodel.arrays import edge_times, graph_arrays, heap_pop, heap_push
from costmodel.memory import size_text
from costmodel.simulate import fits_memory, live_peak
from partitioner.units import expand, less_room, placement_units
from partitioner.validate import kernel_problem, memory_hint
from tfpart.core.errors import PlacementError


REPAIRS = 4  # list schedules made again with less room where the simulation overflowed


def list_schedule(cost, options, priority, contended):
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
        move_free_groups_to_consumers(graph, cost, cluster, device_of)
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


def move_free_groups_to_consumers(graph, cost, cluster, device_of, generators_only=False):
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
