"""Hybrid: data-parallel replicas of an op placement or of a pipeline. The devices
form groups of two or more; each group runs a replica of the step placed across its
devices by the greedy, or pipelined over them (:mod:`partitioner.pipeline_replicas`),
on a share of the batch in proportion to the group's predicted speed.

This is how data parallelism meets devices too slow or too small to hold a replica
alone: a fast and a slow device together make one replica, and two such pairs make
two. Groups are dealt in snake order of device speed (the fastest device to the first
group, the next to the second, …, then back), so that they come out about equally
fast. The greedy places all replicas at once, on the replicated graph
(:func:`costmodel.pipeline.replicas_graph`: each replica's per-sample ops costed at
its share), with each replica's ops restricted to its group's devices; the variables,
their reads and a training step's update stay on the home (the fastest device), as
for :mod:`partitioner.data_parallel`. Shares start equal and are then set from each
replica's simulated finish, and the placement is made again for them.

Examples
--------
Four CPUs make two replicas of two devices each, each replica with half the batch.

>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> for name in ("left", "right"):
...     g.add_op(name, op_type="MatMul", flops=4e10, input_shapes=[(8, 10)])
...     g.add_edge("x", name, bytes=320)
>>> g.add_op("sum", op_type="AddV2"); g.add_edge("left", "sum"); g.add_edge("right", "sum")
>>> plan = partition(CostModel(g, cluster_of_devices(["cpu"] * 4)), HybridOptions(batch_size=8))
>>> plan.replicas.fractions, [len(set(p.values())) for p in plan.replicas.placements]
((0.5, 0.5), [2, 2])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costmodel.pipeline import (pinned_ops, replica_finishes, replicas_cost,
                                shared_ops)
from costmodel.execution import expand
from partitioner.greedy_placement import GreedyOptions, greedy_placement
from partitioner.finish import fastest_plan, make_plan
from partitioner.pipeline_replicas import replicate_pipeline
from partitioner.shares import proportional_shares
from partitioner.training_stages import is_training_graph
from tfpart.core.errors import PlacementError
from tfpart.core.plan import REDUCTIONS, Plan, Replicas, Stages


@dataclass(frozen=True)
class HybridOptions:
    """``batch_size``: the compile batch the shares are planned for; ``groups``: exactly
    this many replicas (None: each count from 2 to half the devices, by simulation);
    ``form``: ``"placement"`` (replicas of an op placement), ``"pipeline"`` (replicas
    of a pipeline) or None (the faster); ``greedy``: the options of the placement of
    the replicas; ``microbatches`` and ``schedule``: fix a replicated pipeline's
    micro-batches per replica and a training step's schedule; ``reduce``: a
    replicated pipeline's gradients reduced on the first replica's devices
    (``"one_device"``, as replicas of a placement always are) or all-reduced among a
    copy of the variables per replica (``"all_reduce"``); None: the faster."""

    batch_size: int = 1
    groups: int | None = None
    form: str | None = None
    greedy: GreedyOptions = field(default_factory=GreedyOptions)
    microbatches: int | None = None
    schedule: str | None = None
    reduce: str | None = None


FORMS = ("placement", "pipeline")


def partition(cost, options=HybridOptions()):
    """Replicas of an op placement (``plan.replicas`` with a ``placements`` entry per
    replica, and one stage of ``plan.microbatches``, one micro-batch per replica) or
    of a pipeline (``plan.stages``, and ``replicas.microbatches`` micro-batches per
    replica), whichever is predicted faster.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If the cluster has fewer than four devices, or no grouping can run every op
        within memory.
    """
    graph, n = cost.graph, len(cost.cluster)
    wanted = options.groups
    most = min(n // 2, options.batch_size)
    if most < 2 or (wanted is not None and not 2 <= wanted <= most):
        raise PlacementError("", f"cannot make {wanted or 2} replicas of two or more devices "
                             f"each from {n} devices and a batch of {options.batch_size}")
    if options.form not in (None, *FORMS):
        raise PlacementError("", f"form must be one of {', '.join(FORMS)}, not "
                             f"{options.form!r}")
    if options.reduce not in (None, *REDUCTIONS):
        raise PlacementError("", f"reduce must be one of {', '.join(REDUCTIONS)}, not "
                             f"{options.reduce!r}")
    if options.form == "placement" and options.reduce == "all_reduce":
        raise PlacementError("", "replicas of a placement reduce their gradients on one "
                             "device; all_reduce needs form=pipeline")
    shared = shared_ops(graph)
    pinned = pinned_ops(graph)

    def attempts():
        for k in [wanted] if wanted else range(2, most + 1):
            groups = _groups(cost, k)
            if options.form in (None, "placement") and options.reduce != "all_reduce":
                yield lambda groups=groups: _plan(cost, groups, pinned, shared, options)
            if options.form in (None, "pipeline"):
                size = min(len(group) for group in groups)  # the slowest extras left out
                yield lambda groups=groups: replicate_pipeline(
                    cost, [group[:size] for group in groups], options.batch_size, options,
                    options.microbatches, options.schedule,
                    [options.reduce] if options.reduce else REDUCTIONS)

    return fastest_plan(attempts(), PlacementError("", "no grouping of the devices fits "
                                                   "in memory"))


def _groups(cost, k):
    """``k`` groups of device indices in snake order of speed (time for every op)."""
    compute = np.where(np.isfinite(cost.compute), cost.compute, 0.0)
    runnable = np.isfinite(cost.compute).sum(axis=0)
    order = sorted(range(len(cost.cluster)), key=lambda d: (-runnable[d], compute[:, d].sum()))
    groups = [[] for _ in range(k)]
    for position, device in enumerate(order):
        lap, offset = divmod(position, k)
        groups[offset if lap % 2 == 0 else k - 1 - offset].append(device)
    return groups


def _plan(cost, groups, pinned, shared, options):
    """The plan of one replica per group: placed with equal shares, then with shares
    by each replica's simulated speed."""
    fractions = [1.0 / len(groups)] * len(groups)
    placed = _placed(cost, groups, fractions, pinned, options)
    finish = replica_finishes(*placed[:2], len(groups))
    shares = proportional_shares(options.batch_size,
                                 [f / t for f, t in zip(fractions, finish)])
    if min(shares) > 0 and shares != [options.batch_size // len(groups)] * len(groups):
        fractions = [share / options.batch_size for share in shares]
        placed = _placed(cost, groups, fractions, pinned, options)
    replicated_cost, device_of, home = placed
    names = cost.cluster.device_names
    where = dict(zip(replicated_cost.ops, (names[d] for d in device_of)))
    placements = [{op: where[f"rep{r}/{op}"] for op in cost.graph.ops
                   if op not in shared and op not in pinned} for r in range(len(groups))]
    plan = Plan(  # the assignment is the first replica's, as for replicas of a pipeline
        assignment={op: where.get(op) or placements[0].get(op) or names[home]
                    for op in cost.graph.ops}, algorithm="hybrid",
        stages=Stages({op: 0 for op in cost.graph.ops if op not in shared}, len(groups),
                      "gpipe" if is_training_graph(cost.graph) else None),
        replicas=Replicas(devices=[names[group[0]] for group in groups],
                          fractions=fractions, pinned=sorted(pinned), placements=placements))
    # Priced as built: the search kept every merge of the outputs on the home, but the
    # rewriter concatenates each output where the first replica computes it.
    built = expand(plan, cost)
    figures = make_plan(built.cost, built.device_of, "hybrid", options, built.priority)
    plan.options, plan.predicted, plan.lower_bound = \
        figures.options, figures.predicted, figures.lower_bound
    return plan


def _placed(cost, groups, fractions, pinned, options):
    """The replicated cost model (each replica's ops runnable on its group only, the
    shared and pinned ops on the home only), the greedy's placement of it, and the
    home's index."""
    home = groups[0][0]
    replicated_cost, _ = replicas_cost(cost, fractions, [g[0] for g in groups], pinned)
    allowed = np.zeros_like(replicated_cost.compute, dtype=bool)
    for i, op in enumerate(replicated_cost.ops):
        attrs = replicated_cost.graph.ops[op]
        if attrs.get("replica") is not None and attrs["origin"] not in pinned:
            allowed[i, groups[attrs["replica"]]] = True
        else:
            allowed[i, home] = True
    replicated_cost.compute[~allowed] = np.inf
    if not np.isfinite(replicated_cost.compute).any(axis=1).all():
        raise PlacementError("", "a group of devices cannot run every op")
    device_of, _ = greedy_placement(replicated_cost, options.greedy)
    return replicated_cost, device_of, home
