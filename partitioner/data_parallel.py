"""Data-parallel replicas with shares of the batch in proportion to device speed.

Every replica runs the whole per-sample graph (a training step's forward and backward
ops) on its share of the batch; a device's speed is the inverse of the time it takes
for the whole graph, and shares are the largest-remainder split of the batch
(:mod:`partitioner.shares`), as in the load balancing of Moreno-Álvarez et al. The
gradients are reduced one of two ways, whichever the simulation predicts faster
(``DataParallelOptions.reduce`` forces one):

- ``one_device``: the variables live on one device, the home (the fastest
  replica's); there the ops that read a variable's resource run for every replica
  (TensorFlow runs them where the variable is), the replicas' gradients are summed,
  each weighted by its share of the batch, and the optimizer's update runs once.
  Every step sends the weights out and the gradients back.
- ``all_reduce``: every replica keeps a copy of the variables (and optimizer slots) on
  its device; the weighted gradients are all-reduced with TensorFlow's collective
  ops, as ``MultiWorkerMirroredStrategy`` does, and the update runs on every copy,
  which stay equal. A ring sends each device ``2 (k - 1) / k`` of the gradients,
  and no weights, but every device holds the variables and runs the update.

The replicas are the k fastest devices that can run every op, for the k whose
simulated step (every replica's ops costed at its share, the weights sent to the
replicas, the gradients sent back, :func:`costmodel.pipeline.replicas_graph`, or
all-reduced, :func:`costmodel.pipeline.all_reduce_replicas_graph`) is
least within memory; a device whose share would be empty, or that only slows the
step, takes no part. The plan is a one-stage pipeline whose micro-batch ``r`` runs on
``replicas.devices[r]`` (the pipeline rewriter builds it).

References
----------
Moreno-Álvarez, Haut, Paoletti, Rico-Gallego, Díaz-Martín, Plaza. "Training deep neural
networks: a static load balancing approach", Neurocomputing, 2021.

Examples
--------
A matmul on a V100 and a T4 (about twice slower): the V100 takes two thirds of the
batch; beside an A100 the T4 would only slow the step and takes no part.

>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> g.add_op("y", op_type="MatMul", flops=3e12, input_shapes=[(6, 10)])
>>> g.add_edge("x", "y", bytes=240)
>>> plan = partition(CostModel(g, cluster_of_devices(["V100", "T4"])),
...                  DataParallelOptions(batch_size=6))
>>> [round(f, 3) for f in plan.replicas.fractions], plan.microbatches
([0.667, 0.333], 2)
>>> plan = partition(CostModel(g, cluster_of_devices(["A100-40GB", "T4"])),
...                  DataParallelOptions(batch_size=6))
>>> plan.replicas.fractions
(1.0,)
>>> print(plan.replicas.why_one_replica)
the next fastest device, /job:localhost/replica:0/task:0/device:CPU:1, is too slow to get a sample of the batch of 6
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel.pipeline import pinned_ops, replicas_cost, shared_ops, table_ops
from costmodel.simulate import start_first_priority
from partitioner.finish import fastest_plan, make_plan
from partitioner.shares import proportional_shares
from partitioner.training_stages import is_training_graph
from partitioner.validate import kernel_problem
from tfpart.core.errors import PlacementError
from tfpart.core.plan import REDUCTIONS, Plan, Replicas, Stages


@dataclass(frozen=True)
class DataParallelOptions:
    """``batch_size``: the compile batch the shares are planned for; ``replicas``:
    exactly this many (the fastest devices; None: as many as help, by simulation);
    ``reduce``: ``"one_device"`` (one copy of the variables, the gradients summed on
    its device), ``"all_reduce"`` (a copy per replica, the gradients all-reduced with
    collective ops) or None (whichever is predicted faster)."""

    batch_size: int = 1
    replicas: int | None = None
    reduce: str | None = None


def partition(cost, options=DataParallelOptions()):
    """A data-parallel plan: ``plan.replicas`` and one stage of ``plan.microbatches``
    (one micro-batch per replica).

    Raises
    ------
    tfpart.core.errors.PlacementError
        If no device can run every op, or no split of the batch fits in memory.
    """
    graph = cost.graph
    shared = shared_ops(graph)
    pinned = pinned_ops(graph)
    per_replica = [cost.index[op] for op in graph.ops if op not in shared]
    everything = np.isfinite(cost.compute).all(axis=0)
    time_on = cost.compute[per_replica].sum(axis=0)
    eligible = [int(d) for d in np.argsort(time_on, kind="stable") if everything[d]]
    if not eligible:
        raise PlacementError("", kernel_problem(cost) or "no device can run every op, "
                             "so no device can hold a replica")
    wanted = options.replicas
    if wanted is not None and not 1 <= wanted <= min(len(eligible), options.batch_size):
        raise PlacementError("", f"cannot make {wanted} replicas: {len(eligible)} devices "
                             f"can run every op, and the batch has {options.batch_size} "
                             "samples")
    counts = [wanted] if wanted else range(1, min(len(eligible), options.batch_size) + 1)
    if options.reduce not in (None, *REDUCTIONS):
        raise PlacementError("", f"reduce must be one of {', '.join(REDUCTIONS)}, not "
                             f"{options.reduce!r}")

    outcomes = {}  # replica count -> the least step of its plans, or why it has none

    def attempts():
        for k in counts:
            devices = eligible[:k]
            shares = proportional_shares(options.batch_size, 1.0 / time_on[devices])
            if min(shares) == 0 and not wanted:
                # the slowest would get no sample, and slower ones after it neither
                slowest = cost.cluster.device_names[devices[-1]]
                outcomes[k] = (f"the next fastest device, {slowest}, is too slow to get a "
                               f"sample of the batch of {options.batch_size}")
                return
            shares = [max(share, 1) for share in shares]  # asked for: each gets a sample
            for reduce in [options.reduce] if options.reduce else REDUCTIONS:
                if k > 1 or reduce == "one_device":
                    yield _noting(outcomes, k, lambda devices=devices, shares=shares,
                                  reduce=reduce: _plan(cost, devices, shares, pinned, shared,
                                                       options, reduce))

    plan = fastest_plan(attempts(), PlacementError("", "no replica fits in memory"))
    if len(plan.replicas.devices) == 1:
        plan.replicas = replace(plan.replicas, why_one_replica=why_one_replica(
            cost, eligible, options, outcomes.get(2), plan.step_time))
    return plan


def _noting(outcomes, count, attempt):
    """``attempt`` (a plan of ``count`` replicas), noting in ``outcomes[count]`` the
    least step of the plans made, or while none was made why the first failed."""
    def run():
        try:
            plan = attempt()
        except PlacementError as exc:
            outcomes.setdefault(count, f"{count} replicas cannot be placed: {exc.problem}")
            raise
        if not isinstance(outcomes.get(count), float) or plan.step_time < outcomes[count]:
            outcomes[count] = plan.step_time
        return plan
    return run


def why_one_replica(cost, eligible, options, two, step):
    """Why a data-parallel plan of ``cost`` has one replica. ``eligible``: the devices
    that can run every op, fastest first; ``two``: the predicted step of two replicas,
    or why they have no plan (None: not tried); ``step``: the plan's step.

    >>> g = OpGraph()
    >>> g.add_op("x", op_type="Placeholder")
    >>> g.add_op("y", op_type="MatMul", flops=3e12, input_shapes=[(6, 10)])
    >>> cost = CostModel(g, cluster_of_devices(["V100", "T4"]))
    >>> why_one_replica(cost, [0, 1], DataParallelOptions(batch_size=1), None, 0.1)
    'the batch has one sample'
    >>> why_one_replica(cost, [0, 1], DataParallelOptions(batch_size=8), 0.2, 0.1)
    '2 replicas are predicted slower (200.000 ms a step against 100.000 ms)'
    """
    names = cost.cluster.device_names
    if options.replicas == 1:
        return "one was asked for (replicas=1)"
    if len(names) == 1:
        return "the cluster has one device"
    if len(eligible) == 1:
        return _no_other_device(cost, eligible[0])
    if options.batch_size == 1:
        return "the batch has one sample"
    if isinstance(two, str):
        return two
    if two is not None:
        return f"2 replicas are predicted slower ({two * 1e3:.3f} ms a step against " \
               f"{step * 1e3:.3f} ms)"
    return "no second replica was tried"


def _no_other_device(cost, only):
    """Why no device but ``only`` can hold a replica: an op another device cannot run."""
    graph, names = cost.graph, cost.cluster.device_names
    other = next(d for d in range(len(names)) if d != only)
    op = next(op for op in cost.ops if not np.isfinite(cost.compute[cost.index[op], other]))
    return (f"no other device can run every op ({names[other]} has no kernel for {op}, "
            f"{graph.ops[op]['op_type']})")


def _plan(cost, devices, shares, pinned, shared, options, reduce):
    """The plan of replicas on ``devices`` (device indices, the home first) with
    ``shares`` of the batch and the gradients reduced by ``reduce``, checked and
    simulated on the replicated graph."""
    graph, cluster = cost.graph, cost.cluster
    names = cluster.device_names
    total = sum(shares)
    fractions = [share / total for share in shares]
    all_reduce = reduce == "all_reduce"
    replicated_cost, device_of = replicas_cost(cost, fractions, devices, pinned,
                                               all_reduce=all_reduce)
    figures = make_plan(replicated_cost, device_of, "data_parallel", options,
                        start_first_priority(replicated_cost))
    home = names[devices[0]]
    return Plan(
        assignment={op: home for op in graph.ops}, algorithm="data_parallel",
        options=figures.options,
        stages=Stages({op: 0 for op in graph.ops if op not in shared}, len(devices),
                      "gpipe" if is_training_graph(graph) else None),
        replicas=Replicas(devices=[names[d] for d in devices], fractions=fractions,
                          pinned=sorted((table_ops(graph) - shared) if all_reduce else pinned),
                          reduce=reduce),
        predicted=figures.predicted, lower_bound=figures.lower_bound)
