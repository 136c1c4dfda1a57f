"""The :class:`~tfpart.core.graph.OpGraph` of a flattened signature imported into a
``tf.Graph`` (:mod:`rewriters.flatten`): each op's FLOPs, bytes accessed (the rows a
gather or scatter addresses, :mod:`tfpart.core.touched`) and output bytes from its
inferred shapes, loops priced by their bodies and trips
(:mod:`rewriters.loops`), state-owning ops with their persistent bytes, and colocation
groups (TensorFlow's own, and those merged for ops that must share a device).
"""
from __future__ import annotations

from rewriters.functions import body_functions, control_input_names
from rewriters.loops import (LOOP_OPS, held_by_loop, is_held, list_contents, run_ahead_ops,
                             trips_bound)
from rewriters.tf_import import tensorflow
from tfpart.core.dtypes import tensor_bytes
from tfpart.core.flops import op_flops
from tfpart.core.graph import OpGraph, UnionFind
from tfpart.core.ops import CALL_OPS, CONTROL_FLOW_OPS, HOST_ONLY_OPS, LOOP_BACK_OPS
from tfpart.core.splits import SPLITTABLE_OPS, sliced_operand
from tfpart.core.touched import bytes_touched


ATTRS_FOR_FLOPS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "ksize", "equation")


def opgraph_of(graph, owned, batch_size, functions):
    """The OpGraph of ``graph``; ``owned`` gives the persistent bytes of the ops that
    own state (variables, resources), which also name their colocation groups."""
    opgraph = OpGraph()
    groups = UnionFind()
    body_cost = _BodyCost(functions, batch_size)
    lists = {}  # a TensorList's name: the (shape, dtype) of the elements it holds
    for op in graph.get_operations():
        in_shapes = [_concrete(t.shape, batch_size) for t in op.inputs]
        in_lists = [lists.get(t.name) for t in op.inputs]
        held = [c or (shape, t.dtype.name) for t, shape, c in zip(op.inputs, in_shapes, in_lists)]
        contents = list_contents(op, in_lists, lambda shape: _concrete(shape, batch_size))
        lists.update((t.name, c) for t, c in zip(op.outputs, contents) if c is not None)
        outputs = [c or (_concrete(t.shape, batch_size), t.dtype.name)
                   for t, c in zip(op.outputs, contents)]
        dtypes = {t.dtype.name for t in list(op.inputs) + list(op.outputs)}
        body_bytes = 0
        if op.type in CONTROL_FLOW_OPS or op.type in CALL_OPS:  # kept whole
            flops, body_bytes = body_cost.flops_and_bytes(op, in_shapes)
        else:
            flops = op_flops(op.type, in_shapes, [s for s, _ in outputs], _plain_attrs(op))
        bytes_accessed = bytes_touched(op.type, held, outputs)
        param_bytes = owned.get(op.name, 0)
        host_only = op.type in HOST_ONLY_OPS or "string" in dtypes
        opgraph.add_op(op.name, op_type=op.type, outputs=outputs, input_shapes=tuple(in_shapes),
                       flops=float(flops),
                       bytes_accessed=float(bytes_accessed), param_bytes=param_bytes,
                       allowed_kinds=frozenset({"cpu"}) if host_only else None,
                       stateful=bool(op.op_def.is_stateful) if op.op_def else False,
                       body_bytes=body_bytes, **_sliced(op))
        for k, tensor in enumerate(op.inputs):
            if tensor.op.type in LOOP_BACK_OPS:
                continue  # a v1 while loop's back edge: the loop is one unit, no cycle
            nbytes = tensor_bytes(*held[k])
            opgraph.add_edge(tensor.op.name, op.name, bytes=nbytes)
            if tensor.dtype.name == "resource" or tensor.dtype.name.endswith("_ref"):
                groups.union(op.name, tensor.op.name)
        for dep in control_input_names(op):
            opgraph.add_edge(dep, op.name, control=True)
        for location in op.colocation_groups():
            target = location.decode()[5:]
            if target != op.name and target in opgraph:
                groups.union(op.name, target)
    members = {}
    for name in opgraph.ops:
        members.setdefault(groups.find(name), []).append(name)
    for group in members.values():
        # Name a group after its variable when it has one, else its first op.
        label = min(group, key=lambda n: (n not in owned, n))
        for name in group:
            opgraph.ops[name]["colocation"] = label
    return opgraph


class _BodyCost:
    """FLOPs of a control-flow op or a call kept whole, and the bytes of the tensors its
    bodies hold at once: its bodies' ops at the op's input shapes (every trip of a loop
    whose trips are known, else one; the costlier branch of a conditional), a loop's
    trips in flight counted as :mod:`rewriters.loops` says."""

    def __init__(self, functions, batch_size):
        self.functions = functions
        self.batch_size = batch_size

    def flops_and_bytes(self, op, in_shapes):
        bodies = [body for body in (self._graph(name, op, in_shapes)
                                    for name in body_functions(op.node_def)) if body]
        if not bodies:
            return 0, 0
        per_body = [(sum(op_flops(o.type, [_concrete(t.shape, self.batch_size) for t in o.inputs],
                                  [_concrete(t.shape, self.batch_size) for t in o.outputs],
                                  _plain_attrs(o)) for o in body.get_operations()),
                     self._held_bytes(body.get_operations())) for body in bodies]
        if op.type not in LOOP_OPS:
            return max(f for f, _ in per_body), max(b for _, b in per_body)
        flops, trip_bytes = sum(f for f, _ in per_body), sum(b for _, b in per_body)
        if len(bodies) != 2:
            return flops, trip_bytes
        cond_name = op.get_attr("cond").name
        cond, body = sorted(bodies, key=lambda g: g.tfpart_function != cond_name)
        trips = trips_bound(cond, list(op.inputs))
        return flops * (trips or 1), held_by_loop(
            trip_bytes, self._held_bytes(run_ahead_ops(body, cond)), trips,
            op.get_attr("parallel_iterations"))

    def _graph(self, fname, op, in_shapes):
        """The FuncGraph of function ``fname`` at ``op``'s input shapes, or None."""
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        from tensorflow.core.framework.function_pb2 import FunctionDef

        tf = tensorflow()
        fdef = FunctionDef()
        fdef.CopyFrom(self.functions[fname])
        for arg in fdef.arg_attr.values():
            arg.attr.pop("_output_shapes", None)
        args = fdef.signature.input_arg
        offset = len(in_shapes) - len(args)  # If/Case take the predicate first
        shapes = [tf.TensorShape(in_shapes[offset + k]) if offset + k >= 0 else None
                  for k in range(len(args))]
        try:
            body = function_def_to_graph(fdef, input_shapes=shapes)
        except (ValueError, tf.errors.OpError):
            return None
        body.tfpart_function = fname
        return body

    def _held_bytes(self, ops):
        return sum(tensor_bytes(_concrete(t.shape, self.batch_size), t.dtype.name)
                   for o in ops if is_held(o) for t in o.outputs)


def merge_colocation_groups(opgraph, groups):
    """Merge the colocation groups of ops that must run on one device (one fused
    kernel, a variable with its optimizer slots)."""
    labels = UnionFind()
    for members in groups:
        for other in members[1:]:
            labels.union(opgraph.ops[members[0]]["colocation"], opgraph.ops[other]["colocation"])
    new_label = {label: min(same, key=lambda n: (not n.startswith("variables/"), n))
                 for same in labels.sets() for label in same}
    for name in opgraph.ops:
        attrs = opgraph.ops[name]
        attrs["colocation"] = new_label.get(attrs["colocation"], attrs["colocation"])


def _concrete(shape, batch_size):
    if shape.rank is None:
        return ()
    return tuple((batch_size if k == 0 else 1) if d is None else d
                 for k, d in enumerate(shape.as_list()))


def _plain_attrs(op):
    attrs = {}
    for name in ATTRS_FOR_FLOPS:
        if name in op.node_def.attr:
            value = op.get_attr(name)
            attrs[name] = value.decode() if isinstance(value, bytes) else value
    return attrs


def _sliced(op):
    """``{"sliced": ...}`` for an op whose output channels can be split across devices
    (:mod:`tfpart.core.splits`): the input it slices, that input's axis, and its producer."""
    if op.type not in SPLITTABLE_OPS:
        return {}
    attrs = {name: op.get_attr(name) for name in ("transpose_b", "data_format")
             if name in op.node_def.attr}
    found = sliced_operand(op.type, attrs)
    if found is None or len(op.outputs) != 1:
        return {}
    index, axis = found
    return {"sliced": {"input": index, "axis": axis, "producer": op.inputs[index].op.name}}


__all__ = ["ATTRS_FOR_FLOPS", "merge_colocation_groups", "opgraph_of"]
