"""The signatures and root functions a rebuilt model (stages, replicas, splits) keeps
of the original, and how: in its original graph on the placed variables, without XLA
where it compiles code that reads variables spread over devices, or, for a root
function the compiled signature only wraps (Keras's ``serve``, a module's
``__call__``), running the rebuilt signature.

Examples
--------
>>> from tensorflow.core.protobuf import saved_model_pb2
>>> meta = saved_model_pb2.SavedModel().meta_graphs.add()
>>> endpoint_functions(meta)
({}, {})
"""
from __future__ import annotations

from dataclasses import dataclass

from rewriters.functions import body_functions, callee, library_index
from tfpart.core.errors import PlacementError


def kept_endpoints(proto, signature):
    """What a rebuilt model keeps of the original besides ``signature``.

    Returns a dict: ``signatures``, the other signatures, and ``endpoints``, the
    functions of the root object (Keras's ``serve``, a module's methods, ``__call__``),
    each running its original graph on the same variables; ``compiled_signatures``,
    ``signature`` under other keys (:func:`same_signature`), and
    ``compiled_endpoints``, the root functions ``signature`` only wraps, which run the
    rebuilt signature (:func:`endpoint_binding`); and ``without_xla``, by name with
    why, the kept ones that run XLA-compiled functions (``jit_compile``), which read
    variables only on their own device while the plan spreads them: they run their
    graph without XLA (:func:`run_without_xla`).

    >>> from tensorflow.core.protobuf import saved_model_pb2
    >>> proto = saved_model_pb2.SavedModel()
    >>> meta = proto.meta_graphs.add()
    >>> for key in ("serving_default", "predict", "__saved_model_init_op"):
    ...     _ = meta.signature_def[key]
    >>> root, serve = meta.object_graph_def.nodes.add(), meta.object_graph_def.nodes.add()
    >>> serve.function.concrete_functions.append("f")
    >>> _ = root.children.add(node_id=1, local_name="serve")
    >>> kept = kept_endpoints(proto, "serving_default")
    >>> kept["signatures"], kept["endpoints"], kept["compiled_endpoints"], kept["without_xla"]
    (['predict'], ['serve'], [], {})
    """
    meta = proto.meta_graphs[0]
    functions = library_index(meta.graph_def.library)
    signature_functions, endpoints = endpoint_functions(meta)
    signatures = [k for k in meta.signature_def if k != signature and not k.startswith("__")]
    compiled = [name for name in endpoints if endpoint_binding(meta, signature, name)]
    twins = [name for name in signatures if same_signature(meta, name, signature)]
    without_xla = {}
    for roots_of, names in ((signature_functions, [k for k in signatures if k not in twins]),
                            (endpoints, [name for name in endpoints if name not in compiled])):
        for name in names:
            if any(_runs_xla(root, functions) for root in roots_of.get(name, [])):
                without_xla[name] = ("its XLA-compiled code reads variables only on its own "
                                     "device and the plan spreads them: it runs without XLA")
    return {"signatures": sorted(k for k in signatures if k not in twins),
            "endpoints": sorted(name for name in endpoints if name not in compiled),
            "compiled_signatures": sorted(twins), "compiled_endpoints": sorted(compiled),
            "without_xla": without_xla}


def check_nothing_kept_reads(kept, table, path):
    """Refuse to cut ``table`` into row shards when the compiled model keeps (``kept``,
    :func:`kept_endpoints`) a signature or a function that runs the original graph,
    which holds the table whole.

    >>> check_nothing_kept_reads({"signatures": ["predict"], "endpoints": []}, "t", "m")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: m: table t would be cut into row shards, but 'predict' of the original, which the compiled model keeps, runs the original graph on the whole table
    """
    whole = [*kept["signatures"], *kept["endpoints"]]
    if whole:
        raise PlacementError(path, f"table {table} would be cut into row shards, but "
                             f"{whole[0]!r} of the original, which the compiled model "
                             "keeps, runs the original graph on the whole table")


def same_signature(meta, name, signature):
    """Whether signature ``name`` is ``signature`` under another key (Keras exports
    ``serve`` and ``serving_default`` alike): the same inputs and outputs, and a
    function calling the same functions."""
    functions = library_index(meta.graph_def.library)
    signature_functions, _ = endpoint_functions(meta)

    def called(key):
        roots = signature_functions.get(key, [])
        return {callee(node, functions) for root in roots if root in functions
                for node in functions[root].node_def} - {None} if len(roots) == 1 else None

    def terms(key):
        found = meta.signature_def[key]
        return ({k: (v.dtype, v.tensor_shape.SerializeToString())
                 for k, v in found.inputs.items()},
                {k: (v.dtype, v.tensor_shape.SerializeToString())
                 for k, v in found.outputs.items()}, found.method_name)
    return name != signature and name in meta.signature_def and \
        signature in meta.signature_def and terms(name) == terms(signature) and \
        bool(called(name)) and called(name) == called(signature)


@dataclass(frozen=True)
class EndpointBinding:
    """A root function that a signature only wraps, in the signature's terms: its
    argument specs (``args``, nested as it takes them), the signature's input key of
    each flat argument (``input_keys``), its output structure (``outputs``, of specs)
    and the signature's output key of each flat output (``output_keys``)."""

    args: tuple
    input_keys: list
    outputs: object
    output_keys: list


def endpoint_binding(meta, signature, name):
    """The :class:`EndpointBinding` of root function ``name`` onto ``signature``, when
    the signature's function calls the function's one concrete function and their
    inputs and outputs match by name (as ``tf.saved_model.save`` and Keras's ``export``
    name them: inputs by their specs' names, outputs by their dict keys or
    ``output_<i>``); else None."""
    from tensorflow.python.saved_model import nested_structure_coder

    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    functions = library_index(meta.graph_def.library)
    signature_functions, endpoints = endpoint_functions(meta)
    concrete, wrapper = endpoints.get(name, []), signature_functions.get(signature, [])
    saved = meta.object_graph_def.concrete_functions
    if len(concrete) != 1 or concrete[0] not in saved or len(wrapper) != 1 \
            or wrapper[0] not in functions or signature not in meta.signature_def \
            or not any(callee(node, functions) == concrete[0]
                       for node in functions[wrapper[0]].node_def):
        return None
    args, kwargs = nested_structure_coder.decode_proto(
        saved[concrete[0]].canonicalized_input_signature)
    outputs = nested_structure_coder.decode_proto(saved[concrete[0]].output_signature)
    flat_args, flat_outputs = tf.nest.flatten(args), tf.nest.flatten(outputs)
    if kwargs or not all(isinstance(spec, tf.TensorSpec) for spec in flat_args + flat_outputs):
        return None
    input_keys = [spec.name for spec in flat_args]
    output_keys = sorted(outputs) if isinstance(outputs, dict) and \
        len(outputs) == len(flat_outputs) else [f"output_{i}" for i in range(len(flat_outputs))]
    wanted = meta.signature_def[signature]
    if sorted(input_keys) != sorted(wanted.inputs) or \
            sorted(output_keys) != sorted(wanted.outputs):
        return None
    return EndpointBinding(tuple(args), input_keys, outputs, output_keys)


def compiled_endpoint(rebuilt, binding):
    """A ``tf.function`` taking and returning what the endpoint of ``binding`` does,
    that runs ``rebuilt`` (the rebuilt signature's function: inputs positional in
    sorted key order, a dict of outputs by key)."""
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    order = sorted(binding.input_keys)

    def endpoint(*args):
        feed = dict(zip(binding.input_keys, tf.nest.flatten(args)))
        results = rebuilt(*[feed[key] for key in order])
        return tf.nest.pack_sequence_as(binding.outputs,
                                        [results[key] for key in binding.output_keys])
    return tf.function(endpoint, input_signature=list(binding.args), autograph=False)


def endpoint_functions(meta):
    """The concrete functions each signature (by key) and each function of the root
    object (by attribute name; tfpart's own excepted) of a TF2 SavedModel's object
    graph runs."""
    objects = meta.object_graph_def
    children = {child.local_name: objects.nodes[child.node_id]
                for child in objects.nodes[0].children} if objects.nodes else {}
    endpoints = {name: list(obj.function.concrete_functions) for name, obj in children.items()
                 if obj.WhichOneof("kind") == "function" and not name.startswith("tfpart_")
                 and name not in ("variables_by_op", "replica_variables", "collective_tokens")}
    signatures = {child.local_name: [objects.nodes[child.node_id].bare_concrete_function
                                     .concrete_function_name]
                  for child in children["signatures"].children} \
        if "signatures" in children else {}
    return signatures, endpoints


def run_without_xla(meta, names, signature):
    """Turn XLA compilation off in what the signatures and root functions ``names`` of
    a saved pipelined model run (``meta``, changed in place): the root functions' specs,
    their own functions and every call in the functions they reach that the pipelined
    ``signature`` does not (it keeps its XLA-compiled calls, placed with their
    variables).

    >>> from tensorflow.core.protobuf import saved_model_pb2
    >>> meta = saved_model_pb2.SavedModel().meta_graphs.add()
    >>> for name in ("serve", "pipelined", "block"):
    ...     meta.graph_def.library.function.add().signature.name = name
    >>> serve, pipelined, block = meta.graph_def.library.function
    >>> call = serve.node_def.add(op="StatefulPartitionedCall")
    >>> call.attr["f"].func.name = "block"; call.attr["_XlaMustCompile"].b = True
    >>> pipelined.node_def.add().CopyFrom(call); block.attr["_XlaMustCompile"].b = True
    >>> objects = meta.object_graph_def
    >>> root = objects.nodes.add()
    >>> for name in ("serve", "block"):
    ...     _ = root.children.add(node_id=len(objects.nodes), local_name=name)
    ...     objects.nodes.add().function.concrete_functions.append(name)
    >>> _ = root.children.add(node_id=len(objects.nodes), local_name="signatures")
    >>> _ = objects.nodes[-1].children.add(node_id=len(objects.nodes), local_name="main")
    >>> objects.nodes.add().bare_concrete_function.concrete_function_name = "pipelined"
    >>> run_without_xla(meta, ["serve", "block"], "main")
    >>> [_xla_compiled(f) for f in (serve.node_def[0], pipelined.node_def[0], block)]
    [False, True, False]
    """
    from tensorflow.core.protobuf.saved_object_graph_pb2 import FunctionSpec

    objects = meta.object_graph_def
    for child in objects.nodes[0].children if objects.nodes else ():
        if child.local_name in names and objects.nodes[child.node_id].HasField("function"):
            # loading wraps a method's concrete functions in a tf.function of this spec
            objects.nodes[child.node_id].function.function_spec.jit_compile = \
                FunctionSpec.JitCompile.OFF
    functions = library_index(meta.graph_def.library)
    signature_functions, endpoints = endpoint_functions(meta)
    pipelined = _reachable(signature_functions.get(signature, []), functions)
    roots = [root for name in names
             for root in signature_functions.get(name, []) + endpoints.get(name, [])]
    for name in _reachable(roots, functions):
        fdef = functions[name]
        # a function the pipelined signature also runs keeps its calls, and its own
        # attribute unless a kept root is that function itself
        holders = [] if name in pipelined else list(fdef.node_def)
        if name in roots or name not in pipelined:
            holders.append(fdef)
        for holder in holders:
            if _xla_compiled(holder):
                holder.attr["_XlaMustCompile"].b = False


def _reachable(roots, functions):
    """The functions of ``functions`` that ``roots`` are or call, at any depth."""
    seen, stack = set(), [root for root in roots if root in functions]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(called for node in functions[name].node_def
                         for called in [*body_functions(node), node.op] if called in functions)
    return seen


def _runs_xla(name, functions, seen=None):
    """Whether function ``name`` of the library ``functions``, or one it calls, is
    compiled by XLA (``_XlaMustCompile``)."""
    seen = set() if seen is None else seen
    if name in seen or name not in functions:
        return False
    seen.add(name)
    fdef = functions[name]
    if _xla_compiled(fdef):
        return True
    return any(_xla_compiled(node) or _runs_xla(called, functions, seen)
               for node in fdef.node_def for called in [*body_functions(node), node.op])


def _xla_compiled(function_or_node):
    # read without indexing: indexing a proto map adds the key
    attr = function_or_node.attr.get("_XlaMustCompile")
    return attr is not None and attr.b


__all__ = ["EndpointBinding", "check_nothing_kept_reads", "compiled_endpoint", "endpoint_binding", "endpoint_functions",
           "kept_endpoints", "run_without_xla", "same_signature"]
