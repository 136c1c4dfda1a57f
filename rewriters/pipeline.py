"""Pipeline rewriter: run a plan's stages over micro-batches, in a new SavedModel.

The compiled signature keeps the original's inputs and outputs. It splits every input
along its first (batch) dimension into M micro-batches of ``ceil(B / M)`` rows (the
last one smaller when M does not divide B), runs each stage's ops for each
micro-batch on the stage's device, and concatenates the micro-batches' outputs. On
each device the micro-batches run in order (fill–drain): the source ops of stage k for
micro-batch m wait, by control edges, for the sink ops of stage k for micro-batch
m - 1, while stage k + 1 works on micro-batch m - 1. This is the schedule the
simulator predicts (:mod:`costmodel.pipeline`).

Mechanism: the signature is flattened into one GraphDef (:mod:`rewriters.reader`),
cut into one GraphDef per stage, and each (micro-batch, stage) is imported into a
``tf.function`` with ``import_graph_def``, its inputs from other stages mapped to the
tensors those stages produced for the same micro-batch and its variables to captured
``tf.Variable`` handles holding the checkpoint's values. The function is saved with
``tf.saved_model.save``, so the output is a SavedModel like any other; its variables
then get their planned devices in the object graph (``SavedVariable.device``), which
lets the compile machine save plans for devices it does not have. Only the compiled
signature is kept. Imported ops are named ``tfpart_mb<m>_stage<k>/<original name>``.

As a pass of :mod:`rewriters.passes` it is :func:`pipeline_pass`, run for plans with
stages.
"""
from __future__ import annotations

import re
from pathlib import Path

from rewriters.functions import private_library
from rewriters.reader import flatten_signature
from rewriters.savedmodel_io import SavedModelParts, read_saved_model
from rewriters.tf_import import tensorflow
from tfpart.errors import ModelError, PlacementError

PIPELINE_PREFIX = re.compile(r"^(?:.*/)?tfpart_mb\d+_stage\d+/")
GATE = "tfpart_gate"


def original_op_name(name):
    """The source model's op name of an op of a pipelined model.

    >>> original_op_name("StatefulPartitionedCall/tfpart_mb3_stage1/model/dense/MatMul")
    'model/dense/MatMul'
    """
    return PIPELINE_PREFIX.sub("", name)


def pipeline_pass(model, plan, workdir):
    """The pass: the pipelined model of ``plan``, with new variables in ``workdir``.

    Parameters
    ----------
    model : rewriters.savedmodel_io.SavedModelParts
        The input model (its checkpoint gives the variables' values).
    plan : tfpart.plan.Plan
        Read: ``stages``, ``microbatches``, ``assignment`` and ``context``'s
        ``signature`` and ``batch_size``.
    workdir : pathlib.Path
        An empty-or-missing scratch folder; the result's files live in it.

    Returns
    -------
    rewriters.savedmodel_io.SavedModelParts

    Raises
    ------
    tfpart.errors.ModelError, tfpart.errors.PlacementError
        If the signature cannot be pipelined (a scalar input, a graph that does not
        trace) or the checkpoint cannot be read.
    """
    target = Path(workdir) / "pipelined"
    device_of = _save_pipelined(model.directory, model.proto, plan, target)
    proto = read_saved_model(target)
    for obj in proto.meta_graphs[0].object_graph_def.nodes:
        if obj.HasField("variable") and obj.variable.name in device_of:
            obj.variable.device = device_of[obj.variable.name]
    return SavedModelParts(proto, target)


def _save_pipelined(model_dir, proto, plan, staging):
    """Save the pipelined model into ``staging``; return the planned device of each
    saved variable, by its name (the caller writes them into the object graph, which
    lets the compile machine save plans for devices it does not have)."""
    tf = tensorflow()
    context = plan.context
    flat = flatten_signature(proto, model_dir, context.get("batch_size"),
                             context.get("signature"))
    stage_of = _stage_of_every_node(flat, plan)
    stages = _stage_graphs(flat, plan, stage_of)
    values = _variable_values(model_dir, proto, flat)
    meta = proto.meta_graphs[0]
    outputs = {key: flat.outputs[int(t.name.rsplit(":", 1)[1])] for key, t in
               meta.signature_def[flat.info.signature].outputs.items()}
    specs = [tf.TensorSpec([None, *shape[1:]], dtype, name=key)
             for key, (_, shape, dtype) in sorted(flat.inputs.items())]
    for key, (_, shape, _) in flat.inputs.items():
        if not shape:
            raise PlacementError(model_dir, f"input {key!r} is a scalar; pipelining needs "
                                 "a batch dimension on every input")

    module = tf.Module()
    module.variables_by_op = {name: tf.Variable(values[name], name=name.replace("/", "_"))
                              for name in sorted(values)}
    pipeline = _PipelineBody(flat, plan, stage_of, stages, module.variables_by_op, outputs)
    module.serve = tf.function(pipeline, input_signature=specs, autograph=False)
    try:
        concrete = module.serve.get_concrete_function()
    except (ValueError, TypeError, tf.errors.OpError) as exc:
        raise ModelError(model_dir, "cannot build the pipelined signature: "
                         f"{str(exc).splitlines()[0]}") from None
    tf.saved_model.save(module, str(staging), signatures={flat.info.signature: concrete})
    return {name.replace("/", "_"): plan.assignment[name] for name in values}


class _PipelineBody:
    """The traced body of the pipelined signature (a callable for ``tf.function``)."""

    def __init__(self, flat, plan, stage_of, stages, variables, outputs):
        self.flat, self.plan, self.stage_of = flat, plan, stage_of
        self.stages, self.variables, self.outputs = stages, variables, outputs
        self.order = sorted(stages)
        self.device = {k: stages[k].node[0].device for k in self.order}
        self.sinks = {k: _sinks(stages[k]) for k in self.order}
        self.members = {k: {node.name for node in stages[k].node} for k in self.order}

    def __call__(self, *args):
        tf = tensorflow()
        graph = tf.compat.v1.get_default_graph()
        m_count = self.plan.microbatches
        keys = sorted(self.flat.inputs)
        handles = {f"{name}:0": graph.capture(var.handle) for name, var in self.variables.items()}
        first_device = self.device[self.order[0]]
        with tf.device(first_device):
            rows = tf.shape(args[0])[0]
            size = (rows + m_count - 1) // m_count
        done = {}  # stage -> sink ops of the previous micro-batch
        results = {key: [] for key in self.outputs}
        for m in range(m_count):
            # A micro-batch past the end of a small batch runs on one borrowed row whose
            # result is dropped: oneDNN's fused convolutions mis-shape empty inputs.
            with tf.device(first_device):
                real = tf.clip_by_value(rows - m * size, 0, size)
                start = tf.maximum(tf.minimum(m * size, rows - 1), 0)
                stop = start + tf.maximum(real, 1)
            env = dict(handles)
            for key, value in zip(keys, args):
                placeholder = self.flat.inputs[key][0]
                with tf.device(self.plan.assignment.get(placeholder, first_device)):
                    env[f"{placeholder}:0"] = value[start:stop]
            ops_of = {}
            for k in self.order:
                with tf.device(self.device[k]), tf.control_dependencies(done.get(k, [])):
                    gate = tf.constant(0.0, name=f"tfpart_gate_mb{m}_stage{k}")
                imported = self._import(k, m, env, ops_of, gate)
                done[k] = [imported[name] for name in self.sinks[k]]
            for key, tensor in self.outputs.items():
                results[key].append(env[tensor][:real])
        merged = {}
        for key, parts in results.items():
            with tf.device(self.plan.assignment.get(self.outputs[key].rsplit(":", 1)[0],
                                                    first_device)):
                merged[key] = tf.concat(parts, axis=0)
        return merged

    def _import(self, k, m, env, ops_of, gate):
        """Import stage ``k`` for micro-batch ``m``; add its tensors to ``env``."""
        tf = tensorflow()
        stage, members = self.stages[k], self.members[k]
        input_map = {f"^{GATE}": gate}
        for node in stage.node:
            for source in node.input:
                if source.startswith("^"):
                    name = source[1:]
                    if name != GATE and name not in members:
                        input_map[source] = _control_tensor(ops_of[name])
                elif source.split(":")[0] not in members:
                    tensor = source if ":" in source else f"{source}:0"
                    input_map[tensor] = env[tensor]
        names = [node.name for node in stage.node]
        ops = tf.graph_util.import_graph_def(stage, input_map=input_map,
                                             return_elements=names,
                                             name=f"tfpart_mb{m}_stage{k}")
        imported = dict(zip(names, ops))
        for name, op in imported.items():
            ops_of[name] = op
            for i, tensor in enumerate(op.outputs):
                env[f"{name}:{i}"] = tensor
        return imported


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
        stage = plan.stages.get(node.name)
        if stage is None:
            sources = [s.lstrip("^").split(":")[0] for s in node.input]
            stage = next((stage_of[s] for s in sources if s in stage_of), 0)
        stage_of[node.name] = stage
    return stage_of


def _stage_graphs(flat, plan, stage_of):
    """One GraphDef per stage: its nodes on its device, the source nodes gated."""
    tf = tensorflow()
    skip = {p for p, _, _ in flat.inputs.values()} | set(flat.variable_ops.values())
    stages = {}
    for node in flat.graph_def.node:
        if node.name in skip:
            continue
        k = stage_of[node.name]
        if k not in stages:
            stages[k] = tf.compat.v1.GraphDef()
            stages[k].versions.CopyFrom(flat.graph_def.versions)
        new = stages[k].node.add()
        new.CopyFrom(node)
        new.attr.pop("_class", None)
        device = plan.assignment.get(node.name)
        if device is None:
            device = next(plan.assignment[n.name] for n in flat.graph_def.node
                          if stage_of[n.name] == k and n.name in plan.assignment)
        new.device = device
        sources = [s.lstrip("^").split(":")[0] for s in node.input]
        if not any(stage_of[s] == k and s not in skip for s in sources):
            new.input.append(f"^{GATE}")
    for stage in stages.values():
        stage.library.CopyFrom(private_library(stage.node, flat.graph_def.library))
    return stages


def _variable_values(model_dir, proto, flat):
    """Checkpoint value of every variable the signature reads, by its flat op name."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    tf = tensorflow()
    prefix = Path(model_dir) / "variables" / "variables"
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    except (ValueError, tf.errors.OpError) as exc:
        raise ModelError(prefix, f"cannot read the variables: {str(exc).splitlines()[0]}") \
            from None
    keys = {node_id: attr.checkpoint_key for node_id, node in enumerate(graph.nodes)
            for attr in node.attributes if attr.name == "VARIABLE_VALUE"}
    missing = sorted(set(flat.variable_ops) - set(keys))
    if missing:
        raise ModelError(prefix, f"has no value for variable object {missing[0]}")
    return {name: reader.get_tensor(keys[node_id])
            for node_id, name in flat.variable_ops.items()}
