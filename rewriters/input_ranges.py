"""The values an input of a signature can take: ids into the rows of the table it
indexes, or keys of the lookup table it is looked up in.

An input whose values are row ids (an embedding's ``GatherV2`` or ``ResourceGather``,
reached through ops that keep values as they are: casts, reshapes, slices, identities,
either branch of a select, as in the negative-id wrap of Keras 3's ``ops.take``)
takes values ``0 … rows - 1`` of the smallest table it indexes; drawing test inputs
over that whole range reaches a table's last row, which ids of 0 and 1 never do.

An input (string or integer) from which the keys of a ``LookupTableFindV2`` are
computed takes the keys of that table (a ``StringLookup``'s or ``TextVectorization``'s
vocabulary, an ``IntegerLookup``'s ids), as words of a sentence when a
``StringSplitV2`` cuts it on the way; drawing a random string or 0 and 1 would only
ever test the out-of-vocabulary row.

Examples
--------
>>> from tensorflow.core.framework import graph_pb2
>>> graph = graph_pb2.GraphDef()
>>> _ = graph.node.add(name="ids", op="Placeholder")
>>> _ = graph.node.add(name="cast", op="Cast", input=["ids"])
>>> gather = graph.node.add(name="rows", op="ResourceGather", input=["table", "cast"])
>>> index_consumers(graph, "ids")
[('rows', 1)]
"""
from __future__ import annotations

from dataclasses import dataclass

from rewriters.captures import captured_tensor, load_captured
from rewriters.functions import split_input
from rewriters.flat_signature import import_flat
from rewriters.flatten import flatten_signature
from rewriters.tf_import import tensorflow

# Ops whose output holds the values of their first input (reshaped, sliced, cast).
VALUE_PRESERVING_OPS = {"Identity", "Cast", "Reshape", "ExpandDims", "Squeeze",
                        "StridedSlice", "Slice", "Transpose", "ConcatV2", "Pack",
                        "Unpack", "Split", "SplitV", "GatherV2", "Tile"}
# Ops whose output holds the values of their second or third input (a select's branches).
SELECT_OPS = {"Select", "SelectV2"}
GATHER_OPS = {"GatherV2", "ResourceGather", "Gather", "GatherNd", "ResourceGatherNd"}
LOOKUP_OPS = {"LookupTableFindV2", "LookupTableFind"}
# Ops that cut a string into words (a sentence in, its words' strings out).
SPLIT_OPS = {"StringSplit", "StringSplitV2", "RegexSplitWithOffsets"}
# At most this many keys of a table are kept to draw from.
MAX_KEYS = 4096


@dataclass(frozen=True)
class InputDomain:
    """The values one input takes: ids ``0 … rows - 1`` (``rows``), or the ``keys`` of a
    lookup table, joined into sentences when ``words``."""

    rows: int = 0
    keys: tuple = ()
    words: bool = False


def index_consumers(graph_def, placeholder):
    """The gathers whose indices input (``(op, input index)``) carries the values of
    ``placeholder``, through :data:`VALUE_PRESERVING_OPS` and :data:`SELECT_OPS`.

    Keras 3's ``Embedding`` (``ops.take``) wraps negative ids before its gather:

    >>> from tensorflow.core.framework import graph_pb2
    >>> graph = graph_pb2.GraphDef()
    >>> _ = graph.node.add(name="ids", op="Placeholder")
    >>> _ = graph.node.add(name="negative", op="Less", input=["ids", "zero"])
    >>> _ = graph.node.add(name="wrapped", op="AddV2", input=["ids", "count"])
    >>> _ = graph.node.add(name="kept", op="SelectV2", input=["negative", "wrapped", "ids"])
    >>> _ = graph.node.add(name="rows", op="GatherV2", input=["table", "kept", "axis"])
    >>> index_consumers(graph, "ids")
    [('rows', 1)]
    """
    consumers = _data_consumers(graph_def)
    found, stack, seen = [], [placeholder], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for node, position in consumers.get(name, []):
            if node.op in GATHER_OPS and position == 1:
                found.append((node.name, position))
            elif (node.op in VALUE_PRESERVING_OPS and position == 0
                  or node.op in SELECT_OPS and position in (1, 2)):
                stack.append(node.name)
    return sorted(found)


def key_consumers(graph_def, placeholder):
    """The lookups whose keys input is computed from ``placeholder`` (through any ops),
    as ``(lookup op, whether a split op is on the way)``.

    >>> from tensorflow.core.framework import graph_pb2
    >>> graph = graph_pb2.GraphDef()
    >>> _ = graph.node.add(name="text", op="Placeholder")
    >>> _ = graph.node.add(name="lower", op="StringLower", input=["text"])
    >>> _ = graph.node.add(name="split", op="StringSplitV2", input=["lower", "sep"])
    >>> _ = graph.node.add(name="find", op="LookupTableFindV2", input=["t", "split:1", "d"])
    >>> _ = graph.node.add(name="word", op="LookupTableFindV2", input=["t", "lower", "d"])
    >>> key_consumers(graph, "text")
    [('find', True), ('word', False)]
    """
    consumers = _data_consumers(graph_def)
    found, stack, seen = set(), [(placeholder, False)], set()
    while stack:
        name, split = stack.pop()
        if (name, split) in seen:
            continue
        seen.add((name, split))
        for node, position in consumers.get(name, []):
            if node.op in LOOKUP_OPS:
                if position == 1:
                    found.add((node.name, split))
            else:
                stack.append((node.name, split or node.op in SPLIT_OPS))
    return sorted(found)


def input_domains(proto, path="", signature=None, root=None):
    """The :class:`InputDomain` of each input of ``signature`` (by key) whose values are
    ids into a table's rows or keys of a lookup table (those keys read from the loaded
    model: ``root``, the TF2 model already loaded, or loaded here)."""
    flat = flatten_signature(proto, path, 1, signature)
    graph = import_flat(flat, path)
    lookups = {key: key_consumers(flat.graph_def, placeholder)
               for key, (placeholder, _, _) in flat.inputs.items()}
    keys_of = _table_keys(proto, path, flat, {op for found in lookups.values()
                                               for op, _ in found}, root)
    domains = {}
    for key, (placeholder, _, dtype) in flat.inputs.items():
        keys = sorted({k for op, _ in lookups[key] for k in keys_of[op]})[:MAX_KEYS]
        if keys:
            domains[key] = InputDomain(keys=tuple(keys),
                                       words=any(split for _, split in lookups[key]))
            continue
        if not dtype.startswith(("int", "uint")):
            continue
        rows = [_rows(graph.get_operation_by_name(op)) for op, _ in
                index_consumers(flat.graph_def, placeholder)]
        rows = [r for r in rows if r]
        if rows:
            domains[key] = InputDomain(rows=min(rows))
    return domains


def _data_consumers(graph_def):
    """For each node name, the ``(node, input index)`` of every data input it feeds."""
    consumers = {}
    for node in graph_def.node:
        for position, source in enumerate(node.input):
            if not source.startswith("^"):
                consumers.setdefault(split_input(source)[0], []).append((node, position))
    return consumers


def _table_keys(proto, path, flat, lookups, root):
    """The keys of the table each of the ``lookups`` (op names) reads, by lookup (empty
    when the table is made by the signature itself)."""
    if not lookups:
        return {}
    tf = tensorflow()
    nodes = {node.name: node for node in flat.graph_def.node}

    def table_op(lookup):
        source = nodes[split_input(nodes[lookup].input[0])[0]]
        while source.op == "Identity" and source.input:
            source = nodes[split_input(source.input[0])[0]]
        return source.name

    def export(lookup, handle):
        attrs = nodes[lookup].attr
        return tf.raw_ops.LookupTableExportV2(
            table_handle=handle, Tkeys=tf.dtypes.as_dtype(attrs["Tin"].type),
            Tvalues=tf.dtypes.as_dtype(attrs["Tout"].type))[0]

    if flat.info.format == "tf1":
        tags = list(proto.meta_graphs[0].meta_info_def.tags)
        with tf.compat.v1.Session(graph=tf.Graph()) as session, session.graph.as_default():
            tf.compat.v1.saved_model.load(session, tags, str(path))
            return {lookup: session.run(export(lookup, session.graph.get_tensor_by_name(
                f"{table_op(lookup)}:0"))).tolist() for lookup in lookups}
    captured = load_captured(path, proto.meta_graphs[0], flat.info.captures, path, root)
    return {lookup: export(lookup, captured_tensor(captured[table_op(lookup)])).numpy().tolist()
            if table_op(lookup) in captured else [] for lookup in lookups}


def _rows(op):
    """How many rows the table a gather reads has (None if unknown)."""
    if op.type.startswith("Resource"):
        source = op.inputs[0].op
        while source.type in ("Identity", "Placeholder") and source.inputs:
            source = source.inputs[0].op
        if "shape" in source.node_def.attr:
            dims = source.node_def.attr["shape"].shape.dim
            return dims[0].size if dims and dims[0].size > 0 else None
        return None
    params = op.inputs[0].shape
    return params[0] if params.rank and params[0] else None


__all__ = ["GATHER_OPS", "InputDomain", "LOOKUP_OPS", "SELECT_OPS", "SPLIT_OPS",
           "VALUE_PRESERVING_OPS", "index_consumers", "input_domains", "key_consumers"]
