"""Replicas of a pipeline: data parallelism over groups of devices, each group running
the step as pipeline stages over micro-batches of its share of the batch.

This is the pipelined data-parallel mode of Applied Intelligence (2022) on uneven
devices: a group of a fast and a slow device pipelines the step (each takes the
stages its speed can carry), and several such groups split the batch. Every group
has the same number of devices, dealt in snake order of speed (as
:mod:`partitioner.hybrid` deals them), so that position ``p`` of each group
holds devices of about the same speed; the stages are cut once, by
:mod:`partitioner.pipeline_stages` on the first group with the graph costed at its
share of the batch, and replica ``r`` runs the stage on position ``p`` of the first group on
position ``p`` of its own. The variables, their reads and a training step's update
stay where the first replica's stages put them (one copy; every replica's gradients
are summed there, each weighted by its share). Shares start equal and are then set
from each replica's simulated finish, as for :mod:`partitioner.hybrid`.

Examples
--------
Six matmuls in a row on four CPUs: two replicas of a two-stage pipeline, half the
batch each.

>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> for i, before in enumerate(["x", "mm0", "mm1", "mm2", "mm3", "mm4"]):
...     g.add_op(f"mm{i}", op_type="MatMul", flops=1e11, input_shapes=[(8, 500)])
...     g.add_edge(before, f"mm{i}", bytes=16000)
>>> cost = CostModel(g, cluster_of_devices(["cpu"] * 4))
>>> plan = replicate_pipeline(cost, [[0, 1], [2, 3]], batch_size=8)
>>> plan.replicas.fractions, len(set(plan.stages.values()))
((0.5, 0.5), 2)
>>> sorted(set(plan.replicas.placements[1].values()))
['/job:localhost/replica:0/task:0/device:CPU:2', '/job:localhost/replica:0/task:0/device:CPU:3']
"""
from __future__ import annotations

import numpy as np

from costmodel.pipeline import (pinned_ops, pipeline_replicas_graph,
                                replica_finishes, scaled_graph, shared_ops, table_ops)
from costmodel.roofline import CostModel
from partitioner.finish import fastest_plan, make_plan
from partitioner.pipeline_stages import PipelineOptions, pipeline_plan
from partitioner.shares import proportional_shares
from tfpart.core.cluster import sub_cluster
from tfpart.core.errors import PlacementError
from tfpart.core.plan import REDUCTIONS, Plan, Replicas, Stages


def replicate_pipeline(cost, groups, batch_size, options=None, microbatches=None,
                       schedule=None, reductions=REDUCTIONS):
    """The plan of a replica of one pipeline per group of device indices (equal
    sizes, position ``p`` of each group matching position ``p`` of the others).

    Parameters
    ----------
    cost : costmodel.CostModel
    groups : list of list of int
    batch_size : int
        The compile batch the shares are planned for.
    options : dataclass, optional
        The calling algorithm's options, echoed into the plan.
    microbatches, schedule : optional
        Fix each replica's micro-batch count and a training step's schedule (else
        :mod:`partitioner.pipeline_stages` chooses them).
    reductions : tuple of str
        How the gradients may be reduced (:data:`tfpart.core.plan.REDUCTIONS`): one copy
        of the variables on the first replica's devices, or a copy per replica and
        the gradients all-reduced among the devices that hold them; the faster.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If the groups differ in size, the graph carries per-device transfer tables
        (imported graphs), or no pipeline fits.
    """
    graph = cost.graph
    if len({len(group) for group in groups}) != 1 or len(groups) > batch_size:
        raise PlacementError("", f"cannot make {len(groups)} equal replicas of a pipeline "
                             f"of groups of {[len(g) for g in groups]} devices and a batch "
                             f"of {batch_size}")
    if any(edge.get("comm") is not None for _, _, edge in graph.edges()):
        raise PlacementError("", "replicas of a pipeline need transfer times from the "
                             "cluster's links, not the graph's per-device tables")
    staged = _first_group_pipeline(cost, groups[0], len(groups), batch_size, microbatches,
                                   schedule)
    position = {device: p for p, device in enumerate(groups[0])}
    staged["position"] = {op: position[device] for op, device in staged["device_of"].items()}
    fractions, per_replica = _shares(cost, groups, staged, batch_size)
    return fastest_plan((lambda reduce=reduce: _plan(
        cost, groups, staged, fractions, per_replica, reduce, options)
        for reduce in reductions), PlacementError("", "no reduction was asked for"))


def _device_maps(graph, groups, position, on_first):
    """Per replica, each op's device index: the replica's own device at the op's
    ``position`` in its group, but for the ops ``on_first`` (one copy of the
    variables: they, their reads and the update), which stay on the first
    replica's."""
    return [{op: (groups[0] if op in on_first else group)[position[op]] for op in graph.ops}
            for group in groups]


def _check_kernels(cost, maps):
    """PlacementError unless every replica's device for each op has its kernel (a
    string op stays off a group of accelerators only)."""
    for r, device_of in enumerate(maps):
        for op, device in device_of.items():
            if not np.isfinite(cost.compute[cost.index[op], device]):
                name = cost.cluster.device_names[device]
                raise PlacementError("", f"replica {r + 1} would run {op} "
                                     f"({cost.graph.ops[op]['op_type']}) on {name}, which "
                                     "has no kernel for it")


def _shares(cost, groups, staged, batch_size):
    """Each replica's fraction of the batch, by its simulated speed (shares start
    equal), and the micro-batches per replica (no more than the smallest share)."""
    count = len(groups)
    fractions = [1.0 / count] * count
    per_replica = min(staged["microbatches"], batch_size // count)
    maps = _device_maps(cost.graph, groups, staged["position"],
                        shared_ops(cost.graph) | pinned_ops(cost.graph))
    _check_kernels(cost, maps)
    finishes = replica_finishes(*_replicated(cost, fractions, maps, staged, per_replica),
                                count, per_microbatch=True)
    shares = proportional_shares(batch_size, [f / t for f, t in zip(fractions, finishes)])
    if min(shares) == 0:
        return fractions, per_replica
    return [share / batch_size for share in shares], min(per_replica, min(shares))


def _plan(cost, groups, staged, fractions, per_replica, reduce, options):
    """The checked plan of the replicas with the gradients reduced by ``reduce``."""
    graph = cost.graph
    all_reduce = reduce == "all_reduce"
    shared = shared_ops(graph)
    pinned = table_ops(graph) - shared if all_reduce else pinned_ops(graph)
    maps = _device_maps(graph, groups, staged["position"], table_ops(graph) if all_reduce
                        else shared | pinned)
    _check_kernels(cost, maps)
    figures = make_plan(*_replicated(cost, fractions, maps, staged, per_replica, all_reduce),
                        "hybrid", options or PipelineOptions())
    names = cost.cluster.device_names
    stage_zero = min(staged["stages"].values())
    lead = next(staged["position"][op] for op, stage in staged["stages"].items()
                if stage == stage_zero and op not in shared and op not in pinned)
    return Plan(
        assignment={op: names[maps[0][op]] for op in graph.ops}, algorithm="hybrid",
        options=figures.options,
        stages=Stages(staged["stages"], per_replica * len(groups), staged["schedule"]),
        replicas=Replicas(devices=[names[group[lead]] for group in groups],
                          fractions=fractions, pinned=sorted(pinned),
                          placements=[{op: names[where[op]] for op in graph.ops
                                       if op not in shared and op not in pinned}
                                      for where in maps],
                          microbatches=per_replica, reduce=reduce),
        predicted=figures.predicted, lower_bound=figures.lower_bound)


def _first_group_pipeline(cost, group, count, batch_size, microbatches, schedule):
    """The pipeline of the graph, costed at one of ``count`` equal shares of its
    batch, on the devices of ``group``: each op's device index (in the whole
    cluster), its stage, the micro-batch count and the schedule."""
    small = CostModel(scaled_graph(cost.graph, 1.0 / count), sub_cluster(cost.cluster, group),
                      measured=cost.measured, tf32=cost.tf32)
    plan = pipeline_plan(small, PipelineOptions(batch_size=batch_size // count,
                                                microbatches=microbatches,
                                                schedule=schedule))
    index = {name: group[d] for d, name in enumerate(small.cluster.device_names)}
    return {"device_of": {op: index[device] for op, device in plan.assignment.items()},
            "stages": plan.stages, "microbatches": plan.microbatches,
            "schedule": plan.schedule}


def _replicated(cost, fractions, maps, staged, per_replica, all_reduce=False):
    """The cost model of the replicas and the device index of each of its ops."""
    replicated, where = pipeline_replicas_graph(
        cost.graph, cost.cluster.device_names, fractions, maps, staged["stages"],
        per_replica, staged["schedule"] or "gpipe", all_reduce)
    replicated_cost = cost.of(replicated)
    return replicated_cost, np.array([where[op] for op in replicated_cost.ops])
