"""List-scheduling simulation of one step of a placed graph.

Ops run when their inputs have arrived and their device is free, in priority order
(upward rank: the longest remaining path to an exit, HEFT's priority), one at a time per
device. A tensor crossing devices arrives ``latency + bytes / bandwidth`` after its
producer ends. The makespan is the predicted step time.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Schedule:
    """Start and end time of every op (by op index) and per-device figures."""

    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    makespan: float
    busy: np.ndarray  # seconds of compute per device
    bytes_moved: float = 0.0
    order: list = field(default_factory=list)


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
    graph = cost.graph.nx_graph
    runnable = np.isfinite(cost.compute)
    total = np.where(runnable, cost.compute, 0.0).sum(axis=1)
    mean_time = total / np.maximum(runnable.sum(axis=1), 1)  # over devices that can run it
    rank = np.zeros(len(cost.ops))
    for name in reversed(cost.graph.topological_order()):
        i = cost.index[name]
        tail = 0.0
        for succ, edge in graph.succ[name].items():
            tail = max(tail, cost.mean_transfer_time(edge["bytes"]) + rank[cost.index[succ]])
        rank[i] = mean_time[i] + tail
    return rank


def ready_order(cost, priority):
    """Yield op indices in list-scheduling order: ready ops, highest priority first.

    Each yielded op must be finished by the caller before the next ``next()``.
    """
    graph = cost.graph.nx_graph
    waiting = {name: graph.in_degree(name) for name in cost.ops}
    heap = [(-priority[cost.index[n]], n) for n, deg in waiting.items() if deg == 0]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        yield cost.index[name]
        for succ in graph.successors(name):
            waiting[succ] -= 1
            if waiting[succ] == 0:
                heapq.heappush(heap, (-priority[cost.index[succ]], succ))


def data_ready_time(cost, i, device, end, placed_on):
    """When all inputs of op ``i`` can be on ``device``, given predecessors' ends."""
    graph = cost.graph.nx_graph
    ready = 0.0
    for pred, edge in graph.pred[cost.ops[i]].items():
        p = cost.index[pred]
        ready = max(ready, end[p] + cost.transfer_time(edge["bytes"], placed_on[p], device))
    return ready


def simulate(cost, device_of, priority=None):
    """Simulate one step with op ``i`` on device index ``device_of[i]``.

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
    start, end = np.zeros(n_ops), np.zeros(n_ops)
    device_free, busy = np.zeros(n_dev), np.zeros(n_dev)
    order, sent, bytes_moved = [], set(), 0.0
    graph = cost.graph.nx_graph
    for i in ready_order(cost, priority):
        d = device_of[i]
        start[i] = max(device_free[d], data_ready_time(cost, i, d, end, device_of))
        end[i] = start[i] + cost.compute[i, d]
        device_free[d] = end[i]
        busy[d] += cost.compute[i, d]
        order.append(i)
        for pred, edge in graph.pred[cost.ops[i]].items():
            p = cost.index[pred]
            if device_of[p] != d and (p, d) not in sent:
                sent.add((p, d))
                bytes_moved += edge["bytes"]
    makespan = float(end.max()) if n_ops else 0.0
    return Schedule(device=device_of, start=start, end=end, makespan=makespan, busy=busy,
                    bytes_moved=bytes_moved, order=order)
