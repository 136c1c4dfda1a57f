"""The values an integer input of a signature can take: ids into the rows of the table
they index.

An input whose values are row ids (an embedding's ``GatherV2`` or ``ResourceGather``,
reached through ops that keep values as they are: casts, reshapes, slices, identities)
takes values ``0 … rows - 1`` of the smallest table it indexes; drawing test inputs
over that whole range reaches a table's last row, which ids of 0 and 1 never do.

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

from rewriters.functions import split_input
from rewriters.reader import flatten_signature, import_flat

# Ops whose output holds the values of their first input (reshaped, sliced, cast).
VALUE_PRESERVING_OPS = {"Identity", "Cast", "Reshape", "ExpandDims", "Squeeze",
                        "StridedSlice", "Slice", "Transpose", "ConcatV2", "Pack",
                        "Unpack", "Split", "SplitV", "GatherV2", "Tile"}
GATHER_OPS = {"GatherV2", "ResourceGather", "Gather", "GatherNd", "ResourceGatherNd"}


def index_consumers(graph_def, placeholder):
    """The gathers whose indices input (``(op, input index)``) carries the values of
    ``placeholder``, through :data:`VALUE_PRESERVING_OPS`."""
    consumers = {}
    for node in graph_def.node:
        for position, source in enumerate(node.input):
            if not source.startswith("^"):
                consumers.setdefault(split_input(source)[0], []).append((node, position))
    found, stack, seen = [], [placeholder], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for node, position in consumers.get(name, []):
            if node.op in GATHER_OPS and position == 1:
                found.append((node.name, position))
            elif node.op in VALUE_PRESERVING_OPS and position == 0:
                stack.append(node.name)
    return sorted(found)


def integer_input_ranges(proto, path="", signature=None, batch_size=1):
    """For each integer input of ``signature`` (by key) whose values index rows of a
    table, the number of rows of the smallest such table."""
    flat = flatten_signature(proto, path, batch_size, signature)
    graph = import_flat(flat, path)
    ranges = {}
    for key, (placeholder, _, dtype) in flat.inputs.items():
        if not dtype.startswith(("int", "uint")):
            continue
        rows = [_rows(graph.get_operation_by_name(op)) for op, _ in
                index_consumers(flat.graph_def, placeholder)]
        rows = [r for r in rows if r]
        if rows:
            ranges[key] = min(rows)
    return ranges


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


__all__ = ["GATHER_OPS", "VALUE_PRESERVING_OPS", "index_consumers", "integer_input_ranges"]
