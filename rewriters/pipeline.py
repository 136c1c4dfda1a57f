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
cut into one GraphDef per stage, and each (micro-batch, stage) is imported into a
``tf.function`` with ``import_graph_def``, its inputs from other stages mapped to the
tensors those stages produced for the same micro-batch and its variables to captured
``tf.Variable`` handles holding the checkpoint's values. The function is saved with
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
import zlib
from pathlib import Path

from rewriters.captures import (HANDLE_KINDS, load_captured, load_root, loaded_objects,
                                object_paths, state_input_map, variable_values)
from rewriters.channel_split import split_channels
from rewriters.composite_inputs import batch_rows, tensor_rows
from rewriters.copies import stamp_op, stamped
from rewriters.endpoints import (check_nothing_kept_reads, compiled_endpoint,
                                 endpoint_binding, kept_endpoints, run_without_xla)
from rewriters.functions import private_library
from rewriters.graph_saver import add_graph_saver, holds_only_variables
from rewriters.flatten import flat_at, flatten_signature
from rewriters.row_shard import shard_flat
from rewriters.savedmodel_io import SavedModelParts, read_saved_model
from rewriters.tf1_reader import is_tf1
from rewriters.tf_import import tensorflow
from rewriters.training_regions import FORWARD, UPDATE, StepRegions, step_regions
from tfpart.core.errors import ModelError, PlacementError, first_line
from tfpart.core.ops import LOOP_ENTRY_OPS, RESOURCE_WRITE_OPS, STATE_OPS
from tfpart.core.plan import all_reduces, device_stand_ins, replica_device, replica_of
from tfpart.core.splits import SCOPE as SPLIT_SCOPE

GATE = "tfpart_gate"
ACCUMULATE = "tfpart_accumulate"  # the scope of a sum over micro-batches or replicas


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
        body = _PipelineBody(flat, plan, regions, pieces, lambda _: [bound], None,
                             flat.outputs_by_key(proto))
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
    if all_reduces(plan.replicas):
        device_of.update(_add_replica_copies(module, plan,
                                             variable_values(model_dir, proto, flat)))
    copies = [module.variables_by_op, *getattr(module, "replica_variables", [])]

    def bind(graph):
        return [state_input_map(graph, captured, copy) for copy in copies]

    pipeline = _PipelineBody(flat, plan, regions, pieces, bind,
                             getattr(module, "collective_tokens", None), outputs)
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


def _add_replica_copies(module, plan, values):
    """Give ``module`` a copy of every variable (``values``, by op name) for each
    replica but the first (``module.replica_variables``), on the replica's device (for
    replicas of a pipeline: on its device standing for the variable's), and a
    collective-ordering token per device of a replica (``module.collective_tokens``,
    by device); return their devices by saved name."""
    tf = tensorflow()
    replicas = plan.replicas
    stand_ins = device_stand_ins(replicas, plan.assignment)
    device_of = {}
    module.replica_variables = []
    for r in range(1, len(replicas.devices)):
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
    """The traced body of the pipelined signature (a callable for ``tf.function``).

    Each micro-batch imports every piece ``(stage, phase)`` of the per-micro-batch ops;
    on each stage (or device) the pieces run in the order of the plan's schedule's task
    table (:mod:`costmodel.schedules`), enforced by control edges (gates). A training
    step then accumulates what the update reads (gradients, the loss), each
    micro-batch weighted by its share of the batch, and imports the update once.
    """

    def __init__(self, flat, plan, regions, pieces, bind, tokens, outputs):
        """``bind(graph)``: per copy of the variables (one, or one per replica of an
        all-reducing plan), the tensors, by name, that stand in the traced graph for the
        flat graph's variables and tables; ``tokens``: per device of a replica, a
        resource on it that orders its collectives (None without); ``outputs``: the
        signature's output tensors of the flat graph, by key."""
        self.flat, self.plan, self.regions = flat, plan, regions
        self.bind = bind
        self.pieces, self.outputs = pieces, outputs
        self.tokens = tokens
        self.stages = sorted({k for k, phase in pieces if phase != UPDATE})
        self.device = {k: graph.node[0].device for (k, phase), graph in pieces.items()
                       if phase != UPDATE}
        self.sinks = {key: _sinks(graph) for key, graph in pieces.items()}
        self.members = {key: {node.name for node in graph.node}
                        for key, graph in pieces.items()}
        self.piece_of = {name: key for key, names in self.members.items() for name in names}
        self.depends = _piece_dependencies(pieces, self.piece_of)
        self.pinned = set(plan.replicas.pinned) if plan.replicas else set()
        self.stand_ins = device_stand_ins(plan.replicas, plan.assignment)
        # One micro-batch and no replicas (an op placement with row shards or filter
        # splits): the batch is not cut and nothing is scheduled, so no op computes
        # bounds or gates on one device for the others (each a message between tasks
        # the plan does not price).
        self.whole_batch = plan.microbatches == 1 and not plan.replicas
        # Replicas that each run their share at once (no micro-batches of their own)
        # follow no task table: their gates wait for nothing, as the simulator orders
        # nothing among a replica's phases (costmodel.pipeline.replicas_graph).
        self.scheduled = not plan.replicas or bool(plan.replicas.microbatches)

    def __call__(self, *args):
        tf = tensorflow()
        graph = tf.compat.v1.get_default_graph()
        keys = sorted(self.flat.inputs)
        handles = self.bind(graph)
        first_device = self.device[self.stages[0]]
        if self.whole_batch:
            envs, ops_of = [self._whole_batch_env(handles[0], keys, args)], [{}]
            real = shares = None
        else:
            envs, ops_of, real, shares = self._micro_batch_envs(handles, keys, args)
        done = {}  # device -> sink ops of its previous task
        for m, k, phase in self._import_order():
            device = self._device(m, k)
            gates = {}
            if not self.whole_batch:
                with tf.device(device), tf.control_dependencies(
                        done.get(device, []) if self.scheduled else []):
                    gates[f"^{GATE}"] = tf.constant(0.0, name=f"{GATE}_mb{m}_stage{k}_{phase}")
            imported = self._import((k, phase), f"tfpart_mb{m}_stage{k}", envs[m],
                                    ops_of[m], gates, self._replica(m), self._microbatch(m))
            done[device] = [imported[name] for name in self.sinks[(k, phase)]]
        if self.tokens:
            lanes = self._lanes()
            update_envs = [{**handles[r], **totals}
                           for r, totals in enumerate(self._all_reduced(envs, shares, lanes))]
            for r, update_env in enumerate(update_envs):
                if (UPDATE, UPDATE) in self.pieces:
                    self._import((UPDATE, UPDATE), f"tfpart_update{f'_r{r}' if r else ''}",
                                 update_env, {},
                                 self._all_microbatches([ops_of[m] for m in lanes[r]]), r)
            update_env = update_envs[0]
        else:
            update_env = dict(handles[0])
            update_env.update(self._accumulated(envs, shares))
            if (UPDATE, UPDATE) in self.pieces:
                control = self._all_microbatches(ops_of)
                self._import((UPDATE, UPDATE), "tfpart_update", update_env, {}, control)
        results = {}
        for key, tensor in self.outputs.items():
            if tensor in update_env:
                results[key] = tf.identity(update_env[tensor])
                continue
            with tf.device(self.plan.assignment.get(tensor.rsplit(":", 1)[0], first_device)):
                results[key] = tf.identity(envs[0][tensor]) if self.whole_batch else \
                    tf.concat([env[tensor][:r] for env, r in zip(envs, real)], axis=0)
        return results

    def _whole_batch_env(self, handles, keys, args):
        """The tensors the one piece per stage reads when the batch is not cut: the
        inputs as they are (no bounds computed on one device and sent to the others)."""
        env = dict(handles)
        for key, value in zip(keys, args):
            env[f"{self.flat.inputs[key][0]}:0"] = value
        return env

    def _micro_batch_envs(self, handles, keys, args):
        """Per micro-batch, the tensors its pieces read (its rows of each input), and
        each micro-batch's rows and share of the batch."""
        tf = tensorflow()
        m_count = self.plan.microbatches
        first_device = self.device[self.stages[0]]
        inputs = dict(zip(keys, args))
        with tf.device(first_device):
            rows = batch_rows(self.flat.composites, inputs, keys)
            real, offsets = _split(rows, m_count, self.plan.replicas)
        envs, ops_of = [], []
        for m in range(m_count):
            # A micro-batch past the end of a small batch runs on one borrowed row whose
            # result is dropped: oneDNN's fused convolutions mis-shape empty inputs.
            with tf.device(first_device):
                start = tf.maximum(tf.minimum(offsets[m], rows - 1), 0)
                stop = start + tf.maximum(real[m], 1)
                composite_rows = tensor_rows(self.flat.composites, inputs, start, stop)
            env = dict(handles[self._replica(m) if self.tokens else 0])
            for key, value in zip(keys, args):
                placeholder = self.flat.inputs[key][0]
                with tf.device(self.plan.assignment.get(placeholder, first_device)):
                    env[f"{placeholder}:0"] = composite_rows[key] if key in composite_rows \
                        else value[start:stop]
            envs.append(env)
            ops_of.append({})
        with tf.device(first_device):
            shares = [tf.cast(r, tf.float64) / tf.cast(rows, tf.float64) for r in real]
        return envs, ops_of, real, shares

    def _import_order(self):
        """``(micro-batch, stage, phase)`` in an order that follows each stage's schedule
        (each replica's, for replicas of a pipeline) and imports every piece after the
        pieces it reads."""
        return [task for lane in self._lanes() for task in self._lane_order(lane[0], len(lane))]

    def _lane_order(self, first, m_count):
        """:meth:`_import_order` of micro-batches ``first`` … ``first + m_count - 1``,
        which flow through the same devices: the lanes of the schedule's task table
        (:mod:`costmodel.schedules`, a stage's or a device's tasks) merged, each lane's
        next task taken once the pieces it reads are imported."""
        from costmodel.schedules import table

        schedule = self.plan.schedule or "gpipe"
        try:
            lanes = table(self.device, m_count, schedule)
        except ValueError as exc:
            raise PlacementError("", str(exc)) from None
        queues = [[(first + m, k, phase) for m, k, phase in lane if (k, phase) in self.pieces]
                  for lane in lanes]
        imported, order = set(), []
        while any(queues):
            ready = [queue for queue in queues if queue and all(
                (queue[0][0], *piece) in imported or piece not in self.pieces
                for piece in self.depends[queue[0][1:]])]
            if not ready:
                m, k, phase = next(queue[0] for queue in queues if queue)
                raise PlacementError("", f"the {schedule} schedule cannot run stage "
                                     f"{k}'s {phase} of micro-batch {m}: the stages read "
                                     "each other's results in both directions")
            for queue in ready:
                imported.add(queue[0])
                order.append(queue.pop(0))
        return order

    def _accumulated(self, envs, shares):
        """Each tensor the update reads or the signature returns once per step: the
        micro-batches' values weighted by their share of the batch if computed from
        the batch, else micro-batch 0's (a weight read, a constant)."""
        tf = tensorflow()
        regions, total = self.regions, {}
        for tensor in sorted(regions.boundary):
            op = tensor.rsplit(":", 1)[0]
            if tensor in regions.batched:
                continue
            if shares is None or op not in regions.data_dependent or \
                    not envs[0][tensor].dtype.is_floating:
                total[tensor] = envs[0][tensor]
                continue
            # every op of the sum in one scope, the op accumulate/<op> of the execution
            # graph the simulator prices (costmodel.pipeline.accumulate_for_update)
            with tf.device(self.plan.assignment.get(op, self.device[self.stages[0]])), \
                    tf.name_scope(f"{ACCUMULATE}/{op}/"):
                dtype = envs[0][tensor].dtype
                weights = [tf.cast(share, dtype) for share in shares]
                weighted = [env[tensor] * weight for env, weight in zip(envs, weights)]
                total[tensor] = tf.add_n(weighted, name="sum")
            made = [total[tensor], *weighted, *(w for w, share in zip(weights, shares)
                                                if w is not share)]  # not a no-op cast
            for value in made:
                stamp_op(value.op, f"accumulate/{op}")
        return total

    def _lanes(self):
        """The micro-batches of each replica (without replicas: all of them, one
        lane)."""
        replicas, m_count = self.plan.replicas, self.plan.microbatches
        per = (replicas.microbatches or 1) if replicas else m_count
        return [list(range(first, first + per)) for first in range(0, m_count, per)]

    def _all_reduced(self, envs, shares, lanes):
        """Per replica, what its copy of the update reads: the replicas' values of
        each tensor computed from the batch (summed over the replica's micro-batches
        ``lanes[r]``), weighted by their shares and all-reduced with TensorFlow's
        collective ops among the devices that hold that tensor in each replica (every
        replica gets the same sum; tensors flattened into packs,
        :func:`costmodel.pipeline.gradient_packs`, one collective each), and its own
        value of the others (its copy's weight reads, constants)."""
        from costmodel.pipeline import gradient_packs

        replicas, regions = self.plan.replicas, self.regions
        totals = [{} for _ in lanes]
        # TensorFlow runs a device's collectives in the order they are made (their
        # token orders them): the order the graph computes the gradients in.
        position = {node.name: i for i, node in enumerate(self.flat.graph_def.node)}
        boundary = sorted(regions.boundary - regions.batched,
                          key=lambda t: (position.get(t.rsplit(":", 1)[0], -1), t))
        reduced = {}  # the tensor's device in each replica -> (tensor, dtype, bytes)
        for tensor in boundary:
            op, value = tensor.rsplit(":", 1)[0], envs[0][tensor]
            if op in regions.data_dependent and value.dtype.is_floating:
                elements = value.shape.num_elements()
                group = tuple(replica_device(replicas, self.stand_ins, r, op,
                                             self.plan.assignment.get(op))
                              for r in range(len(lanes)))
                reduced.setdefault(group, []).append(
                    (tensor, value.dtype, elements and elements * value.dtype.size))
            else:
                for total, lane in zip(totals, lanes):
                    total[tensor] = envs[lane[0]][tensor]
        instance = _collective_keys(replicas.devices, boundary)[1]
        for group, tensors in reduced.items():
            group_key = _collective_keys(group, boundary)[0]
            for pack in gradient_packs(tensors):
                for r, (device, lane) in enumerate(zip(group, lanes)):
                    totals[r].update(_all_reduce_pack(
                        [[envs[m][tensor] for m in lane] for tensor in pack],
                        [shares[m] for m in lane], device, len(lanes),
                        (group_key, instance), self.tokens[device], f"pack{instance}", pack))
                instance += 1
        return totals

    def _all_microbatches(self, ops_of):
        """Control inputs of the update on a per-micro-batch op: after every copy."""
        tf = tensorflow()
        control = {}
        for node in self.pieces[(UPDATE, UPDATE)].node:
            for source in node.input:
                name = source[1:]
                if source.startswith("^") and name != GATE and name in ops_of[0]:
                    with tf.device(ops_of[0][name].device), \
                            tf.control_dependencies([ops[name] for ops in ops_of]):
                        control[source] = tf.constant(0.0)
        if not self.whole_batch:
            with tf.control_dependencies([]):
                control[f"^{GATE}"] = tf.constant(0.0)
        return control

    def _replica(self, m):
        """The replica micro-batch ``m`` runs in (None without replicas)."""
        return replica_of(self.plan.replicas, m) if self.plan.replicas else None

    def _microbatch(self, m):
        """Which micro-batch of its replica micro-batch ``m`` is (None: the replica's,
        or without replicas the step's, whole batch), as the execution graph counts
        them."""
        replicas = self.plan.replicas
        if replicas:
            return m % replicas.microbatches if replicas.microbatches else None
        return m if self.plan.microbatches > 1 else None

    def _device(self, m, k):
        """The device of stage ``k`` for micro-batch ``m`` (its replica's, if any)."""
        replicas = self.plan.replicas
        if self.stand_ins:
            return self.stand_ins[self._replica(m)].get(self.device[k], self.device[k])
        return replicas.devices[m] if replicas else self.device[k]

    def _import(self, key, prefix, env, ops_of, control, replica=None, microbatch=None):
        """Import piece ``key`` under ``prefix`` (on ``replica``'s devices when the
        plan has replicas), each op stamped as the copy of its op for ``replica`` and
        ``microbatch`` (:mod:`rewriters.copies`); add its tensors to ``env``."""
        tf = tensorflow()
        piece, members = stamped(self.pieces[key], replica, microbatch), self.members[key]
        replicas = self.plan.replicas
        if replicas and replica is not None:
            placements = replicas.placements
            piece = _on_replica(piece, replicas.devices[replica], self.pinned,
                                placements[replica] if placements else None,
                                self.stand_ins[replica] if self.stand_ins else None)
        if f"^{GATE}" not in control:  # nothing scheduled: roots wait for no gate
            piece = _without_gate(piece)
        input_map = dict(control)
        for node in piece.node:
            for source in node.input:
                if source.startswith("^"):
                    name = source[1:]
                    if source not in input_map and name not in members:
                        input_map[source] = _control_tensor(ops_of[name])
                elif source.split(":")[0] not in members:
                    tensor = source if ":" in source else f"{source}:0"
                    input_map[tensor] = env[tensor]
        if any(node.op in LOOP_ENTRY_OPS for node in piece.node):
            piece = _in_own_loop_frames(piece, prefix)
        names = [node.name for node in piece.node]
        ops = tf.graph_util.import_graph_def(piece, input_map=input_map,
                                             return_elements=names, name=prefix)
        imported = dict(zip(names, ops))
        for name, op in imported.items():
            ops_of[name] = op
            for i, tensor in enumerate(op.outputs):
                env[f"{name}:{i}"] = tensor
        return imported


def _without_gate(piece):
    """A copy of ``piece`` whose ops do not wait for the schedule's gate."""
    copy = type(piece)()
    copy.CopyFrom(piece)
    for node in copy.node:
        if f"^{GATE}" in node.input:
            inputs = [source for source in node.input if source != f"^{GATE}"]
            del node.input[:]
            node.input.extend(inputs)
    return copy


def _in_own_loop_frames(piece, prefix):
    """A copy of ``piece`` whose ``tf.compat.v1.while_loop`` frames are named for
    ``prefix``: TensorFlow's executor joins loops of one frame name into one loop.

    >>> from tensorflow.core.framework import graph_pb2
    >>> piece = graph_pb2.GraphDef()
    >>> enter = piece.node.add(name="while/Enter", op="Enter")
    >>> enter.attr["frame_name"].s = b"while/while_context"
    >>> _in_own_loop_frames(piece, "tfpart_mb1_stage0").node[0].attr["frame_name"].s
    b'tfpart_mb1_stage0/while/while_context'
    """
    copy = type(piece)()
    copy.CopyFrom(piece)
    for node in copy.node:
        if node.op in LOOP_ENTRY_OPS:
            node.attr["frame_name"].s = f"{prefix}/".encode() + node.attr["frame_name"].s
    return copy


def _all_reduce_pack(values, shares, device, group_size, keys, token, name, tensors):
    """On ``device``: each of ``tensors``' ``values`` (one per micro-batch) weighted by
    the micro-batches' ``shares`` and summed, flattened into one vector, all-reduced
    over ``group_size`` devices with ``keys`` (group, instance) and the ordering
    ``token``; the sums, by ``tensors`` (their names), in their shapes."""
    from tensorflow.python.ops import collective_ops

    tf = tensorflow()
    with tf.device(device), tf.name_scope(f"tfpart_allreduce/{name}"):
        weighted = [tf.add_n([value * tf.cast(share, value.dtype)
                              for value, share in zip(per_microbatch, shares)])
                    for per_microbatch in values]
        flat = tf.concat([tf.reshape(value, [-1]) for value in weighted], axis=0)
        summed = collective_ops.all_reduce_v2(
            flat, group_size=group_size, group_key=keys[0], instance_key=keys[1],
            ordering_token=token.handle)
        parts = tf.split(summed, tf.stack([tf.size(value) for value in weighted]),
                         num=len(weighted))
        return {tensor: tf.reshape(part, tf.shape(value))
                for tensor, part, value in zip(tensors, parts, weighted)}


def _collective_keys(devices, tensors):
    """The group key of ``devices`` and the first of the instance keys of the
    all-reduces of ``tensors``: stable across processes (every worker must agree),
    and unlikely to meet another compiled model's in one process.

    >>> group, first = _collective_keys(["/device:CPU:0", "/device:CPU:1"], ["g:0"])
    >>> (group, first) == _collective_keys(["/device:CPU:0", "/device:CPU:1"], ["g:0"])
    True
    >>> 0 < group < 2 ** 31 and 0 < first < 2 ** 31 - 2 ** 14
    True
    """
    group = 1 + zlib.crc32(",".join(devices).encode()) % (2 ** 30)
    first_instance = 1 + zlib.crc32(",".join(tensors).encode()) % (2 ** 16) * 2 ** 14
    return group, first_instance


def _split(rows, m_count, replicas):
    """Rows and first row of each micro-batch (scalar tensors): ``ceil(rows / M)`` each
    but the last, or the replicas' largest-remainder shares of ``rows`` (as
    :func:`partitioner.shares.proportional_shares` computes them, the faster replica
    first on ties), each cut the same way into its micro-batches for replicas of a
    pipeline."""
    tf = tensorflow()
    if not replicas:
        size = (rows + m_count - 1) // m_count
        return ([tf.clip_by_value(rows - m * size, 0, size) for m in range(m_count)],
                [m * size for m in range(m_count)])
    exact = tf.cast(rows, tf.float64) * tf.constant(replicas.fractions, tf.float64)
    whole = tf.floor(exact)
    left = tf.cast(rows, tf.float64) - tf.reduce_sum(whole)
    rank = tf.argsort(tf.argsort(whole - exact, stable=True), stable=True)
    sizes = tf.cast(whole + tf.cast(tf.cast(rank, tf.float64) < left, tf.float64), tf.int32)
    per = replicas.microbatches or 1
    if per > 1:  # replicas of a pipeline: each share in micro-batches of ceil(share / per)
        step = (sizes + per - 1) // per
        sizes = tf.reshape(tf.clip_by_value(
            sizes[:, None] - step[:, None] * tf.range(per)[None, :], 0, step[:, None]), [-1])
    offsets = tf.cumsum(sizes, exclusive=True)
    return [sizes[m] for m in range(m_count)], [offsets[m] for m in range(m_count)]


def _on_replica(piece, device, pinned, placement=None, stand_ins=None):
    """A copy of ``piece`` with its ops on ``device``, but the ``pinned`` ones; with a
    ``placement`` (a hybrid plan's replica), each op it names on its device there, and
    with ``stand_ins`` (a replica of a pipeline: its device for each of the first
    replica's) the others on the device standing for theirs."""
    copy = type(piece)()
    copy.CopyFrom(piece)
    for node in copy.node:
        if node.name not in pinned:
            node.device = (placement or {}).get(
                node.name, stand_ins.get(node.device, device) if stand_ins else device)
    return copy


def _piece_dependencies(pieces, piece_of):
    """For each piece, the pieces whose ops it reads (by data or control)."""
    return {key: {piece_of[source.lstrip("^").split(":")[0]] for node in graph.node
                  for source in node.input
                  if source.lstrip("^").split(":")[0] in piece_of} - {key}
            for key, graph in pieces.items()}


def _sinks(stage):
    """Nodes of a stage GraphDef that no other node of it consumes."""
    consumed = {source.lstrip("^").split(":")[0] for node in stage.node for source in node.input}
    return [node.name for node in stage.node if node.name not in consumed]


def _control_tensor(op):
    tf = tensorflow()
    if op.outputs:
        return op.outputs[0]
    with tf.control_dependencies([op]):
        return tf.constant(0.0)


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
