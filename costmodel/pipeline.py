"""Pipelined execution: op costs at a micro-batch, and a simulation of M micro-batches
flowing through stages.

A micro-batch of ``1/M`` of the batch does ``1/M`` of the arithmetic and moves ``1/M``
of the activations, but still reads every weight and still pays each op's fixed
launch overhead, so M micro-batches cost more than one batch; the pipeline wins back
the idle time of the other stages. :func:`microbatch_graph` scales a graph to a
micro-batch, and :func:`simulate_pipeline` runs the same event simulator as
single-batch plans on M copies of the ops, each stage taking the micro-batches in
order (fill–drain, the order the pipeline rewriter enforces with control edges).

Examples
--------
Two equal stages on two devices: four micro-batches take about (4 + 1) stage times
instead of 2 × 4.

>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> g = OpGraph()
>>> g.add_op("a", op_type="Relu", bytes_accessed=4e9)
>>> g.add_op("b", op_type="Relu", bytes_accessed=4e9)
>>> g.add_edge("a", "b", bytes=8)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> run = simulate_pipeline(g, cluster, {"a": 0, "b": 1}, {"a": 0, "b": 1}, 4)
>>> round(run.batch_time / run.first_result, 2), round(run.interval / run.first_result, 2)
(2.5, 0.5)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.roofline import CostModel
from costmodel.simulate import simulate
from tfpart.graph import OpGraph
from tfpart.ops import WEIGHT_OPS



def microbatch_graph(graph, microbatches):
    """A copy of ``graph`` costed for one of ``microbatches`` equal micro-batches.

    FLOPs and activation bytes shrink by the factor; bytes read from weights (inputs
    coming from variables and constants) do not. Explicit ``cost`` tables (imported
    graphs) are scaled as a whole; times from measured profiles keep their fixed per-op
    overhead and scale the rest (``batch_fraction``).
    """
    if microbatches == 1:
        return graph
    fraction = 1.0 / microbatches
    scaled = OpGraph()
    for name, attrs in graph.ops.items():
        weight_bytes = sum(edge["bytes"] for src, edge in graph.in_edges(name).items()
                           if graph.ops[src]["op_type"] in WEIGHT_OPS)
        weight_bytes = min(weight_bytes, attrs["bytes_accessed"])
        new = dict(attrs)
        new["batch_fraction"] = fraction  # measured profiles scale their full-batch times
        new["flops"] = attrs["flops"] * fraction
        new["bytes_accessed"] = weight_bytes + (attrs["bytes_accessed"] - weight_bytes) * fraction
        if attrs.get("cost") is not None:
            new["cost"] = {d: t * fraction for d, t in attrs["cost"].items()}
        scaled.add_op(name, **new)
    for src, dst, edge in graph.edges():
        is_weight = graph.ops[src]["op_type"] in WEIGHT_OPS
        comm = edge.get("comm")
        scaled.add_edge(src, dst, bytes=edge["bytes"] * (1.0 if is_weight else fraction),
                        control=edge["control"],
                        comm=None if comm is None else (np.asarray(comm) * fraction).tolist())
    return scaled


@dataclass
class PipelineRun:
    """Predicted figures of one batch run as ``microbatches`` micro-batches."""

    microbatches: int
    batch_time: float  # first input to last output of the whole batch
    first_result: float  # when micro-batch 0's outputs are all ready
    interval: float  # steady-state time between micro-batches leaving the pipeline
    busy: dict  # device name -> busy seconds over the batch

    @property
    def bubble_fraction(self):
        stages = max(1, len([b for b in self.busy.values() if b > 0]))
        return (stages - 1) / (self.microbatches + stages - 1)


def simulate_pipeline(graph, cluster, device_of, stage_of, microbatches, costs=None):
    """Simulate ``graph`` (costed at one micro-batch) run ``microbatches`` times through
    its stages. ``device_of`` and ``stage_of`` map op names to device indices and stage
    numbers; variables are shared by all micro-batches. ``costs`` is a CostModel whose
    measured profiles and precision policy apply (default: the roofline's, the
    cluster's)."""
    replicated, placement = _replicate(graph, cluster.device_names, device_of, stage_of,
                                       microbatches)
    cost = costs.of(replicated) if costs is not None else CostModel(replicated, cluster)
    schedule = simulate(cost, np.array([placement[op] for op in cost.ops]), memory=False)
    end = dict(zip(cost.ops, schedule.end))
    finish = [max((end[f"mb{m}/{op}"] for op in graph.ops if f"mb{m}/{op}" in end),
                  default=0.0) for m in range(microbatches)]
    interval = (finish[-1] - finish[0]) / (microbatches - 1) if microbatches > 1 else finish[0]
    return PipelineRun(microbatches=microbatches, batch_time=float(schedule.makespan),
                       first_result=float(finish[0]), interval=float(interval),
                       busy=dict(zip(cluster.device_names, map(float, schedule.busy))))


def _replicate(graph, cluster_names, device_of, stage_of, microbatches):
    """M copies of the ops (variables shared), with a barrier ordering each stage's
    sinks of micro-batch m - 1 before its sources of micro-batch m."""
    shared = {op for op, attrs in graph.ops.items()
              if attrs["op_type"] in ("VarHandleOp", "VariableV2")}

    def name(op, m):
        return op if op in shared else f"mb{m}/{op}"

    replicated, placement = OpGraph(), {}
    for op in shared:
        replicated.add_op(op, **graph.ops[op])
        placement[op] = device_of[op]
    for m in range(microbatches):
        for op, attrs in graph.ops.items():
            if op not in shared:
                replicated.add_op(name(op, m), **attrs)
                placement[name(op, m)] = device_of[op]
        for src, dst, edge in graph.edges():
            if dst in shared:
                continue
            replicated.add_edge(name(src, m), name(dst, m), bytes=edge["bytes"],
                                control=edge["control"], comm=edge.get("comm"))
    same_stage = {(u, v) for u, v, _ in graph.edges() if stage_of.get(u) == stage_of.get(v)}
    sinks = [op for op in graph.ops if op not in shared
             and not any((op, v) in same_stage for v in graph.successors(op))]
    sources = [op for op in graph.ops if op not in shared
               and not any((u, op) in same_stage for u in graph.predecessors(op)
                           if u not in shared)]
    zero = {d: 0.0 for d in cluster_names}
    stage_device = {stage_of[op]: device_of[op] for op in graph.ops if op in stage_of}
    for m in range(1, microbatches):
        for stage, device in sorted(stage_device.items()):
            barrier = f"mb{m}/stage{stage}-waits"
            replicated.add_op(barrier, op_type="NoOp", cost=zero)
            placement[barrier] = device
            for op in sinks:
                if stage_of.get(op) == stage:
                    replicated.add_edge(name(op, m - 1), barrier, control=True)
            for op in sources:
                if stage_of.get(op) == stage:
                    replicated.add_edge(barrier, name(op, m), control=True)
    return replicated, placement
