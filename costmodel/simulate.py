"""Discrete-event simulation of one step of a placed graph.

Model
-----
* Ops run when their inputs are on their device and their executor is free, one op at a
  time per executor (a device, or a ``core_group`` of devices sharing cores). An idle
  executor never waits while one of its ops is ready (it is work-conserving, as
  TensorFlow's executor is); among ready ops it takes the highest priority first (upward
  rank, as in HEFT).
* A tensor needed on another device is sent once per destination device as soon as its
  producer ends, over the directed link between the two devices. Its bytes occupy the
  link for ``bytes / bandwidth``, queued first come, first served behind the link's
  other transfers (so concurrent transfers share its bandwidth), and arrive ``latency``
  after the last byte leaves: latencies of concurrent transfers overlap, as
  TensorFlow's receives run concurrently. On a ``cpu_copy`` link the copy also
  occupies both endpoints' executors, which compute nothing meanwhile. Each copy is a
  Send/Recv pair: its link's ``message_cost`` of executor time is taken at both ends
  when it starts, so spreading ops is never free, even off the critical path.
* The cluster's ``step_overhead`` (a client launching the step on remote workers) is
  added once to the step.
* Memory: each device holds its variables for the whole step, plus every activation
  from when it is produced (or starts arriving) until the last op on that device that
  reads it ends (ops such as ``ReadVariableOp`` or ``Reshape`` alias their input and
  allocate nothing); graph outputs stay until the end.

The makespan is the predicted step time.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from costmodel.memory import new_output_bytes, output_bytes
from tfpart.ops import ALIASING_OPS


@dataclass
class Schedule:
    """Start and end time of every op (by op index) and per-device figures."""

    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    makespan: float
    busy: np.ndarray  # seconds of compute per device
    link_bytes: dict = field(default_factory=dict)  # (src device, dst device) -> bytes
    transfers: list = field(default_factory=list)  # (op index, src, dst, start, end)
    peak_memory: np.ndarray = None  # bytes per device, variables included
    order: list = field(default_factory=list)

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
    >>> from tfpart.graph import OpGraph
    >>> from tfpart.cluster import cluster_of_devices
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph()
    >>> for n in "abc": g.add_op(n, op_type="Relu", bytes_accessed=2e10)
    >>> g.add_edge("a", "b"); g.add_edge("b", "c")
    >>> rank = upward_rank(CostModel(g, cluster_of_devices(["cpu"])))
    >>> bool(rank[0] > rank[1] > rank[2] > 0)
    True
    """
    graph = cost.graph
    mean_time = cost.mean_time()
    rank = np.zeros(len(cost.ops))
    for name in reversed(cost.graph.topological_order()):
        i = cost.index[name]
        tail = 0.0
        for succ, edge in graph.out_edges(name).items():
            tail = max(tail, cost.mean_edge_time(edge) + rank[cost.index[succ]])
        rank[i] = mean_time[i] + tail
    return rank


def ready_order(cost, priority):
    """Yield op indices in list-scheduling order: ready ops, highest priority first.

    Each yielded op must be finished by the caller before the next ``next()``.
    """
    graph = cost.graph
    key = cost.graph.structural_key
    waiting = {name: graph.in_degree(name) for name in cost.ops}
    heap = [(-priority[cost.index[n]], key(n)) for n, deg in waiting.items() if deg == 0]
    heapq.heapify(heap)
    while heap:
        _, (*_, name) = heapq.heappop(heap)
        yield cost.index[name]
        for succ in graph.successors(name):
            waiting[succ] -= 1
            if waiting[succ] == 0:
                heapq.heappush(heap, (-priority[cost.index[succ]], key(succ)))


def data_ready_time(cost, i, device, end, placed_on):
    """When all inputs of op ``i`` could be on ``device`` with uncontended links."""
    graph = cost.graph
    ready = 0.0
    for pred, edge in graph.in_edges(cost.ops[i]).items():
        p = cost.index[pred]
        ready = max(ready, end[p] + cost.edge_time(edge, placed_on[p], device))
    return ready


def _send_outputs(cost, i, device_of, end, link_free, arrival, schedule, busy_until):
    """Queue the transfers of op ``i``'s outputs to every other device that reads them."""
    src = device_of[i]
    per_device = {}  # dst -> (bytes, time on the link, total time): the tensor goes once
    for succ, edge in cost.graph.out_edges(cost.ops[i]).items():
        dst = device_of[cost.index[succ]]
        if dst != src and not edge["control"]:
            old = per_device.get(dst, (0.0, 0.0, 0.0))
            per_device[dst] = (max(old[0], edge["bytes"]),
                               max(old[1], cost.edge_link_time(edge, src, dst)),
                               max(old[2], cost.edge_time(edge, src, dst)))
    executor_of = cost.cluster.executor_of
    for dst, (nbytes, on_link, total) in sorted(per_device.items()):
        begin = max(end[i], link_free.get((src, dst), 0.0))
        ends = (executor_of[src], executor_of[dst])
        if cost.cpu_copy[src, dst]:
            begin = max(begin, *(busy_until[e] for e in ends))
        link_free[(src, dst)] = begin + on_link
        if cost.cpu_copy[src, dst]:
            for e in ends:
                busy_until[e] = link_free[(src, dst)]
        for e in ends:  # the Send and the Recv each take their executor a moment
            busy_until[e] = max(busy_until[e], begin) + cost.message_cost[src, dst]
        finish = link_free[(src, dst)] + (total - on_link)
        arrival[(i, dst)] = finish
        schedule.transfers.append((i, src, dst, begin, finish))
        schedule.link_bytes[(src, dst)] = schedule.link_bytes.get((src, dst), 0.0) + nbytes


def simulate(cost, device_of, priority=None, memory=True):
    """Simulate one step with op ``i`` on device index ``device_of[i]``.

    Event-driven and work-conserving, like TensorFlow's executor: whenever an executor
    is idle it starts, among the ops whose inputs are on its devices, the one of
    highest ``priority`` (upward rank by default; ties by what the ops are). With
    ``memory=False`` the peak-memory sweep is skipped (for searches that only compare
    step times).

    Examples
    --------
    >>> from tfpart.graph import OpGraph
    >>> from tfpart.cluster import cluster_of_devices
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
    device_of = np.asarray(device_of, dtype=int)
    priority = upward_rank(cost) if priority is None else priority
    n_ops, n_dev = cost.compute.shape
    executor_of = cost.cluster.executor_of
    graph = cost.graph
    start, end = np.zeros(n_ops), np.zeros(n_ops)
    busy_until = np.zeros(max(executor_of, default=0) + 1)  # also held by cpu_copy transfers
    running = np.zeros(len(busy_until), dtype=bool)
    queues = [[] for _ in busy_until]  # per executor: ready ops by priority
    schedule = Schedule(device=device_of, start=start, end=end, makespan=0.0,
                        busy=np.zeros(n_dev))
    link_free, arrival = {}, {}
    waiting = np.array([graph.in_degree(name) for name in cost.ops])
    ready_at = np.zeros(n_ops)
    events = []  # (time, order, kind, payload): kind 0 = op finished, 1 = op ready, 2 = wake
    sequence = 0

    def push(time, kind, payload):
        nonlocal sequence
        heapq.heappush(events, (time, sequence, kind, payload))
        sequence += 1

    def try_start(e, now):
        if running[e] or not queues[e]:
            return
        if busy_until[e] > now:
            push(busy_until[e], 2, e)
            return
        _, _, i = heapq.heappop(queues[e])
        start[i] = now
        end[i] = now + cost.compute[i, device_of[i]]
        running[e] = True
        busy_until[e] = end[i]
        schedule.busy[device_of[i]] += cost.compute[i, device_of[i]]
        schedule.order.append(i)
        push(end[i], 0, i)

    for i in np.flatnonzero(waiting == 0):
        push(0.0, 1, int(i))
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == 1:  # all inputs of op `payload` are on its device
            e = executor_of[device_of[payload]]
            heapq.heappush(queues[e], (-priority[payload],
                                       cost.graph.structural_key(cost.ops[payload]), payload))
            try_start(e, now)
        elif kind == 2:
            try_start(payload, now)
        else:  # op `payload` finished: send its outputs, wake its consumers
            i = payload
            e = executor_of[device_of[i]]
            running[e] = False
            _send_outputs(cost, i, device_of, end, link_free, arrival, schedule, busy_until)
            d_i = device_of[i]
            for succ in graph.successors(cost.ops[i]):
                j = cost.index[succ]
                d_j = device_of[j]
                ready_at[j] = max(ready_at[j], end[i] if d_j == d_i else
                                  arrival.get((i, d_j), end[i]))
                waiting[j] -= 1
                if waiting[j] == 0:
                    push(ready_at[j], 1, j)
            try_start(e, now)
    schedule.makespan = float(max(end.max(initial=0.0),
                                  max((t[4] for t in schedule.transfers), default=0.0)))
    schedule.makespan += cost.cluster.step_overhead
    if memory:
        schedule.peak_memory = peak_memory(cost, schedule)
    return schedule


def simulate_plan(plan, cost):
    """Simulate a :class:`~tfpart.plan.Plan` (device names) with a cost model.

    >>> from tfpart.graph import OpGraph
    >>> from tfpart.cluster import cluster_of_devices
    >>> from tfpart.plan import Plan
    >>> from costmodel.roofline import CostModel
    >>> g = OpGraph(); g.add_op("a", op_type="Relu", bytes_accessed=2e10)
    >>> cluster = cluster_of_devices(["cpu"])
    >>> plan = Plan(assignment={"a": cluster.device_names[0]})
    >>> round(simulate_plan(plan, CostModel(g, cluster)).makespan, 3)
    1.0
    """
    names = cost.cluster.device_names
    missing = [op for op in cost.ops if op not in plan.assignment]
    if missing:
        from tfpart.errors import PlacementError

        raise PlacementError("", f"the plan does not place {len(missing)} ops of this "
                             f"model, e.g. {missing[0]} (was it made for another model?)")
    return simulate(cost, np.array([names.index(plan.assignment[op]) for op in cost.ops]))


def peak_memory(cost, schedule):
    """Peak bytes per device: variables plus the most activations alive at once."""
    graph = cost.graph
    device_of, start, end = schedule.device, schedule.start, schedule.end
    params = np.zeros(cost.compute.shape[1])
    owner_of = {}  # op index -> op index whose buffer its output lives in
    allocated = {}  # (owner, device) -> (time, bytes)
    freed = {}  # (owner, device) -> time its last reader (or send) there ends
    for i in schedule.order:
        attrs = graph.ops[cost.ops[i]]
        d = device_of[i]
        params[d] += attrs["param_bytes"]
        inputs = [cost.index[p] for p, e in graph.in_edges(cost.ops[i]).items() if not e["control"]]
        if attrs["op_type"] in ALIASING_OPS and inputs and device_of[inputs[0]] == d:
            owner_of[i] = owner_of[inputs[0]]
        else:
            owner_of[i] = i
            allocated[(i, d)] = (start[i], new_output_bytes(attrs))
        for p in inputs:
            key = (owner_of[p], d)
            freed[key] = max(freed.get(key, 0.0), end[i])
    for i, src, dst, begin, finish in schedule.transfers:
        owner = owner_of[i]
        allocated[(owner, dst)] = (begin, output_bytes(graph.ops[cost.ops[i]]))
        freed[(owner, src)] = max(freed.get((owner, src), 0.0), finish)
    events = []
    for (owner, d), (t0, nbytes) in allocated.items():
        if nbytes <= 0:
            continue
        is_output = graph.out_degree(cost.ops[owner]) == 0
        t1 = schedule.makespan if is_output else max(freed.get((owner, d), t0), t0)
        events += [(t0, 1, d, nbytes), (t1, 0, d, -nbytes)]
    events.sort()  # at equal times, frees (0) before allocations (1)
    live, peak = np.zeros_like(params), np.zeros_like(params)
    for _, _, d, delta in events:
        live[d] += delta
        peak[d] = max(peak[d], live[d])
    return params + peak
