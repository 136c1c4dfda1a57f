"""The gates pass: every task of a step's lowering imported in the lowering's order,
each behind a gate that waits for the task before it on its lane.

A gate is a constant on the task's device whose control inputs are the last ops (the
sinks) of the task it waits for, the ordering edge of the lowering
(:class:`costmodel.lowering.Lowering`); the task's first ops read it as a control
input (``^tfpart_gate``), so TensorFlow runs each lane's tasks in the schedule's order
(:mod:`costmodel.schedules`), the order the simulator prices with its barriers.
"""
from __future__ import annotations

from rewriters.lowered import GATE
from rewriters.tf_import import tensorflow


def import_in_order(lowering, sinks, import_task, gated=True):
    """Import every task of ``lowering`` by ``import_task(task, control)`` (``control``:
    the gate's input, by ``^tfpart_gate``; none without ``gated``), each gate waiting for
    the ops ``sinks[piece]`` of the task before it on its lane; the imported ops of each
    task, by name."""
    tf = tensorflow()
    waits, imported = lowering.waits_for(), {}
    for task in lowering.tasks:
        control = {}
        if gated:
            before = waits.get(task)
            with tf.device(task.device), tf.control_dependencies(
                    [imported[before][name] for name in sinks[before.piece]] if before else []):
                control[f"^{GATE}"] = tf.constant(0.0, name=gate_name(task))
        imported[task] = import_task(task, control)
    return imported


def gate_name(task):
    """The name of ``task``'s gate.

    >>> from costmodel.lowering import Task
    >>> gate_name(Task(3, 1, "backward", None, 3, "/device:CPU:1"))
    'tfpart_gate_mb3_stage1_backward'
    """
    return f"{GATE}_mb{task.step_microbatch}_stage{task.stage}_{task.phase}"


def sinks(piece):
    """Nodes of a piece's GraphDef that no other node of it consumes.

    >>> from tensorflow.core.framework import graph_pb2
    >>> piece = graph_pb2.GraphDef()
    >>> _ = piece.node.add(name="a"), piece.node.add(name="b", input=["a"])
    >>> sinks(piece)
    ['b']
    """
    consumed = {source.lstrip("^").split(":")[0] for node in piece.node
                for source in node.input}
    return [node.name for node in piece.node if node.name not in consumed]


def piece_reads(pieces):
    """For each piece (by key, of ``pieces``: key -> GraphDef), the pieces whose ops it
    reads (by data or control).

    >>> from tensorflow.core.framework import graph_pb2
    >>> a, b = graph_pb2.GraphDef(), graph_pb2.GraphDef()
    >>> _ = a.node.add(name="x"), b.node.add(name="y", input=["^x"])
    >>> piece_reads({"a": a, "b": b})
    {'a': set(), 'b': {'a'}}
    """
    piece_of = {node.name: key for key, graph in pieces.items() for node in graph.node}
    return {key: {piece_of[source.lstrip("^").split(":")[0]] for node in graph.node
                  for source in node.input
                  if source.lstrip("^").split(":")[0] in piece_of} - {key}
            for key, graph in pieces.items()}
