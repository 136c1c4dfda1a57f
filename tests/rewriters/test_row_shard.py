"""Row shards made in a GraphDef (``rewriters.row_shard``): every lookup of a table cut
into shards gives the rows the whole table gives, for ids in every shard, the first and
last rows, repeated ids, an empty batch, int32 and int64 ids, gathers of a read, a
``ResourceGather`` and sparse segment reductions; a table read other than by rows is
refused, naming the op."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorflow as tf

from rewriters.row_shard import shard_tables
from tfpart.core.errors import PlacementError
from tfpart.core.row_shards import first_rows, shard_name

ROWS, WIDTH = 50, 3
TABLE = np.arange(ROWS * WIDTH, dtype=np.float32).reshape(ROWS, WIDTH)


def lookup_graph(kind, id_dtype=tf.int32):
    """A GraphDef reading rows of variable ``table`` by placeholders ``ids`` (and
    ``segments``) into ``out``."""
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH], name="table")
        ids = tf.compat.v1.placeholder(id_dtype, [None, None] if kind == "gather" else [None],
                                       name="ids")
        segments = tf.compat.v1.placeholder(tf.int32, [None], name="segments")
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32, name="read")
        if kind == "gather":
            out = tf.gather(read, ids, axis=0)
        elif kind == "resource_gather":
            out = tf.raw_ops.ResourceGather(resource=handle, indices=ids, dtype=tf.float32)
        elif kind == "segment_mean":
            out = tf.raw_ops.SparseSegmentMean(data=read, indices=ids, segment_ids=segments)
        elif kind == "segment_sum_n":
            out = tf.raw_ops.SparseSegmentSumWithNumSegments(
                data=read, indices=ids, segment_ids=segments, num_segments=5)
        tf.identity(out, name="out")
        with tf.control_dependencies([read]):
            tf.no_op(name="after_read")
    return graph.as_graph_def()


def run(graph_def, variables, feeds):
    """``out`` of ``graph_def`` with its variable ops bound to ``variables`` (by op
    name) and placeholders fed."""
    def body():
        graph = tf.compat.v1.get_default_graph()
        input_map = {f"{name}:0": graph.capture(v.handle) for name, v in variables.items()}
        input_map.update({f"{name}:0": tf.constant(value) for name, value in feeds.items()})
        return tf.graph_util.import_graph_def(graph_def, input_map=input_map,
                                              return_elements=["out:0"], name="")[0]
    return tf.function(body, autograph=False)().numpy()


def sharded_run(kind, sizes, feeds, id_dtype=tf.int32):
    graph_def = lookup_graph(kind, id_dtype)
    sharded, shards, _ = shard_tables(graph_def, {"table": sizes})
    pieces = {name: tf.Variable(TABLE[first:first + rows])
              for name, (_, first, rows) in shards.items()}
    whole = run(graph_def, {"table": tf.Variable(TABLE)}, feeds)
    return whole, run(sharded, pieces, feeds), sharded


@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_a_gather_gives_every_row_from_its_shard(id_dtype):
    # ids in every shard, the first and last rows, repeats, each shard's edges
    ids = np.array([[0, 49, 17], [16, 17, 33], [34, 0, 0], [49, 49, 25]],
                   dtype=id_dtype.as_numpy_dtype)
    whole, sharded, graph_def = sharded_run("gather", [17, 17, 16], {"ids": ids}, id_dtype)
    np.testing.assert_array_equal(sharded, whole)
    assert sharded.shape == (4, 3, WIDTH)
    # the whole table is gone: each shard is its own variable, read by rows only
    ops = {node.name: node.op for node in graph_def.node}
    assert "table" not in ops and ops["read"] == "NoOp"
    assert [ops[shard_name("table", i)] for i in range(3)] == ["VarHandleOp"] * 3
    readers = [node for node in graph_def.node
               if any(s.split(":")[0].startswith("table/") for s in node.input)]
    assert {node.op for node in readers} == {"ResourceGather"}
    # what waited for the read still waits, now for the NoOp standing for it
    assert "^read" in next(node for node in graph_def.node if node.name == "after_read").input


def test_an_empty_batch_of_ids_gives_no_rows():
    whole, sharded, _ = sharded_run("resource_gather", [25, 25],
                                    {"ids": np.zeros((0,), np.int32)})
    assert sharded.shape == whole.shape == (0, WIDTH)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=2, max_size=5).filter(lambda s: sum(s) <= ROWS),
       st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=30), st.data())
def test_any_cut_gives_the_rows_of_the_whole_table(sizes, ids, data):
    sizes = [*sizes[:-1], sizes[-1] + ROWS - sum(sizes)]  # cover every row
    kind = data.draw(st.sampled_from(["resource_gather", "segment_mean", "segment_sum_n"]))
    segments = np.sort(np.array(data.draw(st.lists(st.integers(0, 4), min_size=len(ids),
                                                   max_size=len(ids))), np.int32))
    whole, sharded, _ = sharded_run(kind, sizes, {"ids": np.array(ids, np.int32),
                                                  "segments": segments})
    np.testing.assert_allclose(sharded, whole, rtol=1e-6)


def test_shards_are_consecutive_rows_in_order():
    _, shards, _ = shard_tables(lookup_graph("gather"), {"table": [20, 20, 10]})
    assert list(shards.values()) == [("table", first, rows) for first, rows in
                                     zip(first_rows([20, 20, 10]), [20, 20, 10])]


def test_sizes_that_do_not_cover_the_table_or_a_missing_table_are_refused():
    with pytest.raises(PlacementError, match="do not cut the 50 rows of table table"):
        shard_tables(lookup_graph("gather"), {"table": [20, 20]})
    with pytest.raises(PlacementError, match="cuts table read, which is no variable"):
        shard_tables(lookup_graph("gather"), {"read": [25, 25]})


def test_a_table_read_whole_is_refused_naming_the_op():
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH], name="table")
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32, name="read")
        tf.gather(read, [0], name="lookup")
        tf.matmul(read, tf.ones([WIDTH, 1]), name="scores")  # a tied output layer
    with pytest.raises(PlacementError, match=r"op scores \(a MatMul\) reads it other than "
                                             "by rows"):
        shard_tables(graph.as_graph_def(), {"table": [25, 25]})


def test_a_gather_along_another_axis_is_refused():
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH], name="table")
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32, name="read")
        tf.gather(read, [0, 2], axis=1, name="columns")
    with pytest.raises(PlacementError, match=r"columns \(a GatherV2\)"):
        shard_tables(graph.as_graph_def(), {"table": [25, 25]})


def update_graph(kind):
    """A GraphDef of one optimizer step on variable ``table`` (and its slot
    ``momentum``) for the gradient rows ``grads`` of ``ids``: ``scatter`` (SGD: the
    rows read, updated in place) or ``momentum`` (the gradient made dense by a segment
    sum, the slot and the table updated whole, as Keras does)."""
    graph = tf.Graph()
    with graph.as_default():
        table = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH], name="table")
        ids = tf.compat.v1.placeholder(tf.int32, [None], name="ids")
        grads = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="grads")
        if kind == "scatter":
            tf.raw_ops.ResourceScatterSub(resource=table, indices=ids, updates=grads * 0.1,
                                          name="step")
        else:
            slot = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH],
                                          name="momentum")
            dense = tf.math.unsorted_segment_sum(grads, ids, ROWS, name="dense")
            value = tf.raw_ops.ReadVariableOp(resource=slot, dtype=tf.float32)
            keep = tf.raw_ops.AssignVariableOp(resource=slot, value=value * 0.9 - dense * 0.1,
                                               name="keep")
            with tf.control_dependencies([keep]):
                new = tf.raw_ops.ReadVariableOp(resource=slot, dtype=tf.float32)
            tf.raw_ops.AssignAddVariableOp(resource=table, value=tf.sqrt(tf.abs(new)) + new,
                                           name="step")
    return graph.as_graph_def()


def stepped(graph_def, variables, feeds):
    """Run ``graph_def``'s updates once on ``variables`` (by op name)."""
    def body():
        graph = tf.compat.v1.get_default_graph()
        input_map = {f"{name}:0": graph.capture(v.handle) for name, v in variables.items()}
        input_map.update({f"{name}:0": tf.constant(value) for name, value in feeds.items()})
        tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="")
    tf.function(body, autograph=False)()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=2, max_size=4).filter(lambda s: sum(s) <= ROWS),
       st.lists(st.integers(0, ROWS - 1), min_size=0, max_size=20),
       st.sampled_from(["scatter", "momentum"]))
def test_an_update_cut_by_rows_leaves_every_variable_as_the_whole_update(sizes, ids, kind):
    sizes = [*sizes[:-1], sizes[-1] + ROWS - sum(sizes)]
    graph_def = update_graph(kind)
    sharded, shards, _ = shard_tables(graph_def, {"table": sizes})
    assert {table for table, _, _ in shards.values()} == (
        {"table"} if kind == "scatter" else {"table", "momentum"})  # the slot cut with it
    start = {"table": TABLE, "momentum": TABLE[::-1] / 100}
    feeds = {"ids": np.array(ids, np.int32),
             "grads": np.arange(len(ids) * WIDTH, dtype=np.float32).reshape(-1, WIDTH)}
    whole = {name: tf.Variable(start[name]) for name in {t for t, _, _ in shards.values()}}
    pieces = {name: tf.Variable(start[table][first:first + rows])
              for name, (table, first, rows) in shards.items()}
    stepped(graph_def, whole, feeds)
    stepped(sharded, pieces, feeds)
    for name, variable in whole.items():
        joined = np.concatenate([pieces[shard].numpy() for shard, (table, _, _)
                                 in shards.items() if table == name])
        np.testing.assert_allclose(joined, variable.numpy(), rtol=1e-6)
    if ids:  # the update did something
        assert not np.array_equal(whole["table"].numpy(), TABLE)


def test_an_update_not_made_row_by_row_is_refused_naming_the_op():
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH], name="table")
        tf.raw_ops.AssignAddVariableOp(resource=handle, value=tf.ones([ROWS, WIDTH]),
                                       name="shift")
    with pytest.raises(PlacementError, match=r"op shift \(a AssignAddVariableOp\) assigns "
                                             "it a value that is not made row by row"):
        shard_tables(graph.as_graph_def(), {"table": [25, 25]})
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[ROWS, WIDTH], name="table")
        tf.raw_ops.ResourceApplyGradientDescent(var=handle, alpha=0.1,
                                                delta=tf.ones([ROWS, WIDTH]), name="apply")
    with pytest.raises(PlacementError, match=r"op apply \(a ResourceApplyGradientDescent\) "
                                             "updates it in a way not cut by rows"):
        shard_tables(graph.as_graph_def(), {"table": [25, 25]})
