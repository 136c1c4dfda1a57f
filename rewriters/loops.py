"""What a functional ``While`` loop holds in memory, read from its bodies, and what a
``TensorList`` holds.

TensorFlow's executor runs up to ``parallel_iterations`` trips of a loop at once: every
op of the body that depends only on loop invariants (a weight, the input sequence) and
on counters (``i + 1``) runs ahead of the recurrence. In a Keras RNN that is the input
projection of every time step, ``x[t] @ kernel``: all of them are held while the
recurrence catches up. A ``TensorList`` (a variant tensor) holds its elements: the input
sequence unstacked for the loop, the outputs the loop writes.
"""
from __future__ import annotations

from rewriters.tf_import import tensorflow
from tfpart.core.ops import ALIASING_OPS

LIST_READS = {"TensorListGetItem"}  # an element of a list, its buffer shared
LOOP_OPS = {"While", "StatelessWhile"}


def run_ahead_ops(body, cond):
    """The ops of a loop's ``body`` and ``cond`` (FuncGraphs, the loop variables as their
    inputs and the body's next values as its outputs) that TensorFlow can run trips
    ahead: ops that read, through the bodies, only loop invariants (a variable the body
    passes through unchanged) and counters (a scalar the body computes from itself and
    invariants alone).

    Examples
    --------
    >>> import tensorflow as tf
    >>> from tensorflow.python.framework.function_def_to_graph import function_def_to_graph
    >>> xs = tf.zeros([6, 2, 3]); kernel = tf.ones([3, 4])
    >>> @tf.function
    ... def f(xs, kernel):
    ...     return tf.while_loop(lambda i, h: i < 6,
    ...                          lambda i, h: (i + 1, tf.tanh(h + xs[i] @ kernel)),
    ...                          (0, tf.zeros([2, 4])))
    >>> graph = f.get_concrete_function(xs, kernel).graph
    >>> loop = next(op for op in graph.get_operations() if op.type == "StatelessWhile")
    >>> lib = {f.signature.name: f for f in graph.as_graph_def().library.function}
    >>> body, cond = (function_def_to_graph(lib[loop.get_attr(k).name]) for k in ("body", "cond"))
    >>> ahead = {op.type for op in run_ahead_ops(body, cond)}
    >>> "MatMul" in ahead, "Less" in ahead, "Tanh" in ahead  # Tanh waits on the last trip
    (True, True, False)
    """
    invariant, counter = _invariant_and_counter_inputs(body)
    steady = {body.inputs[k].op for k in invariant | counter}
    ahead = []
    for graph in (body, cond):
        graph_steady = steady if graph is body else {
            cond.inputs[k].op for k in invariant | counter if k < len(cond.inputs)}
        for op in graph.get_operations():  # in topological order
            if op.type == "Placeholder":
                continue
            if all(t.op in graph_steady for t in op.inputs) and all(
                    c in graph_steady for c in op.control_inputs):
                graph_steady.add(op)
                ahead.append(op)
    return ahead


def _invariant_and_counter_inputs(body):
    """Indices of the loop variables the body passes through unchanged, and of those it
    computes from themselves and invariants through scalar ops alone."""
    invariant, candidates = set(), {}
    for k, (arg, result) in enumerate(zip(body.inputs, body.outputs)):
        source = result
        while source.op.type in ("Identity", "IdentityN") and source.op.inputs:
            source = source.op.inputs[source.value_index if source.op.type == "IdentityN" else 0]
        if source is arg:
            invariant.add(k)
        else:
            candidates[k] = source
    position = {arg.op: k for k, arg in enumerate(body.inputs)}
    counter = set()
    for k, source in candidates.items():
        cone, stack, scalar = set(), [source.op], True
        while stack and scalar:
            op = stack.pop()
            if op in cone:
                continue
            cone.add(op)
            if op in position:
                scalar = position[op] in invariant or position[op] == k
                continue
            scalar = all(t.shape.rank == 0 for t in op.outputs)
            stack.extend(t.op for t in op.inputs)
        if scalar:
            counter.add(k)
    return invariant, counter


def trips_bound(cond, loop_inputs):
    """The number of trips a loop makes when its condition compares a loop variable with
    a constant (``i < 12``, as Keras RNNs and ``tf.range`` loops do), else None.
    ``loop_inputs`` are the loop op's inputs in the outer graph (their constant values
    stand for the cond's arguments)."""
    bounds = []
    outer = {arg.op: loop_inputs[k] for k, arg in enumerate(cond.inputs) if k < len(loop_inputs)}
    for op in cond.get_operations():
        if op.type not in ("Less", "LessEqual") or len(op.inputs) != 2:
            continue
        value = _constant(outer.get(op.inputs[1].op, op.inputs[1]))
        if value is not None and value.ndim == 0 and value.dtype.kind == "i":
            bounds.append(int(value) + (op.type == "LessEqual"))
    return min(bounds) if bounds else None


def _constant(tensor):
    from tensorflow.python.framework import tensor_util

    try:
        return tensor_util.constant_value(tensor)
    except (TypeError, ValueError):
        return None


def held_by_loop(trip_bytes, ahead_bytes, trips, parallel_iterations):
    """Bytes a loop's bodies hold at once: one trip's tensors, and those of the ops that
    run ahead for each further trip in flight.

    >>> held_by_loop(trip_bytes=5000, ahead_bytes=1000, trips=12, parallel_iterations=32)
    16000
    >>> held_by_loop(5000, 1000, trips=None, parallel_iterations=10)
    14000
    """
    in_flight = min(trips, parallel_iterations) if trips else parallel_iterations
    return trip_bytes + max(0, in_flight - 1) * ahead_bytes


def list_contents(op, input_contents, concrete):
    """What each output of ``op`` holds when it is a ``TensorList``: (shape, dtype) of its
    elements stacked, or None. ``input_contents`` gives the same for the op's inputs;
    ``concrete`` turns a TensorShape into a tuple at the batch size.

    A list made from a tensor holds a copy of it; a loop passes its lists through, and a
    list reserved with a known length and element shape comes out of the loop full."""
    if op.type == "TensorListFromTensor":
        return [(concrete(op.inputs[0].shape), op.inputs[0].dtype.name)]
    if op.type not in LOOP_OPS:
        return [None] * len(op.outputs)
    contents = []
    for k, tensor in enumerate(op.inputs[:len(op.outputs)]):
        if input_contents[k] is not None:
            contents.append(input_contents[k])
        elif tensor.op.type == "TensorListReserve":
            contents.append(_reserved(tensor.op, concrete))
        else:
            contents.append(None)
    return contents


def _reserved(reserve, concrete):
    tf = tensorflow()
    from tensorflow.python.framework import tensor_util

    element_shape = tensor_util.constant_value_as_shape(reserve.inputs[0])
    count = tensor_util.constant_value(reserve.inputs[1])
    if count is None or element_shape.rank is None:
        return None
    dtype = tf.as_dtype(reserve.get_attr("element_dtype")).name
    return (int(count),) + concrete(element_shape), dtype


def is_held(op):
    """Whether ``op``'s outputs are buffers of their own (not a view, not a constant)."""
    return op.type not in ALIASING_OPS and op.type not in LIST_READS and op.type != "Const"
