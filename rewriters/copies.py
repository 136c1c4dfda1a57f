"""Which op of the source model, which replica and which micro-batch each op of a
compiled model computes: stamped on the op by the rewriter that makes the copy and read
back from the saved model, never parsed from the op's name.

The stamps are node attributes (``_tfpart_origin``, ``_tfpart_replica``,
``_tfpart_microbatch``; TensorFlow keeps attributes that start with ``_`` on a node and
in the functions it saves). They are the keys of the execution graph the simulator
prices (:func:`costmodel.execution.expand`: each copy's ``origin``, ``replica``
and ``microbatch``), so verification and the tests hold what TensorFlow runs to what
was priced.

Grappler's fusions make new nodes without the stamps but with the name of the fused
pattern's last op, and a function's ops run under the name of the call that inlined
them: a node that ran is looked up by the longest ending of its name (whole scopes)
that names a stamped node (:func:`copy_of`).

Examples
--------
>>> from tensorflow.core.protobuf import meta_graph_pb2
>>> meta = meta_graph_pb2.MetaGraphDef()
>>> body = meta.graph_def.library.function.add()
>>> node = body.node_def.add(name="tfpart_mb3_stage1/dense/MatMul", op="MatMul")
>>> stamp(node, "dense/MatMul", replica=1, microbatch=0)
>>> copies = copies_in(meta)
>>> copy_of("StatefulPartitionedCall/tfpart_mb3_stage1/dense/MatMul", copies)
OpCopy(origin='dense/MatMul', replica=1, microbatch=0)
>>> copy_of("StatefulPartitionedCall/dense/MatMul", copies) is None
True
"""
from __future__ import annotations

from dataclasses import dataclass

ORIGIN, REPLICA, MICROBATCH = "_tfpart_origin", "_tfpart_replica", "_tfpart_microbatch"


@dataclass(frozen=True)
class OpCopy:
    """The source model's op a compiled op computes, for which replica (None: not a
    replica's copy) and which micro-batch of it (None: the whole batch)."""

    origin: str
    replica: int | None = None
    microbatch: int | None = None


def _attr_values(origin, replica, microbatch):
    """The stamp of an :class:`OpCopy`: attribute name -> ``AttrValue``."""
    from tensorflow.core.framework import attr_value_pb2

    values = {ORIGIN: attr_value_pb2.AttrValue(s=origin.encode())}
    for key, value in ((REPLICA, replica), (MICROBATCH, microbatch)):
        if value is not None:
            values[key] = attr_value_pb2.AttrValue(i=value)
    return values


def stamp(node, origin, replica=None, microbatch=None):
    """Write an :class:`OpCopy` onto ``node`` (a ``NodeDef``) as its attributes."""
    for key, value in _attr_values(origin, replica, microbatch).items():
        node.attr[key].CopyFrom(value)


def stamped(graph_def, replica=None, microbatch=None):
    """A copy of ``graph_def`` each of whose nodes is stamped as the copy of the node of
    its own name, for ``replica`` and ``microbatch``."""
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        stamp(node, node.name, replica, microbatch)
    return copy


def stamp_op(op, origin, replica=None, microbatch=None):
    """Stamp a ``tf.Operation`` already in a graph (an op tfpart builds itself)."""
    for key, value in _attr_values(origin, replica, microbatch).items():
        op._set_attr(key, value)


def _read(node):
    if ORIGIN not in node.attr:
        return None
    value = lambda key: node.attr[key].i if key in node.attr else None  # noqa: E731
    return OpCopy(node.attr[ORIGIN].s.decode(), value(REPLICA), value(MICROBATCH))


def copies_in(meta_graph):
    """Every stamped node of ``meta_graph`` (its graph and its functions), by name."""
    nodes = [*meta_graph.graph_def.node,
             *(node for function in meta_graph.graph_def.library.function
               for node in function.node_def)]
    return {node.name: copy for node in nodes if (copy := _read(node)) is not None}


def copy_of(name, copies):
    """The :class:`OpCopy` an op that ran as ``name`` computes (the stamp of the node
    named by the longest ending of ``name`` in ``copies``), or None for an op of no
    copy."""
    parts = name.split("/")
    for start in range(len(parts)):
        found = copies.get("/".join(parts[start:]))
        if found is not None:
            return found
    return None
