"""Filter splits in a GraphDef give the same tensors as the whole op, for every op type
that splits (forward convolutions and matmuls, and a training step's gradient ops)."""
import numpy as np
import pytest
import tensorflow as tf

from rewriters.channel_split import split_channels
from tfpart.core.errors import PlacementError
from tfpart.core.plan import Split
from tfpart.core.splits import part_name

DEVICES = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]


def _conv2d(rng):
    x = tf.constant(rng.standard_normal((2, 7, 7, 3)), tf.float32)
    w = tf.constant(rng.standard_normal((3, 3, 3, 8)), tf.float32)
    return tf.nn.conv2d(x, w, strides=2, padding="SAME", name="op")


def _matmul(transpose_b):
    def build(rng):
        a = tf.constant(rng.standard_normal((5, 6)), tf.float32)
        b = tf.constant(rng.standard_normal((8, 6) if transpose_b else (6, 8)), tf.float32)
        return tf.matmul(a, b, transpose_b=transpose_b, name="op")
    return build


def _filter_gradient(rng):
    x = tf.constant(rng.standard_normal((2, 7, 7, 3)), tf.float32)
    w = tf.constant(rng.standard_normal((3, 3, 3, 8)), tf.float32)
    dy = tf.constant(rng.standard_normal((2, 4, 4, 8)), tf.float32)
    return tf.compat.v1.nn.conv2d_backprop_filter(x, tf.shape(w), dy, [1, 2, 2, 1], "SAME",
                                                  name="op")


def _input_gradient(rng):
    w = tf.constant(rng.standard_normal((3, 3, 6, 4)), tf.float32)
    dy = tf.constant(rng.standard_normal((2, 4, 4, 4)), tf.float32)
    return tf.compat.v1.nn.conv2d_backprop_input([2, 7, 7, 6], w, dy, [1, 2, 2, 1], "SAME",
                                                 name="op")


@pytest.mark.parametrize("build, sizes", [
    (_conv2d, [5, 2, 1]), (_matmul(False), [4, 4]), (_matmul(True), [1, 6, 1]),
    (_filter_gradient, [3, 5]), (_input_gradient, [1, 2, 3])])
def test_the_slices_concatenate_to_the_whole_op(build, sizes):
    graph = tf.Graph()
    with graph.as_default():
        whole = build(np.random.default_rng(0))
        readers = tf.identity(whole, name="reader")
    with tf.compat.v1.Session(graph=graph) as session:
        expected = session.run(readers)
    split, devices = split_channels(graph.as_graph_def(), {"op": Split(
        DEVICES[:len(sizes)], sizes)}, lambda name: DEVICES[0])
    assert [devices[part_name("op", i)] for i in range(len(sizes))] == DEVICES[:len(sizes)]
    nodes = {node.name: node for node in split.node}
    assert nodes["op"].op == "ConcatV2" and nodes["reader"].input[0] == "op"
    with tf.Graph().as_default() as rewritten:
        tf.graph_util.import_graph_def(split, name="")
        slices = [rewritten.get_tensor_by_name(f"{part_name('op', i)}:0")
                  for i in range(len(sizes))]
        with tf.compat.v1.Session() as session:
            got, parts = session.run(["reader:0", slices])
    assert [part.shape[-1] for part in parts] == sizes
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_op_that_does_not_split_is_an_error():
    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.constant([1.0, -1.0]), name="op")
    with pytest.raises(PlacementError, match="Relu cannot be split"):
        split_channels(graph.as_graph_def(), {"op": Split(DEVICES[:2], [1, 1])},
                       lambda name: DEVICES[0])
    with pytest.raises(PlacementError, match="does not have"):
        split_channels(graph.as_graph_def(), {"gone": Split(DEVICES[:2], [1, 1])},
                       lambda name: DEVICES[0])
