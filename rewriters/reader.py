"""Read a TensorFlow 2 SavedModel into an OpGraph, without running any of its code.

One signature is flattened into one graph (:mod:`rewriters.flatten`), imported into a
``tf.Graph`` with the inputs fixed at the compile batch size, so TensorFlow's shape
inference gives every tensor a concrete shape, hence FLOPs and bytes
(:mod:`rewriters.to_opgraph`).

Ops that TensorFlow runs as one fused kernel (:mod:`rewriters.fusion`) share a
colocation group, so every algorithm places them as one unit.

Variables the signature does not read (Keras 3 exports a second, unread copy of every
variable) are not ops of the graph: ``ModelInfo.unread_variables`` lists them, and the
placement rewriter puts them on the host, where they take no accelerator memory.
"""
from __future__ import annotations

from rewriters.captures import resource_bytes
from rewriters.dead_ops import dead_ops, drop_costs
from rewriters.flat_signature import import_flat, variable_op_name
from rewriters.flatten import flatten_signature
from rewriters.functions import library_index
from rewriters.fusion import fusion_groups
from rewriters.row_shard import output_nodes, shard_flat
from rewriters.tf1_reader import is_tf1, read_tf1_model
from rewriters.to_opgraph import merge_colocation_groups, opgraph_of
from rewriters.training_regions import step_regions
from tfpart.core.dtypes import tensor_bytes
from tfpart.core.limits import check_batch_size, check_tensor_sizes
from tfpart.core.ops import RESOURCE_WRITE_OPS
from tfpart.core.phases import timed


def read_model(proto, path="", batch_size=None, signature=None, timings=None):
    """OpGraph and ModelInfo of one signature of a SavedModel proto.

    Parameters
    ----------
    proto : saved_model_pb2.SavedModel
    path : str
        Where it came from (for error messages).
    batch_size : int, optional
        Size of unknown leading dimensions; default from the signature, else 1.
    signature : str, optional
        Signature to read; default ``serving_default`` or the first one.
    timings : dict, optional
        Gets the seconds of the analysis (Grappler's fusions, colocation groups, a
        training step's phases) as ``"analyse"`` (:func:`tfpart.core.phases.timed`).

    A TF1 SavedModel is read by :func:`rewriters.tf1_reader.read_tf1_model`.
    """
    if batch_size is not None:
        check_batch_size(batch_size, path)
    if is_tf1(proto):
        return read_tf1_model(proto, path, batch_size, signature, timings)
    flat = flatten_signature(proto, path, batch_size, signature)
    return _read_flat(proto, path, flat, timings)


def read_with_row_shards(proto, path, info, sizes, timings=None):
    """OpGraph and ModelInfo of the signature ``info`` describes (a
    :func:`read_model`'s), with the tables of ``sizes`` (table op -> rows of each
    shard) cut into row shards (:mod:`rewriters.row_shard`). ``info.flat`` stays the
    signature as the model has it, which the rewriter cuts the same way."""
    unsharded = info.flat
    # the cut adds no pattern Grappler's remapper fuses: its fusions of the whole model
    # are kept instead of running it again
    opgraph, info = _read_flat(proto, path, shard_flat(unsharded, sizes), timings,
                               fused=info.fusion_groups)
    info.flat = unsharded
    return opgraph, info


def _read_flat(proto, path, flat, timings, fused=None):
    """OpGraph and ModelInfo of a flattened signature (``fused``: fusion groups found
    already, instead of Grappler's)."""
    meta = proto.meta_graphs[0]
    objects = meta.object_graph_def
    graph = import_flat(flat, path)
    with graph.as_default():
        opgraph = opgraph_of(graph, _capture_bytes(meta, flat, path),
                              flat.info.batch_size, library_index(meta.graph_def.library))
    check_tensor_sizes(opgraph, flat.info.batch_size, path)  # before Grappler sees them
    with timed(timings, "analyse"):
        flat.info.fusion_groups = fusion_groups(
            opgraph, graph.as_graph_def() if fused is None else None, flat.outputs,
            found=fused or ())
        merge_colocation_groups(opgraph, flat.info.fusion_groups)
        merge_colocation_groups(opgraph, flat.row_shard_groups)
        merge_colocation_groups(opgraph, optimizer_slot_groups(
            opgraph, {*flat.variable_ops.values(), *flat.row_shards},
            [p for p, _, _ in flat.inputs.values()]))
        if any(attrs["op_type"] in RESOURCE_WRITE_OPS for attrs in opgraph.ops.values()):
            _mark_phases(opgraph, flat, proto, path)
        # not in a training step: there, making the pruned ops' inputs control edges
        # crashed a GRU pipeline (BENCHMARKS.md, "Models bigger than a device")
        if not flat.info.training:
            drop_costs(opgraph, dead_ops(opgraph, output_nodes(flat)))
    for node_id, node in enumerate(objects.nodes):
        if node.HasField("variable") and node_id not in flat.variable_ops:
            flat.info.unread_variables[node_id] = (variable_op_name(node_id, node.variable),
                                                   _variable_bytes(node.variable))
    flat.info.flat = flat
    return opgraph, flat.info


def _mark_phases(opgraph, flat, proto, path):
    """Each op's phase of a training step (:mod:`rewriters.training_regions`)."""
    info = flat.info
    info.regions = regions = step_regions(proto, path, info.batch_size, info.signature, flat)
    if not regions.is_training:
        return
    info.training, info.nonlinear = True, regions.nonlinear
    for name, attrs in opgraph.ops.items():
        attrs["phase"] = regions.phase.get(name, "update")


def optimizer_slot_groups(opgraph, variables, inputs):
    """Each trained variable with its optimizer slots (momentum, Adam's moments), so a
    variable, its slots and its update run on one device.

    A slot is a variable of the same size that the variable's update reads through
    data edges that carry nothing computed from the batch (``inputs``): Keras
    optimizers update a slot in place, then read it again (after a control edge) to
    update the variable, while the gradient is computed from the batch. Scalars
    (learning rate, step counter) are read by every update and never grouped.

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> for name, nbytes in [("w", 64), ("m", 64), ("lr", 4), ("x", 0)]:
    ...     g.add_op(name, op_type="VarHandleOp" if nbytes else "Placeholder",
    ...              param_bytes=nbytes)
    >>> for name, op_type in [("grad", "MatMul"), ("m_update", "AssignAddVariableOp"),
    ...                       ("m_read", "ReadVariableOp"), ("step", "Mul"),
    ...                       ("w_update", "AssignSubVariableOp")]:
    ...     g.add_op(name, op_type=op_type)
    >>> for a, b in [("x", "grad"), ("w", "grad"), ("m", "m_update"), ("grad", "m_update"),
    ...              ("m", "m_read"), ("m_read", "step"), ("lr", "step"), ("w", "w_update"),
    ...              ("step", "w_update")]:
    ...     g.add_edge(a, b)
    >>> g.add_edge("m_update", "m_read", control=True)
    >>> optimizer_slot_groups(g, {"w", "m", "lr"}, ["x"])
    [['w', 'm']]
    """
    def data_inputs(name):
        return [p for p, edge in opgraph.in_edges(name).items() if not edge["control"]]

    batched = set(inputs)
    for name in opgraph.topological_order():
        if any(p in batched for p in data_inputs(name)):
            batched.add(name)
    groups = []
    for write in opgraph.ops:
        if opgraph.ops[write]["op_type"] not in RESOURCE_WRITE_OPS:
            continue
        handles = [p for p in data_inputs(write) if p in variables]
        if not handles:
            continue
        target, size = handles[0], opgraph.ops[handles[0]]["param_bytes"]
        if size <= 8:
            continue
        seen, stack, slots = {write}, data_inputs(write), []
        while stack:
            name = stack.pop()
            if name in seen or name in batched:
                continue
            seen.add(name)
            if name in variables:
                if name != target and opgraph.ops[name]["param_bytes"] == size:
                    slots.append(name)
                continue  # a variable's inputs are not its value
            stack.extend(data_inputs(name))
        if slots:
            groups.append([target, *sorted(slots)])
    return groups


def _variable_bytes(variable):
    from tensorflow.python.framework import dtypes

    shape = tuple(max(d.size, 1) for d in variable.shape.dim)
    return tensor_bytes(shape, dtypes.as_dtype(variable.dtype).name)


def _capture_bytes(meta, flat, path):
    """Persistent bytes of each captured variable and resource, by flat op name."""
    objects = meta.object_graph_def
    owned = {name: _variable_bytes(objects.nodes[node_id].variable)
             for node_id, name in flat.variable_ops.items()}
    node_of = {name: node_id for node_id, name in flat.variable_ops.items()}
    for shard, (table, _, rows) in flat.row_shards.items():
        whole = objects.nodes[node_of[table]].variable
        owned[shard] = _variable_bytes(whole) * rows // max(whole.shape.dim[0].size, 1)
    owned.update({capture.op_name: resource_bytes(meta, node_id, path or None)
                  for node_id, capture in flat.info.captures.items()
                  if capture.kind == "resource"})
    return owned


__all__ = ["optimizer_slot_groups", "read_model", "read_with_row_shards"]
