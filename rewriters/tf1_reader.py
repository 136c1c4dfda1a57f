"""Read a TensorFlow 1 SavedModel (``tf.compat.v1.saved_model.Builder``) into an OpGraph.

A TF1 SavedModel is a MetaGraphDef with ``signature_def`` and no object graph: each
signature names tensors of the top-level graph, whose variables (``VarHandleOp``
resource variables or legacy ``VariableV2`` ref variables) are restored by the
``saver_def``'s ops. The flat graph of a signature is the part of the top-level graph
its outputs need (data and control inputs), the inputs' placeholders fixed at the
compile batch size; op names are the graph's own, so the plan names the nodes the
placement rewriter (:mod:`rewriters.tf1_placement`) writes devices into.

Control flow of either kind is read: ``If``/``While`` ops (control flow v2) stay
single ops as in TF2 models; a ``tf.compat.v1.while_loop`` of control flow v1 is a
cycle of ``Enter``, ``Merge``, ``Switch``, ``NextIteration`` and ``Exit`` ops, whose
back edges (``NextIteration`` to ``Merge``) are left out of the OpGraph and whose
frame is one colocation group, so a loop is placed whole; ``cond``'s ``Switch`` and
``Merge`` ops are ops like any other, but a ``Switch`` runs beside its data input. A ref variable shares a colocation group with
every op that takes its ref (``Assign``, the ``read`` Identity), as a resource
variable does with the ops that take its handle.

Examples
--------
>>> from tensorflow.core.protobuf import saved_model_pb2
>>> is_tf1(saved_model_pb2.SavedModel(meta_graphs=[{"signature_def": {"serve": {}}}]))
True
"""
from __future__ import annotations

from rewriters.flat_signature import (FlatSignature, ModelInfo, choose_signature, import_flat,
                                      signature_batch)
from rewriters.functions import split_input
from rewriters.tf_import import tensorflow
from rewriters.to_opgraph import merge_colocation_groups, opgraph_of
from tfpart.core.dtypes import tensor_bytes
from tfpart.core.errors import ModelError
from tfpart.core.graph import UnionFind
from tfpart.core.ops import LOOP_BACK_OPS, LOOP_ENTRY_OPS, LOOP_EXIT_OPS, VARIABLE_OPS
from tfpart.core.phases import timed


def is_tf1(proto):
    """Whether ``proto`` is a TF1 SavedModel: signatures, and no object graph."""
    meta = proto.meta_graphs[0] if proto.meta_graphs else None
    return meta is not None and not meta.object_graph_def.nodes and bool(meta.signature_def)


def flatten_tf1_signature(proto, path="", batch_size=None, signature=None):
    """The :class:`~rewriters.reader.FlatSignature` of one signature of a TF1 model;
    ``variable_ops`` maps each variable's op name to itself."""

    tf = tensorflow()
    meta = proto.meta_graphs[0]
    signature = choose_signature(meta, signature, path)
    sig = meta.signature_def[signature]
    nodes = {node.name: node for node in meta.graph_def.node}
    if batch_size is None:
        batch_size = signature_batch(sig) or 1
    inputs = {}
    for key, info in sorted(sig.inputs.items()):
        name = split_input(info.name)[0]
        node = nodes.get(name)
        if node is None or node.op not in ("Placeholder", "PlaceholderWithDefault"):
            raise ModelError(path, f"signature {signature!r} input {key!r} is {info.name}, "
                             "not a placeholder of the graph")
        dims = info.tensor_shape.dim if not info.tensor_shape.unknown_rank else \
            node.attr["shape"].shape.dim
        shape = tuple(batch_size if d.size < 0 else d.size for d in dims)
        inputs[key] = (name, shape, tf.dtypes.as_dtype(node.attr["dtype"].type
                                                       if "dtype" in node.attr
                                                       else info.dtype).name)
    outputs = [sig.outputs[key].name for key in sorted(sig.outputs)]
    for key in sorted(sig.outputs):
        if split_input(sig.outputs[key].name)[0] not in nodes:
            raise ModelError(path, f"signature {signature!r} output {key!r} names "
                             f"{sig.outputs[key].name}, not a tensor of the graph")
    needed = _needed(nodes, [split_input(t)[0] for t in outputs],
                     {name for name, _, _ in inputs.values()})
    flat = tf.compat.v1.GraphDef()
    flat.versions.CopyFrom(meta.graph_def.versions)
    flat.library.CopyFrom(meta.graph_def.library)
    placeholders = {name: (shape, dtype) for name, shape, dtype in inputs.values()}
    for node in meta.graph_def.node:
        if node.name not in needed:
            continue
        copy = flat.node.add()
        if node.name in placeholders:
            shape, _ = placeholders[node.name]
            copy.name, copy.op = node.name, "Placeholder"
            copy.attr["dtype"].CopyFrom(node.attr["dtype"])
            copy.attr["shape"].shape.CopyFrom(tf.TensorShape(list(shape)).as_proto())
            continue
        copy.CopyFrom(node)
        copy.device = ""
        copy.attr.pop("_output_shapes", None)
    variable_ops = {node.name: node.name for node in flat.node if node.op in VARIABLE_OPS}
    info = ModelInfo(signature=signature, root_function="", batch_size=batch_size,
                     inputs={k: (shape, dtype) for k, (_, shape, dtype) in inputs.items()},
                     variable_ops=variable_ops, format="tf1",
                     signatures=sorted(k for k in meta.signature_def if not k.startswith("__")))
    return FlatSignature(graph_def=flat, inputs=inputs, outputs=outputs,
                         variable_ops=variable_ops, info=info)


def _needed(nodes, outputs, inputs):
    """Names of the nodes that computing ``outputs`` runs (data and control inputs,
    back to the signature's ``inputs``)."""
    needed, stack = set(), list(outputs)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        if name not in inputs:
            stack.extend(split_input(text)[0] for text in nodes[name].input)
    return needed


def read_tf1_model(proto, path="", batch_size=None, signature=None, timings=None):
    """OpGraph and ModelInfo of one signature of a TF1 SavedModel (see
    :func:`rewriters.reader.read_model`)."""
    from rewriters.fusion import fusion_groups

    flat = flatten_tf1_signature(proto, path, batch_size, signature)
    graph = import_flat(flat, path)
    owned = {node.name: _variable_bytes(node) for node in flat.graph_def.node
             if node.name in flat.variable_ops}
    meta = proto.meta_graphs[0]
    with graph.as_default():
        opgraph = opgraph_of(graph, owned, flat.info.batch_size,
                             {f.signature.name: f for f in meta.graph_def.library.function})
    with timed(timings, "analyse"):
        merge_colocation_groups(opgraph, loop_frames(graph) + switch_groups(graph))
        flat.info.fusion_groups = fusion_groups(opgraph, graph.as_graph_def(),
                                                flat.outputs)
        merge_colocation_groups(opgraph, flat.info.fusion_groups)
    read = set(flat.variable_ops)
    for node in meta.graph_def.node:
        if node.op in VARIABLE_OPS and node.name not in read:
            flat.info.unread_variables[node.name] = (node.name, _variable_bytes(node))
    return opgraph, flat.info


def loop_frames(graph):
    """The ops of each outermost ``tf.compat.v1.while_loop`` of ``graph`` (a tf.Graph),
    one list per loop, so that a loop is placed as one unit: the ops on its cycles
    (strongly connected through ``NextIteration``, one cycle per loop variable, joined
    by the loop's ``LoopCond``), the ``Enter`` ops that feed them and the ``Exit`` ops
    they feed (an inner loop lies on its outer loop's cycles)."""
    import networkx as nx

    edges = nx.DiGraph()
    for op in graph.get_operations():
        edges.add_node(op.name)
        for tensor in op.inputs:
            edges.add_edge(tensor.op.name, op.name)
        for dep in op.control_inputs:
            edges.add_edge(dep.name, op.name)
    types = {op.name: op.type for op in graph.get_operations()}
    cycles = [c for c in nx.strongly_connected_components(edges)
              if len(c) > 1 and any(types[name] in LOOP_BACK_OPS for name in c)]
    # each loop variable is a cycle of its own; the loop's condition joins them
    joined = UnionFind()
    cycle_of = {name: k for k, cycle in enumerate(cycles) for name in cycle}
    for name, k in cycle_of.items():
        joined.union(k, k)
        if types[name] == "LoopCond":
            for switch in edges.successors(name):
                if switch in cycle_of:
                    joined.union(k, cycle_of[switch])
    frames = []
    for ks in joined.sets():
        cycle = set().union(*(cycles[k] for k in ks))
        entries = {p for name in cycle for p in edges.predecessors(name)
                   if types[p] in LOOP_ENTRY_OPS}
        exits = {s for name in cycle for s in edges.successors(name) if types[s] in LOOP_EXIT_OPS}
        frames.append(sorted(cycle | entries | exits))
    return sorted(frames)


def switch_groups(graph):
    """Each control-flow v1 ``Switch`` with the op of its data input: TensorFlow's
    placer runs a Switch there, whatever device it names (seen on 2.21)."""
    return [[op.name, op.inputs[0].op.name] for op in graph.get_operations()
            if op.type in ("Switch", "RefSwitch") and op.inputs]


def _variable_bytes(node):
    from tensorflow.python.framework import dtypes

    dims = tuple(max(d.size, 1) for d in node.attr["shape"].shape.dim)
    return tensor_bytes(dims, dtypes.as_dtype(node.attr["dtype"].type).name)


__all__ = ["flatten_tf1_signature", "is_tf1", "loop_frames", "read_tf1_model",
           "switch_groups"]
