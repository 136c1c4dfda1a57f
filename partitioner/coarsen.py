"""Coarsening: merge ops into units so exact methods (the ILP) can handle large graphs.

Ops are merged when they must share a device anyway (colocation groups), optionally by
name-scope layer (ops whose names share their first ``name_scope_depth`` components),
then along chains (a unit whose only successor has it as only predecessor), lightest
merged pair first, until at most ``target_units`` remain; if chains are not enough, the
units' topological order is cut into ``target_units`` contiguous pieces of about equal
work. Any cycle a merge creates is collapsed into one unit, so the result is a DAG. A coarse placement maps back to ops
exactly (:meth:`Coarse.expand`).

The coarse graph carries explicit cost tables (each unit's time on each device is the
sum of its ops'), summed tensor bytes and transfer tables on its edges, summed
variable bytes, and the outputs of its non-aliasing ops, so its memory bound is no
lower than the ops'.

Example
-------
>>> g = OpGraph()
>>> for i in range(6): g.add_op(f"op{i}", op_type="Relu", bytes_accessed=1e9)
>>> for i in range(5): g.add_edge(f"op{i}", f"op{i + 1}", bytes=8)
>>> coarse = coarsen(g, CostModel(g, cluster_of_devices(["cpu", "cpu"])),
...                  CoarsenOptions(target_units=2))
>>> len(coarse.graph), sorted(len(m) for m in coarse.members.values())
(2, [2, 4])
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import networkx as nx
import numpy as np

from tfpart.core.graph import OpGraph
from tfpart.core.ops import ALIASING_OPS, WEIGHT_OPS


@dataclass(frozen=True)
class CoarsenOptions:
    chains: bool = True
    name_scope_depth: int | None = None
    target_units: int | None = None
    weights_with_reader: bool = False  # a weight joins the unit of its first reader


@dataclass
class Coarse:
    graph: OpGraph
    members: dict  # unit name -> list of op names

    def expand(self, unit_assignment):
        """Op -> device from unit -> device."""
        return {op: unit_assignment[unit] for unit, ops in self.members.items() for op in ops}


class _Partition:
    """Union-find over ops with the unit graph kept up to date on merges."""

    def __init__(self, graph):
        self.parent = {op: op for op in graph.ops}

    def find(self, x):
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def _unit_graph(graph, part):
    units = nx.DiGraph()
    units.add_nodes_from({part.find(op) for op in graph.ops})
    for u, v, _ in graph.edges():
        a, b = part.find(u), part.find(v)
        if a != b:
            units.add_edge(a, b)
    return units


def _collapse_cycles(graph, part):
    while True:
        units = _unit_graph(graph, part)
        cycles = [c for c in nx.strongly_connected_components(units) if len(c) > 1]
        if not cycles:
            return units
        for component in cycles:
            first, *rest = sorted(component)
            for other in rest:
                part.union(first, other)


def _merge_chains(units, weight, target):
    """Merge single-successor/single-predecessor pairs, lightest first."""
    merged = {u: u for u in units}  # unit -> representative (chain merges only)

    def rep(u):
        while merged[u] != u:
            u = merged[u]
        return u
    heap = [(weight[u] + weight[v], u, v) for u, v in units.edges
            if units.out_degree(u) == 1 and units.in_degree(v) == 1]
    heapq.heapify(heap)
    count = units.number_of_nodes()
    while heap and (target is None or count > target):
        pair_weight, u, v = heapq.heappop(heap)
        if merged[u] != u or merged[v] != v or pair_weight != weight[u] + weight[v]:
            continue  # stale: one side was merged since this entry was pushed
        if not units.has_edge(u, v) or units.out_degree(u) != 1 or units.in_degree(v) != 1:
            continue
        for succ in list(units.successors(v)):
            units.add_edge(u, succ)
        units.remove_node(v)
        merged[v] = u
        weight[u] += weight[v]
        count -= 1
        for succ in units.successors(u):
            if units.out_degree(u) == 1 and units.in_degree(succ) == 1:
                heapq.heappush(heap, (weight[u] + weight[succ], u, succ))
        for pred in units.predecessors(u):
            if units.out_degree(pred) == 1 and units.in_degree(u) == 1:
                heapq.heappush(heap, (weight[pred] + weight[u], pred, u))
    return rep


def coarsen(graph, cost, options=CoarsenOptions()):
    """Merge ``graph``'s ops into units; see the module docstring."""
    part = _Partition(graph)
    groups = {}
    for op, attrs in graph.ops.items():
        groups.setdefault(attrs.get("colocation"), []).append(op)
    for members in groups.values():
        for other in members[1:]:
            part.union(members[0], other)
    if options.name_scope_depth:
        scopes = {}
        for op in graph.ops:
            scope = "/".join(op.split("/")[:options.name_scope_depth])
            if scope != op:
                scopes.setdefault(scope, []).append(op)
        for members in scopes.values():
            for other in members[1:]:
                part.union(members[0], other)
    if options.weights_with_reader:
        _join_weights_to_readers(graph, part)
    units = _collapse_cycles(graph, part)
    mean_time = cost.mean_time()
    weight = {u: 0.0 for u in units}
    for op in graph.ops:
        weight[part.find(op)] += mean_time[cost.index[op]]
    if options.chains:
        rep = _merge_chains(units, weight, options.target_units)
        for op in graph.ops:
            part.union(rep(part.find(op)), op)
    if options.target_units and len({part.find(op) for op in graph.ops}) > options.target_units:
        _merge_segments(graph, part, mean_time, cost, options.target_units)
    return _build(graph, cost, part)


def _join_weights_to_readers(graph, part):
    """Put each op computed from weights alone (variables, their reads, constants, and
    ops whose data inputs are all such ops) in the unit of the first op that reads it
    (by data edges), so a weight lives where it is used rather than with the other
    weights, which lead every topological order, and independent constants do not
    multiply the pipeline DP's ideals."""
    weight_only = set()
    for op in graph.topological_order():
        sources = [u for u, edge in graph.in_edges(op).items() if not edge["control"]]
        if graph.ops[op]["op_type"] in WEIGHT_OPS or (
                sources and all(u in weight_only for u in sources)):
            weight_only.add(op)
    position = {op: k for k, op in enumerate(graph.topological_order())}
    for op in weight_only:
        readers = [v for v, edge in graph.out_edges(op).items() if not edge["control"]]
        if readers:
            part.union(op, min(readers, key=position.__getitem__))


def regroup(graph, cost, members):
    """The coarse graph of ``graph`` for a given grouping (unit -> ops), e.g. the same
    units costed at another batch size."""
    unit_of = {op: unit for unit, ops in members.items() for op in ops}

    class _Fixed:
        find = staticmethod(unit_of.__getitem__)
    return _build(graph, cost, _Fixed)


def _merge_segments(graph, part, mean_time, cost, target):
    """Cut the unit DAG's topological order into ``target`` contiguous pieces of about
    equal work and merge each piece. A contiguous piece of a topological order cannot
    close a cycle: a path leaving and re-entering it would pass through an op between
    its ends, which is in the piece."""
    units = _unit_graph(graph, part)
    weight = {u: 0.0 for u in units}
    for op in graph.ops:
        weight[part.find(op)] += mean_time[cost.index[op]]
    order = list(nx.lexicographical_topological_sort(units))
    total = sum(weight.values()) or 1.0
    share = total / target
    piece_start, done, pieces = order[0], 0.0, 1
    for unit in order:
        if done >= share and pieces < target:
            piece_start, done, pieces = unit, 0.0, pieces + 1
        part.union(piece_start, unit)
        done += weight[unit]


def _build(graph, cost, part):
    members = {}
    for op in graph.topological_order():
        members.setdefault(part.find(op), []).append(op)
    names = cost.cluster.device_names
    coarse = OpGraph()
    for unit, ops in members.items():
        idx = [cost.index[o] for o in ops]
        time = cost.compute[idx].sum(axis=0)
        dispatch = cost.dispatch_time()[idx].sum(axis=0)
        outputs = [out for o in ops if graph.ops[o]["op_type"] not in ALIASING_OPS
                   for out in graph.ops[o]["outputs"]]
        coarse.add_op(unit, op_type="Unit", outputs=outputs,
                      param_bytes=sum(graph.ops[o]["param_bytes"] for o in ops),
                      cost={names[d]: float(t) for d, t in enumerate(time) if np.isfinite(t)},
                      dispatch={names[d]: float(t) for d, t in enumerate(dispatch) if t > 0})
    n = len(names)
    for u, v, edge in graph.edges():
        a, b = part.find(u), part.find(v)
        if a == b:
            continue
        table = np.array([[cost.edge_time(edge, s, d) for d in range(n)] for s in range(n)])
        if coarse.has_edge(a, b):
            existing = coarse.edge(a, b)
            existing["bytes"] += edge["bytes"]
            existing["control"] = existing["control"] and edge["control"]
            existing["comm"] = (np.array(existing["comm"]) + table).tolist()
        else:
            coarse.add_edge(a, b, bytes=edge["bytes"], control=edge["control"])
            coarse.edge(a, b)["comm"] = table.tolist()
    return Coarse(graph=coarse, members=members)
