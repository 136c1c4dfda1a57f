"""Discrete-event simulation of one step of a placed graph.

Model
-----
* Ops run when their inputs are on their device and their executor is free, one op at a
  time per executor (a device, or a ``core_group`` of devices sharing cores). An idle
  executor never waits while one of its ops is ready (it is work-conserving, as
  TensorFlow's executor is); among ready ops it takes the highest priority first (upward
  rank, as in HEFT).
* A CPU device has one timeline, its executor's: the thread that dispatches an op also
  runs its kernel, so the op holds it for its whole ``compute`` (the per-op cost and
  the kernel) and the next op waits. That is TensorFlow's executor with one inter-op
  thread, as ``tfpart profile`` measures ops and pinned workers run them
  (``tfpart worker --inter-threads 1``): two independent chains took the sum of their
  times on one such worker and the longer one's on two (``../shared/DESIGN.md``). The
  intra-op pool parallelises one kernel, which the op's measured or fitted time
  holds. More inter-op threads would run independent ops of one device side by side
  on the host's cores: not modelled.
* An accelerator (a GPU: :mod:`costmodel.lanes`) has two: its host issues its ops one
  at a time in the executor's order (ready ops, highest priority first), each taking
  the host's dispatch cost
  (:meth:`~costmodel.roofline.CostModel.dispatch_time`), and the device runs their
  kernels (:meth:`~costmodel.roofline.CostModel.device_time`) in the order issued, one
  at a time (one stream), each once issued and after the kernel before it. An op is
  ready to issue when its inputs from other devices have arrived and its producers on
  the device have been issued (the stream runs them first), so the host runs ahead of
  the kernels, as TensorFlow's GPU executor does. TensorFlow gives each GPU its own
  executor: each accelerator has its own host timeline (unless a ``core_group`` joins
  them), whose threads are taken not to compete for the host's cores. An op's start
  and end are its kernel's; the step is bounded by both timelines.
* A tensor needed on another device is sent once per destination device as soon as its
  producer ends, over the directed link between the two devices. Its bytes occupy the
  link for ``bytes / bandwidth``, queued first come, first served behind the link's
  other transfers (so concurrent transfers share its bandwidth), and arrive ``latency``
  after the last byte leaves: latencies of concurrent transfers overlap, as
  TensorFlow's receives run concurrently. On a ``cpu_copy`` link the copy also
  occupies both endpoints' executors, which compute nothing meanwhile. Each copy is a
  Send/Recv pair: its link's ``message_cost`` of executor time (on an accelerator, of
  its host's timeline) is taken at both ends when its producer ends (a copy queued
  behind others on its link holds no executor meanwhile), so spreading ops is never
  free, even off the critical path.
* Ops that become ready at the same moment are all queued before an executor chooses
  among them.
* The cluster's ``step_overhead`` (a client launching the step on remote workers) is
  added once to the step.
* Memory: each device holds its variables for the whole step, plus every activation
  from when it is produced (or starts arriving) until the last op on that device that
  reads it ends (ops such as ``ReadVariableOp`` or ``Reshape`` alias their input and
  allocate nothing; element-wise ops such as ``Relu`` or ``AddV2`` write into an input
  of their size that nothing else reads any more, as TensorFlow's kernels do; ops
  that read only shapes hold no buffer); graph outputs stay until the end; kernels that
  copy their inputs (``Einsum``) hold the copies, and loops, conditionals and calls kept
  whole one trip's tensors of their bodies, while they run.

The makespan is the predicted step time.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numba
import numpy as np

from costmodel.arrays import edge_times, graph_arrays, heap_pop, heap_push
from costmodel.splits import split_cost
from tfpart.core.ops import STATE_OPS


@dataclass
class Schedule:
    """Start and end time of every op (by op index; on an accelerator, of its kernel)
    and per-device figures."""

    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    makespan: float
    busy: np.ndarray  # seconds of compute per device (an accelerator's: of its kernels)
    link_bytes: dict = field(default_factory=dict)  # (src device, dst device) -> bytes
    transfers: list = field(default_factory=list)  # (op index, src, dst, start, end)
    peak_memory: np.ndarray = None  # bytes per device, variables included
    order: list = field(default_factory=list)
    issued: np.ndarray = None  # when the host began issuing each op (a CPU op: its start)
    host_busy: np.ndarray = None  # seconds each accelerator's host spent issuing its ops

    @property
    def idle(self):
        return self.makespan - self.busy

    @property
    def bytes_moved(self):
        return float(sum(self.link_bytes.values()))


def upward_rank(cost):
    """HEFT upward rank: mean op time plus the longest mean-cost path to an exit.

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph()
    >>> for n in "abc": g.add_op(n, op_type="Relu", bytes_accessed=2e10)
    >>> g.add_edge("a", "b"); g.add_edge("b", "c")
    >>> rank = upward_rank(CostModel(g, cluster_of_devices(["cpu"])))
    >>> bool(rank[0] > rank[1] > rank[2] > 0)
    True
    """
    a = graph_arrays(cost)
    return longest_path_to_exit(a.topological, a.succ_ptr, a.succ_op, a.succ_edge,
                                cost.mean_time(), mean_edge_times(cost))


def mean_edge_times(cost):
    """:meth:`CostModel.mean_edge_time` of every edge, by edge id of
    :func:`~costmodel.arrays.graph_arrays`."""
    a = graph_arrays(cost)
    n_dev = len(cost.cluster)
    if n_dev < 2:
        return np.zeros(len(a.edge_bytes))
    mask = ~np.eye(n_dev, dtype=bool)
    times = np.where(a.edge_bytes > 0, np.mean(cost.latency[mask]) +
                     a.edge_bytes * np.mean(cost.inverse_bandwidth[mask]), 0.0)
    has_table = a.comm_row >= 0
    times[has_table] = a.comm[a.comm_row[has_table]][:, mask].mean(axis=1)
    return times


@numba.njit(cache=True)
def longest_path_to_exit(topological, succ_ptr, succ_op, succ_edge, op_time, edge_time):
    """Per op, the longest path from its start to an exit, op and edge times included."""
    rank = np.zeros(len(topological))
    for k in range(len(topological) - 1, -1, -1):
        i = topological[k]
        tail = 0.0
        for s in range(succ_ptr[i], succ_ptr[i + 1]):
            tail = max(tail, edge_time[succ_edge[s]] + rank[succ_op[s]])
        rank[i] = op_time[i] + tail
    return rank


def start_first_priority(cost):
    """:func:`upward_rank`, with the ops that are ready when the step starts (those
    reading nothing but variables' handles, or nothing) ahead of all others.

    TensorFlow's executor queues ops as they become ready, so a step's variable reads
    run first. Upward rank alone would let one replica's reads on the variables' device
    wait behind another replica's whole forward pass there (data-parallel replicas,
    :func:`costmodel.pipeline.replicas_graph`).

    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp"); g.add_op("read", op_type="ReadVariableOp")
    >>> g.add_op("heavy", op_type="Relu", bytes_accessed=2e10); g.add_op("x", op_type="Relu")
    >>> g.add_edge("w", "read"); g.add_edge("read", "heavy"); g.add_edge("x", "heavy")
    >>> g.add_op("tail", op_type="Relu", bytes_accessed=2e9); g.add_edge("heavy", "tail")
    >>> g.add_op("late", op_type="ReadVariableOp"); g.add_edge("w", "late")
    >>> cost = CostModel(g, cluster_of_devices(["cpu"]))
    >>> rank = start_first_priority(cost)
    >>> bool(rank[cost.index["late"]] > rank[cost.index["tail"]] > 0)
    True
    """
    rank = upward_rank(cost)
    graph = cost.graph
    at_start = [i for i, op in enumerate(cost.ops) if all(
        graph.ops[p]["op_type"] in STATE_OPS for p in graph.predecessors(op))]
    rank[at_start] += rank.max()
    return rank


def ready_order(cost, priority):
    """Yield op indices in list-scheduling order: ready ops, highest priority first.

    Each yielded op must be finished by the caller before the next ``next()``.
    """
    a = graph_arrays(cost)
    waiting = np.diff(a.pred_ptr)
    heap = [(-priority[i], a.tie[i], i) for i in np.flatnonzero(waiting == 0).tolist()]
    heapq.heapify(heap)
    while heap:
        *_, i = heapq.heappop(heap)
        yield i
        for j in a.succ_op[a.succ_ptr[i]:a.succ_ptr[i + 1]].tolist():
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (-priority[j], a.tie[j], j))


def data_ready_time(cost, i, device, end, placed_on):
    """When all inputs of op ``i`` could be on ``device`` with uncontended links."""
    graph = cost.graph
    ready = 0.0
    for pred, edge in graph.in_edges(cost.ops[i]).items():
        p = cost.index[pred]
        ready = max(ready, end[p] + cost.edge_time(edge, placed_on[p], device))
    return ready


def simulate(cost, device_of, priority=None, memory=True):
    """Simulate one step with op ``i`` on device index ``device_of[i]``.

    Event-driven and work-conserving, like TensorFlow's executor: whenever an executor
    is idle it starts, among the ops whose inputs are on its devices, the one of
    highest ``priority`` (upward rank by default; ties by what the ops are). With
    ``memory=False`` the peak-memory sweep and the list of transfers are skipped (for
    searches that only compare step times and bytes moved). The event loop is compiled
    (:func:`_simulate_events`).

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph()
    >>> for n in "abc": g.add_op(n, op_type="Relu", bytes_accessed=2e10)
    >>> g.add_edge("a", "b"); g.add_edge("a", "c")
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
    >>> one = simulate(cost, np.array([0, 0, 0]))
    >>> two = simulate(cost, np.array([0, 0, 1]))
    >>> round(one.makespan, 3), two.makespan < one.makespan
    (3.0, True)
    """
    device_of = np.asarray(device_of, dtype=np.int64)
    priority = upward_rank(cost) if priority is None else np.asarray(priority, dtype=float)
    start, end, busy, order, transfers, link_bytes, issued, host_busy = _run_events(
        cost, device_of, priority)
    src, dst = np.nonzero(link_bytes)
    schedule = Schedule(
        device=device_of, start=start, end=end,
        makespan=_makespan(cost, end, transfers), busy=busy,
        link_bytes={(int(s), int(d)): float(link_bytes[s, d]) for s, d in zip(src, dst)},
        transfers=[(int(i), int(s), int(d), float(b), float(f))
                   for i, s, d, b, f in transfers] if memory else [],
        order=order.tolist(), issued=issued, host_busy=host_busy)
    if memory:
        schedule.peak_memory = peak_memory(cost, schedule)
    return schedule


def simulated_step(cost, device_of, priority):
    """The step time and bytes moved of :func:`simulate`, without building a Schedule
    (for searches that simulate thousands of placements of a small graph).

    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph()
    >>> for n in "ab": g.add_op(n, op_type="Relu", bytes_accessed=2e10)
    >>> g.add_edge("a", "b", bytes=1e6)
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
    >>> placement = np.array([0, 1])
    >>> schedule = simulate(cost, placement, upward_rank(cost))
    >>> simulated_step(cost, placement, upward_rank(cost)) == (schedule.makespan, 1e6)
    True
    """
    _, end, _, _, transfers, link_bytes, _, _ = _run_events(cost, device_of, priority)
    return _makespan(cost, end, transfers), float(link_bytes.sum())


def _run_events(cost, device_of, priority):
    a = graph_arrays(cost)
    executor_of = cost.derived("executor_of", lambda: np.asarray(cost.cluster.executor_of,
                                                                 dtype=np.int64))
    return _simulate_events(
        device_of, priority, a.tie, cost.compute, executor_of, cost.accelerator,
        cost.dispatch_time(), a.succ_ptr, a.succ_op, a.succ_edge, a.edge_bytes,
        a.edge_control, a.comm_row, a.comm, cost.latency, cost.inverse_bandwidth,
        cost.cpu_copy, cost.message_cost)


def _makespan(cost, end, transfers):
    return _last_event(end, transfers) + cost.cluster.step_overhead


@numba.njit(cache=True)
def _last_event(end, transfers):
    """The latest op end or transfer arrival (compiled: numpy's reductions cost more
    than the simulation itself on small graphs)."""
    last = 0.0
    for t in end:
        last = max(last, t)
    for k in range(transfers.shape[0]):
        last = max(last, transfers[k, 4])
    return last


# Kinds of events, in the order they happen at one moment: an executor chooses its next
# op (WAKE) once every op that ends or becomes ready then has done so.
FINISHED, READY, WAKE = 0, 1, 2


@numba.njit(cache=True, nogil=True)  # a compile's batch-mixing probe runs meanwhile
def _simulate_events(device_of, priority, tie, compute, executor_of, accelerator,
                     dispatch_time, succ_ptr, succ_op, succ_edge, edge_bytes,
                     edge_control, comm_row, comm, latency, inverse_bandwidth, cpu_copy,
                     message_cost):
    """The event loop of :func:`simulate`: start and end per op, busy seconds per
    device, the order ops started in, the transfers (rows: op, src, dst, begin,
    finish), the bytes per directed link, when the host began issuing each op and the
    seconds each accelerator's host spent issuing."""
    n_ops, n_dev = compute.shape
    n_exec = executor_of.max() + 1
    start, end, issued = np.zeros(n_ops), np.zeros(n_ops), np.zeros(n_ops)
    busy, host_busy = np.zeros(n_dev), np.zeros(n_dev)
    busy_until = np.zeros(n_exec)  # also held by cpu_copy transfers and messages
    kernels_until = np.zeros(n_dev)  # an accelerator's last kernel issued so far ends
    running = np.zeros(n_exec, dtype=np.bool_)
    # A WAKE is due. An executor issuing to an accelerator is never `running`, so one
    # WAKE at a time stands for it (a CPU's extra ones die when its op starts).
    waking = np.zeros(n_exec, dtype=np.bool_)
    issuing = np.zeros(n_exec, dtype=np.bool_)
    for d in range(n_dev):
        issuing[executor_of[d]] |= accelerator[d]
    queue = np.empty((n_exec, n_ops), dtype=np.int64)
    queued = np.zeros(n_exec, dtype=np.int64)
    link_free = np.zeros((n_dev, n_dev))
    link_bytes = np.zeros((n_dev, n_dev))
    arrival = np.full((n_ops, n_dev), -1.0)
    transfers = np.empty((len(succ_op), 5))
    n_transfers = 0
    order = np.empty(n_ops, dtype=np.int64)
    n_started = 0
    waiting = np.zeros(n_ops, dtype=np.int64)
    for k in range(len(succ_op)):
        waiting[succ_op[k]] += 1
    ready_at = np.zeros(n_ops)
    events = [(0.0, 0, 0, 0)]  # (time, kind, sequence, op or executor)
    events.pop()
    sequence = 0
    for i in range(n_ops):
        if waiting[i] == 0:
            heapq.heappush(events, (0.0, READY, sequence, i))
            sequence += 1
    copy_bytes, copy_link, copy_total = np.zeros(n_dev), np.zeros(n_dev), np.zeros(n_dev)
    copy_to = np.zeros(n_dev, dtype=np.bool_)
    while len(events) > 0:
        now, kind, _, payload = heapq.heappop(events)
        if kind == READY:  # all inputs of op `payload` are on its device
            e = executor_of[device_of[payload]]
            heap_push(queue, queued, e, payload, priority, tie)
        elif kind == WAKE:
            e = payload
            waking[e] = False
        else:  # op `payload` finished: send its outputs, wake its consumers
            i = payload
            src = device_of[i]
            e = executor_of[src]
            if not accelerator[src]:
                running[e] = False
            copy_to[:] = False
            for k in range(succ_ptr[i], succ_ptr[i + 1]):  # one copy per destination
                dst = device_of[succ_op[k]]
                edge = succ_edge[k]
                if dst == src or edge_control[edge]:
                    continue
                on_link, total = edge_times(edge, src, dst, edge_bytes, comm_row, comm,
                                            latency, inverse_bandwidth)
                if not copy_to[dst]:
                    copy_to[dst] = True
                    copy_bytes[dst], copy_link[dst], copy_total[dst] = 0.0, 0.0, 0.0
                copy_bytes[dst] = max(copy_bytes[dst], edge_bytes[edge])
                copy_link[dst] = max(copy_link[dst], on_link)
                copy_total[dst] = max(copy_total[dst], total)
            for dst in range(n_dev):
                if not copy_to[dst]:
                    continue
                begin = max(end[i], link_free[src, dst])
                ends = (executor_of[src], executor_of[dst])
                if cpu_copy[src, dst]:
                    begin = max(begin, busy_until[ends[0]], busy_until[ends[1]])
                link_free[src, dst] = begin + copy_link[dst]
                for x in ends:
                    if cpu_copy[src, dst]:
                        busy_until[x] = link_free[src, dst]
                # The Send and the Recv each take their executor a moment when the
                # producer ends, not when a queued copy reaches the link: TensorFlow
                # issues both then, and the executors go on computing while it waits.
                for x in ends:
                    busy_until[x] = max(busy_until[x], end[i]) + message_cost[src, dst]
                finish = link_free[src, dst] + (copy_total[dst] - copy_link[dst])
                arrival[i, dst] = finish
                transfers[n_transfers, 0] = i
                transfers[n_transfers, 1] = src
                transfers[n_transfers, 2] = dst
                transfers[n_transfers, 3] = begin
                transfers[n_transfers, 4] = finish
                n_transfers += 1
                link_bytes[src, dst] += copy_bytes[dst]
            for k in range(succ_ptr[i], succ_ptr[i + 1]):
                j = succ_op[k]
                d_j = device_of[j]
                if d_j == src and accelerator[src]:
                    continue  # ready since i was issued
                there = end[i] if d_j == src or arrival[i, d_j] < 0 else arrival[i, d_j]
                ready_at[j] = max(ready_at[j], there)
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(events, (ready_at[j], READY, sequence, j))
                    sequence += 1
        if kind != WAKE:  # the executor chooses once everything due now has happened
            if not running[e] and queued[e] > 0 and not (waking[e] and issuing[e]):
                heapq.heappush(events, (max(now, busy_until[e]), WAKE, sequence, e))
                sequence += 1
                waking[e] = True
            continue
        # start the next op on executor e
        if running[e] or queued[e] == 0:
            continue
        if busy_until[e] > now:
            heapq.heappush(events, (busy_until[e], WAKE, sequence, e))
            sequence += 1
            waking[e] = True
            continue
        i = heap_pop(queue, queued, e, priority, tie)
        d = device_of[i]
        issued[i] = now
        order[n_started] = i
        n_started += 1
        if accelerator[d]:  # the host issues it; the device runs it after the last kernel
            dispatch = dispatch_time[i, d]
            busy_until[e] = now + dispatch
            host_busy[d] += dispatch
            start[i] = max(busy_until[e], kernels_until[d])
            end[i] = start[i] + (compute[i, d] - dispatch)
            kernels_until[d] = end[i]
            busy[d] += compute[i, d] - dispatch
            for k in range(succ_ptr[i], succ_ptr[i + 1]):  # the stream orders the rest
                j = succ_op[k]
                if device_of[j] == d:
                    ready_at[j] = max(ready_at[j], busy_until[e])
                    waiting[j] -= 1
                    if waiting[j] == 0:
                        heapq.heappush(events, (ready_at[j], READY, sequence, j))
                        sequence += 1
            if queued[e] > 0 and not waking[e]:
                heapq.heappush(events, (busy_until[e], WAKE, sequence, e))
                sequence += 1
                waking[e] = True
        else:
            running[e] = True
            start[i] = now
            end[i] = now + compute[i, d]
            busy_until[e] = end[i]
            busy[d] += compute[i, d]
        heapq.heappush(events, (end[i], FINISHED, sequence, i))
        sequence += 1
    return (start, end, busy, order[:n_started], transfers[:n_transfers], link_bytes, issued,
            host_busy)


def simulate_plan(plan, cost):
    """Simulate a :class:`~tfpart.core.plan.Plan` (device names) with a cost model (its
    filter splits made: :func:`placed_cost`).

    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from tfpart.core.plan import Plan
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph(); g.add_op("a", op_type="Relu", bytes_accessed=2e10)
    >>> cluster = cluster_of_devices(["cpu"])
    >>> plan = Plan(assignment={"a": cluster.device_names[0]})
    >>> round(simulate_plan(plan, CostModel(g, cluster)).makespan, 3)
    1.0
    """
    return simulate(*placed_cost(plan, cost))


def placed_cost(plan, cost):
    """The cost model a plan runs with (``cost``, or with the plan's filter splits
    made, :mod:`costmodel.splits`) and the device index of each of its ops."""
    names = cost.cluster.device_names
    missing = [op for op in cost.ops if op not in plan.assignment]
    if missing:
        from tfpart.core.errors import PlacementError

        raise PlacementError("", f"the plan does not place {len(missing)} ops of this "
                             f"model, e.g. {missing[0]} (was it made for another model?)")
    device_of = np.array([names.index(plan.assignment[op]) for op in cost.ops])
    if not plan.splits:
        return cost, device_of
    return split_cost(cost, {op: ([names.index(d) for d in split.devices], split.sizes)
                             for op, split in plan.splits.items()}, device_of)


def peak_memory(cost, schedule):
    """Peak bytes per device of a :class:`Schedule`: variables plus the most
    activations alive at once (see the module docstring)."""
    transfers = np.asarray(schedule.transfers, dtype=float).reshape(-1, 5)
    return _peak(cost, np.asarray(schedule.order, dtype=np.int64), schedule.device,
                 schedule.start, schedule.end, transfers, schedule.makespan)


def live_peak(cost, device_of, priority=None):
    """Peak bytes per device of ``device_of`` (an array by device index) under the
    simulated schedule: the figure every plan is held to.

    ``priority`` defaults to the upward rank, the simulator's default, so this is the
    peak :func:`simulate` reports for the placement.

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp", param_bytes=400)
    >>> for n in "abc": g.add_op(n, op_type="Transpose", outputs=[((64,), "float32")])
    >>> g.add_edge("w", "a"); g.add_edge("a", "b", bytes=256); g.add_edge("b", "c", bytes=256)
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
    >>> live_peak(cost, np.array([0, 0, 0, 0])).tolist()  # a freed once b has run
    [912.0, 0.0]
    """
    device_of = np.asarray(device_of, dtype=np.int64)
    if priority is None:
        priority = cost.derived("upward_rank", lambda: upward_rank(cost))
    start, end, _, order, transfers, _, _, _ = _run_events(cost, device_of, priority)
    return _peak(cost, order, device_of, start, end, transfers,
                 _makespan(cost, end, transfers))


def activation_peak(cost):
    """The most bytes of tensors alive at once when the graph runs alone on one device
    (each op on the first device that can run it), variables excluded: the room for
    activations that algorithms placing variables by a ledger keep on every device."""
    def build():
        device_of = np.argmax(np.isfinite(cost.compute), axis=1)
        params = graph_arrays(cost).param_bytes.sum()
        return max(0.0, float(live_peak(cost, device_of).sum() - params))
    return cost.derived("activation_peak", build)


def fits_memory(cost, device_of, priority=None):
    """Whether every device holds its :func:`live_peak` under ``device_of``."""
    capacity = cost.derived("capacity", lambda: np.array(
        [device.memory for device in cost.cluster.devices], dtype=float))
    return bool(np.all(live_peak(cost, device_of, priority) <= capacity))


def _peak(cost, order, device_of, start, end, transfers, makespan):
    a = graph_arrays(cost)
    n_dev = cost.compute.shape[1]
    alloc_time, alloc_bytes, freed = _buffer_lifetimes(
        order, device_of, start, end, a.pred_ptr, a.pred_op, a.pred_edge, a.edge_control,
        a.aliasing, a.forwarding, a.constant, a.shape_only, a.own_bytes, a.out_bytes,
        transfers, n_dev, a.succ_ptr[1:] == a.succ_ptr[:-1])
    peak = _sweep(alloc_time, alloc_bytes, freed, makespan, a.scratch_bytes, device_of,
                  start, end, n_dev)
    return np.bincount(device_of, a.param_bytes, minlength=n_dev) + peak


@numba.njit(cache=True)
def _sweep(alloc_time, alloc_bytes, freed, makespan, scratch_bytes, device_of, start, end,
           n_dev):
    """The most bytes alive at once per device: each buffer from its allocation to its
    last use (at most the makespan), each op's scratch while it runs. Events are
    summed in the order (device, time, frees before allocations, bytes), one running
    sum over all devices, as an earlier numpy version of this sweep did, so its
    peaks are the same to the last bit."""
    owners, devices = np.nonzero(alloc_bytes > 0)
    scratch = np.flatnonzero(scratch_bytes)
    n_buffers, n_events = len(owners), len(owners) + len(scratch)
    device = np.empty(2 * n_events, dtype=np.int64)
    time, kind, delta = np.empty(2 * n_events), np.empty(2 * n_events), np.empty(2 * n_events)
    for k in range(n_events):
        if k < n_buffers:
            i, d = owners[k], devices[k]
            t0, nbytes = alloc_time[i, d], alloc_bytes[i, d]
            t1 = min(makespan, max(freed[i, d], t0))
        else:
            i = scratch[k - n_buffers]
            d, t0, t1, nbytes = device_of[i], start[i], end[i], scratch_bytes[i]
        device[k], time[k], kind[k], delta[k] = d, t0, 1.0, nbytes
        j = n_events + k
        device[j], time[j], kind[j], delta[j] = d, t1, 0.0, -nbytes
    # a lexicographic sort: stable sorts from the last key to the first
    events = np.argsort(delta, kind="mergesort")
    events = events[np.argsort(kind[events], kind="mergesort")]
    events = events[np.argsort(time[events], kind="mergesort")]
    events = events[np.argsort(device[events], kind="mergesort")]
    peak = np.zeros(n_dev)
    running, before, current = 0.0, 0.0, -1
    for e in events:
        if device[e] != current:
            current, before = device[e], running
        running += delta[e]
        peak[current] = max(peak[current], running - before)
    return peak


@numba.njit(cache=True)
def _buffer_lifetimes(order, device_of, start, end, pred_ptr, pred_op, pred_edge,
                      edge_control, aliasing, forwarding, constant, shape_only, own_bytes,
                      out_bytes, transfers, n_dev, is_output):
    """Per (owner op, device): when its buffer is allocated, its bytes, and when its last
    reader (or send) there ends. An aliasing op's output lives in the buffer of its
    first input when that is on its device; a received copy is a buffer of its own. A
    forwarding op whose data input is a tensor of its own size, on its device, that
    nothing else reads once it starts (its other readers and sends have ended, it is
    not a weight) writes its output into that tensor's buffer, as TensorFlow's
    element-wise kernels do: the buffer then lives until the output's readers end.
    A graph output (``is_output``) holds its buffer to the end of the step. Ops that
    read only shapes (``Shape``, ``Size``: Grappler folds them where shapes are known)
    hold no buffer."""
    n_ops = len(device_of)
    owner = np.arange(n_ops)
    alloc_time, alloc_bytes = np.zeros((n_ops, n_dev)), np.zeros((n_ops, n_dev))
    freed = np.zeros((n_ops, n_dev))
    # the two latest ends among a buffer's readers there, and the reader of the latest
    last, second = np.zeros((n_ops, n_dev)), np.zeros((n_ops, n_dev))
    last_reader = np.full((n_ops, n_dev), -1)
    for i in order:
        d = device_of[i]
        first = -1
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if not edge_control[pred_edge[k]]:
                first = pred_op[k]
                break
        if aliasing[i] and first >= 0 and device_of[first] == d:
            owner[i] = owner[first]
        else:
            alloc_time[i, d], alloc_bytes[i, d] = start[i], own_bytes[i]
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if not edge_control[pred_edge[k]] and not shape_only[i]:
                _read(owner[pred_op[k]], d, end[i], i, freed, last, second, last_reader)
    for row in range(len(transfers)):
        i, src, dst = int(transfers[row, 0]), int(transfers[row, 1]), int(transfers[row, 2])
        o = owner[i]
        alloc_time[o, dst], alloc_bytes[o, dst] = transfers[row, 3], out_bytes[i]
        _read(o, src, transfers[row, 4], -1, freed, last, second, last_reader)
    for i in range(n_ops):
        if is_output[i]:
            freed[owner[i], device_of[i]] = np.inf
    size = alloc_bytes.copy()
    into = np.arange(n_ops)  # the buffer an op's output was forwarded into, on its device
    for i in order:
        d = device_of[i]
        if not forwarding[i] or alloc_bytes[i, d] == 0:
            continue
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            if edge_control[pred_edge[k]]:
                continue
            o = owner[pred_op[k]]
            others = second[o, d] if last_reader[o, d] == i else last[o, d]
            if constant[o] or abs(size[o, d] - own_bytes[i]) > 1e-6 * own_bytes[i] \
                    or others > start[i] or freed[o, d] == np.inf:  # not a graph output
                continue
            target = into[o] if device_of[o] == d else o
            alloc_bytes[i, d] = 0.0
            into[i] = target
            freed[target, d] = max(freed[target, d], freed[i, d])
            break
    return alloc_time, alloc_bytes, freed


@numba.njit(cache=True)
def _read(o, d, until, reader, freed, last, second, last_reader):
    """Record that ``reader`` (-1: a send) holds buffer ``o`` on device ``d`` until
    ``until``."""
    freed[o, d] = max(freed[o, d], until)
    if until >= last[o, d]:
        if last_reader[o, d] != reader:
            second[o, d] = last[o, d]
        last[o, d], last_reader[o, d] = until, reader
    elif until > second[o, d]:
        second[o, d] = until
