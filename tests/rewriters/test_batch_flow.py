"""The loops and branches the batch steers, found from the graph alone
(rewriters/batch_flow.py), on graphs of small ``tf.function``s: a batch-wide stop
condition or predicate is reported with the op that reduces over the batch; fixed trip
counts, other dimensions, weights and ``tf.map_fn``'s per-sample work are not, nor are
branches that only assert, nor what an op the role table does not list decides (no
proof: the random probe's to judge)."""
from contextlib import contextmanager

import pytest

from rewriters.batch_flow import batch_flow_mixing


def _graph_def(function):
    import tensorflow as tf

    traced = tf.function(function, input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    return traced.get_concrete_function().graph.as_graph_def()



@contextmanager
def _control_flow_v1():
    """A new graph, built with ``tf.compat.v1``'s Switch/Merge control flow."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    was_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        graph = tf.Graph()
        with graph.as_default():
            yield graph
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = was_v2

def _weights():
    import numpy as np
    import tensorflow as tf

    return tf.constant(np.random.default_rng(0).standard_normal((8, 8)).astype("float32"))


def batch_max_loop(x):
    import tensorflow as tf

    return tf.while_loop(lambda i, h: tf.reduce_max(tf.abs(h)) > 1.0,
                         lambda i, h: (i + 1, h * 0.5), [0, x])[1]


def carried_batch_max_loop(x):
    """The condition reads only a carried value, which the body takes over the batch."""
    import tensorflow as tf

    return tf.while_loop(lambda i, h, top: top > 1.0,
                         lambda i, h, top: (i + 1, h * 0.5, tf.reduce_max(h * 0.5)),
                         [0, x, 2.0])[1]


def batch_mean_cond(x):
    import tensorflow as tf

    return tf.cond(tf.reduce_mean(x) > 0, lambda: x * 2.0, lambda: x - 1.0)


def batch_sum_cond_in_map_fn(x):
    """The branch runs once per sample, but on a sum over the whole batch."""
    import tensorflow as tf

    return tf.map_fn(lambda row: tf.cond(tf.reduce_sum(x) > 0, lambda: row * 2.0,
                                         lambda: row - 1.0), x)


def batch_size_loop(x):
    """As many trips as the batch has samples, each changing every sample."""
    import tensorflow as tf

    return tf.while_loop(lambda i, h: i < tf.shape(x)[0],
                         lambda i, h: (i + 1, tf.tanh(h) + 0.5), [0, x])[1]


def scan_over_batch(x):
    import tensorflow as tf

    return tf.scan(lambda total, row: total + row, x)


def fixed_trip_loop(x):
    import tensorflow as tf

    w = _weights()
    return tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h @ w)), [0, x])[1]


def feature_count_loop(x):
    """Trips counted by ``tf.shape(x)[1]``, a dimension other than the batch."""
    import tensorflow as tf

    w = _weights()
    return tf.while_loop(lambda i, h: i < tf.shape(x)[1],
                         lambda i, h: (i + 1, tf.tanh(h @ w)), [0, x])[1]


def map_fn_per_sample(x):
    import tensorflow as tf

    return tf.map_fn(lambda row: tf.tanh(row) * 2.0 + tf.reduce_sum(row), x)


def per_sample_cond_in_map_fn(x):
    import tensorflow as tf

    return tf.map_fn(lambda row: tf.cond(tf.reduce_sum(row) > 0, lambda: row * 2.0,
                                         lambda: row - 1.0), x)


def per_sample_loops_in_map_fn(x):
    """Each sample halved until its own largest magnitude is at most 1."""
    import tensorflow as tf

    return tf.map_fn(lambda row: tf.while_loop(lambda v: tf.reduce_max(tf.abs(v)) > 1.0,
                                               lambda v: v * 0.5, [row])[0], x)


def batch_max_loops_in_map_fn(x):
    import tensorflow as tf

    return tf.map_fn(lambda row: tf.while_loop(lambda v: tf.reduce_max(tf.abs(x)) > 1.0,
                                               lambda v: v * 0.5, [row])[0], x)


def gathered_rows_loop(x):
    """A hand-written ``tf.map_fn``: trip ``i`` reads row ``i`` and writes slot ``i``."""
    import tensorflow as tf

    def body(i, rows):
        return i + 1, rows.write(i, tf.tanh(tf.gather(x, i)) * 2.0)
    rows = tf.TensorArray(tf.float32, size=tf.shape(x)[0])
    return tf.while_loop(lambda i, rows: i < tf.shape(x)[0], body, [0, rows])[1].stack()


def weight_cond(x):
    import tensorflow as tf

    w = _weights()
    return tf.cond(tf.reduce_sum(w) > 0, lambda: x @ w, lambda: x - 1.0)


def time_major_recurrence(x):
    """A Keras RNN's shape: the sequence axis moved first, one trip per time step, the
    state started from ``tf.zeros([batch, units])``."""
    import tensorflow as tf

    steps = tf.transpose(tf.reshape(x, [-1, 4, 2]), [1, 0, 2])
    kernel = tf.ones([2, 3])
    return tf.while_loop(lambda t, h: t < tf.shape(steps)[0],
                         lambda t, h: (t + 1, tf.tanh(h + tf.gather(steps, t) @ kernel)),
                         [0, tf.zeros([tf.shape(x)[0], 3])])[1]


@pytest.mark.parametrize("model, op, cause", [
    (batch_max_loop, "while", "stop condition depends on Max over the batch at op while/"),
    (carried_batch_max_loop, "while", "stop condition depends on Max over the batch"),
    (batch_mean_cond, "cond", "predicate depends on Mean over the batch at op Mean"),
    (batch_sum_cond_in_map_fn, "map/while/map/while/cond", "Sum over the batch"),
    (batch_size_loop, "while", "trip count is the batch size"),
    (scan_over_batch, "scan/while", "trip count is the batch size"),
    (batch_max_loops_in_map_fn, "map/while/map/while/while", "Max over the batch"),
])
def test_a_loop_or_branch_the_batch_steers_is_named_with_its_cause(model, op, cause):
    found = batch_flow_mixing(_graph_def(model), ["x"])
    assert found and found[0][0] == op, found
    assert cause in found[0][1], found


@pytest.mark.parametrize("model", [fixed_trip_loop, feature_count_loop, map_fn_per_sample,
                                   per_sample_cond_in_map_fn, per_sample_loops_in_map_fn,
                                   gathered_rows_loop, weight_cond, time_major_recurrence])
def test_per_sample_loops_and_branches_are_not_reported(model):
    assert batch_flow_mixing(_graph_def(model), ["x"]) == []


def test_an_input_that_is_not_batched_steers_nothing():
    """The same batch-wide loop, its input not named a batch input: nothing to mix."""
    assert batch_flow_mixing(_graph_def(batch_max_loop), []) == []


@pytest.mark.parametrize("statistic, reported", [("batch", True), ("weight", False)])
def test_control_flow_v1_conds_and_loops(statistic, reported):
    """``tf.compat.v1`` control flow: a ``Switch`` on the batch's sum is reported once
    (one cond, a ``Switch`` per tensor it takes), a ``LoopCond`` on the batch's max
    too; a fixed loop and a cond on a weight are not."""
    import tensorflow as tf

    with _control_flow_v1() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        w = _weights()
        gated = tf.compat.v1.cond(
            tf.reduce_sum(x if statistic == "batch" else w) > 0,
            lambda: x * 2.0, lambda: x - 1.0)
        tf.compat.v1.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h @ w)),
                                [tf.constant(0), gated])
        if statistic == "batch":
            tf.compat.v1.while_loop(lambda h: tf.reduce_max(h) < 10.0,
                                    lambda h: h * 2.0, [x])
    found = batch_flow_mixing(graph.as_graph_def(), ["x"])
    if not reported:
        assert found == []
        return
    assert [op.rsplit("/", 1)[-1] for op, _ in found] == ["Switch", "LoopCond"], found
    assert "predicate depends on Sum over the batch" in found[0][1]
    assert "stop condition depends on Max over the batch" in found[1][1]


# What changes no values, or what the analysis cannot read, is no proof of mixing.

def _checked(x):
    """``x``, after an assertion on it (an ``Assert`` op, no value)."""
    import tensorflow as tf

    with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(x > -1e9), [x])]):
        return tf.identity(x)


def asserted_batch_statistics(x):
    """``tf.debugging`` assertions on reductions over the whole batch: each an
    ``AssertGuard`` (an ``If`` whose branches only assert, read by control edges)."""
    import tensorflow as tf

    checks = [tf.debugging.assert_non_negative(x),
              tf.debugging.assert_less(tf.reduce_max(x), 10.0)]
    with tf.control_dependencies(checks):
        return tf.identity(x * 2.0)


def assert_only_cond(x):
    """A ``tf.cond`` on the batch's mean whose branches both return ``x``, one of them
    after an assertion: whichever runs, the values are the same."""
    import tensorflow as tf

    return tf.cond(tf.reduce_mean(x) > 0, lambda: x, lambda: _checked(x)) * 2.0


def unread_cond(x):
    """A ``tf.cond`` on the batch's mean that computes a value nobody reads (only a
    control edge waits for it)."""
    import tensorflow as tf

    flag = tf.cond(tf.reduce_mean(x) > 0, lambda: tf.constant(1.0), lambda: tf.constant(0.0))
    with tf.control_dependencies([flag]):
        return tf.identity(x * 2.0)


def unknown_op_feature_count_loop(x):
    """Trips counted by a dimension other than the batch of an op the role table does
    not list (``BesselI0e``)."""
    import tensorflow as tf

    w = _weights()
    return tf.while_loop(lambda i, h: i < tf.shape(tf.math.bessel_i0e(x))[1],
                         lambda i, h: (i + 1, tf.tanh(h @ w)), [0, x])[1]


def unknown_op_batch_max_cond(x):
    """A branch on the batch's largest value of an op the role table does not list:
    it does mix, but the graph alone cannot show it; the random probe's to find."""
    import tensorflow as tf

    return tf.cond(tf.reduce_max(tf.math.bessel_i0e(x)) > 0.5, lambda: x * 2.0,
                   lambda: x - 1.0)


@pytest.mark.parametrize("model", [asserted_batch_statistics, assert_only_cond, unread_cond,
                                   unknown_op_feature_count_loop, unknown_op_batch_max_cond])
def test_assertions_and_ops_not_known_are_no_proof_of_mixing(model):
    assert batch_flow_mixing(_graph_def(model), ["x"]) == []


def test_control_flow_v1_assertions_are_no_proof_of_mixing():
    """A ``tf.compat.v1`` ``AssertGuard``: ``Switch``es on the batch's ``All`` that feed
    only an ``Assert`` and a ``Merge`` read by control edges."""
    import tensorflow as tf

    with _control_flow_v1() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        with tf.control_dependencies([tf.debugging.assert_non_negative(x)]):
            tf.identity(x * 2.0, name="y")
    assert batch_flow_mixing(graph.as_graph_def(), ["x"]) == []


def test_a_tensorflow_text_tokenizer_is_no_proof_of_mixing():
    """Whitespace tokens hashed into an embedding, summed per string (the model of
    tests/test_op_libraries.py): the ``TFText>`` op is not in the role table, and the
    ``AssertGuard``s of ``RaggedTensor.from_row_splits`` check its row splits."""
    tensorflow_text = pytest.importorskip("tensorflow_text")
    import tensorflow as tf

    table, dense = tf.ones([64, 8]), tf.ones([8, 3])
    tokenizer = tensorflow_text.WhitespaceTokenizer()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def scores(text):
        words = tokenizer.tokenize(text)
        rows = tf.strings.to_hash_bucket_fast(words.flat_values, 64)
        vectors = words.with_flat_values(tf.gather(table, rows))
        return tf.matmul(tf.reduce_sum(vectors, axis=1), dense)

    graph_def = scores.get_concrete_function().graph.as_graph_def()
    assert any(node.op.startswith("TFText>") for node in graph_def.node)
    assert batch_flow_mixing(graph_def, ["text"]) == []
