"""A cost model's graph as flat arrays, for the compiled loops of the simulator and the
list schedules (numba cannot walk networkx's dictionaries).

Edges are stored twice in compressed sparse rows: by producer (``succ_*``, in the order
of :meth:`~tfpart.core.graph.OpGraph.out_edges`) and by consumer (``pred_*``, in the order of
:meth:`~tfpart.core.graph.OpGraph.in_edges`), so a compiled loop visits them in the order
the Python code did and makes the same choices. Built once per cost model and cached
on it (:func:`graph_arrays`).

Examples
--------
>>> from tfpart.core.graph import OpGraph
>>> from tfpart.core.cluster import cluster_of_devices
>>> from costmodel.roofline import CostModel
>>> g = OpGraph()
>>> for n in "abc": g.add_op(n, op_type="Relu")
>>> g.add_edge("a", "b", bytes=8); g.add_edge("a", "c", bytes=4)
>>> arrays = graph_arrays(CostModel(g, cluster_of_devices(["cpu", "cpu"])))
>>> arrays.succ_ptr.tolist(), arrays.succ_op.tolist(), arrays.edge_bytes.tolist()
([0, 2, 2, 2], [1, 2], [8.0, 4.0])
>>> arrays.pred_edge.tolist()  # c's input is edge 1
[0, 1]
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from costmodel.memory import output_bytes, scratch_bytes
from tfpart.core.ops import ALIASING_OPS, FORWARDING_OPS, SHAPE_ONLY_OPS, WEIGHT_OPS


@dataclass(frozen=True)
class GraphArrays:
    """``succ_ptr[i]:succ_ptr[i+1]`` index ``succ_op`` (consumers) and ``succ_edge``
    (edge ids) of op ``i``; ``pred_*`` likewise for its producers. Per edge: bytes,
    whether it is a control edge, and its row in ``comm`` (its own transfer-time table,
    ``-1`` for alpha-beta). ``tie`` ranks ops by :meth:`OpGraph.structural_key` (the
    simulator's tie-break). ``topological`` is :meth:`OpGraph.topological_order` as
    op indices."""

    succ_ptr: np.ndarray
    succ_op: np.ndarray
    succ_edge: np.ndarray
    pred_ptr: np.ndarray
    pred_op: np.ndarray
    pred_edge: np.ndarray
    edge_bytes: np.ndarray
    edge_control: np.ndarray
    comm_row: np.ndarray
    comm: np.ndarray
    tie: np.ndarray
    topological: np.ndarray
    out_bytes: np.ndarray
    own_bytes: np.ndarray
    param_bytes: np.ndarray
    aliasing: np.ndarray  # the op's output lives in its first input's buffer
    forwarding: np.ndarray  # the op may write its output into a dying input's buffer
    constant: np.ndarray  # a weight: its buffer is never written into
    shape_only: np.ndarray  # the op reads only its inputs' shapes, never their buffers
    scratch_bytes: np.ndarray  # bytes the op holds only while it runs
    group_of: np.ndarray  # colocation group per op, an index into group_names
    group_names: np.ndarray  # sorted
    group_param_bytes: np.ndarray  # variable bytes per group
    group_runnable: np.ndarray  # per group and device: the device can run all its ops


def graph_arrays(cost):
    """The :class:`GraphArrays` of ``cost``'s graph (built on first use, then cached)."""
    return cost.derived("graph_arrays", lambda: _build(cost))


def _build(cost):
    graph, index = cost.graph, cost.index
    n_dev = len(cost.cluster)
    # networkx's own dictionaries: its read-only views cost a wrapper object per lookup
    successors, predecessors = graph.nx_graph._succ, graph.nx_graph._pred
    edges = [(u, v, edge) for u in cost.ops for v, edge in successors[u].items()]
    edge_id = {(u, v): k for k, (u, v, _) in enumerate(edges)}  # edges by producer
    tables = [k for k, (_, _, edge) in enumerate(edges) if edge.get("comm") is not None]
    comm_row = np.full(len(edges), -1, dtype=np.int64)
    comm_row[tables] = np.arange(len(tables))
    comm = np.array([edges[k][2]["comm"] for k in tables], dtype=float)
    ints = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    pointers = lambda adjacency: np.concatenate(  # noqa: E731
        [[0], np.cumsum([len(adjacency[u]) for u in cost.ops])]).astype(np.int64)
    succ_ptr, succ_op = pointers(successors), ints([index[v] for _, v, _ in edges])
    pred_ptr = pointers(predecessors)
    pred_pairs = [(u, v) for v in cost.ops for u in predecessors[v]]
    attrs = [graph.ops[name] for name in cost.ops]
    out_bytes = np.array([output_bytes(a) for a in attrs], dtype=float)
    aliasing = np.array([a["op_type"] in ALIASING_OPS for a in attrs], dtype=np.bool_)
    tie = _structural_ranks(cost.ops, attrs, np.diff(pred_ptr), np.diff(succ_ptr))
    param_bytes = np.array([a["param_bytes"] for a in attrs], dtype=float)
    groups = [a["colocation"] for a in attrs]
    group_names = np.array(sorted(set(groups)))  # np.unique's, sorted by Python, faster
    rank = {name: k for k, name in enumerate(group_names.tolist())}
    group_of = np.array([rank[group] for group in groups], dtype=np.int64)
    blocked = np.zeros((len(group_names), n_dev), dtype=np.int64)
    np.add.at(blocked, group_of, ~np.isfinite(cost.compute))
    return GraphArrays(
        succ_ptr=succ_ptr, succ_op=succ_op, succ_edge=np.arange(len(edges), dtype=np.int64),
        pred_ptr=pred_ptr, pred_op=ints([index[u] for u, _ in pred_pairs]),
        pred_edge=ints([edge_id[pair] for pair in pred_pairs]),
        edge_bytes=np.array([edge["bytes"] for _, _, edge in edges], dtype=float),
        edge_control=np.array([edge["control"] for _, _, edge in edges], dtype=np.bool_),
        comm_row=comm_row, comm=comm.reshape(len(tables), n_dev, n_dev),
        tie=tie, topological=topological_order(succ_ptr, succ_op, tie),
        out_bytes=out_bytes,
        own_bytes=np.where(aliasing, 0.0, out_bytes),  # memory.new_output_bytes
        param_bytes=param_bytes, aliasing=aliasing,
        forwarding=np.array([a["op_type"] in FORWARDING_OPS for a in attrs], dtype=np.bool_),
        constant=np.array([a["op_type"] in WEIGHT_OPS for a in attrs], dtype=np.bool_),
        shape_only=np.array([a["op_type"] in SHAPE_ONLY_OPS for a in attrs], dtype=np.bool_),
        scratch_bytes=np.array([scratch_bytes(a, predecessors[name].values())
                                for name, a in zip(cost.ops, attrs)], dtype=float),
        group_of=group_of, group_names=group_names,
        group_param_bytes=np.bincount(group_of, param_bytes, minlength=len(group_names)),
        group_runnable=blocked == 0)


def _structural_ranks(names, attrs, in_degree, out_degree):
    """Each op's rank in the order of :meth:`OpGraph.structural_key` (op type, flops,
    bytes accessed, variable bytes, sorted cost table, in- and out-degree, name), sorted
    column by column rather than key by key."""
    def codes(values):  # ranks that sort as the values do
        order = sorted(set(values))
        rank = {value: k for k, value in enumerate(order)}
        return np.array([rank[v] for v in values], dtype=np.int64)

    tables = [tuple(sorted(a["cost"].values())) if a.get("cost") else () for a in attrs]
    columns = [codes(list(names)), out_degree, in_degree, codes(tables),
               np.array([a["param_bytes"] for a in attrs], dtype=float),
               np.array([a["bytes_accessed"] for a in attrs], dtype=float),
               np.array([a["flops"] for a in attrs], dtype=float),
               codes([a["op_type"] for a in attrs])]
    tie = np.empty(len(names), dtype=np.int64)
    tie[np.lexsort(columns)] = np.arange(len(names))
    return tie


@numba.njit(cache=True)
def topological_order(succ_ptr, succ_op, tie):
    """The topological order of :meth:`OpGraph.topological_order` (among ready ops,
    the lowest ``tie`` first: the lexicographic order by structural key)."""
    n_ops = len(tie)
    waiting = np.zeros(n_ops, dtype=np.int64)
    for k in range(len(succ_op)):
        waiting[succ_op[k]] += 1
    no_priority = np.zeros(n_ops)
    heap = np.empty((1, n_ops), dtype=np.int64)
    size = np.zeros(1, dtype=np.int64)
    for i in range(n_ops):
        if waiting[i] == 0:
            heap_push(heap, size, 0, i, no_priority, tie)
    order = np.empty(n_ops, dtype=np.int64)
    for k in range(n_ops):
        i = heap_pop(heap, size, 0, no_priority, tie)
        order[k] = i
        for s in range(succ_ptr[i], succ_ptr[i + 1]):
            waiting[succ_op[s]] -= 1
            if waiting[succ_op[s]] == 0:
                heap_push(heap, size, 0, succ_op[s], no_priority, tie)
    return order


@numba.njit(cache=True)
def ranks_before(i, j, key, column, priority, tie):
    """Whether op ``i`` comes before ``j`` in a heap: lower ``key[:, column]`` (unless
    ``column < 0``), then higher priority, then lower tie."""
    if column >= 0 and key[i, column] != key[j, column]:
        return key[i, column] < key[j, column]
    return priority[i] > priority[j] or (priority[i] == priority[j] and tie[i] < tie[j])


NO_KEY = np.zeros((0, 0))  # for heaps ordered by priority and tie alone


@numba.njit(cache=True)
def heap_push(queue, size, e, i, priority, tie):
    """Push op ``i`` on heap ``e`` (row ``e`` of ``queue``, ``size[e]`` long), highest
    priority first, then lowest tie."""
    keyed_heap_push(queue, size, e, i, NO_KEY, -1, priority, tie)


@numba.njit(cache=True)
def heap_pop(queue, size, e, priority, tie):
    """Pop the first op of heap ``e`` (see :func:`heap_push`)."""
    return keyed_heap_pop(queue, size, e, NO_KEY, -1, priority, tie)


@numba.njit(cache=True)
def keyed_heap_push(queue, size, e, i, key, column, priority, tie):
    """Push op ``i`` on heap ``e``, ordered by :func:`ranks_before`."""
    k = size[e]
    size[e] += 1
    queue[e, k] = i
    while k > 0:
        parent = (k - 1) // 2
        if not ranks_before(queue[e, k], queue[e, parent], key, column, priority, tie):
            break
        queue[e, k], queue[e, parent] = queue[e, parent], queue[e, k]
        k = parent


@numba.njit(cache=True)
def keyed_heap_pop(queue, size, e, key, column, priority, tie):
    """Pop the first op of heap ``e`` (see :func:`keyed_heap_push`)."""
    top = queue[e, 0]
    size[e] -= 1
    n = size[e]
    queue[e, 0] = queue[e, n]
    k = 0
    while True:
        first, left, right = k, 2 * k + 1, 2 * k + 2
        if left < n and ranks_before(queue[e, left], queue[e, first], key, column, priority,
                                     tie):
            first = left
        if right < n and ranks_before(queue[e, right], queue[e, first], key, column,
                                      priority, tie):
            first = right
        if first == k:
            return top
        queue[e, k], queue[e, first] = queue[e, first], queue[e, k]
        k = first


@numba.njit(cache=True)
def edge_times(e, src, dst, edge_bytes, comm_row, comm, latency, inverse_bandwidth):
    """(time on the link, total time) for edge ``e`` from device ``src`` to ``dst``:
    :meth:`CostModel.edge_link_time` and :meth:`CostModel.edge_time`."""
    if src == dst:
        return 0.0, 0.0
    row = comm_row[e]
    if row >= 0:
        t = comm[row, src, dst]
        return t, t
    nbytes = edge_bytes[e]
    on_link = nbytes * inverse_bandwidth[src, dst]
    return on_link, (latency[src, dst] + on_link if nbytes > 0 else 0.0)
