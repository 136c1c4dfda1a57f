"""Read a TensorFlow 2 SavedModel into an OpGraph, without running any of its code.

One signature is read (``serving_default`` unless named). Its function and every
function it calls are inlined into one flat graph whose op names carry the call site
(``StatefulPartitionedCall/model/dense/MatMul``), the same names TensorFlow's own
function inlining gives them at run time. Control-flow ops (``While``, ``If``, ``Case``)
stay single ops, and so do calls of functions TensorFlow must compile whole with XLA
(:func:`rewriters.functions.inlined_callee`). The signature's captured variables become ``VarHandleOp`` ops named
``variables/<object id>/<variable name>``. The flat graph is imported into a
``tf.Graph`` with the inputs fixed at the compile batch size, so TensorFlow's shape
inference gives every tensor a concrete shape, hence FLOPs and bytes.

Ops that TensorFlow runs as one fused kernel (:mod:`rewriters.fusion`) share a
colocation group, so every algorithm places them as one unit.

Variables the signature does not read (Keras 3 exports a second, unread copy of every
variable) are not ops of the graph: ``ModelInfo.unread_variables`` lists them, and the
placement rewriter puts them on the host, where they take no accelerator memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rewriters.captures import add_capture, resource_bytes
from rewriters.dead_ops import dead_ops, drop_costs
from rewriters.fusion import fusion_groups
from rewriters.functions import (body_functions, callee, inlined_callee,
                                 library_index, split_input, topological_nodes)
from rewriters.loops import (LOOP_OPS, held_by_loop, is_held, list_contents, run_ahead_ops,
                             trips_bound)
from rewriters.tf_import import tensorflow
from tfpart.dtypes import tensor_bytes
from tfpart.errors import ModelError
from tfpart.flops import op_flops
from tfpart.graph import OpGraph, UnionFind
from tfpart.limits import (MAX_CALL_DEPTH, check_batch_size, check_graph_ops,
                           check_tensor_sizes)
from tfpart.ops import (CALL_OPS, CONTROL_FLOW_OPS, HOST_ONLY_OPS, LOOP_BACK_OPS,
                        RESOURCE_WRITE_OPS)
from tfpart.phases import timed
from tfpart.splits import SPLITTABLE_OPS, sliced_operand

HANDLE_DTYPES = {"variant", "resource"}  # tensors whose shape says nothing of their contents
ATTRS_FOR_FLOPS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "ksize", "equation")


@dataclass
class ModelInfo:
    """What the reader learned besides the graph."""

    signature: str
    root_function: str
    batch_size: int
    inputs: dict  # signature input name -> (shape at batch size, dtype)
    variable_ops: dict = field(default_factory=dict)  # object-graph node id -> op name
    # the other captures (constants, resources, assets): node id -> rewriters.captures.Capture
    captures: dict = field(default_factory=dict)
    signatures: list = field(default_factory=list)
    fusion_groups: list = field(default_factory=list)  # lists of ops run as one kernel
    unread_variables: dict = field(default_factory=dict)  # node id -> (op name, bytes)
    training: bool = False  # the signature updates variables from the batch
    format: str = "tf2"  # "tf1": a MetaGraphDef with signatures and no object graph
    nonlinear: list = field(default_factory=list)  # ops making samples depend on the batch


def variable_op_name(node_id, saved_variable):
    """OpGraph name of the variable at object-graph node ``node_id``."""
    return f"variables/{node_id}/{saved_variable.name}" if saved_variable.name else \
        f"variables/{node_id}"


def choose_signature(meta, signature, path):
    names = sorted(k for k in meta.signature_def if not k.startswith("__"))
    if not names:
        raise ModelError(path, "the SavedModel has no signatures to compile")
    if signature is None:
        return "serving_default" if "serving_default" in names else names[0]
    if signature not in names:
        raise ModelError(path, f"no signature {signature!r} (has: {', '.join(names)})")
    return signature


def signature_call(meta, signature, path):
    """The top-level call node that computes ``signature`` and its function's name."""
    nodes = {n.name: n for n in meta.graph_def.node}
    output = next(iter(meta.signature_def[signature].outputs.values())).name
    node = nodes.get(split_input(output)[0])
    functions = library_index(meta.graph_def.library)
    if node is None or callee(node, functions) not in functions:
        raise ModelError(path, f"signature {signature!r} is not computed by a function call;"
                         " only TensorFlow 2 SavedModels are supported")
    return node, callee(node, functions), nodes


@dataclass
class FlatSignature:
    """One signature inlined into a single GraphDef (see the module docstring)."""

    graph_def: object
    inputs: dict  # signature input name -> (placeholder name, shape, dtype name)
    outputs: list  # flat tensor names of the signature's outputs
    variable_ops: dict  # object-graph node id -> VarHandleOp name
    info: ModelInfo

    def outputs_by_key(self, proto):
        """The flat tensor of each of the signature's outputs, by its key in ``proto``'s
        ``signature_def`` (a TF1 signature names the graph's own tensors)."""
        outputs = proto.meta_graphs[0].signature_def[self.info.signature].outputs
        if self.info.format == "tf1":
            return {key: info.name for key, info in outputs.items()}
        return {key: self.outputs[int(info.name.rsplit(":", 1)[1])]
                for key, info in outputs.items()}

    def bound_outside(self):
        """A test of a node's name: whether it is one a rebuilt function binds to
        tensors of its own instead of importing it (an input's placeholder, a variable,
        or any node of a captured table or asset)."""
        from rewriters.captures import HANDLE_KINDS

        names = set(self.variable_ops.values()) | {p for p, _, _ in self.inputs.values()}
        handles = {c.op_name for c in self.info.captures.values() if c.kind in HANDLE_KINDS}
        prefixes = tuple(f"{h}/" for h in handles)
        return lambda name: name in names or name in handles or name.startswith(prefixes)


def flatten_signature(proto, path="", batch_size=None, signature=None):
    """Inline one signature of a SavedModel proto into a :class:`FlatSignature` (of a
    TF1 SavedModel: :func:`rewriters.tf1_reader.flatten_tf1_signature`)."""
    from rewriters.tf1_reader import flatten_tf1_signature, is_tf1

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
    arg_sources, inputs, variable_ops = [], {}, {}
    input_names = {split_input(t.name)[0]: k for k, t in
                   meta.signature_def[signature].inputs.items()}
    for i in range(n_inputs):
        placeholder = top_nodes[split_input(call.input[i])[0]]
        shape = [batch_size if d.size < 0 else d.size
                 for d in placeholder.attr["shape"].shape.dim]
        node = flat.node.add(name=placeholder.name, op="Placeholder")
        node.attr["dtype"].type = placeholder.attr["dtype"].type
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
        inputs[input_names.get(placeholder.name, placeholder.name)] = (
            placeholder.name, tuple(shape),
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
                         variable_ops=variable_ops, info=info)


def import_flat(flat, path=""):
    """A ``tf.Graph`` holding the flattened signature, every shape inferred."""
    tf = tensorflow()
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(flat.graph_def, name="")
        except (ValueError, tf.errors.OpError) as exc:
            raise ModelError(path, f"cannot rebuild signature {flat.info.signature!r}: "
                             f"{str(exc).splitlines()[0]}") from None
    return graph


def tensor_shapes(proto, path, batch_size, signature=None):
    """Every tensor's shape at ``batch_size`` and one more (None where unknown or a
    handle), the ops as ``(name, type, data inputs, control inputs, outputs)``, and the
    flattened signature at ``batch_size``."""
    flats = [flatten_signature(proto, path, batch, signature)
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
            [c.name for c in op.control_inputs], [t.name for t in op.outputs])
           for op in graphs[0].get_operations()]
    return shapes, ops, flats[0]


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
        training step's phases) as ``"analyse"`` (:func:`tfpart.phases.timed`).

    A TF1 SavedModel is read by :func:`rewriters.tf1_reader.read_tf1_model`.
    """
    if batch_size is not None:
        check_batch_size(batch_size, path)
    from rewriters.tf1_reader import is_tf1, read_tf1_model

    if is_tf1(proto):
        return read_tf1_model(proto, path, batch_size, signature, timings)
    flat = flatten_signature(proto, path, batch_size, signature)
    meta = proto.meta_graphs[0]
    objects = meta.object_graph_def
    graph = import_flat(flat, path)
    with graph.as_default():
        opgraph = opgraph_of(graph, _capture_bytes(meta, flat, path),
                              flat.info.batch_size, library_index(meta.graph_def.library))
    check_tensor_sizes(opgraph, flat.info.batch_size, path)  # before Grappler sees them
    with timed(timings, "analyse"):
        flat.info.fusion_groups = fusion_groups(opgraph, graph.as_graph_def(), flat.outputs)
        merge_colocation_groups(opgraph, flat.info.fusion_groups)
        merge_colocation_groups(opgraph, optimizer_slot_groups(
            opgraph, set(flat.variable_ops.values()), [p for p, _, _ in flat.inputs.values()]))
        if any(attrs["op_type"] in RESOURCE_WRITE_OPS for attrs in opgraph.ops.values()):
            _mark_phases(opgraph, flat.info, proto, path, signature)
        # not in a training step: there, making the pruned ops' inputs control edges
        # crashed a GRU pipeline (BENCHMARKS.md, "Models bigger than a device")
        if not flat.info.training:
            drop_costs(opgraph, dead_ops(opgraph, {t.rsplit(":", 1)[0] for t in flat.outputs}))
    for node_id, node in enumerate(objects.nodes):
        if node.HasField("variable") and node_id not in flat.variable_ops:
            flat.info.unread_variables[node_id] = (variable_op_name(node_id, node.variable),
                                                   _variable_bytes(node.variable))
    return opgraph, flat.info


def _mark_phases(opgraph, info, proto, path, signature):
    """Each op's phase of a training step (:mod:`rewriters.training_regions`)."""
    from rewriters.training_regions import step_regions

    regions = step_regions(proto, path, info.batch_size, signature)
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
    >>> from tfpart.graph import OpGraph
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


def signature_batch(signature_def):
    for tensor in signature_def.inputs.values():
        dims = tensor.tensor_shape.dim
        if dims and dims[0].size > 0:
            return dims[0].size
    return None


def _variable_bytes(variable):
    from tensorflow.python.framework import dtypes

    shape = tuple(max(d.size, 1) for d in variable.shape.dim)
    return tensor_bytes(shape, dtypes.as_dtype(variable.dtype).name)


class _Inliner:
    """Copies function bodies into one flat GraphDef, call sites becoming name prefixes.
    Before copying anything it counts the ops the copies would make
    (:func:`inlined_size`): functions that call each other twice per level grow
    exponentially, so that count is held to :data:`tfpart.limits.MAX_GRAPH_OPS` and the
    nesting to :data:`tfpart.limits.MAX_CALL_DEPTH`."""

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
    (:mod:`tfpart.splits`): the input it slices, that input's axis, and its producer."""
    if op.type not in SPLITTABLE_OPS:
        return {}
    attrs = {name: op.get_attr(name) for name in ("transpose_b", "data_format")
             if name in op.node_def.attr}
    found = sliced_operand(op.type, attrs)
    if found is None or len(op.outputs) != 1:
        return {}
    index, axis = found
    return {"sliced": {"input": index, "axis": axis, "producer": op.inputs[index].op.name}}


def _capture_bytes(meta, flat, path):
    """Persistent bytes of each captured variable and resource, by flat op name."""
    objects = meta.object_graph_def
    owned = {name: _variable_bytes(objects.nodes[node_id].variable)
             for node_id, name in flat.variable_ops.items()}
    owned.update({capture.op_name: resource_bytes(meta, node_id, path or None)
                  for node_id, capture in flat.info.captures.items()
                  if capture.kind == "resource"})
    return owned


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
        bytes_accessed = sum(tensor_bytes(s, d) for s, d in held + outputs)
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
        for dep in op.control_inputs:
            opgraph.add_edge(dep.name, op.name, control=True)
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


__all__ = ["FlatSignature", "ModelInfo", "flatten_signature", "import_flat",
           "merge_colocation_groups", "opgraph_of", "read_model", "signature_batch",
           "variable_op_name"]
