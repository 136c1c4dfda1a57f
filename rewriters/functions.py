"""Walking the function library of a SavedModel: calls, control-flow bodies, tensors.

Function-call ops are inlined by the reader (their bodies' ops become OpGraph nodes
prefixed by the call site); control-flow ops stay one unit, with their bodies placed
on the op's device.
"""
from __future__ import annotations

from tfpart.core.ops import CALL_OPS

KEPT_WHOLE = ("_XlaMustCompile",)  # function attrs that keep a call one op


def library_index(library):
    """Function name -> FunctionDef."""
    return {f.signature.name: f for f in library.function}


def callee(node, functions):
    """Name of the function a call node runs, or None if ``node`` is not a call."""
    if node.op in CALL_OPS:
        return node.attr["f"].func.name
    if node.op in functions:
        return node.op
    return None


def inlined_callee(node, functions):
    """The function a call node runs if the reader inlines it, else None: a function
    TensorFlow must compile whole with XLA (Keras 3 compiles grouped convolutions so,
    which TensorFlow's CPU kernels cannot run) stays one op, as a control-flow op does.

    >>> from tensorflow.core.framework import function_pb2, node_def_pb2
    >>> f = function_pb2.FunctionDef(); f.signature.name = "conv"
    >>> call = node_def_pb2.NodeDef(name="c", op="StatefulPartitionedCall")
    >>> call.attr["f"].func.name = "conv"
    >>> inlined_callee(call, {"conv": f})
    'conv'
    >>> f.attr["_XlaMustCompile"].b = True
    >>> inlined_callee(call, {"conv": f}) is None
    True
    """
    target = callee(node, functions)
    if target is None or target not in functions:
        return target
    attrs = [functions[target].attr, node.attr]
    if any(a[key].b for a in attrs for key in KEPT_WHOLE if key in a):
        return None
    return target


def body_functions(node):
    """Names of the functions a control-flow (or any function-valued) attr refers to."""
    names = []
    for _, value in sorted(node.attr.items()):
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list") and value.list.func:
            names.extend(f.name for f in value.list.func)
    return names


def split_input(text):
    """``(node_name, output, is_control)`` of a FunctionDef or GraphDef input string.

    >>> split_input("dense/MatMul:product:0"), split_input("^init"), split_input("x")
    (('dense/MatMul', 'product:0', False), ('init', '', True), ('x', '', False))
    """
    if text.startswith("^"):
        return text[1:], "", True
    node, _, output = text.partition(":")
    return node, output, False


def control_input_names(op):
    """The names of the ops ``op`` (a ``tf.Operation``) waits for, in its NodeDef's
    order: ``op.control_inputs`` comes from the graph's edge set, whose order past a
    few edges follows pointer hashes and so changes from process to process.

    >>> import tensorflow as tf
    >>> with tf.Graph().as_default():
    ...     waited = [tf.constant(i, name=f"c{i}") for i in range(40)]
    ...     with tf.control_dependencies(waited):
    ...         after = tf.constant(0, name="after")
    >>> control_input_names(after.op) == [f"c{i}" for i in range(40)]
    True
    """
    if not op.control_inputs:
        return []
    return [text[1:] for text in op.node_def.input if text.startswith("^")]


def topological_nodes(node_defs):
    """NodeDefs ordered so every node comes after the nodes it reads (Kahn)."""
    by_name = {n.name: n for n in node_defs}
    waiting = {n.name: {split_input(i)[0] for i in n.input} & by_name.keys() for n in node_defs}
    users = {name: [] for name in by_name}
    for name, deps in waiting.items():
        for dep in deps:
            users[dep].append(name)
    ready = [n.name for n in node_defs if not waiting[n.name]]
    order = []
    while ready:
        name = ready.pop()
        order.append(by_name[name])
        for user in users[name]:
            waiting[user].discard(name)
            if not waiting[user]:
                ready.append(user)
    if len(order) != len(node_defs):
        raise ValueError("function body has a cycle")
    return order


def private_library(nodes, library):
    """The functions ``nodes`` reach, renamed ``<name>_<hash of its definition>``.

    Importing a library into a process that already holds a different function of the
    same name fails; names derived from the definitions make equal functions share a
    name and different ones never collide. ``nodes`` (NodeDefs) are updated in place;
    the pruned, renamed FunctionDefList is returned.
    """
    import hashlib

    from tensorflow.core.framework import function_pb2

    functions = library_index(library)
    reached, stack = [], [name for node in nodes for name in body_functions(node)]
    while stack:
        name = stack.pop()
        if name in functions and name not in reached:
            reached.append(name)
            stack.extend(n for node in functions[name].node_def for n in body_functions(node)
                         + ([node.op] if node.op in functions else []))
    digest = {name: hashlib.sha1(functions[name].SerializeToString(deterministic=True))
              .hexdigest()[:10] for name in reached}
    rename = {name: f"{name}_{digest[name]}" for name in reached}
    pruned = function_pb2.FunctionDefLibrary()
    for name in sorted(reached):
        fdef = pruned.function.add()
        fdef.CopyFrom(functions[name])
        fdef.signature.name = rename[name]
        _rename_calls(fdef.node_def, rename)
    _rename_calls(nodes, rename)
    return pruned


def _rename_calls(nodes, rename):
    for node in nodes:
        if node.op in rename:
            node.op = rename[node.op]
        for value in node.attr.values():
            if value.HasField("func") and value.func.name in rename:
                value.func.name = rename[value.func.name]
            elif value.HasField("list"):
                for func in value.list.func:
                    if func.name in rename:
                        func.name = rename[func.name]
