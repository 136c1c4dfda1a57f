"""Flatten one signature of a TensorFlow 2 SavedModel into a single GraphDef, without
running any of its code.

One signature is read (``serving_default`` unless named). Its function and every
function it calls are inlined into one flat graph whose op names carry the call site
(``StatefulPartitionedCall/model/dense/MatMul``), the same names TensorFlow's own
function inlining gives them at run time. Control-flow ops (``While``, ``If``, ``Case``)
stay single ops, and so do calls of functions TensorFlow must compile whole with XLA
(:func:`rewriters.functions.inlined_callee`). The signature's captured variables become
``VarHandleOp`` ops named ``variables/<object id>/<variable name>``
(:func:`rewriters.flat_signature.variable_op_name`); its inputs become placeholders
fixed at the compile batch size (a ragged input's row splits at one more,
:mod:`rewriters.composite_inputs`).
"""
from __future__ import annotations

import dataclasses

from rewriters.captures import add_capture
from rewriters.composite_inputs import composite_inputs, row_splits_keys
from rewriters.flat_signature import (FlatSignature, ModelInfo, choose_signature, import_flat,
                                      signature_batch, signature_call)
from rewriters.functions import (callee, control_input_names, inlined_callee,
                                 library_index, split_input, topological_nodes)
from rewriters.tf1_reader import flatten_tf1_signature, is_tf1
from rewriters.tf_import import tensorflow
from tfpart.core.errors import ModelError
from tfpart.core.limits import MAX_CALL_DEPTH, check_graph_ops


HANDLE_DTYPES = {"variant", "resource"}  # tensors whose shape says nothing of their contents


def flatten_signature(proto, path="", batch_size=None, signature=None):
    """Inline one signature of a SavedModel proto into a :class:`FlatSignature` (of a
    TF1 SavedModel: :func:`rewriters.tf1_reader.flatten_tf1_signature`)."""
    if is_tf1(proto):
        return flatten_tf1_signature(proto, path, batch_size, signature)
    tf = tensorflow()
    meta = proto.meta_graphs[0]
    signature = choose_signature(meta, signature, path)
    call, root, top_nodes = signature_call(meta, signature, path)
    functions = library_index(meta.graph_def.library)
    objects = meta.object_graph_def
    bound = list(objects.concrete_functions[root].bound_inputs) \
        if root in objects.concrete_functions else []
    n_inputs = len(functions[root].signature.input_arg) - len(bound)
    if batch_size is None:
        batch_size = signature_batch(meta.signature_def[signature]) or 1

    flat = tf.compat.v1.GraphDef()
    flat.library.CopyFrom(meta.graph_def.library)
    arg_sources, inputs, variable_ops, batch_axes = [], {}, {}, {}
    input_names = {split_input(t.name)[0]: k for k, t in
                   meta.signature_def[signature].inputs.items()}
    composites = composite_inputs(meta, signature)
    splits = row_splits_keys(composites)  # batch + 1 values
    for i in range(n_inputs):
        placeholder = top_nodes[split_input(call.input[i])[0]]
        key = input_names.get(placeholder.name, placeholder.name)
        dims = placeholder.attr["shape"].shape.dim
        shape = [batch_size + (key in splits) if d.size < 0 else d.size for d in dims]
        batch_axes[placeholder.name] = tuple(i for i, d in enumerate(dims) if d.size < 0)
        node = flat.node.add(name=placeholder.name, op="Placeholder")
        node.attr["dtype"].type = placeholder.attr["dtype"].type
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
        inputs[key] = (placeholder.name, tuple(shape),
                       tf.dtypes.as_dtype(placeholder.attr["dtype"].type).name)
        arg_sources.append(f"{placeholder.name}:0")
    call_data = [t for t in call.input if not t.startswith("^")]
    captures = {}
    for k, node_id in enumerate(bound):
        capture = add_capture(flat, meta, node_id, call_data[n_inputs + k], path, top_nodes)
        captures[node_id] = capture
        if capture.kind == "variable":
            variable_ops[node_id] = capture.op_name
        arg_sources.append(f"{capture.op_name}:0")
    outputs = _Inliner(flat, functions, path).inline(root, "", arg_sources, [])
    for node in flat.node:
        node.attr.pop("_output_shapes", None)
    info = ModelInfo(signature=signature, root_function=root, batch_size=batch_size,
                     inputs={k: (shape, dtype) for k, (_, shape, dtype) in inputs.items()},
                     variable_ops=variable_ops,
                     captures={i: c for i, c in captures.items() if c.kind != "variable"},
                     signatures=sorted(k for k in meta.signature_def if not k.startswith("__")))
    return FlatSignature(graph_def=flat, inputs=inputs, outputs=outputs,
                         variable_ops=variable_ops, info=info, batch_axes=batch_axes,
                         composites=composites)


def flat_at(proto, path, batch_size, signature=None, like=None):
    """The signature flattened at ``batch_size``: from ``like``, an earlier flattening of
    it (TF2) at any batch size, without inlining again, since a flattening's batch size
    fixes only its inputs' placeholders; else (and for the signature's own batch size,
    ``None``) flattened anew."""
    if like is None or batch_size is None or like.info.format == "tf1" or \
            (signature is not None and signature != like.info.signature):
        return flatten_signature(proto, path, batch_size, signature)
    if batch_size == like.info.batch_size:
        return like
    tf = tensorflow()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(like.graph_def)
    placeholders = {node.name: node for node in graph_def.node if node.name in like.batch_axes}
    inputs, splits = {}, row_splits_keys(like.composites)
    for key, (name, shape, dtype) in like.inputs.items():
        shape = tuple(batch_size + (key in splits) if i in like.batch_axes[name] else d
                      for i, d in enumerate(shape))
        placeholders[name].attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
        inputs[key] = (name, shape, dtype)
    info = dataclasses.replace(like.info, batch_size=batch_size, regions=None, flat=None,
                               inputs={k: (s, d) for k, (_, s, d) in inputs.items()})
    return dataclasses.replace(like, graph_def=graph_def, inputs=inputs, info=info)


def tensor_shapes(proto, path, batch_size, signature=None, like=None):
    """Every tensor's shape at ``batch_size`` and one more (None where unknown or a
    handle), the ops as ``(name, type, data inputs, control inputs, outputs)``, and the
    flattened signature at ``batch_size`` (from ``like``, :func:`flat_at`)."""
    flats = [flat_at(proto, path, batch, signature, like)
             for batch in (batch_size, batch_size + 1)]
    graphs = [import_flat(flat, path) for flat in flats]
    shapes = {}
    for graph in graphs:
        for op in graph.get_operations():
            for tensor in op.outputs:
                shape = tensor.shape
                unknown = shape.rank is None or tensor.dtype.name in HANDLE_DTYPES
                shapes.setdefault(tensor.name, []).append(
                    None if unknown else tuple(shape.as_list()))
    ops = [(op.name, op.type, [t.name for t in op.inputs],
            control_input_names(op), [t.name for t in op.outputs])
           for op in graphs[0].get_operations()]
    return shapes, ops, flats[0]


class _Inliner:
    """Copies function bodies into one flat GraphDef, call sites becoming name prefixes.
    Before copying anything it counts the ops the copies would make
    (:func:`inlined_size`): functions that call each other twice per level grow
    exponentially, so that count is held to :data:`tfpart.core.limits.MAX_GRAPH_OPS` and the
    nesting to :data:`tfpart.core.limits.MAX_CALL_DEPTH`."""

    def __init__(self, flat, functions, source=""):
        self.flat = flat
        self.functions = functions
        self.source = source
        self._flat_cache = {}

    def _flat_body(self, fname):
        """(GraphDef with flat tensor names, list of flat output tensor names)."""
        if fname not in self._flat_cache:
            from tensorflow.python.framework.function_def_to_graph import (
                function_def_to_graph_def)

            tf = tensorflow()
            fdef = self.functions[fname]
            with tf.Graph().as_default():
                tf.graph_util.import_graph_def(tf.compat.v1.GraphDef(
                    library=self.flat.library), name="")
                body, names = function_def_to_graph_def(fdef)
            outputs = [names[fdef.ret[arg.name]] for arg in fdef.signature.output_arg]
            args = {a.name for a in fdef.signature.input_arg}
            nodes = [n for n in body.node if n.name not in args]
            self._flat_cache[fname] = (topological_nodes(nodes), outputs,
                                       [a.name for a in fdef.signature.input_arg])
        return self._flat_cache[fname]

    def inline(self, fname, prefix, arg_sources, control_in):
        """Inline ``fname`` under ``prefix``; return the flat names of its outputs."""
        if not prefix:
            self._check_size(fname)
        nodes, outputs, arg_names = self._flat_body(fname)
        args = dict(zip(arg_names, arg_sources))
        calls = {}  # call node name -> list of flat output tensor names
        local_names = {n.name for n in nodes}

        def resolve(text):
            node, output, control = split_input(text)
            if control:
                if node in args:
                    return ["^" + split_input(args[node])[0]]
                if node in calls:
                    return ["^" + split_input(t)[0] for t in calls[node]]
                return ["^" + prefix + node]
            if node in args:
                return [args[node]]
            if node in calls:
                return [calls[node][int(output or 0)]]
            return [prefix + node + (":" + output if output else "")]

        for node in nodes:
            inputs = [t for text in node.input for t in resolve(text)]
            target = inlined_callee(node, self.functions)
            if target is not None:
                data = [t for t in inputs if not t.startswith("^")]
                control = [t for t in inputs if t.startswith("^")]
                calls[node.name] = self.inline(target, f"{prefix}{node.name}/", data,
                                               control + control_in)
                continue
            copy = self.flat.node.add()
            copy.CopyFrom(node)
            copy.name = prefix + node.name
            del copy.input[:]
            copy.input.extend(inputs)
            if not inputs:
                copy.input.extend(control_in)
            _rename_colocation(copy, prefix, local_names)
        return [t for out in outputs for t in resolve(out)]


    def _check_size(self, fname):
        try:
            ops, depth = inlined_size(fname, self.functions)
        except ValueError as exc:
            raise ModelError(self.source, str(exc)) from None
        check_graph_ops(ops, self.source, "inlining the signature's function calls")
        if depth > MAX_CALL_DEPTH:
            raise ModelError(self.source, f"the signature's function calls nest {depth} "
                             f"deep, more than the {MAX_CALL_DEPTH} levels tfpart inlines")


def inlined_size(root, functions):
    """``(ops, depth)``: how many ops inlining every call of function ``root`` makes,
    and how deeply its calls nest; counted per function once, without copying
    anything. ValueError if a function calls itself.

    >>> from tensorflow.core.framework import function_pb2
    >>> def fdef(name, calls):
    ...     f = function_pb2.FunctionDef()
    ...     f.signature.name = name
    ...     for k, callee_name in enumerate(calls):
    ...         f.node_def.add(name=f"n{k}", op=callee_name)
    ...     return f
    >>> functions = {f"f{i}": fdef(f"f{i}", [f"f{i + 1}"] * 2) for i in range(30)}
    >>> functions["f30"] = fdef("f30", ["Relu"])
    >>> inlined_size("f28", functions), inlined_size("f0", functions)
    ((4, 3), (1073741824, 31))
    >>> functions["f30"] = fdef("f30", ["f12"])
    >>> inlined_size("f0", functions)
    Traceback (most recent call last):
    ...
    ValueError: function f12 calls itself
    """
    sizes, on_path, stack = {}, set(), [(root, False)]
    while stack:
        name, expanded = stack.pop()
        calls = [callee(node, functions) for node in functions[name].node_def]
        if expanded:
            ops = sum(sizes[c][0] if c else 1 for c in calls)
            depth = 1 + max((sizes[c][1] for c in calls if c), default=0)
            sizes[name] = (ops, depth)
            on_path.discard(name)
            continue
        if name in sizes:
            continue
        if name in on_path:
            raise ValueError(f"function {name} calls itself")
        on_path.add(name)
        stack.append((name, True))
        stack.extend((c, False) for c in dict.fromkeys(calls) if c and c not in sizes)
    return sizes[root]


def _rename_colocation(node, prefix, local_names):
    """Point ``_class: loc:@x`` at the inlined name of x (dropping x outside the body)."""
    if "_class" not in node.attr:
        return
    kept = [f"loc:@{prefix}{v.decode()[5:]}" for v in node.attr["_class"].list.s
            if v.decode().startswith("loc:@") and v.decode()[5:] in local_names]
    del node.attr["_class"].list.s[:]
    if kept:
        node.attr["_class"].list.s.extend(k.encode() for k in kept)
    else:
        del node.attr["_class"]


__all__ = ["HANDLE_DTYPES", "flatten_signature", "inlined_size", "tensor_shapes"]
