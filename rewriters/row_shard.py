"""Row shards in a flat GraphDef: a table's variable cut into shards of consecutive
rows (:mod:`tfpart.core.row_shards`), and every lookup of its rows made a partitioned
lookup.

For a table cut into shards of ``sizes`` rows, the rewritten graph has

* ``<table>/tfpart_shard<i>``: a variable holding rows ``first[i]`` to
  ``first[i] + sizes[i] - 1`` (the table's own variable op is gone);
* for each lookup (a ``GatherV2`` along axis 0 of a read of the table, a
  ``ResourceGather`` of it, or a ``SparseSegmentSum``/``Mean``/``SqrtN`` of its rows),
  ops under ``<lookup>/tfpart_rows/`` that route each id to the shard holding it (the
  number of shard boundaries at or below it, ``UpperBound``), make it an index into
  that shard, split the ids and their positions by shard (``DynamicPartition``),
  gather each shard's rows on the shard's device (``ResourceGather``) and put the rows
  back in the order of the ids (``DynamicStitch``);
* ``<lookup>`` itself: the stitched rows in the lookup's output shape (or the segment
  reduction of them), so every reader of the lookup reads the same tensor as before;
* each read of the table that fed only lookups (or only control edges): a ``NoOp`` of
  its name, so what waited for the read still waits.

Repeated ids, ids in every shard and an empty batch of ids give the original's rows;
an id outside the table fails as the original's gather does on a CPU (in the last or
the first shard). A table read in any other way (a slice, a matmul with the whole
table, an update) cannot be cut: :func:`shard_tables` refuses it, naming the op.

This is a library function of the reader (which prices the sharded graph) and of the
pipeline pass (which imports the same sharded graph); it is not a pass by itself.

Examples
--------
>>> import numpy as np, tensorflow as tf
>>> graph = tf.Graph()
>>> with graph.as_default():
...     handle = tf.raw_ops.VarHandleOp(dtype=tf.float64, shape=[6, 2], name="t")
...     ids = tf.constant([[5], [0], [3], [5]], name="ids")
...     rows = tf.raw_ops.ResourceGather(resource=handle, indices=ids, dtype=tf.float64,
...                                      name="rows")
>>> sharded, shards = shard_tables(graph.as_graph_def(), {"t": [4, 2]})
>>> shards
{'t/tfpart_shard0': ('t', 0, 4), 't/tfpart_shard1': ('t', 4, 2)}
>>> values = np.arange(12.0).reshape(6, 2)
>>> pieces = [tf.Variable(values[first:first + rows]) for _, first, rows in shards.values()]
>>> def run():
...     graph = tf.compat.v1.get_default_graph()
...     return tf.graph_util.import_graph_def(sharded, input_map={
...         f"{name}:0": graph.capture(piece.handle) for name, piece in zip(shards, pieces)},
...         return_elements=["rows:0"], name="")[0]
>>> tf.function(run, autograph=False)().numpy()[:, :, 0].tolist()
[[10.0], [0.0], [6.0], [10.0]]
"""
from __future__ import annotations

import dataclasses

from rewriters.node_defs import (bool_attr, int_attr, int_constant, make_node, shape_attr,
                                 string_attr, type_attr)
from rewriters.tf_import import tensorflow
from tfpart.core.errors import PlacementError
from tfpart.core.ops import writes_state
from tfpart.core.row_shards import first_rows, lookup_scope, shard_name

SEGMENT_LOOKUPS = frozenset({"SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
                             "SparseSegmentSumWithNumSegments",
                             "SparseSegmentMeanWithNumSegments",
                             "SparseSegmentSqrtNWithNumSegments"})


def shard_tables(graph_def, sizes):
    """A copy of ``graph_def`` with each table of ``sizes`` cut into row shards.

    Parameters
    ----------
    graph_def : tensorflow.GraphDef
        A flat graph, the tables' variables as ``VarHandleOp`` nodes.
    sizes : dict
        Table op name -> the rows of each shard, in order (their sum: the table's
        rows).

    Returns
    -------
    (tensorflow.GraphDef, dict)
        The rewritten graph, and each shard's variable op name -> ``(table, first row,
        rows)``.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If a table is read other than by its rows (naming the op), or the sizes do not
        cover its rows.
    """
    tf = tensorflow()
    nodes = {node.name: node for node in graph_def.node}
    readers = _data_readers(graph_def)
    replaced, shards = {}, {}
    for table, shard_sizes in sizes.items():
        if table not in nodes or nodes[table].op != "VarHandleOp":
            raise PlacementError("", f"the plan cuts table {table}, which is no variable of "
                                 "the model")
        shape, dtype = table_shape(nodes[table])
        if not shape or sum(shard_sizes) != shape[0] or min(shard_sizes) < 1:
            raise PlacementError("", f"row shards of {list(shard_sizes)} rows do not cut the "
                                 f"{shape[0] if shape else 0} rows of table {table}")
        reads, lookups = _table_readers(readers, nodes, table)
        firsts = first_rows(shard_sizes)
        for i, (first, rows) in enumerate(zip(firsts, shard_sizes)):
            shards[shard_name(table, i)] = (table, first, int(rows))
        replaced[table] = [_shard_variable(shard_name(table, i), [rows, *shape[1:]], dtype)
                           for i, rows in enumerate(shard_sizes)]
        for read in reads:
            replaced[read.name] = [make_node(read.name, "NoOp", [
                s for s in read.input if s.startswith("^")])]
        for lookup in lookups:
            replaced[lookup.name] = _partitioned_lookup(lookup, nodes, table, firsts, shape,
                                                        dtype)
    new = tf.compat.v1.GraphDef()
    new.versions.CopyFrom(graph_def.versions)
    new.library.CopyFrom(graph_def.library)
    controls = {f"^{table}": f"^{shard_name(table, 0)}" for table in sizes}
    for node in graph_def.node:
        for added in replaced.get(node.name, [node]):
            copy = new.node.add()
            copy.CopyFrom(added)
            if any(source in controls for source in copy.input):
                inputs = [controls.get(source, source) for source in copy.input]
                del copy.input[:]
                copy.input.extend(inputs)
    return new, shards


def _shard_variable(name, shape, dtype):
    """The ``VarHandleOp`` of one shard."""
    return make_node(name, "VarHandleOp", [], dtype=type_attr(dtype), shape=shape_attr(shape),
                     shared_name=string_attr(name), container=string_attr(""))


def shard_flat(flat, sizes):
    """``flat`` (a :class:`rewriters.flat_signature.FlatSignature`) with the tables of
    ``sizes`` cut into row shards (:func:`shard_tables`), its ``row_shards`` naming
    them."""
    if not sizes:
        return flat
    graph_def, shards = shard_tables(flat.graph_def, sizes)
    return dataclasses.replace(flat, graph_def=graph_def, row_shards=shards)


def table_shape(node):
    """``(shape, dtype name)`` of the variable of a ``VarHandleOp`` node."""
    tf = tensorflow()
    shape = tf.TensorShape(node.attr["shape"].shape)
    return (tuple(shape.as_list()) if shape.rank is not None else (),
            tf.as_dtype(node.attr["dtype"].type).name)


def _table_readers(readers, nodes, table):
    """``(reads, lookups)``: the table's ``ReadVariableOp`` nodes (which feed only
    lookups or control edges) and the lookups of its rows (``readers``:
    :func:`_data_readers`); PlacementError naming the first op that reads it
    otherwise."""
    reads, lookups = [], []
    for reader, index in readers.get(table, []):
        if reader.op == "ReadVariableOp":
            reads.append(reader)
            for user, user_index in readers.get(reader.name, []):
                if user_index != 0 or not _reads_rows(user, nodes):
                    raise _refused(table, user)
                lookups.append(user)
        elif reader.op == "ResourceGather" and index == 0 and _attr_int(reader, "batch_dims") == 0:
            lookups.append(reader)
        else:
            raise _refused(table, reader)
    return reads, lookups


def _data_readers(graph_def):
    """Node name -> the ``(node, input index)`` of every data input reading it (index -1
    for a read of an output other than the first)."""
    readers = {}
    for node in graph_def.node:
        data = [source for source in node.input if not source.startswith("^")]
        for index, source in enumerate(data):
            name, _, port = source.partition(":")
            readers.setdefault(name, []).append((node, index if port in ("", "0") else -1))
    return readers


def _reads_rows(node, nodes):
    """Whether ``node`` reads rows of its first input: a ``GatherV2`` along axis 0, or
    a sparse segment reduction."""
    if node.op in SEGMENT_LOOKUPS:
        return True
    if node.op != "GatherV2" or _attr_int(node, "batch_dims") != 0:
        return False
    axis = nodes.get(node.input[2].split(":")[0])
    if axis is None or axis.op != "Const":
        return False
    return int(tensorflow().make_ndarray(axis.attr["value"].tensor)) == 0


def _refused(table, reader):
    how = ("updates it (a training step's updates of row shards are not built yet)"
           if writes_state(reader.op) else "reads it other than by rows")
    return PlacementError("", f"table {table} cannot be cut into row shards: op "
                          f"{reader.name} (a {reader.op}) {how}")


def _partitioned_lookup(lookup, nodes, table, firsts, shape, dtype):
    """The nodes that replace ``lookup`` (which keeps its name, as the result)."""
    scope = lookup_scope(lookup.name)
    data = [source for source in lookup.input if not source.startswith("^")]
    control = [source for source in lookup.input if source.startswith("^")]
    ids = data[1]
    id_type = lookup.attr["Tindices" if "Tindices" in lookup.attr else "Tidx"]
    id_name = "int64" if id_type.type == type_attr("int64").type else "int32"
    count = len(firsts)
    added = [
        int_constant(f"{scope}/minus_one", [-1]),
        make_node(f"{scope}/flat_ids", "Reshape", [ids, f"{scope}/minus_one"],
                  T=id_type, Tshape=type_attr("int32")),
        int_constant(f"{scope}/one_row", [1, -1]),
        make_node(f"{scope}/ids_row", "Reshape", [f"{scope}/flat_ids", f"{scope}/one_row"],
                  T=id_type, Tshape=type_attr("int32")),
        int_constant(f"{scope}/bounds", [firsts[1:]], id_name),
        make_node(f"{scope}/shard_row", "UpperBound", [f"{scope}/bounds", f"{scope}/ids_row"],
                  T=id_type, out_type=type_attr("int32")),
        make_node(f"{scope}/shard", "Reshape", [f"{scope}/shard_row", f"{scope}/minus_one"],
                  T=type_attr("int32"), Tshape=type_attr("int32")),
        int_constant(f"{scope}/firsts", firsts, id_name),
        int_constant(f"{scope}/axis", 0),
        make_node(f"{scope}/first", "GatherV2", [f"{scope}/firsts", f"{scope}/shard",
                                                 f"{scope}/axis"],
                  Tparams=id_type, Tindices=type_attr("int32"), Taxis=type_attr("int32"),
                  batch_dims=int_attr(0)),
        make_node(f"{scope}/local_ids", "Sub", [f"{scope}/flat_ids", f"{scope}/first"],
                  T=id_type),
        make_node(f"{scope}/count", "Size", [f"{scope}/flat_ids"], T=id_type,
                  out_type=type_attr("int32")),
        int_constant(f"{scope}/one", 1),
        make_node(f"{scope}/positions", "Range", [f"{scope}/axis", f"{scope}/count",
                                                  f"{scope}/one"], Tidx=type_attr("int32")),
        make_node(f"{scope}/ids_parts", "DynamicPartition", [
            f"{scope}/local_ids", f"{scope}/shard"], T=id_type, num_partitions=int_attr(count)),
        make_node(f"{scope}/position_parts", "DynamicPartition", [
            f"{scope}/positions", f"{scope}/shard"], T=type_attr("int32"),
            num_partitions=int_attr(count))]
    added += [make_node(f"{scope}/rows{i}", "ResourceGather", [
        shard_name(table, i), f"{scope}/ids_parts:{i}"], dtype=type_attr(dtype),
        Tindices=id_type, batch_dims=int_attr(0), validate_indices=bool_attr(True))
        for i in range(count)]
    added.append(make_node(f"{scope}/stitched", "DynamicStitch", [
        *(f"{scope}/position_parts:{i}" for i in range(count)),
        *(f"{scope}/rows{i}" for i in range(count))], N=int_attr(count), T=type_attr(dtype)))
    if lookup.op in SEGMENT_LOOKUPS:
        row_ids = f"{scope}/positions"
        if id_name == "int64":
            added.append(make_node(f"{scope}/row_ids", "Cast", [row_ids],
                                   SrcT=type_attr("int32"), DstT=id_type))
            row_ids = f"{scope}/row_ids"
        result = type(lookup)()
        result.CopyFrom(lookup)
        del result.input[:]
        result.input.extend([f"{scope}/stitched", row_ids, *data[2:], *control])
    else:
        added += [
            make_node(f"{scope}/ids_shape", "Shape", [ids], T=id_type,
                      out_type=type_attr("int32")),
            int_constant(f"{scope}/row_shape", list(shape[1:])),
            make_node(f"{scope}/out_shape", "ConcatV2", [
                f"{scope}/ids_shape", f"{scope}/row_shape", f"{scope}/axis"],
                N=int_attr(2), T=type_attr("int32"), Tidx=type_attr("int32"))]
        result = make_node(lookup.name, "Reshape", [f"{scope}/stitched", f"{scope}/out_shape",
                                                    *control],
                           T=type_attr(dtype), Tshape=type_attr("int32"))
    return [*added, result]


def _attr_int(node, name):
    return node.attr[name].i if name in node.attr else 0


__all__ = ["SEGMENT_LOOKUPS", "shard_flat", "shard_tables", "table_shape"]
