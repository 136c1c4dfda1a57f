"""One expansion of any plan: what it runs, op by op, and that run simulated.

:func:`expand` gives the execution graph of a plan, whatever its strategy. A
placement's graph is the model's own. Filter splits add each op's slices and their
concatenation (:mod:`costmodel.splits`). Stages run every micro-batch's copy of their
ops (:func:`costmodel.pipeline.pipeline_graph`). Replicas copy the ops once per
replica, with the reduction of their gradients
(:func:`costmodel.pipeline.plan_replicas_cost`). Every copy says what it computes in
its attributes (``origin``, ``replica``, ``microbatch``), the keys the rewriter stamps
on the ops it builds (:mod:`rewriters.copies`).

:func:`simulate_execution` simulates that graph. It is the one way to price a plan
after it is made: ``tfpart simulate``, the report's Gantt chart and the notebooks call
it, and none of them asks which strategy made the plan.

Examples
--------
Two replicas of a two-op model, each on its own device, each with half the batch:

>>> from tfpart.core.graph import OpGraph
>>> from tfpart.core.cluster import cluster_of_devices
>>> from tfpart.core.plan import Plan, Replicas, Stages
>>> from costmodel.roofline import CostModel
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder", shape=(8, 4))
>>> g.add_op("y", op_type="Relu", shape=(8, 4), bytes_accessed=4e9, batch_dim=0)
>>> g.add_edge("x", "y", bytes=128)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> a, b = cluster.device_names
>>> plan = Plan(assignment={"x": a, "y": a}, stages=Stages({"x": 0, "y": 0}, 2),
...             replicas=Replicas(devices=[a, b], fractions=[0.5, 0.5]))
>>> run = simulate_execution(plan, CostModel(g, cluster))
>>> sorted(op for op in run.cost.ops if op.startswith("rep"))
['rep0/x', 'rep0/y', 'rep1/x', 'rep1/y']
>>> whole = simulate_execution(Plan(assignment={"x": a, "y": a}), CostModel(g, cluster))
>>> round(whole.step_time / run.step_time, 1)
2.0
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.pipeline import (bubble_fraction, chunks_per_device, microbatch_ends,
                                microbatch_graph, pipeline_graph, plan_replicas_cost)
from costmodel.roofline import CostModel
from costmodel.simulate import Schedule, placed_cost, simulate, start_first_priority


@dataclass(frozen=True)
class Expansion:
    """The execution graph of a plan, as a cost model, with where each of its ops runs
    and the simulator's priority (None: the default, upward rank)."""

    cost: CostModel
    device_of: np.ndarray
    priority: np.ndarray | None = None

    def where(self):
        """Each op of the execution graph -> its device index."""
        return dict(zip(self.cost.ops, map(int, self.device_of)))


def expand(plan, cost):
    """The :class:`Expansion` of ``plan`` (device names) over ``cost`` (the model's
    graph on the cluster; for a pipeline, costed at the whole batch).

    Replicas are simulated with their variable reads first
    (:func:`~costmodel.simulate.start_first_priority`), as their partitioners priced
    them; a replica of a pipeline, like a pipeline, by upward rank.
    """
    if plan.replicas:
        replicated, device_of = plan_replicas_cost(cost, plan)
        priority = None if plan.replicas.microbatches else start_first_priority(replicated)
        return Expansion(replicated, device_of, priority)
    if plan.stages:
        names = cost.cluster.device_names
        index = {name: d for d, name in enumerate(names)}
        graph, where = pipeline_graph(
            microbatch_graph(cost.graph, plan.microbatches), names,
            {op: index[d] for op, d in plan.assignment.items()}, plan.stages,
            plan.microbatches, plan.schedule or "gpipe")
        expanded = cost.of(graph)
        return Expansion(expanded, np.array([where[op] for op in expanded.ops]))
    return Expansion(*placed_cost(plan, cost))


@dataclass(frozen=True)
class PlanRun:
    """A plan's simulated step: the schedule of its execution graph (``cost``), and
    when each micro-batch's last op finished (empty for a step of one batch)."""

    schedule: Schedule
    cost: CostModel
    microbatch_ends: tuple = ()
    order: str = "gpipe"  # the pipeline schedule (costmodel.schedules) and its stages
    chunks: int = 1  # per device, for the bubble

    @property
    def step_time(self):
        """First input to last output of the whole step (all micro-batches)."""
        return float(self.schedule.makespan)

    @property
    def first_result(self):
        """When micro-batch 0's outputs are all ready."""
        return self.microbatch_ends[0] if self.microbatch_ends else self.step_time

    @property
    def interval(self):
        """Steady-state time between micro-batches leaving the pipeline."""
        ends = self.microbatch_ends
        if len(ends) < 2:
            return self.step_time
        return (ends[-1] - ends[0]) / (len(ends) - 1)

    @property
    def bubble_fraction(self):
        """The idle share of the plan's pipeline schedule over its busy devices."""
        if not self.microbatch_ends:
            return 0.0
        return bubble_fraction((self.schedule.busy > 0).sum(), len(self.microbatch_ends),
                               self.order, self.chunks)


def simulate_execution(plan, cost):
    """Simulate :func:`expand` of ``plan``; a :class:`PlanRun`."""
    expansion = expand(plan, cost)
    schedule = simulate(expansion.cost, expansion.device_of, expansion.priority)
    ends = microbatch_ends(expansion.cost, schedule)
    return PlanRun(schedule, expansion.cost,
                   tuple(ends[m] for m in sorted(ends)) if len(ends) > 1 else (),
                   plan.schedule or "gpipe",
                   chunks_per_device(plan.stages or {}, plan.assignment))
