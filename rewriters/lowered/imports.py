"""One task's copy of a piece: the piece's GraphDef stamped as the copy it computes,
placed on its replica's devices, and imported into the traced graph with its inputs
mapped to the tensors its micro-batch has made so far.
"""
from __future__ import annotations

from rewriters.copies import stamped
from rewriters.lowered import GATE
from rewriters.tf_import import tensorflow
from tfpart.core.ops import LOOP_ENTRY_OPS


def import_copy(piece, prefix, env, ops_of, control, replica=None, microbatch=None,
                place=None):
    """Import ``piece`` (a GraphDef) under ``prefix``, each op stamped as the copy of
    its op for ``replica`` and ``microbatch`` (:mod:`rewriters.copies`) and placed by
    ``place`` (a copy of the GraphDef -> the copy on its devices; None: as planned).

    Its inputs from other pieces are mapped to ``env`` (tensors by name) and
    ``ops_of`` (ops by name), both of its micro-batch, and ``control`` (control inputs
    by name, such as its gate; a piece with no gate in ``control`` waits for none);
    its ops and tensors are added to them. Returns the imported ops, by name."""
    tf = tensorflow()
    piece, members = stamped(piece, replica, microbatch), {node.name for node in piece.node}
    if place is not None:
        piece = place(piece)
    if f"^{GATE}" not in control:  # nothing scheduled: roots wait for no gate
        piece = without_gate(piece)
    input_map = dict(control)
    for node in piece.node:
        for source in node.input:
            if source.startswith("^"):
                name = source[1:]
                if source not in input_map and name not in members:
                    input_map[source] = control_tensor(ops_of[name])
            elif source.split(":")[0] not in members:
                tensor = source if ":" in source else f"{source}:0"
                input_map[tensor] = env[tensor]
    if any(node.op in LOOP_ENTRY_OPS for node in piece.node):
        piece = in_own_loop_frames(piece, prefix)
    names = [node.name for node in piece.node]
    ops = tf.graph_util.import_graph_def(piece, input_map=input_map,
                                         return_elements=names, name=prefix)
    imported = dict(zip(names, ops))
    for name, op in imported.items():
        ops_of[name] = op
        for i, tensor in enumerate(op.outputs):
            env[f"{name}:{i}"] = tensor
    return imported


def on_replica(piece, device, pinned, placement=None, stand_ins=None):
    """A copy of ``piece`` with its ops on ``device``, but the ``pinned`` ones; with a
    ``placement`` (a hybrid plan's replica), each op it names on its device there, and
    with ``stand_ins`` (a replica of a pipeline: its device for each of the first
    replica's) the others on the device standing for theirs.

    >>> from tensorflow.core.framework import graph_pb2
    >>> piece = graph_pb2.GraphDef()
    >>> _ = piece.node.add(name="x", device="A"), piece.node.add(name="w", device="A")
    >>> [n.device for n in on_replica(piece, "B", {"w"}).node]
    ['B', 'A']
    """
    copy = type(piece)()
    copy.CopyFrom(piece)
    for node in copy.node:
        if node.name not in pinned:
            node.device = (placement or {}).get(
                node.name, stand_ins.get(node.device, device) if stand_ins else device)
    return copy


def without_gate(piece):
    """A copy of ``piece`` whose ops do not wait for the schedule's gate."""
    copy = type(piece)()
    copy.CopyFrom(piece)
    for node in copy.node:
        if f"^{GATE}" in node.input:
            inputs = [source for source in node.input if source != f"^{GATE}"]
            del node.input[:]
            node.input.extend(inputs)
    return copy


def in_own_loop_frames(piece, prefix):
    """A copy of ``piece`` whose ``tf.compat.v1.while_loop`` frames are named for
    ``prefix``: TensorFlow's executor joins loops of one frame name into one loop.

    >>> from tensorflow.core.framework import graph_pb2
    >>> piece = graph_pb2.GraphDef()
    >>> enter = piece.node.add(name="while/Enter", op="Enter")
    >>> enter.attr["frame_name"].s = b"while/while_context"
    >>> in_own_loop_frames(piece, "tfpart_mb1_stage0").node[0].attr["frame_name"].s
    b'tfpart_mb1_stage0/while/while_context'
    """
    copy = type(piece)()
    copy.CopyFrom(piece)
    for node in copy.node:
        if node.op in LOOP_ENTRY_OPS:
            node.attr["frame_name"].s = f"{prefix}/".encode() + node.attr["frame_name"].s
    return copy


def control_tensor(op):
    """A tensor that is ready once ``op`` has run: its first output, or a constant
    that waits for it."""
    tf = tensorflow()
    if op.outputs:
        return op.outputs[0]
    with tf.control_dependencies([op]):
        return tf.constant(0.0)
