"""Which ops of a flat graph act on a table's rows, and how: what cutting the table into
row shards (:mod:`rewriters.row_shard`) must rewrite, and the variables cut with it.

Starting from the table's variable op, every op reading it, or reading a tensor made of
its rows, is one of

* ``lookup``: a ``ResourceGather`` of the variable, a ``GatherV2`` along axis 0 or a
  sparse segment reduction of a read of it (reads a few rows);
* ``lookup_read``: a ``ReadVariableOp`` whose only data readers are lookups (it
  becomes a ``NoOp``);
* ``read``: any other ``ReadVariableOp``: the whole value, one read per shard;
* ``elementwise``: arithmetic of a value of the table's shape with values of that
  shape or values that broadcast along its rows (an optimizer's ``m * beta + g``);
* ``segment_sum``: an ``UnsortedSegmentSum`` into as many rows as the table (a sparse
  gradient, ``IndexedSlices``, made dense by an optimizer), one per shard;
* ``assign``: ``AssignVariableOp``, ``AssignAddVariableOp`` or ``AssignSubVariableOp``
  of the variable with such a value: one per shard;
* ``scatter``: a ``ResourceScatter*`` update of some of its rows (SGD's sparse update):
  the ids routed to their shards, one per shard.

A value of the table's shape read from another variable of that shape and dtype (an
optimizer's slot: momentum, Adam's ``m`` and ``v``) makes that variable a *companion*:
it is cut into the same row shards. Anything else reading the rows (a slice, a matmul
with the whole table, a signature returning it, a sparse ``Apply`` op of a TF1
optimizer) cannot be cut: :func:`row_region` refuses it, naming the op.

Examples
--------
Keras's SGD with momentum on an embedding table: the slot is cut with the table.

>>> import tensorflow as tf
>>> graph = tf.Graph()
>>> with graph.as_default():
...     table = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[6, 2], name="table")
...     slot = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[6, 2], name="momentum")
...     ids = tf.constant([4, 1], name="ids")
...     rows = tf.raw_ops.ResourceGather(resource=table, indices=ids, dtype=tf.float32,
...                                      name="rows")
...     gradient = tf.math.unsorted_segment_sum(rows, ids, 6, name="dense_gradient")
...     value = tf.raw_ops.ReadVariableOp(resource=slot, dtype=tf.float32, name="read")
...     new = tf.subtract(value * 0.9, gradient, name="new")
...     _ = tf.raw_ops.AssignVariableOp(resource=slot, value=new, name="keep")
...     _ = tf.raw_ops.AssignAddVariableOp(resource=table, value=new, name="step")
>>> region = row_region(graph.as_graph_def(), "table")
>>> region.variables
('table', 'momentum')
>>> sorted(region.kinds.items())  # doctest: +NORMALIZE_WHITESPACE
[('dense_gradient', 'segment_sum'), ('keep', 'assign'), ('mul', 'elementwise'),
 ('new', 'elementwise'), ('read', 'read'), ('rows', 'lookup'), ('step', 'assign')]
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rewriters.tf_import import tensorflow
from tfpart.core.errors import PlacementError
from tfpart.core.ops import writes_state

SEGMENT_LOOKUPS = frozenset({"SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
                             "SparseSegmentSumWithNumSegments",
                             "SparseSegmentMeanWithNumSegments",
                             "SparseSegmentSqrtNWithNumSegments"})
# Ops whose output row r reads only row r of each input (or a value broadcast to all rows).
ELEMENTWISE = frozenset({
    "Identity", "Neg", "Sqrt", "Rsqrt", "Square", "Abs", "Sign", "Exp", "Log",
    "Reciprocal", "Cast", "ZerosLike", "OnesLike", "AddV2", "Add", "Sub", "Mul",
    "RealDiv", "Div", "DivNoNan", "MulNoNan", "Maximum", "Minimum", "Pow",
    "SquaredDifference", "SelectV2", "ClipByValue"})
ASSIGNS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
SCATTERS = frozenset({"ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate",
                      "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin",
                      "ResourceScatterMax"})


@dataclass(frozen=True)
class RowRegion:
    """The ops acting on the rows of ``variables`` (the table, then its companions):
    op name -> kind (the module's list), and each lookup's variable."""

    variables: tuple
    kinds: dict
    lookups: dict = field(default_factory=dict)

    def partitioned(self):
        """The nodes whose value is cut by rows: the variables and the reads,
        arithmetic and segment sums of their rows."""
        return {*self.variables, *(name for name, kind in self.kinds.items()
                                   if kind in ("read", "elementwise", "segment_sum"))}


class _Companion(Exception):
    def __init__(self, variable):
        super().__init__(variable)
        self.variable = variable


def graph_index(graph_def):
    """``(nodes by name, data_readers(graph_def), variables by (shape, dtype))``: what
    :func:`row_region` looks nodes, their readers and a table's possible companions up
    in, built once for a graph whose tables are read."""
    variables = {}
    for node in graph_def.node:
        if node.op == "VarHandleOp":
            variables.setdefault(table_shape(node), []).append(node.name)
    return {node.name: node for node in graph_def.node}, data_readers(graph_def), variables


def row_region(graph_def, table, outputs=(), shapes=None, index=None):
    """The ops of ``graph_def`` acting on the rows of variable ``table``.

    Parameters
    ----------
    graph_def : tensorflow.GraphDef
        A flat graph, variables as ``VarHandleOp`` nodes.
    table : str
        The table's variable op.
    outputs : collection of str
        Nodes whose value the graph returns: a value of the rows among them is refused.
    shapes : callable, optional
        Tensor name -> static shape (tuple, None where unknown); by default the graph
        is imported to infer them.
    index : tuple, optional
        :func:`graph_index` of ``graph_def`` (by default built here).

    Returns
    -------
    RowRegion

    Raises
    ------
    tfpart.core.errors.PlacementError
        Naming the first op that reads the rows in a way that cannot be cut.
    """
    nodes, readers, variables_like = index or graph_index(graph_def)
    shape, dtype = table_shape(nodes[table])
    candidates = set(variables_like[shape, dtype]) - {table}
    shapes = shapes or graph_shapes(graph_def)
    variables = [table]
    while True:
        try:
            kinds, lookups = _grow(nodes, readers, variables, candidates, shape, shapes,
                                   set(outputs))
        except _Companion as found:
            variables.append(found.variable)
            candidates.discard(found.variable)
            continue
        return RowRegion(tuple(variables), kinds, lookups)


def _grow(nodes, readers, variables, candidates, shape, shapes, outputs):
    """``(kinds, lookups)`` of the ops reached from ``variables``; _Companion when a
    candidate variable's value meets theirs."""
    kinds, lookups = {}, {}
    variable_of = {name: name for name in variables}  # partitioned read -> its variable
    partitioned = set(variables)
    todo = list(variables)
    assigns = []

    def cut(name, kind):
        kinds[name] = kind
        partitioned.add(name)
        todo.append(name)
        if name in outputs:
            raise _refused(variables[0], nodes[name], "returns them whole")

    def convertible(source):
        """Make the producer of ``source`` partitioned if it can be; whether it is."""
        name = source.split(":")[0]
        node = nodes.get(name)
        if name in partitioned:
            return True
        if node is None:
            return False
        if node.op == "ReadVariableOp":
            handle = node.input[0].split(":")[0]
            if handle in candidates:
                raise _Companion(handle)
            return handle in variables  # reached from the variable
        if node.op == "UnsortedSegmentSum" and shapes(f"{name}:0") == shape and not any(
                s.split(":")[0] in partitioned for s in node.input[:2]):
            cut(name, "segment_sum")
            return True
        # arithmetic of such values: reached from them once they are cut
        return node.op in ELEMENTWISE and shapes(f"{name}:0") == shape and any(
            [convertible(s) for s in _data(node)])

    while todo:
        name = todo.pop()
        for reader, index in readers.get(name, []):
            if reader.name in kinds:
                continue
            op = reader.op
            if name in variables:
                if op == "ReadVariableOp":
                    users = readers.get(reader.name, [])
                    if all(i == 0 and _reads_rows(u, nodes) for u, i in users):
                        kinds[reader.name] = "lookup_read"
                        for user, _ in users:
                            kinds[user.name], lookups[user.name] = "lookup", name
                    else:
                        variable_of[reader.name] = name
                        cut(reader.name, "read")
                elif op == "ResourceGather" and index == 0 and _attr_int(reader, "batch_dims") == 0:
                    kinds[reader.name], lookups[reader.name] = "lookup", name
                elif op in SCATTERS and index == 0:
                    kinds[reader.name] = "scatter"
                elif op in ASSIGNS and index == 0:
                    kinds[reader.name] = "assign"
                    assigns.append(reader)
                else:
                    raise _refused(variables[0], reader)
            elif index == 0 and name in variable_of and _reads_rows(reader, nodes):
                kinds[reader.name], lookups[reader.name] = "lookup", variable_of[name]
            elif op in ELEMENTWISE and shapes(f"{reader.name}:0") == shape:
                for source in _data(reader):
                    if not convertible(source) and not _broadcasts(shapes(source), shape):
                        raise _refused(variables[0], reader)
                cut(reader.name, "elementwise")
            elif op in ASSIGNS and index == 1:
                handle = reader.input[0].split(":")[0]
                if handle in candidates:
                    raise _Companion(handle)
                if handle not in variables:
                    raise _refused(variables[0], reader)
                kinds[reader.name] = "assign"
            else:
                raise _refused(variables[0], reader)
        if not todo:
            for assign in assigns:
                value = _data(assign)[1]
                if value.split(":")[0] not in partitioned and not (
                        convertible(value) and todo):
                    raise _refused(variables[0], assign, "assigns it a value that is not "
                                   "made row by row")
    return kinds, lookups


def _broadcasts(found, shape):
    """Whether a value of shape ``found`` broadcasts along the rows of ``shape``."""
    return found is not None and (len(found) < len(shape) or (
        len(found) == len(shape) and found[0] == 1))


def graph_shapes(graph_def):
    """Tensor name -> static shape, from importing ``graph_def`` (on the first call: a
    graph whose tables are all refused at their first reader is never imported)."""
    tf = tensorflow()
    imported = []

    def shape_of(name):
        if not imported:
            imported.append(tf.Graph())
            with imported[0].as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
        found = imported[0].get_tensor_by_name(name if ":" in name else f"{name}:0").shape
        return tuple(found.as_list()) if found.rank is not None else None
    return shape_of


def table_shape(node):
    """``(shape, dtype name)`` of the variable of a ``VarHandleOp`` node."""
    tf = tensorflow()
    shape = tf.TensorShape(node.attr["shape"].shape)
    return (tuple(shape.as_list()) if shape.rank is not None else (),
            tf.as_dtype(node.attr["dtype"].type).name)


def data_readers(graph_def):
    """Node name -> the ``(node, input index)`` of every data input reading it (index -1
    for a read of an output other than the first)."""
    readers = {}
    for node in graph_def.node:
        for index, source in enumerate(_data(node)):
            name, _, port = source.partition(":")
            readers.setdefault(name, []).append((node, index if port in ("", "0") else -1))
    return readers


def _data(node):
    return [source for source in node.input if not source.startswith("^")]


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


def _refused(table, reader, how=None):
    how = how or ("updates it in a way not cut by rows" if writes_state(reader.op)
                  else "reads it other than by rows")
    return PlacementError("", f"table {table} cannot be cut into row shards: op "
                          f"{reader.name} (a {reader.op}) {how}")


def _attr_int(node, name):
    return node.attr[name].i if name in node.attr else 0


__all__ = ["ASSIGNS", "ELEMENTWISE", "RowRegion", "SCATTERS", "SEGMENT_LOOKUPS",
           "data_readers", "graph_index", "graph_shapes", "row_region", "table_shape"]
