"""Pipeline rewriter: run a plan's stages over micro-batches, in a new SavedModel.

The compiled signature keeps the original's inputs and outputs. It splits every input
along its first (batch) dimension into M micro-batches of ``ceil(B / M)`` rows (the
last one smaller when M does not divide B), runs each stage's ops for each
micro-batch on the stage's device, and concatenates the micro-batches' outputs. On
each device the micro-batches run in order (fill–drain): the source ops of stage k for
micro-batch m wait, by control edges, for the sink ops of stage k for micro-batch
m - 1, while stage k + 1 works on micro-batch m - 1. This is the schedule the
simulator predicts (:mod:`costmodel.pipeline`).

A training step (:mod:`rewriters.training_regions`) runs each micro-batch's forward
and backward ops on the stages, in the order of the plan's ``schedule`` on each stage
(``gpipe``: every forward, then every backward; ``1f1b``: one forward, one backward
after the pipeline fills; ``interleaved``: 1F1B over several stages per device, in
each device's order; the task tables of :mod:`costmodel.schedules`). What the
optimizer's update reads (the gradients, and the loss the signature returns) is
accumulated over the micro-batches, each weighted by its share of the batch, which
keeps a mean loss's gradients exact; the update then runs once per step, each op on
its planned device.

Mechanism: the signature is flattened into one GraphDef (:mod:`rewriters.reader`),
cut into one GraphDef per piece ``(stage, phase)``, and the step is lowered
(:mod:`costmodel.lowering`, which the simulator reads too) into tasks, a piece for a
micro-batch of a replica on a device, and the schedule's ordering edges between them.
An emitter (:class:`_PipelineBody`) runs the passes of :mod:`rewriters.lowered` over
that lowering: each task is imported into a ``tf.function`` with
``import_graph_def``, behind a gate that waits for the task before it on its lane,
its inputs from other stages mapped to the tensors those stages produced for the same
micro-batch and its variables to captured ``tf.Variable`` handles holding the
checkpoint's values. The function is saved with
``tf.saved_model.save``, so the output is a SavedModel like any other; its variables
then get their planned devices in the object graph (``SavedVariable.device``), which
lets the compile machine save plans for devices it does not have. Only the compiled
signature is kept. Imported ops are named ``tfpart_mb<m>_stage<k>/<original name>``
(a training step's update: ``tfpart_update/<original name>``) and stamped with the op,
replica and micro-batch they compute (:mod:`rewriters.copies`), which is how
verification reads them back.

As a pass of :mod:`rewriters.passes` it is :func:`pipeline_pass`, run for plans with
stages.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from costmodel.lowering import lower
from rewriters.captures import (HANDLE_KINDS, load_captured, load_root, loaded_objects,
                                object_paths, state_input_map, variable_values)
from rewriters.channel_split import split_channels
from rewriters.endpoints import (check_nothing_kept_reads, compiled_endpoint,
                                 endpoint_binding, kept_endpoints, run_without_xla)
from rewriters.functions import private_library
from rewriters.graph_saver import add_graph_saver, holds_only_variables
from rewriters.flatten import flat_at, flatten_signature
from rewriters.lowered import GATE
from rewriters.lowered.accumulation import accumulated, after_every_microbatch
from rewriters.lowered.collectives import all_reduced
from rewriters.lowered.gates import import_in_order, piece_reads, sinks
from rewriters.lowered.imports import import_copy, on_replica
from rewriters.lowered.slicing import microbatch_envs, whole_batch_env
from rewriters.row_shard import shard_flat
from rewriters.savedmodel_io import SavedModelParts, read_saved_model
from rewriters.tf1_reader import is_tf1
from rewriters.tf_import import tensorflow
from rewriters.training_regions import FORWARD, UPDATE, StepRegions, step_regions
from tfpart.core.errors import ModelError, PlacementError, first_line
from tfpart.core.ops import RESOURCE_WRITE_OPS, STATE_OPS
from tfpart.core.plan import all_reduces, device_stand_ins, replica_device
from tfpart.core.splits import SCOPE as SPLIT_SCOPE


def pipeline_pass(model, plan, workdir):
    """The pass: the pipelined model of ``plan``, with new variables in ``workdir``.

    Parameters
    ----------
    model : rewriters.savedmodel_io.SavedModelParts
        The input model (its checkpoint gives the variables' values).
    plan : tfpart.core.plan.Plan
        Read: ``stages``, ``microbatches``, ``assignment`` and ``context``'s
        ``signature`` and ``batch_size``.
    workdir : pathlib.Path
        An empty-or-missing scratch folder; the result's files live in it.

    Returns
    -------
    rewriters.savedmodel_io.SavedModelParts

    Raises
    ------
    tfpart.core.errors.ModelError, tfpart.core.errors.PlacementError
        If the signature cannot be pipelined (a scalar input, a graph that does not
        trace) or the checkpoint cannot be read.
    """
    if is_tf1(model.proto):
        return SavedModelParts(_pipelined_tf1(model.directory, model.proto, plan),
                               model.directory)
    target = Path(workdir) / "pipelined"
    proto, device_of, kept, signature, resources = _save_pipelined(
        model.directory, model.proto, plan, target, model.flat)
    run_without_xla(proto.meta_graphs[0], kept["without_xla"], signature)
    objects = proto.meta_graphs[0].object_graph_def
    host = plan.context.get("unread_variables", {}).get("device") or \
        (plan.context.get("devices") or [""])[0]
    by_op = next(child.node_id for child in objects.nodes[0].children
                 if child.local_name == "variables_by_op")
    planned = {child.node_id: plan.assignment[child.local_name]
               for child in objects.nodes[by_op].children}
    for node_id, obj in enumerate(objects.nodes):
        if obj.HasField("variable"):  # the signature's own, a replica's copy, or unread
            obj.variable.device = planned.get(node_id) or \
                device_of.get(obj.variable.name, host)
    for node_id, path in object_paths(objects).items():
        name = path.removeprefix("root.tfpart_resources.")
        if name != path and name.isdigit() and objects.nodes[node_id].HasField("resource"):
            objects.nodes[node_id].resource.device = resources[int(name)]
    return SavedModelParts(proto, target)


def _pipelined_tf1(model_dir, proto, plan):
    """A copy of the TF1 SavedModel ``proto`` whose compiled signature runs ``plan``'s
    stages over micro-batches (an inference signature: a step that writes variables is
    refused by the compiler). The pipelined ops join the graph beside the original's,
    which its other signatures still run, and read the same variables and tables: the
    checkpoint, the saver and the signature's inputs are unchanged; its outputs name
    the pipelined tensors. Nodes the plan does not place get their devices from
    :mod:`rewriters.tf1_placement`, the next pass."""
    from tensorflow.core.protobuf import saved_model_pb2

    tf = tensorflow()
    flat = flatten_signature(proto, model_dir, plan.context.get("batch_size"),
                             plan.context.get("signature"))
    regions = _forward_only(flat)
    flat, assignment = _with_splits(flat, plan, regions.phase)
    shared = {node.name for node in flat.graph_def.node if node.op in STATE_OPS}
    pieces = _piece_graphs(flat, assignment, _stage_of_every_node(flat, plan),
                           regions.phase, shared)
    new = saved_model_pb2.SavedModel()
    new.CopyFrom(proto)
    meta = new.meta_graphs[0]
    signature = meta.signature_def[flat.info.signature]
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(meta.graph_def, name="")
        bound = {f"{name}:0": graph.get_tensor_by_name(f"{name}:0") for name in shared}
        body = _PipelineBody(flat, plan, regions, pieces, lambda _: [bound],
                             flat.outputs_by_key(proto), _lowering(plan, pieces))
        results = body(*[graph.get_tensor_by_name(f"{flat.inputs[key][0]}:0")
                         for key in sorted(flat.inputs)])
    meta.graph_def.CopyFrom(graph.as_graph_def())
    for key, tensor in results.items():
        signature.outputs[key].name = tensor.name
    return new


def _resource_devices(flat, plan):
    """The planned device of each table the pipelined model captures, in the order of
    its ``tfpart_resources`` (sorted by op name; assets have none)."""
    names = sorted(c.op_name for c in flat.info.captures.values() if c.kind in HANDLE_KINDS)
    return [plan.assignment.get(name, "") for name in names]


def _save_pipelined(model_dir, proto, plan, staging, read=None):
    """Save the pipelined model into ``staging``; return its proto, the planned device
    of each saved variable, by its name (the caller writes them into the object graph,
    which lets the compile machine save plans for devices it does not have), what it
    kept of the original (:func:`rewriters.endpoints.kept_endpoints`), the signature
    and the planned device of each table (:func:`_resource_devices`). ``read``: the
    reader's flattening of the signature, to start from
    (:func:`rewriters.flatten.flat_at`)."""
    tf = tensorflow()
    context = plan.context
    flat = flat_at(proto, model_dir, context.get("batch_size"), context.get("signature"), read)
    flat = shard_flat(flat, {table: shards.sizes
                             for table, shards in (plan.row_shards or {}).items()})
    regions = _regions(proto, model_dir, flat)
    flat, assignment = _with_splits(flat, plan, regions.phase)
    stage_of = _stage_of_every_node(flat, plan)
    pieces = _piece_graphs(flat, assignment, stage_of, regions.phase)
    meta = proto.meta_graphs[0]
    outputs = flat.outputs_by_key(proto)
    specs = [tf.TensorSpec([None, *shape[1:]], dtype, name=key)
             for key, (_, shape, dtype) in sorted(flat.inputs.items())]
    for key, (_, shape, _) in flat.inputs.items():
        if not shape:
            raise PlacementError(model_dir, f"input {key!r} is a scalar; pipelining needs "
                                 "a batch dimension on every input")

    module = tf.Module()
    original = load_root(model_dir)
    # the original's own variables: every signature and endpoint kept reads them
    found = loaded_objects(original, meta, flat.variable_ops, model_dir)
    module.variables_by_op = {flat.variable_ops[node_id]: found[node_id]
                              for node_id in sorted(found, key=flat.variable_ops.get)}
    kept = kept_endpoints(proto, flat.info.signature)
    if flat.row_shards:
        check_nothing_kept_reads(kept, next(iter(plan.row_shards)), model_dir)
        module.variables_by_op = _with_row_shards(module.variables_by_op, flat.row_shards)
    else:
        module.tfpart_original = original
    captured = load_captured(model_dir, meta, flat.info.captures, model_dir, root=original)
    # saved with the model: loading it makes and fills each table on its device
    module.tfpart_resources = [captured[name] for name in sorted(captured)]
    device_of = {}

    def bind(graph):
        copies = [module.variables_by_op, *getattr(module, "replica_variables", [])]
        return [state_input_map(graph, captured, copy) for copy in copies]

    lowering, tokens = _lowering(plan, pieces), None
    if all_reduces(plan.replicas):  # each replica of the lowering its own variables
        device_of.update(_add_replica_copies(module, plan, lowering,
                                             variable_values(model_dir, proto, flat)))
        tokens = module.collective_tokens
    pipeline = _PipelineBody(flat, plan, regions, pieces, bind, outputs, lowering, tokens)
    module.tfpart_pipelined = tf.function(pipeline, input_signature=specs, autograph=False)
    for name in kept["endpoints"]:
        setattr(module, name, getattr(original, name))
    for name in kept["compiled_endpoints"]:
        setattr(module, name, compiled_endpoint(module.tfpart_pipelined, endpoint_binding(
            meta, flat.info.signature, name)))
    # Custom gradients (Keras's swish) are not saved: in a process that exported the
    # model, their registered functions capture tensors of the exporter's graph, which
    # saving refuses; the step's gradients are ops of the graph already. The TF1
    # loader's saver is written as graph nodes after the save (rewriters.graph_saver),
    # not traced by it, unless the original's checkpoint holds more than variables.
    graph_saver = holds_only_variables(Path(model_dir) / "variables" / "variables")
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False,
                                         experimental_skip_saver=graph_saver)
    try:
        concrete = _traced_as_saved(module.tfpart_pipelined, options)
    except (ValueError, TypeError, tf.errors.OpError) as exc:
        raise ModelError(model_dir, "cannot build the pipelined signature: "
                         f"{first_line(exc)}") from None
    signatures = {name: original.signatures[name] for name in kept["signatures"]}
    signatures.update({name: concrete for name in
                       [flat.info.signature, *kept["compiled_signatures"]]})
    tf.saved_model.save(module, str(staging), signatures=signatures, options=options)
    saved = read_saved_model(staging)
    if graph_saver and not add_graph_saver(saved.meta_graphs[0],
                                           Path(staging) / "variables" / "variables"):
        options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
        tf.saved_model.save(module, str(staging), signatures=signatures, options=options)
        saved = read_saved_model(staging)
    return saved, device_of, kept, flat.info.signature, _resource_devices(flat, plan)


def _traced_as_saved(function, options):
    """The concrete function of ``function`` (a ``tf.function`` with an input
    signature), traced as ``tf.saved_model.save`` with ``options`` traces it: the
    function's cache then hands the save this trace for the object graph, where a
    trace made outside a save (another cache key: the save's variable policy) would
    be traced again."""
    from tensorflow.python.saved_model import save_context

    with save_context.save_context(options):
        return function.get_concrete_function()


def _with_row_shards(variables, row_shards):
    """``variables`` (by op name) with each table of ``row_shards`` (shard op ->
    ``(table, first row, rows)``) replaced by a new variable per shard holding its
    rows."""
    tf = tensorflow()
    cut = {table for table, _, _ in row_shards.values()}
    remaining = {name: variable for name, variable in variables.items() if name not in cut}
    for shard, (table, first, rows) in row_shards.items():
        remaining[shard] = tf.Variable(variables[table][first:first + rows],
                                       name=shard.replace("/", "_"))
    return remaining


def _add_replica_copies(module, plan, lowering, values):
    """Give ``module`` a copy of every variable (``values``, by op name) for each
    replica of ``lowering`` (the step's) but the first
    (``module.replica_variables``), on the replica's device (for
    replicas of a pipeline: on its device standing for the variable's), and a
    collective-ordering token per device of a replica (``module.collective_tokens``,
    by device); return their devices by saved name."""
    tf = tensorflow()
    replicas = plan.replicas
    stand_ins = device_stand_ins(replicas, plan.assignment)
    device_of = {}
    module.replica_variables = []
    for r in range(1, len(lowering.lanes)):
        copies = {}
        for name in sorted(values):
            saved = f"{name.replace('/', '_')}_replica{r}"
            copies[name] = tf.Variable(values[name], name=saved)
            device_of[saved] = replica_device(replicas, stand_ins, r, name,
                                              plan.assignment[name])
        module.replica_variables.append(copies)
    devices = sorted({*replicas.devices, *(d for m in stand_ins or () for d in m.values())})
    module.collective_tokens = {device: tf.Variable(0.0, name=f"tfpart_collective_token{i}")
                                for i, device in enumerate(devices)}
    device_of.update({f"tfpart_collective_token{i}": device
                      for i, device in enumerate(devices)})
    return device_of


def _regions(proto, model_dir, flat):
    """The training step's regions (the reader's, when it found them), or every op
    forward for an inference signature."""
    if any(node.op in RESOURCE_WRITE_OPS for node in flat.graph_def.node):
        regions = flat.info.regions or step_regions(
            proto, model_dir, flat.info.batch_size, flat.info.signature, flat)
        if regions.is_training and regions.misplaced_writes:
            raise PlacementError(model_dir, f"op {regions.misplaced_writes[0]} writes a "
                                 "variable before the forward pass reads it; a training "
                                 "step pipelines only if its writes follow the gradients")
        if regions.is_training:
            return regions
    return _forward_only(flat)


def _forward_only(flat):
    """The regions of an inference signature: every op forward."""
    return StepRegions(phase={node.name: FORWARD for node in flat.graph_def.node},
                       boundary=set(), data_dependent=set(), batched=set())


class _PipelineBody:
    """The traced body of the pipelined signature (a callable for ``tf.function``): an
    emitter that runs the passes of :mod:`rewriters.lowered` over the step's lowering
    (:mod:`costmodel.lowering`). The batch is cut into micro-batches; every task, a
    piece ``(stage, phase)`` for one micro-batch, is imported in the lowering's order
    behind a gate that waits for the task before it on its lane; a training step then
    accumulates what the update reads (all-reduces it, for replicas with their own
    variables) and imports the update once (per such replica); the micro-batches'
    outputs are concatenated.
    """

    def __init__(self, flat, plan, regions, pieces, bind, outputs, lowering, tokens=None):
        """``bind(graph)``: per copy of the variables (one, or one per replica of an
        all-reducing plan), the tensors, by name, that stand in the traced graph for the
        flat graph's variables and tables; ``outputs``: the signature's output tensors
        of the flat graph, by key; ``lowering``: the step's (:func:`_lowering`);
        ``tokens``: per device of a replica, a resource on it that orders its
        collectives (None without)."""
        self.flat, self.plan, self.regions = flat, plan, regions
        self.bind, self.pieces, self.outputs, self.tokens = bind, pieces, outputs, tokens
        self.lowering = lowering
        self.device = _stage_devices(pieces)
        self.first_device = self.device[min(self.device)]
        self.sinks = {key: sinks(graph) for key, graph in pieces.items()}
        self.pinned = set(plan.replicas.pinned) if plan.replicas else set()
        self.stand_ins = device_stand_ins(plan.replicas, plan.assignment)
        # One micro-batch and no replicas (an op placement with row shards or filter
        # splits): the batch is not cut and nothing is scheduled, so no op computes
        # bounds or gates on one device for the others (each a message between tasks
        # the plan does not price).
        self.whole_batch = plan.microbatches == 1 and not plan.replicas

    def __call__(self, *args):
        tf = tensorflow()
        keys = sorted(self.flat.inputs)
        handles = self.bind(tf.compat.v1.get_default_graph())
        lowering = self.lowering
        if self.whole_batch:
            envs = [whole_batch_env(self.flat, handles[0], keys, args)]
            real = shares = None
        else:
            envs, real, shares = microbatch_envs(
                self.flat, self.plan, self.first_device,
                [handles[lowering.replica_of(m) if self.tokens else 0]
                 for m in range(self.plan.microbatches)], keys, args)
        ops_of = [{} for _ in envs]

        def import_task(task, control):
            m = task.step_microbatch
            return self._import(task.piece, f"tfpart_mb{m}_stage{task.stage}", envs[m],
                                ops_of[m], control, task.replica, task.microbatch)

        import_in_order(lowering, self.sinks, import_task, gated=not self.whole_batch)
        update_env = self._updated(handles, envs, ops_of, shares, lowering.lanes)
        return self._outputs(update_env, envs, real)

    def _updated(self, handles, envs, ops_of, shares, lanes):
        """Import the update (a training step's, per replica with its own variables)
        after what it reads is accumulated or all-reduced; the tensors it and the
        outputs read once per step (the first replica's), by name."""
        update = self.pieces.get((UPDATE, UPDATE))
        gated = not self.whole_batch
        if self.tokens:
            update_envs = [{**handles[r], **totals} for r, totals in enumerate(all_reduced(
                self.plan, self.regions, self.flat.graph_def, self.stand_ins, self.tokens,
                envs, shares, lanes))]
            for r, update_env in enumerate(update_envs):
                if update is not None:
                    self._import((UPDATE, UPDATE), f"tfpart_update{f'_r{r}' if r else ''}",
                                 update_env, {}, after_every_microbatch(
                                     update, [ops_of[m] for m in lanes[r]], gated), r)
            return update_envs[0]
        update_env = {**handles[0], **accumulated(
            self.regions, envs, shares,
            lambda op: self.plan.assignment.get(op, self.first_device))}
        if update is not None:
            self._import((UPDATE, UPDATE), "tfpart_update", update_env, {},
                         after_every_microbatch(update, ops_of, gated))
        return update_env

    def _outputs(self, update_env, envs, real):
        """The signature's outputs: a tensor computed once per step as it is, one
        computed per micro-batch concatenated from their ``real`` rows."""
        tf = tensorflow()
        results = {}
        for key, tensor in self.outputs.items():
            if tensor in update_env:
                results[key] = tf.identity(update_env[tensor])
                continue
            with tf.device(self.plan.assignment.get(tensor.rsplit(":", 1)[0],
                                                    self.first_device)):
                results[key] = tf.identity(envs[0][tensor]) if self.whole_batch else \
                    tf.concat([env[tensor][:r] for env, r in zip(envs, real)], axis=0)
        return results

    def _import(self, key, prefix, env, ops_of, control, replica=None, microbatch=None):
        """Import piece ``key`` under ``prefix`` as the copy for ``replica`` and
        ``microbatch`` (:func:`rewriters.lowered.imports.import_copy`), on the
        replica's devices when the plan has replicas."""
        replicas, place = self.plan.replicas, None
        if replicas and replica is not None:
            placements = replicas.placements
            place = functools.partial(
                on_replica, device=replicas.devices[replica], pinned=self.pinned,
                placement=placements[replica] if placements else None,
                stand_ins=self.stand_ins[replica] if self.stand_ins else None)
        return import_copy(self.pieces[key], prefix, env, ops_of, control, replica,
                           microbatch, place)


def _stage_devices(pieces):
    """Each stage's device: its pieces' (key -> GraphDef), the update's aside."""
    return {k: graph.node[0].device for (k, phase), graph in pieces.items()
            if phase != UPDATE}


def _lowering(plan, pieces):
    """The lowering (:func:`costmodel.lowering.lower`) of ``plan``'s step over its
    ``pieces`` (key -> GraphDef), stages on their devices, each replica's tasks on its
    devices (:func:`tfpart.core.plan.device_stand_ins`)."""
    replicas, stage_devices = plan.replicas, _stage_devices(pieces)
    stand_ins = device_stand_ins(replicas, plan.assignment)
    per = (replicas.microbatches or 1) if replicas else plan.microbatches
    count = len(range(0, plan.microbatches, per)) if replicas else 0
    # a replica's device standing for the stage's, or the replica's one device
    devices = [{k: replica_device(replicas, stand_ins, r, None, device)
                for k, device in stage_devices.items()} for r in range(count)] or [stage_devices]
    try:
        return lower(stage_devices, set(pieces),
                     replicas.microbatches if replicas else plan.microbatches,
                     plan.schedule or "gpipe", count, piece_reads(pieces), devices)
    except ValueError as exc:
        raise PlacementError("", str(exc)) from None


def _stage_of_every_node(flat, plan):
    """Stage of each flat node; nodes the plan does not name follow their first input."""
    stage_of = {}
    for node in flat.graph_def.node:
        stage = (plan.stages or {}).get(node.name)
        if stage is None:
            sources = [s.lstrip("^").split(":")[0] for s in node.input]
            stage = next((stage_of[s] for s in sources if s in stage_of), 0)
        stage_of[node.name] = stage
    return stage_of


def _with_splits(flat, plan, phase_of):
    """``flat`` with the plan's filter splits made (:mod:`rewriters.channel_split`),
    and the device of every node; ``phase_of`` gains the added nodes, each in its split
    op's phase."""
    if not plan.splits:
        return flat, plan.assignment
    graph_def, added = split_channels(flat.graph_def, plan.splits,
                                      lambda name: plan.assignment.get(name, ""))
    for name in added:
        phase_of.setdefault(name, phase_of[name.split(f"/{SPLIT_SCOPE}/")[0]])
    return dataclasses.replace(flat, graph_def=graph_def), {**plan.assignment, **added}


def _piece_graphs(flat, assignment, stage_of, phase_of, shared=()):
    """One GraphDef per ``(stage, phase)`` of the per-micro-batch ops, and one
    ``(UPDATE, UPDATE)`` of the update's ops: each node on its planned device, the
    nodes reading nothing else of their piece gated. The inputs' placeholders, the
    variables and the ``shared`` nodes (state every micro-batch reads) are left out."""
    tf = tensorflow()
    outside = flat.bound_outside()
    pieces = {}
    for node in flat.graph_def.node:
        if node.name in shared or outside(node.name):
            continue
        phase = phase_of[node.name]
        key = (UPDATE, UPDATE) if phase == UPDATE else (stage_of[node.name], phase)
        if key not in pieces:
            pieces[key] = tf.compat.v1.GraphDef()
            pieces[key].versions.CopyFrom(flat.graph_def.versions)
        new = pieces[key].node.add()
        new.CopyFrom(node)
        new.attr.pop("_class", None)
        device = assignment.get(node.name)
        if device is None:
            device = next(assignment[n.name] for n in flat.graph_def.node
                          if stage_of[n.name] == stage_of[node.name]
                          and n.name in assignment)
        new.device = device
    for graph in pieces.values():
        members = {node.name for node in graph.node}
        for node in graph.node:
            if not any(s.lstrip("^").split(":")[0] in members for s in node.input):
                node.input.append(f"^{GATE}")
        graph.library.CopyFrom(private_library(graph.node, flat.graph_def.library))
    return pieces
