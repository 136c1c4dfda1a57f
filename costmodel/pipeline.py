"""Pipelined execution: op costs at a micro-batch, and a simulation of M micro-batches
flowing through stages.

A micro-batch of ``1/M`` of the batch does ``1/M`` of the arithmetic and moves ``1/M``
of the activations, but still reads every weight and still pays each op's fixed
launch overhead, so M micro-batches cost more than one batch; the pipeline wins back
the idle time of the other stages. :func:`microbatch_graph` scales a graph to a
micro-batch, and :func:`simulate_pipeline` runs the same event simulator as
single-batch plans on M copies of the ops, each stage (or device) taking its tasks in
the order of the schedule's task table (:mod:`costmodel.schedules`; fill–drain by
default), the order the pipeline rewriter enforces with control edges.

Every copy of an op in these execution graphs says what it is in its attributes, never
only in its name: ``origin`` (the op it copies), ``replica`` and ``microbatch`` (None
where it is not one of several); the shared ops (variables, a training step's update)
and the ops that feed and merge the batch carry none (:func:`copy_attrs`).

Examples
--------
Two equal stages on two devices: four micro-batches take about (4 + 1) stage times
instead of 2 × 4.

>>> from tfpart.core.graph import OpGraph
>>> from tfpart.core.cluster import cluster_of_devices
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

import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from costmodel.lowering import lower
from costmodel.roofline import CostModel
from costmodel.schedules import SCHEDULES, bubble, table  # SCHEDULES: read from here too
from costmodel.schedules import in_flight as schedule_in_flight
from costmodel.simulate import simulate
from tfpart.core.dtypes import tensor_bytes
from tfpart.core.graph import OpGraph
from tfpart.core.ops import STATE_OPS, TABLE_CREATORS, WEIGHT_OPS
from tfpart.core.plan import all_reduces, device_stand_ins, replica_device



def copy_attrs(attrs, origin, replica=None, microbatch=None, **changed):
    """The attributes of a copy of op ``origin`` (its ``attrs``) run for ``replica``
    and ``microbatch``, with ``changed`` ones.

    >>> copy_attrs({"op_type": "Relu"}, "y", replica=1, microbatch=0)
    {'op_type': 'Relu', 'origin': 'y', 'replica': 1, 'microbatch': 0}
    """
    return {**attrs, "origin": origin, "replica": replica, "microbatch": microbatch,
            **changed}


def task_order(schedule, stage, stages, microbatches):
    """The order in which pipeline stage ``stage`` of ``stages``, one per device, runs
    its tasks: ``(micro-batch, "forward" | "backward")`` pairs, from ``schedule``'s
    task table (:mod:`costmodel.schedules`).

    ``gpipe`` (fill–drain) runs every micro-batch's forward, then every backward;
    activations of all M micro-batches are held at once. ``1f1b`` (PipeDream-Flush)
    runs ``stages - stage - 1`` forwards to fill the pipeline, then alternates one
    forward and one backward, then drains the backwards: a stage holds the
    activations of at most ``stages - stage`` micro-batches. Both update the weights
    once, after the last backward.

    >>> task_order("1f1b", 0, 2, 3)
    [(0, 'forward'), (1, 'forward'), (0, 'backward'), (2, 'forward'), (1, 'backward'), (2, 'backward')]
    >>> task_order("gpipe", 1, 2, 2)
    [(0, 'forward'), (1, 'forward'), (0, 'backward'), (1, 'backward')]
    """
    lanes = table({k: k for k in range(stages)}, microbatches, schedule)
    return [(m, phase) for lane in lanes for m, k, phase in lane if k == stage]


def in_flight(schedule, stage, stages, microbatches):
    """Most micro-batches whose activations stage ``stage`` of ``stages``, one per
    device, holds at once.

    >>> [in_flight("1f1b", k, 4, 8) for k in range(4)], in_flight("gpipe", 0, 4, 8)
    ([4, 3, 2, 1], 8)
    """
    return schedule_in_flight({k: k for k in range(stages)}, microbatches, schedule)[stage]


def microbatch_graph(graph, microbatches):
    """A copy of ``graph`` costed for one of ``microbatches`` equal micro-batches.

    FLOPs and activation bytes shrink by the factor; bytes read from weights (inputs
    coming from variables and constants) do not. Explicit ``cost`` tables (imported
    graphs) are scaled as a whole; times from measured profiles keep their fixed per-op
    overhead and scale the rest (``batch_fraction``). A training step's update ops run
    once per step on whole gradients, so neither they nor the gradients they read
    shrink.
    """
    return graph if microbatches == 1 else scaled_graph(graph, 1.0 / microbatches)


def _batched(graph, op):
    """Whether ``op``'s outputs hold a part of the batch: it is not a weight, nor a
    gradient an update op reads, and some data input is not a weight (weights and what
    is computed from them alone, e.g. a cast of a variable, are whole in every
    micro-batch)."""
    if graph.ops[op]["op_type"] in WEIGHT_OPS or any(
            graph.ops[dst].get("phase") == "update" for dst in graph.successors(op)):
        return False
    sources = [src for src, edge in graph.in_edges(op).items() if not edge["control"]]
    return not sources or any(graph.ops[src]["op_type"] not in WEIGHT_OPS for src in sources)


def scaled_graph(graph, fraction):
    """A copy of ``graph`` costed for ``fraction`` of its batch (see
    :func:`microbatch_graph`, which is this for ``1 / microbatches``)."""
    scaled = OpGraph()
    for name, attrs in graph.ops.items():
        if attrs.get("phase") == "update":
            scaled.add_op(name, **attrs)
            continue
        weight_bytes = sum(edge["bytes"] for src, edge in graph.in_edges(name).items()
                           if graph.ops[src]["op_type"] in WEIGHT_OPS)
        weight_bytes = min(weight_bytes, attrs["bytes_accessed"])
        new = dict(attrs)
        new["batch_fraction"] = fraction  # measured profiles scale their full-batch times
        if _batched(graph, name):
            new["memory_fraction"] = fraction
        new["flops"] = attrs["flops"] * fraction
        new["bytes_accessed"] = weight_bytes + (attrs["bytes_accessed"] - weight_bytes) * fraction
        if attrs.get("cost") is not None:
            new["cost"] = {d: t * fraction for d, t in attrs["cost"].items()}
        scaled.add_op(name, **new)
    for src, dst, edge in graph.edges():
        whole = graph.ops[src]["op_type"] in WEIGHT_OPS or graph.ops[dst].get("phase") == "update"
        comm = edge.get("comm")
        scaled.add_edge(src, dst, bytes=edge["bytes"] * (1.0 if whole else fraction),
                        control=edge["control"],
                        comm=None if comm is None or whole else (np.asarray(comm) * fraction).tolist())
    return scaled


@dataclass
class PipelineRun:
    """Predicted figures of one batch run as ``microbatches`` micro-batches."""

    microbatches: int
    batch_time: float  # first input to last output of the whole batch
    first_result: float  # when micro-batch 0's outputs are all ready
    interval: float  # steady-state time between micro-batches leaving the pipeline
    busy: dict  # device name -> busy seconds over the batch
    links: dict = field(default_factory=dict)  # "src -> dst" -> bytes over the batch
    transfers: int = 0  # tensors copied between devices over the batch
    cross_host_transfers: int = 0  # of which between hosts
    peak_memory: dict | None = None  # device name -> live-range peak bytes, if asked
    schedule: str = "gpipe"
    chunks: int = 1  # stages per busy device

    @property
    def bubble_fraction(self):
        return bubble_fraction(sum(b > 0 for b in self.busy.values()), self.microbatches,
                               self.schedule, self.chunks)


def bubble_fraction(busy_devices, microbatches, schedule="gpipe", chunks=1):
    """The idle share of ``schedule``'s pipeline of ``microbatches`` over
    ``busy_devices`` (at least one), each holding ``chunks`` stages
    (:mod:`costmodel.schedules`).

    >>> bubble_fraction(3, 8), bubble_fraction(3, 8, "interleaved", 2)
    (0.2, 0.1111111111111111)
    """
    return bubble(schedule, busy_devices, chunks, microbatches)


def chunks_per_device(stage_of, device_of):
    """How many stages the busiest device holds (1 without stages).

    >>> chunks_per_device({"a": 0, "b": 1, "c": 2}, {"a": 0, "b": 1, "c": 0})
    2
    """
    stages = {}
    for op, stage in stage_of.items():
        if op in device_of:
            stages.setdefault(device_of[op], set()).add(stage)
    return max(map(len, stages.values()), default=1)


def microbatch_ends(cost, schedule):
    """When the last copy of each micro-batch finished in ``schedule`` (of ``cost``'s
    ops), by each copy's ``microbatch`` attribute: micro-batch -> seconds."""
    ends = {}
    for op, end in zip(cost.ops, schedule.end):
        microbatch = cost.graph.ops[op].get("microbatch")
        if microbatch is not None:
            ends[microbatch] = max(ends.get(microbatch, 0.0), float(end))
    return ends


def simulate_pipeline(graph, cluster, device_of, stage_of, microbatches, costs=None,
                      schedule="gpipe", memory=False):
    """Simulate ``graph`` (costed at one micro-batch) run ``microbatches`` times through
    its stages. ``device_of`` and ``stage_of`` map op names to device indices and stage
    numbers; variables are shared by all micro-batches, and so are a training step's
    update ops, which run once after every micro-batch's backward pass. Each stage runs
    its forward and backward tasks in the order of ``schedule``'s task table
    (:mod:`costmodel.schedules`).
    ``costs`` is a CostModel whose measured profiles and precision policy apply
    (default: the roofline's, the cluster's). With ``memory``, the run's
    ``peak_memory`` is each device's live-range peak over the batch: every micro-batch's
    tensors alive as the schedule interleaves them, each gradient kept until it is
    summed for the update (:func:`pipeline_graph`)."""
    names, order = cluster.device_names, schedule
    replicated, placement = pipeline_graph(graph, names, device_of, stage_of, microbatches,
                                           schedule)
    cost = costs.of(replicated) if costs is not None else CostModel(replicated, cluster)
    schedule = simulate(cost, np.array([placement[op] for op in cost.ops]), memory=memory)
    ends = microbatch_ends(cost, schedule)
    finish = [ends.get(m, 0.0) for m in range(microbatches)]
    if not np.isfinite(finish[-1]):  # an op on a device without its kernel: never done
        interval = np.inf
    else:
        interval = (finish[-1] - finish[0]) / (microbatches - 1) if microbatches > 1 \
            else finish[0]
    return PipelineRun(microbatches=microbatches, batch_time=float(schedule.makespan),
                       first_result=float(finish[0]), interval=float(interval),
                       busy=dict(zip(cluster.device_names, map(float, schedule.busy))),
                       links={f"{names[a]} -> {names[b]}": float(n)
                              for (a, b), n in sorted(schedule.link_bytes.items())},
                       transfers=len(schedule.transfers),
                       cross_host_transfers=sum(
                           cluster.devices[src].host != cluster.devices[dst].host
                           for _, src, dst, _, _ in schedule.transfers),
                       peak_memory=dict(zip(names, map(float, schedule.peak_memory)))
                       if memory else None,
                       schedule=order, chunks=chunks_per_device(stage_of, device_of))


def pipeline_graph(graph, cluster_names, device_of, stage_of, microbatches,
                   schedule="gpipe"):
    """The execution graph of a pipeline, as the rewriter builds it: ``microbatches``
    copies of ``graph``'s per-micro-batch ops (``mb<m>/<op>``, :func:`_replicate`), the
    batch fed and the outputs merged (:func:`feed_microbatches`) and what the update
    reads accumulated (:func:`accumulate_for_update`). Returns it and the device index
    of each of its ops."""
    replicated, placement = _replicate(graph, cluster_names, device_of, stage_of,
                                       microbatches, schedule)
    feed_microbatches(replicated, placement, graph, microbatches)
    if microbatches > 1:
        accumulate_for_update(replicated, placement, graph,
                              lambda op: [f"mb{m}/{op}" for m in range(microbatches)],
                              device_of.get)
    return replicated, placement


def _phase(attrs):
    return attrs.get("phase") or "forward"


def shared_ops(graph):
    """The ops every micro-batch or replica shares: the variables, the tables and a
    training step's update ops (which run once, on the whole batch's gradients)."""
    return {op for op, attrs in graph.ops.items()
            if attrs["op_type"] in STATE_OPS or _phase(attrs) == "update"}


def table_ops(graph):
    """The ops colocated with a table (the table, its lookups): one table serves every
    replica, even replicas that keep their own copy of the variables, so these run
    where it is.

    >>> g = OpGraph()
    >>> g.add_op("table", op_type="HashTableV2"); g.add_op("find", colocation="table")
    >>> g.add_op("w", op_type="VarHandleOp"); g.add_op("read", colocation="w")
    >>> sorted(table_ops(g))
    ['find', 'table']
    """
    tables = {attrs["colocation"] for attrs in graph.ops.values()
              if attrs["op_type"] in TABLE_CREATORS}
    return {op for op, attrs in graph.ops.items() if attrs["colocation"] in tables}


def pinned_ops(graph):
    """The per-replica ops that run where the variables are: those colocated with a
    shared op (a variable's readers, which TensorFlow runs beside the variable)."""
    shared = shared_ops(graph)
    groups = {graph.ops[op]["colocation"] for op in shared}
    return {op for op, attrs in graph.ops.items()
            if op not in shared and attrs["colocation"] in groups}


def _replicate(graph, cluster_names, device_of, stage_of, microbatches, schedule,
               into=None, prefix="", reduced=None, replica=None, step=None, pieces=None):
    """M copies of the per-micro-batch ops (variables and update ops shared), with a
    barrier for each ordering edge of the step's lowering (:mod:`costmodel.lowering`:
    consecutive tasks of a lane of the schedule's task table): the sinks of one task
    before the sources of the next. With ``into`` (a graph and
    placement from an earlier call), the copies, named ``<prefix>mb<m>/<op>``, are
    added to it, sharing its variables and update ops: a replica of the pipeline;
    with ``reduced`` too (the ops whose results the replicas all-reduce), the replica
    has its own variables and update ops, ``<prefix><op>``, and the caller connects
    the ``reduced`` ops to them. The copies are of ``replica`` (:func:`copy_attrs`),
    whose tasks ``step`` lowers (by default, a lowering of this pipeline alone);
    ``pieces``: :func:`_pieces` of ``graph``, if the caller has them."""
    shared = shared_ops(graph)
    own = reduced is not None
    piece, sinks, sources = pieces or _pieces(graph, stage_of, shared)
    if step is None:
        step = lower(_stage_devices(piece, stage_of, device_of), set(sources), microbatches,
                     schedule)
    first_microbatch = step.lanes[replica or 0][0]

    def name(op, m):
        if op in shared:
            return f"{prefix}{op}" if own else op
        return f"{prefix}mb{m}/{op}"

    replicated, placement = into or (OpGraph(), {})
    first = into is None or own
    for op in [op for op in graph.ops if op in shared and first]:  # graph order
        attrs = graph.ops[op]
        replicated.add_op(name(op, 0), **copy_attrs(
            attrs, op, replica, colocation=f"{prefix}{attrs['colocation']}") if own else attrs)
        placement[name(op, 0)] = device_of[op]
    for m in range(microbatches):
        for op, attrs in graph.ops.items():
            if op not in shared:
                replicated.add_op(name(op, m), **copy_attrs(attrs, op, replica, m))
                placement[name(op, m)] = device_of[op]
        for src, dst, edge in graph.edges():
            if src in shared and dst in shared and (m or not first) \
                    or dst in shared and src in (reduced or ()):
                continue
            replicated.add_edge(name(src, m), name(dst, m), bytes=edge["bytes"],
                                control=edge["control"], comm=edge.get("comm"))
    zero = {d: 0.0 for d in cluster_names}
    for earlier, later in step.ordering:
        if later.replica != replica:
            continue
        m0 = earlier.step_microbatch - first_microbatch
        m1 = later.step_microbatch - first_microbatch
        barrier = f"{prefix}mb{m1}/stage{later.stage}-{later.phase}-waits"
        replicated.add_op(barrier, op_type="NoOp", cost=zero)
        placement[barrier] = later.device
        for op in sinks[earlier.piece]:
            replicated.add_edge(name(op, m0), barrier, control=True)
        for op in sources[later.piece]:
            replicated.add_edge(barrier, name(op, m1), control=True)
    return replicated, placement


def _pieces(graph, stage_of, shared):
    """The piece ``(stage, phase)`` of each per-micro-batch op of ``graph`` (not one of
    the ``shared``), and each piece's sinks and sources: its ops no op of the piece
    reads, and those that read no op of it."""
    piece = {op: (stage_of.get(op), _phase(graph.ops[op])) for op in graph.ops if op not in shared}
    same_piece = {(u, v) for u, v, _ in graph.edges()
                  if u != v and u in piece and v in piece and piece[u] == piece[v]}
    sinks, sources = {}, {}
    for op, key in piece.items():
        if not any((op, v) in same_piece for v in graph.successors(op)):
            sinks.setdefault(key, []).append(op)
        if not any((u, op) in same_piece for u in graph.predecessors(op)):
            sources.setdefault(key, []).append(op)
    return piece, sinks, sources


def _stage_devices(piece, stage_of, device_of):
    """Each stage's device: where most of its per-micro-batch ops (of ``piece``) run (a
    replica's variable reads run on the first replica's devices: not its stage's)."""
    counts = Counter((stage_of[op], device_of[op]) for op in piece if op in stage_of)
    return {stage: device for (stage, device), _ in counts.most_common()[::-1]}


def accumulate_for_update(replicated, placement, graph, copies, home):
    """Feed a training step's update as the rewriter does: what the update reads from
    the per-micro-batch ops is, for a float tensor computed from the batch (a
    gradient, the loss), the sum of its copies (``copies(op)``, every replica's and
    micro-batch's), made by an op ``accumulate/<op>`` on ``home(op)`` and sent on
    once; for any other (a weight's read, a shape), the first copy's value.

    >>> g = OpGraph()
    >>> g.add_op("x", op_type="Placeholder", outputs=[((8, 4), "float32")])
    >>> g.add_op("grad", op_type="MatMul", phase="backward", outputs=[((4, 4), "float32")])
    >>> g.add_op("apply", op_type="AssignSubVariableOp", phase="update")
    >>> g.add_edge("x", "grad", bytes=128); g.add_edge("grad", "apply", bytes=64)
    >>> replicated, where = _replicate(g, ["d0", "d1"], {"x": 0, "grad": 0, "apply": 1},
    ...                                {"x": 0, "grad": 0}, 2, "gpipe")
    >>> accumulate_for_update(replicated, where, g,
    ...                       lambda op: [f"mb{m}/{op}" for m in range(2)], lambda op: 0)
    >>> sorted(replicated.predecessors("apply")), where["accumulate/grad"]
    (['accumulate/grad'], 0)
    >>> replicated.edge("accumulate/grad", "apply")["bytes"]
    64.0
    """
    update = {op for op, attrs in graph.ops.items() if attrs.get("phase") == "update"}
    if not update:
        return
    shared, from_batch = shared_ops(graph), _computed_from_batch(graph)
    for src, dst, edge in list(graph.edges()):
        if dst not in update or src in shared or edge["control"]:
            continue
        made = copies(src)
        for copy in made:
            if replicated.nx_graph.has_edge(copy, dst):
                replicated.nx_graph.remove_edge(copy, dst)
        outputs = graph.ops[src]["outputs"]  # none known (a synthetic graph): a gradient
        floating = not outputs or any("float" in str(dtype) for _, dtype in outputs)
        if src not in from_batch or not floating:
            replicated.add_edge(made[0], dst, bytes=edge["bytes"])
            continue
        total = f"accumulate/{src}"
        if total not in replicated:
            replicated.add_op(total, op_type="AddN", colocation=total,
                              flops=edge["bytes"] / 4 * len(made),
                              bytes_accessed=edge["bytes"] * (len(made) + 1),
                              outputs=graph.ops[src]["outputs"])
            placement[total] = home(src)
            for copy in made:
                replicated.add_edge(copy, total, bytes=edge["bytes"])
        replicated.add_edge(total, dst, bytes=edge["bytes"])


INPUT_OPS = {"Placeholder", "PlaceholderWithDefault"}


def _computed_from_batch(graph):
    """The ops a data path leads to from an input op (the inputs included)."""
    found, frontier = set(), [op for op in graph.ops if _is_input(graph, op)]
    while frontier:
        op = frontier.pop()
        if op not in found:
            found.add(op)
            frontier += [dst for dst in graph.successors(op)
                         if not graph.edge(op, dst)["control"]]
    return found


def _is_input(graph, op):
    """Whether ``op`` takes the client's batch: a placeholder that reads nothing."""
    return graph.ops[op]["op_type"] in INPUT_OPS and not list(graph.predecessors(op))


def feed_microbatches(replicated, placement, graph, microbatches):
    """Feed the micro-batches of a pipeline as the rewriter does: the whole batch of
    each input op of ``graph`` arrives where its first copy runs, as an op
    ``feed/<op>``, and every micro-batch's copy is a slice of it that shares its
    buffer, so the batch stays alive until the last slice's readers are done; the
    copies of each output op are concatenated there, by an op ``merge/<op>``
    (:func:`feed_and_merge`)."""
    def copies(r, op):
        return [f"mb{m}/{op}" for m in range(microbatches)]

    for op, attrs in graph.ops.items():
        if _is_input(graph, op):
            feed = f"feed/{op}"
            replicated.add_op(feed, **{k: v for k, v in attrs.items()
                                       if k != "memory_fraction"})
            placement[feed] = placement[copies(0, op)[0]]
            for copy in copies(0, op):
                replicated.ops[copy]["op_type"] = "Identity"  # a slice sharing the batch
                replicated.add_edge(feed, copy)
    feed_and_merge(replicated, placement, graph, [1.0], copies)


def feed_and_merge(replicated, placement, graph, fractions, copies):
    """Route replicas' inputs and outputs as the rewriter does: every replica's copies
    (``copies(r, op)``) of an input op of ``graph`` take their rows where the first
    replica's first copy is (the batch arrives there and is sliced), and the copies of
    each output op (one with outputs and no data successor) are concatenated there, by
    an op ``merge/<op>``: a replica elsewhere receives its rows and sends its results.

    >>> g = OpGraph()
    >>> g.add_op("x", op_type="Placeholder", outputs=[((8, 4), "float32")])
    >>> g.add_op("y", op_type="Relu", outputs=[((8, 4), "float32")])
    >>> g.add_edge("x", "y", bytes=128)
    >>> replicated, where = replicas_graph(g, [0.75, 0.25], [0, 1], 0, set())
    >>> where["rep1/x"], where["merge/y"], replicated.edge("rep1/y", "merge/y")["bytes"]
    (0, 0, 32.0)
    """
    shared = shared_ops(graph)
    for op, attrs in graph.ops.items():
        if op in shared:
            continue
        home = placement[copies(0, op)[0]]
        if _is_input(graph, op):
            for r in range(len(fractions)):
                placement.update({copy: home for copy in copies(r, op)})
        elif attrs["outputs"] and all(graph.edge(op, dst)["control"]
                                      for dst in graph.successors(op)):
            size = sum(tensor_bytes(shape, dtype) for shape, dtype in attrs["outputs"])
            merge = f"merge/{op}"
            replicated.add_op(merge, op_type="ConcatV2", colocation=merge,
                              bytes_accessed=2.0 * size, outputs=attrs["outputs"])
            placement[merge] = home
            for r, fraction in enumerate(fractions):
                for copy in copies(r, op):
                    replicated.add_edge(copy, merge,
                                        bytes=size * fraction / len(copies(r, op)))


def replicas_graph(graph, fractions, replica_devices, home, pinned):
    """Data-parallel replicas of a graph, for the simulator: replica ``r`` runs a copy
    of the per-sample ops (named ``rep<r>/<op>``), costed for ``fractions[r]`` of the
    batch, on device index ``replica_devices[r]`` (or, for a replica placed across
    devices, on ``replica_devices[r][op]``); variables, a training step's update
    ops and the ``pinned`` ops (those that read a variable's resource, which
    TensorFlow runs where the variable is) run on device ``home``, the update once on
    every replica's gradients.

    Returns the graph and the device index of each of its ops.

    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp", param_bytes=4)
    >>> g.add_op("read", op_type="ReadVariableOp")
    >>> g.add_op("y", op_type="MatMul", flops=8e9)
    >>> g.add_edge("w", "read", bytes=4); g.add_edge("read", "y", bytes=4)
    >>> replicated, where = replicas_graph(g, [0.75, 0.25], [0, 1], 0, {"read"})
    >>> sorted(replicated.ops), where["rep1/y"], where["rep1/read"]
    (['rep0/read', 'rep0/y', 'rep1/read', 'rep1/y', 'w'], 1, 0)
    >>> replicated.ops["rep1/y"]["flops"]
    2000000000.0
    """
    shared = shared_ops(graph)
    step = replicas_step(replica_devices)
    copies = replica_copies(step)
    replicated, placement = OpGraph(), {}
    for op in [op for op in graph.ops if op in shared]:  # graph order: sets vary by process
        replicated.add_op(op, **graph.ops[op])
        placement[op] = home
    for task in step.tasks:
        r, device = task.replica, task.device
        scaled = scaled_graph(graph, fractions[r])
        name = {op: op if op in shared else copies(r, op)[0] for op in graph.ops}
        for op, attrs in scaled.ops.items():
            if op in shared:
                continue
            own = op not in pinned  # its colocation group is this replica's alone
            replicated.add_op(name[op], **copy_attrs(
                attrs, op, r, colocation=copies(r, attrs["colocation"])[0] if own
                else attrs["colocation"]))
            placement[name[op]] = home if not own else \
                device[op] if isinstance(device, dict) else device
        for src, dst, edge in scaled.edges():
            if src in shared and dst in shared:
                if r == 0:
                    replicated.add_edge(src, dst, **edge)
                continue
            replicated.add_edge(name[src], name[dst], **edge)
    accumulate_for_update(replicated, placement, graph, functools.partial(copies, None),
                          lambda op: placement[copies(0, op)[0]])
    feed_and_merge(replicated, placement, graph, fractions, copies)
    return replicated, placement


def replicas_step(replica_devices):
    """The lowering (:func:`costmodel.lowering.lower`) of data-parallel replicas that
    run their shares at once: one task each, replica ``r``'s on ``replica_devices[r]``
    (a device index, or op -> device index for a replica placed across devices).

    >>> [(task.replica, task.microbatch, task.device) for task in replicas_step([2, 0]).tasks]
    [(0, None, 2), (1, None, 0)]
    """
    return lower({0: replica_devices[0]}, {(0, "forward")}, None, replicas=len(replica_devices),
                 devices=[{0: device} for device in replica_devices])


def replica_copies(step):
    """``copies(r, op)``: the names of replica ``r``'s copies of op ``op`` in ``step``
    (a :class:`~costmodel.lowering.Lowering` with replicas), ``rep<r>/mb<m>/<op>`` per
    micro-batch or ``rep<r>/<op>`` where the replica runs its rows at once; ``r`` None:
    every replica's, in order.

    >>> copies = replica_copies(lower({0: 0}, {(0, "forward")}, 2, replicas=2))
    >>> copies(1, "y"), copies(None, "y")
    (['rep1/mb0/y', 'rep1/mb1/y'], ['rep0/mb0/y', 'rep0/mb1/y', 'rep1/mb0/y', 'rep1/mb1/y'])
    >>> replica_copies(replicas_step([0, 1]))(1, "y")
    ['rep1/y']
    """
    prefixes = [[f"rep{r}/" if m is None else f"rep{r}/mb{m}/" for m in step.copies(r)]
                for r in range(len(step.lanes))]
    every = [prefix for replica in prefixes for prefix in replica]

    def copies(r, op):
        return [prefix + op for prefix in (every if r is None else prefixes[r])]
    return copies


def pipeline_replicas_graph(graph, cluster_names, fractions, device_maps, stage_of,
                            microbatches, schedule="gpipe", all_reduce=False):
    """Replicas of a pipeline, for the simulator: replica ``r`` runs ``microbatches``
    micro-batches of ``fractions[r] / microbatches`` of the batch each through the
    stages ``stage_of`` on its own devices, ``device_maps[r]`` (op -> device index;
    the variables, a training step's update and the variable reads on the first
    replica's devices, where the variables are); ops are named ``rep<r>/mb<m>/<op>``.
    With ``all_reduce``, every replica has its own variables and update
    (``rep<r>/<op>``, on its devices) and the gradients are all-reduced among the
    devices that hold them in each replica (:func:`add_all_reduces`).

    Returns the graph and the device index of each of its ops.

    >>> g = OpGraph()
    >>> g.add_op("a", op_type="Relu", bytes_accessed=4e9)
    >>> g.add_op("b", op_type="Relu", bytes_accessed=4e9)
    >>> g.add_edge("a", "b", bytes=8)
    >>> stages = {"a": 0, "b": 1}
    >>> replicated, where = pipeline_replicas_graph(
    ...     g, ["cpu:0", "cpu:1", "cpu:2", "cpu:3"], [0.5, 0.5],
    ...     [{"a": 0, "b": 1}, {"a": 2, "b": 3}], stages, 2)
    >>> where["rep1/mb1/b"], replicated.ops["rep1/mb0/a"]["bytes_accessed"]
    (3, 1000000000.0)
    """
    into = None
    gradients = reduced_tensors(graph) if all_reduce else None
    pieces = _pieces(graph, stage_of, shared_ops(graph))  # scaling keeps them
    piece, _, sources = pieces
    devices = [_stage_devices(piece, stage_of, device_of) for device_of in device_maps]
    step = lower(devices[0], set(sources), microbatches, schedule, len(fractions),
                 devices=devices)
    for r, (fraction, device_of) in enumerate(zip(fractions, device_maps)):
        scaled = scaled_graph(graph, fraction / microbatches)
        for op, attrs in scaled.ops.items():
            if device_of[op] != device_maps[0][op]:  # a colocation group of its own
                attrs["colocation"] = f"rep{r}/{attrs['colocation']}"
        into = _replicate(scaled, cluster_names, device_of, stage_of, microbatches,
                          schedule, into, f"rep{r}/", gradients, r, step, pieces)
    copies = replica_copies(step)
    if all_reduce:
        add_all_reduces(*into, graph, gradients, len(fractions), copies,
                        lambda r, src: device_maps[r][src])
    else:
        accumulate_for_update(*into, graph, functools.partial(copies, None),
                              device_maps[0].get)
    feed_and_merge(*into, graph, fractions, copies)
    return into


def replica_finishes(replicated_cost, device_of, count, per_microbatch=False):
    """When each of ``count`` replicas' last copy of an op (with ``per_microbatch``, of
    an op run per micro-batch: not a replica's own variables and update) ends in the
    simulated step of ``replicated_cost`` placed by ``device_of``."""
    from costmodel.simulate import start_first_priority

    end = simulate(replicated_cost, device_of, start_first_priority(replicated_cost),
                   memory=False).end
    finish = [0.0] * count
    for i, op in enumerate(replicated_cost.ops):
        attrs = replicated_cost.graph.ops[op]
        r = attrs.get("replica")
        if r is not None and not (per_microbatch and attrs.get("microbatch") is None):
            finish[r] = max(finish[r], float(end[i]))
    return finish


PACK_BYTES = 32 * 2 ** 20  # as MultiWorkerMirroredStrategy's bytes_per_pack: few, large


def gradient_packs(tensors, limit=PACK_BYTES):
    """Consecutive runs of ``tensors`` (``(key, kind, bytes)`` in the order they are
    reduced) that one all-reduce each carries: a run keeps one ``kind`` (dtype) and
    stays within ``limit`` bytes, but a bigger tensor (or one of unknown size,
    ``None``) goes alone. Each collective costs a round of messages, so fewer, larger
    ones are faster; packs close at ``limit`` so the first can start before the last
    gradient is ready.

    >>> gradient_packs([("a", "f32", 10), ("b", "f32", 20), ("c", "f16", 5),
    ...                 ("d", "f16", 40), ("e", "f16", None), ("f", "f16", 1)], limit=30)
    [['a', 'b'], ['c'], ['d'], ['e'], ['f']]
    """
    packs, kind, size = [], None, None  # size None: the open pack takes no more
    for key, this_kind, nbytes in tensors:
        if size is not None and nbytes is not None and this_kind == kind \
                and size + nbytes <= limit:
            packs[-1].append(key)
            size += nbytes
        else:
            packs.append([key])
            kind, size = this_kind, nbytes if nbytes is not None and nbytes <= limit else None
    return packs


def all_reduce_replicas_graph(graph, fractions, replica_devices, pinned):
    """Data-parallel replicas that each keep a copy of the variables, for the
    simulator: replica ``r`` runs a copy of every op (named ``rep<r>/<op>``), its
    per-sample ops costed for ``fractions[r]`` of the batch, on device index
    ``replica_devices[r]`` (but the :func:`table_ops`, on the first replica's, where the
    one table is); each tensor a per-sample op (not one of the ``pinned``
    variable readers) sends the update is all-reduced: an op ``rep<r>/allreduce/<op>``
    per replica that receives ``2 / k`` of the tensor from each other replica, the
    volume each device of a ring all-reduce over ``k`` replicas sends, and feeds
    the replica's copy of the update. Tensors are all-reduced in packs
    (:func:`gradient_packs`, in graph order; the op is named after the pack's first
    tensor), one pack at a time per device, as the rewriter does.

    Returns the graph and the device index of each of its ops.

    >>> g = OpGraph()
    >>> g.add_op("w", op_type="VarHandleOp", param_bytes=4e6)
    >>> g.add_op("grad", op_type="MatMul", flops=8e9)
    >>> g.add_op("apply", op_type="ResourceApplyGradientDescent", phase="update")
    >>> g.add_edge("w", "grad", bytes=4e6); g.add_edge("grad", "apply", bytes=4e6)
    >>> g.add_edge("w", "apply")
    >>> replicated, where = all_reduce_replicas_graph(g, [0.75, 0.25], [0, 1], set())
    >>> sorted(replicated.predecessors("rep1/allreduce/grad")), where["rep1/apply"]
    (['rep0/pack/grad', 'rep1/pack/grad'], 1)
    >>> replicated.edge("rep0/pack/grad", "rep1/allreduce/grad")["bytes"]
    4000000.0
    """
    shared = shared_ops(graph)
    tables = table_ops(graph)
    replicated, placement = OpGraph(), {}
    count = len(fractions)
    gradients = reduced_tensors(graph, pinned) if count > 1 else {}
    step = replicas_step(replica_devices)
    copies = replica_copies(step)
    for task in step.tasks:
        r = task.replica
        scaled = scaled_graph(graph, fractions[r])
        name = {op: copies(r, op)[0] for op in graph.ops}
        for op, attrs in scaled.ops.items():
            replicated.add_op(name[op], **copy_attrs(
                attrs, op, r, colocation=copies(r, attrs["colocation"])[0]))
            placement[name[op]] = replica_devices[0] if op in tables else task.device
        for src, dst, edge in scaled.edges():
            if not (src in gradients and dst in shared):
                replicated.add_edge(name[src], name[dst], **edge)
    add_all_reduces(replicated, placement, graph, gradients, count, copies,
                    lambda r, src: replica_devices[r])
    feed_and_merge(replicated, placement, graph, fractions, copies)
    return replicated, placement


def reduced_tensors(graph, pinned=()):
    """The bytes each per-sample op (not one of the ``pinned``) sends the shared ops
    (a training step's update): the gradients replicas all-reduce, in graph order."""
    shared = shared_ops(graph)
    return {src: sum(edge["bytes"] for dst, edge in graph.out_edges(src).items()
                     if dst in shared)
            for src in graph.ops if src not in shared and src not in pinned
            and any(dst in shared for dst in graph.successors(src))}


def add_all_reduces(replicated, placement, graph, gradients, count, copies, device_of):
    """Add to ``replicated`` (with ``placement``) the all-reduce of ``gradients``
    (op -> bytes, :func:`reduced_tensors`) over ``count`` replicas, feeding each
    replica's shared ops (named ``rep<r>/<op>``): per replica a pack op
    ``rep<r>/pack/<first op>`` that gathers the ops ``copies(r, op)`` (each of the
    replica's micro-batches' copy of ``op``) and an op ``rep<r>/allreduce/<first op>``
    that receives ``2 / count`` of the pack from each other replica, the volume each
    device of a ring all-reduce sends. Gradients are packed
    (:func:`gradient_packs`) among those on the same device in every replica
    (``device_of(r, op)``), and each device runs its packs one at a time."""
    shared = shared_ops(graph)
    groups = {}
    for src, size in gradients.items():
        key = tuple(device_of(r, src) for r in range(count))
        groups.setdefault(key, []).append((src, None, size))
    previous = {}
    for devices, tensors in groups.items():
        for pack in gradient_packs(tensors):
            first, size = pack[0], sum(gradients[src] for src in pack)
            for r, device in enumerate(devices):
                for name, attrs in ((f"rep{r}/pack/{first}", {"op_type": "ConcatV2"}),
                                    (f"rep{r}/allreduce/{first}", {
                                        "op_type": "CollectiveReduceV2",
                                        "flops": size / 4 * (count - 1) / count,
                                        "bytes_accessed": 2 * size})):
                    replicated.add_op(name, colocation=name, **attrs)
                    placement[name] = device
                for src in pack:
                    for copy in copies(r, src):
                        replicated.add_edge(copy, f"rep{r}/pack/{first}", bytes=gradients[src])
                    for dst, edge in graph.out_edges(src).items():
                        if dst in shared:
                            replicated.add_edge(f"rep{r}/allreduce/{first}", f"rep{r}/{dst}",
                                                **edge)
                if device in previous:
                    replicated.add_edge(previous[device], f"rep{r}/allreduce/{first}",
                                        control=True)
                previous[device] = f"rep{r}/allreduce/{first}"
            for r in range(count):
                for q in range(count):
                    replicated.add_edge(f"rep{q}/pack/{first}", f"rep{r}/allreduce/{first}",
                                        bytes=size * (1 if q == r else 2 / count))


def replicas_cost(cost, fractions, devices, pinned, home=None, all_reduce=False):
    """The cost model of :func:`replicas_graph` (the home is ``home``, by default
    ``devices[0]``, the fastest replica's device), or with ``all_reduce`` of
    :func:`all_reduce_replicas_graph`, and the device index of each of its ops."""
    home = devices[0] if home is None else home
    replicated, where = all_reduce_replicas_graph(cost.graph, fractions, devices, pinned) \
        if all_reduce else replicas_graph(cost.graph, fractions, devices, home, pinned)
    replicated_cost = cost.of(replicated)
    return replicated_cost, np.array([where[op] for op in replicated_cost.ops])


def plan_replicas_cost(cost, plan):
    """:func:`replicas_cost` of a plan's ``replicas`` (device names; a replica placed
    across devices has its ``placements`` entry), or for replicas of a pipeline
    (``replicas.microbatches`` each) the cost model of
    :func:`pipeline_replicas_graph`."""
    replicas = plan.replicas
    index = {name: d for d, name in enumerate(cost.cluster.device_names)}
    placements = replicas.placements
    if replicas.microbatches:
        all_reduce = all_reduces(replicas)
        stand_ins = device_stand_ins(replicas, plan.assignment)
        maps = [{op: index[replica_device(replicas, stand_ins, r, op, plan.assignment[op])
                           if all_reduce else placement.get(op, plan.assignment[op])]
                 for op in cost.graph.ops} for r, placement in enumerate(placements)]
        replicated, where = pipeline_replicas_graph(
            cost.graph, cost.cluster.device_names, replicas.fractions, maps, plan.stages,
            replicas.microbatches, plan.schedule or "gpipe", all_reduce)
        replicated_cost = cost.of(replicated)
        return replicated_cost, np.array([where[op] for op in replicated_cost.ops])
    devices = [{op: index[d] for op, d in placement.items()} for placement in placements] \
        if placements else [index[d] for d in replicas.devices]
    return replicas_cost(cost, replicas.fractions, devices, set(replicas.pinned),
                         index[replicas.devices[0]], all_reduces(replicas))
