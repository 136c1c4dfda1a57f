"""Baseline: a balanced min-cut partition into one part per device.

Starts from the contiguous topological split (balanced by mean op time) and moves
colocation groups between parts, Fiduccia-Mattheyses style (single moves, and swaps of
two groups that both gain), while that lowers the transfer time cut and keeps every
part within ``imbalance`` of an equal share of the work. Device speeds play no part: parts go to devices in cluster order, as a
graph-partitioning tool (METIS and the like) would leave them.

Example
-------
>>> g = OpGraph()
>>> for tower in "ab":
...     for i in range(3): g.add_op(f"{tower}{i}", op_type="Relu", bytes_accessed=1e9)
...     for i in range(2): g.add_edge(f"{tower}{i}", f"{tower}{i + 1}", bytes=1e8)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> plan = partition(CostModel(g, cluster))
>>> plan.predicted.bytes_moved  # the two towers end up apart: nothing crosses
0.0
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioner.finish import make_plan
from partitioner.units import expand, placement_units


@dataclass(frozen=True)
class MinCutOptions:
    imbalance: float = 0.1
    passes: int = 10


def _unit_edges(graph, cost, units):
    unit_of = {i: k for k, u in enumerate(units) for i in u.members}
    weights = {}
    for u, v, edge in graph.edges():
        a, b = unit_of[cost.index[u]], unit_of[cost.index[v]]
        if a != b:
            key = (min(a, b), max(a, b))
            weights[key] = weights.get(key, 0.0) + cost.mean_edge_time(edge)
    neighbours = {k: {} for k in range(len(units))}
    for (a, b), w in weights.items():
        neighbours[a][b] = neighbours[b].get(a, 0.0) + w
        neighbours[b][a] = neighbours[a][b]
    return neighbours


def partition(cost, options=MinCutOptions()):
    graph, cluster = cost.graph, cost.cluster
    units = placement_units(cost)
    n = len(cluster)
    work = np.array([np.mean(u.time[np.isfinite(u.time)]) if u.runnable.any() else 0.0
                     for u in units])
    limit = (1 + options.imbalance) * work.sum() / n
    part, load, done = np.zeros(len(units), dtype=int), np.zeros(n), 0.0
    for k, unit in enumerate(units):  # contiguous, balanced start
        part[k] = min(int(done / work.sum() * n), n - 1) if work.sum() else 0
        while not unit.runnable[part[k]]:
            part[k] = (part[k] + 1) % n
        load[part[k]] += work[k]
        done += work[k]
    neighbours = _unit_edges(graph, cost, units)

    def gain(k, target):
        """How much the cut shrinks if unit k moves to part ``target``."""
        return sum(w if part[o] == target else -w if part[o] == part[k] else 0.0
                   for o, w in neighbours[k].items())

    for _ in range(options.passes):
        moved = False
        for k in range(len(units)):  # single moves within the balance limit
            for target in sorted({part[o] for o in neighbours[k]} - {part[k]}):
                if (gain(k, target) > 1e-15 and units[k].runnable[target]
                        and load[target] + work[k] <= limit):
                    load[part[k]] -= work[k]
                    load[target] += work[k]
                    part[k] = target
                    moved = True
                    break
        # swaps between two parts, for units that would gain by moving but do not fit
        wanting = [(k, t) for k in range(len(units))
                   for t in sorted({part[o] for o in neighbours[k]} - {part[k]})
                   if gain(k, t) > 1e-15 and units[k].runnable[t]]
        for k, t in wanting:
            for j, s in wanting:
                if part[k] != s or part[j] != t or j == k:
                    continue
                shared = neighbours[k].get(j, 0.0)
                total_gain = gain(k, t) + gain(j, s) - 2 * shared
                new_t, new_s = load[t] - work[j] + work[k], load[s] - work[k] + work[j]
                if total_gain > 1e-15 and new_t <= limit and new_s <= limit and \
                        units[j].runnable[s]:
                    part[k], part[j] = t, s
                    load[t], load[s] = new_t, new_s
                    moved = True
                    break
        if not moved:
            break
    return make_plan(cost, expand(units, part, len(cost.ops)), "min_cut",
                     options)
