"""Greedy v1: memory-aware earliest-finish-time list scheduling (the HEFT/ETF family).

Ops are taken in list-scheduling order (ready ops first, highest upward rank first).
The first op of a colocation group decides the group's device: among the devices that
have a kernel for every op of the group and room for the group's variables and the
op's tensors, and that leave room for the variables of the groups still unplaced (a
first-fit-decreasing packing must exist), the one where the op would finish earliest,
counting the transfers of its inputs. The rest of the group follows. Groups that cost nothing and read nothing
(variables with their reads, constants) are finally moved next to their heaviest
consumer, which changes no op time and saves transfers.

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
>>> plan = partition(g, CostModel(g, cluster), cluster)
>>> len(plan.devices_used())  # the two branches run in parallel
2
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.memory import device_memory, new_output_bytes, output_bytes
from costmodel.simulate import data_ready_time, ready_order, upward_rank
from partitioner.finish import make_plan
from tfpart.errors import PlacementError


@dataclass(frozen=True)
class GreedyOptions:
    """``memory_headroom``: fraction of each device's memory kept free."""

    memory_headroom: float = 0.0


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
    for pred, edge in cost.graph.nx_graph.pred[cost.ops[i]].items():
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


def partition(graph, cost, cluster, *, options=GreedyOptions()):
    """Place every op of ``graph`` on a device of ``cluster``; return a checked Plan."""
    n_ops, n_dev = cost.compute.shape
    capacity = np.array([d.memory for d in cluster.devices]) * (1 - options.memory_headroom)
    group_params, group_runnable = _group_tables(graph, cost)
    out_bytes = np.array([output_bytes(graph.ops[name]) for name in cost.ops], dtype=float)
    own_bytes = np.array([new_output_bytes(graph.ops[name]) for name in cost.ops], dtype=float)
    priority = upward_rank(cost)

    device_of = np.full(n_ops, -1)
    end = np.zeros(n_ops)
    device_free = np.zeros(n_dev)
    used = np.zeros(n_dev)
    group_device, received = {}, set()
    unplaced = sorted(((size, g) for g, size in group_params.items() if size > 0), reverse=True)
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
            if new_params and not _leaves_room(unplaced, group, capacity - used, d, need):
                continue
            finish = (max(device_free[d], data_ready_time(cost, i, d, end, device_of))
                      + cost.compute[i, d])
            key = (finish, used[d] / capacity[d], d)
            if best_key is None or key < best_key:
                best, best_key, best_need = d, key, need
        if best is None:
            free = max(capacity[d] - used[d] for d in candidates)
            raise PlacementError("", f"out of memory placing {cost.ops[i]}: it needs "
                                 f"{(new_params + out_bytes[i]) / 1e6:.1f} MB, the roomiest "
                                 f"device that can run it has {free / 1e6:.1f} MB left")
        if group not in group_device and group_params[group] > 0:
            unplaced.remove((group_params[group], group))
        group_device[group] = best
        device_of[i] = best
        end[i] = best_key[0]
        device_free[best] = end[i]
        used[best] += best_need
        for pred, edge in cost.graph.nx_graph.pred[cost.ops[i]].items():
            p = cost.index[pred]
            if not edge["control"] and device_of[p] != best:
                received.add((p, best))
    _move_free_groups_to_consumers(graph, cost, cluster, device_of)
    return make_plan(graph, cost, cluster, device_of, "greedy", options, priority)


def _leaves_room(unplaced, group, free, d, need):
    """Whether the other unplaced groups' variables still fit once ``group`` takes
    ``need`` bytes of device ``d``."""
    free = free.copy()
    free[d] -= need
    return packable([size for size, g in unplaced if g != group], free)


def _move_free_groups_to_consumers(graph, cost, cluster, device_of):
    """Put colocation groups that cost nothing anywhere and read nothing from outside
    (variables with their reads, constants) beside their heaviest outside consumer.

    A group's device is fixed by its first op, which for a variable is a free
    ``VarHandleOp`` placed before anything reads it; moving the group to where its
    value is used removes transfers without changing any op time. Kept only if every
    device stays within its memory.
    """
    nxg = graph.nx_graph
    moved = device_of.copy()
    for members in graph.colocation_groups().values():
        inside = set(members)
        indices = [cost.index[m] for m in members]
        if np.any(cost.compute[indices] > 0) or any(
                p not in inside for m in members for p in nxg.predecessors(m)):
            continue
        uses = [(edge["bytes"], succ) for m in members for succ, edge in nxg.succ[m].items()
                if succ not in inside]
        if not uses:
            continue
        target = moved[cost.index[max(uses)[1]]]
        if np.all(np.isfinite(cost.compute[indices, target])):
            moved[indices] = target
    names = cluster.device_names
    memory = device_memory(graph, {op: names[d] for op, d in zip(cost.ops, moved)}, names)
    if all(memory[d.name] <= d.memory for d in cluster.devices):
        device_of[:] = moved
