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
  its name, waiting for the lookups' gathers, so what waited for the read still waits;
* in a training step, every other op acting on the rows (:mod:`rewriters.row_region`:
  reads, element-wise arithmetic, segment sums into the rows, assignments, scatters),
  once per shard as ``<op>/tfpart_rows/shard<i>`` on that shard's rows (a scatter or
  segment sum routing its ids as a lookup does), and a ``NoOp`` of the op's name
  waiting for them all; an optimizer's slots of the table's shape are cut with it.

Repeated ids, ids in every shard and an empty batch of ids give the original's rows;
an id outside the table fails as the original's gather does on a CPU (in the last or
the first shard). A table read or updated in any other way (a slice, a matmul with
the whole table, a dense ``Apply`` op) cannot be cut: :func:`shard_tables` refuses it,
naming the op.

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
>>> sharded, shards, _ = shard_tables(graph.as_graph_def(), {"t": [4, 2]})
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
from rewriters.row_region import (SEGMENT_LOOKUPS, graph_index, graph_shapes, row_region,
                                  table_shape)
from rewriters.tf_import import tensorflow
from tfpart.core.errors import PlacementError
from tfpart.core.row_shards import first_rows, lookup_scope, shard_name


def table_regions(graph_def, sizes, outputs=(), index=None):
    """The :class:`rewriters.row_region.RowRegion` of each table of ``sizes`` (table op
    -> rows of each shard), its companions (an optimizer's slots) in the same region;
    a companion named in ``sizes`` too must have the table's shards. ``index``:
    :func:`rewriters.row_region.graph_index` of ``graph_def`` (by default built here).

    Raises
    ------
    tfpart.core.errors.PlacementError
        If a table is no variable, the sizes do not cover its rows, or its rows are
        read in a way that cannot be cut (naming the op).
    """
    index = index or graph_index(graph_def)
    nodes = index[0]
    regions, done = [], set()
    shapes = None
    for table, shard_sizes in sizes.items():
        if table not in nodes or nodes[table].op != "VarHandleOp":
            raise PlacementError("", f"the plan cuts table {table}, which is no variable of "
                                 "the model")
        shape = table_shape(nodes[table])[0]
        if not shape or sum(shard_sizes) != shape[0] or min(shard_sizes) < 1:
            raise PlacementError("", f"row shards of {list(shard_sizes)} rows do not cut the "
                                 f"{shape[0] if shape else 0} rows of table {table}")
        if table in done:
            continue
        shapes = shapes or graph_shapes(graph_def)
        region = row_region(graph_def, table, outputs=outputs, shapes=shapes, index=index)
        for companion in region.variables[1:]:
            if list(sizes.get(companion, shard_sizes)) != list(shard_sizes):
                raise PlacementError("", f"variable {companion} is updated row by row with "
                                     f"table {table}, so it needs the same row shards")
        done.update(region.variables)
        regions.append(region)
    return regions


def cuttable_tables(graph_def, candidates, outputs=()):
    """Of ``candidates`` (variable op names), in order, those whose rows can be cut
    (:func:`rewriters.row_region.row_region` refuses none of their readers), each
    region once (a companion of an earlier one is not named): name -> its region.

    >>> import tensorflow as tf
    >>> graph = tf.Graph()
    >>> with graph.as_default():
    ...     t = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4, 2], name="t")
    ...     w = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[2, 2], name="w")
    ...     rows = tf.raw_ops.ResourceGather(resource=t, indices=[1], dtype=tf.float32)
    ...     kernel = tf.raw_ops.ReadVariableOp(resource=w, dtype=tf.float32)
    ...     _ = tf.matmul(rows, kernel)
    >>> found = cuttable_tables(graph.as_graph_def(), ["w", "t"])
    >>> list(found), found["t"].kinds  # doctest: +ELLIPSIS
    (['t'], {'ResourceGather': 'lookup'})
    """
    shapes, index = graph_shapes(graph_def), graph_index(graph_def)
    found, seen = {}, set()
    for name in candidates:
        if name in seen:
            continue
        try:
            region = row_region(graph_def, name, outputs=outputs, shapes=shapes, index=index)
        except PlacementError:
            continue
        seen.update(region.variables)
        found[name] = region
    return found


def with_companions(graph_def, sizes, outputs=()):
    """``sizes`` with each table's companions (:func:`table_regions`) cut the same way.

    >>> import tensorflow as tf
    >>> graph = tf.Graph()
    >>> with graph.as_default():
    ...     t = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4, 2], name="t")
    ...     m = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4, 2], name="m")
    ...     value = tf.raw_ops.ReadVariableOp(resource=m, dtype=tf.float32)
    ...     _ = tf.raw_ops.AssignAddVariableOp(resource=t, value=value)
    >>> with_companions(graph.as_graph_def(), {"t": [3, 1]})
    {'t': [3, 1], 'm': [3, 1]}
    """
    found = dict(sizes)
    for region in table_regions(graph_def, sizes, outputs):
        for variable in region.variables:
            found[variable] = list(sizes[region.variables[0]])
    return found


def shard_tables(graph_def, sizes, outputs=()):
    """A copy of ``graph_def`` with each table of ``sizes`` (and its companions,
    :func:`with_companions`) cut into row shards.

    Parameters
    ----------
    graph_def : tensorflow.GraphDef
        A flat graph, the tables' variables as ``VarHandleOp`` nodes.
    sizes : dict
        Table op name -> the rows of each shard, in order (their sum: the table's
        rows).
    outputs : collection of str
        The nodes whose values the graph returns (none may be made of a table's rows).

    Returns
    -------
    (tensorflow.GraphDef, dict, list)
        The rewritten graph; each shard's variable op name -> ``(table, first row,
        rows)``; and for each shard of a table, its variables (the table's shard and
        its companions') with the ops that read or update those rows (an update on
        another device would copy a shard's worth of values there, so they are placed
        as one).

    Raises
    ------
    tfpart.core.errors.PlacementError
        If a table is read other than by its rows (naming the op), or the sizes do not
        cover its rows.
    """
    tf = tensorflow()
    index = graph_index(graph_def)
    nodes, readers, _ = index
    replaced, shards, groups = {}, {}, []
    cut = set()
    for region in table_regions(graph_def, sizes, outputs, index):
        shard_sizes = list(sizes[region.variables[0]])
        firsts = first_rows(shard_sizes)
        pieces = _Pieces(region, len(shard_sizes))
        row_shape = table_shape(nodes[region.variables[0]])[0][1:]
        for variable in region.variables:
            shape, dtype = table_shape(nodes[variable])
            for i, (first, rows) in enumerate(zip(firsts, shard_sizes)):
                shards[shard_name(variable, i)] = (variable, first, int(rows))
            replaced[variable] = [_shard_variable(shard_name(variable, i), [rows, *shape[1:]],
                                                  dtype) for i, rows in enumerate(shard_sizes)]
            cut.add(variable)
        on_rows = [name for name, kind in region.kinds.items() if kind in _REWRITES]
        groups.extend([*(shard_name(variable, i) for variable in region.variables),
                       *(pieces(name, i) for name in on_rows)]
                      for i in range(len(shard_sizes)))
        for name, kind in region.kinds.items():
            node = nodes[name]
            if kind == "lookup":
                variable = region.lookups[name]
                shape, dtype = table_shape(nodes[variable])
                replaced[name] = _partitioned_lookup(node, nodes, variable, firsts, shape,
                                                     dtype)
            elif kind == "lookup_read":
                gathers = [f"^{lookup_scope(user.name)}/rows{i}"
                           for user, _ in readers.get(name, [])
                           for i in range(len(shard_sizes))]
                replaced[name] = [make_node(name, "NoOp", [*_control(node), *gathers])]
            else:
                replaced[name] = [*_REWRITES[kind](node, pieces, shard_sizes, row_shape),
                                  make_node(name, "NoOp", [f"^{pieces(name, i)}" for i in
                                                           range(len(shard_sizes))])]
    new = tf.compat.v1.GraphDef()
    new.versions.CopyFrom(graph_def.versions)
    new.library.CopyFrom(graph_def.library)
    controls = {f"^{table}": f"^{shard_name(table, 0)}" for table in cut}
    for node in graph_def.node:
        for added in replaced.get(node.name, [node]):
            copy = new.node.add()
            copy.CopyFrom(added)
            if any(source in controls for source in copy.input):
                inputs = [controls.get(source, source) for source in copy.input]
                del copy.input[:]
                copy.input.extend(inputs)
    return new, shards, groups


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
    graph_def, shards, groups = shard_tables(flat.graph_def, sizes, output_nodes(flat))
    return dataclasses.replace(flat, graph_def=graph_def, row_shards=shards,
                               row_shard_groups=groups)


def output_nodes(flat):
    """The nodes whose values ``flat`` returns."""
    return {tensor.rsplit(":", 1)[0] for tensor in flat.outputs}


class _Pieces:
    """The name of shard ``i`` of a value cut by rows: a shard's variable, or
    ``<op>/tfpart_rows/shard<i>``; other tensors as they are."""

    def __init__(self, region, count):
        self.variables = set(region.variables)
        self.partitioned = region.partitioned()
        self.count = count

    def __call__(self, name, i):
        if name in self.variables:
            return shard_name(name, i)
        return f"{lookup_scope(name)}/shard{i}"

    def source(self, source, i):
        """Input ``source`` of shard ``i``'s op."""
        name = source.split(":")[0]
        return self(name, i) if name in self.partitioned else source


def _control(node):
    return [source for source in node.input if source.startswith("^")]


def _copy(node, name, inputs):
    """``node`` (its attributes) as ``name`` reading ``inputs``, unplaced."""
    copy = type(node)()
    copy.CopyFrom(node)
    copy.name = name
    copy.device = ""
    del copy.input[:]
    copy.input.extend(inputs)
    return copy


def _per_shard(node, pieces):
    """A copy of ``node`` for each shard, its inputs cut by rows read shard by shard."""
    return [_copy(node, pieces(node.name, i), [
        source if source.startswith("^") else pieces.source(source, i)
        for source in node.input]) for i in range(pieces.count)]


def _routed_update(node, pieces, sizes, row_shape, values_index):
    """A segment sum into the rows or a scatter of some rows: the ids (input 1) routed
    to their shards, the values (input ``values_index``) split with them, and the op
    once per shard on its ids, made local."""
    scope = lookup_scope(node.name)
    data = [source for source in node.input if not source.startswith("^")]
    id_type = node.attr["Tindices"]
    dtype = node.attr["T" if "T" in node.attr else "dtype"]
    added = [*_route(scope, data[1], id_type, first_rows(sizes)),
             int_constant(f"{scope}/values_shape", [-1, *row_shape]),
             make_node(f"{scope}/value_rows", "Reshape", [data[values_index],
                                                           f"{scope}/values_shape"],
                       T=dtype, Tshape=type_attr("int32")),
             make_node(f"{scope}/value_parts", "DynamicPartition", [
                 f"{scope}/value_rows", f"{scope}/shard"], T=dtype,
                 num_partitions=int_attr(len(sizes)))]
    for i, rows in enumerate(sizes):
        if node.op == "UnsortedSegmentSum":
            count_type = tensorflow().as_dtype(node.attr["Tnumsegments"].type).name
            added.append(int_constant(f"{scope}/rows{i}", rows, count_type))
            inputs = [f"{scope}/value_parts:{i}", f"{scope}/ids_parts:{i}", f"{scope}/rows{i}"]
        else:
            inputs = [pieces(data[0].split(":")[0], i), f"{scope}/ids_parts:{i}",
                      f"{scope}/value_parts:{i}"]
        added.append(_copy(node, pieces(node.name, i), [*inputs, *_control(node)]))
    return added


def _partitioned_lookup(lookup, nodes, table, firsts, shape, dtype):
    """The nodes that replace ``lookup`` (which keeps its name, as the result)."""
    scope = lookup_scope(lookup.name)
    data = [source for source in lookup.input if not source.startswith("^")]
    control = [source for source in lookup.input if source.startswith("^")]
    ids = data[1]
    id_type = lookup.attr["Tindices" if "Tindices" in lookup.attr else "Tidx"]
    id_name = "int64" if id_type.type == type_attr("int64").type else "int32"
    count = len(firsts)
    added = _route(scope, ids, id_type, firsts)
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


def _route(scope, ids, id_type, firsts):
    """The nodes under ``scope`` that route each of ``ids`` (flattened) to the shard
    holding it (``<scope>/shard``: the number of shard boundaries at or below it), make
    it an index into that shard and split the ids and their positions by shard
    (``<scope>/ids_parts:<i>``, ``<scope>/position_parts:<i>``)."""
    id_name = "int64" if id_type.type == type_attr("int64").type else "int32"
    return [
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
            f"{scope}/local_ids", f"{scope}/shard"], T=id_type,
            num_partitions=int_attr(len(firsts))),
        make_node(f"{scope}/position_parts", "DynamicPartition", [
            f"{scope}/positions", f"{scope}/shard"], T=type_attr("int32"),
            num_partitions=int_attr(len(firsts)))]


# kind of op (rewriters.row_region) -> its ops for each shard, from (node, pieces, the
# shards' rows, the shape of a row)
_REWRITES = {**{kind: lambda node, pieces, *_: _per_shard(node, pieces)
                for kind in ("read", "elementwise", "assign")},
             "segment_sum": lambda *args: _routed_update(*args, values_index=0),
             "scatter": lambda *args: _routed_update(*args, values_index=2)}


__all__ = ["cuttable_tables", "output_nodes", "shard_flat", "shard_tables", "table_regions",
           "with_companions"]
