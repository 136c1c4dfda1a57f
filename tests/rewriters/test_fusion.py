"""Fusion groups: the table of remapper patterns covers what Grappler itself fuses in
this process's oneDNN mode (the tests run with oneDNN on and off), and the reader
makes every group one colocation group."""
import pytest

from rewriters.fusion import grappler_fusion_groups, table_fusion_groups
from rewriters.flat_signature import import_flat
from rewriters.flatten import flatten_signature
from rewriters.reader import read_model
from rewriters.savedmodel_io import read_saved_model

MODELS = ["residual_cnn", "transformer_encoder", "stacked_lstm", "parallel_dense",
          "conv_batchnorm", "resnet50", "mlp_module"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_table_covers_what_grappler_fuses(name, exported):
    model = exported(name)
    proto = read_saved_model(model)
    graph, info = read_model(proto, model, batch_size=2)
    flat = flatten_signature(proto, model, 2)
    by_grappler = grappler_fusion_groups(import_flat(flat).as_graph_def(), flat.outputs)
    group_of = {op: k for k, members in enumerate(table_fusion_groups(graph))
                for op in members}
    uncovered = [members for members in by_grappler
                 if len({group_of.get(op, op) for op in members}) > 1]
    assert uncovered == []
    for members in info.fusion_groups:  # one placement unit each
        assert len({graph.ops[op]["colocation"] for op in members}) == 1
    if name in ("residual_cnn", "parallel_dense", "resnet50"):
        assert by_grappler  # convolutions and dense layers with a bias do fuse


def test_table_patterns_on_a_residual_block():
    from tfpart.core.graph import OpGraph

    g = OpGraph()
    ops = {"x": "Placeholder", "c1": "Conv2D", "b1": "BiasAdd", "c2": "Conv2D",
           "b2": "BiasAdd", "add": "AddV2", "relu": "Relu", "pool": "MaxPool",
           "m": "MatMul", "r": "Relu"}
    for name, op_type in ops.items():
        g.add_op(name, op_type=op_type)
    for a, b in [("x", "c1"), ("c1", "b1"), ("x", "c2"), ("c2", "b2"), ("b1", "add"),
                 ("b2", "add"), ("add", "relu"), ("relu", "pool"), ("pool", "m"), ("m", "r")]:
        g.add_edge(a, b, bytes=4)
    # The add stays with both convolutions (the remapper may fuse either); a matmul
    # without a bias add fuses nothing.
    assert table_fusion_groups(g) == [["add", "b1", "b2", "c1", "c2", "relu"]]


def test_a_matmul_with_a_vector_added_fuses_even_when_its_shape_is_read():
    """Keras 3's Dense without an activation adds its bias with AddV2; in a training
    step the add's gradient reads the matmul's shape, which Grappler folds, and the
    remapper fuses the two at run time (a plan that split them ran the add off-plan)."""
    from tfpart.core.graph import OpGraph

    g = OpGraph()
    for name, op_type, shape in [("x", "Placeholder", (8, 4)), ("w", "Placeholder", (4, 2)),
                                 ("m", "MatMul", (8, 2)), ("b", "Placeholder", (2,)),
                                 ("add", "AddV2", (8, 2)), ("shape", "Shape", (2,)),
                                 ("m2", "MatMul", (8, 2)), ("residual", "AddV2", (8, 2))]:
        g.add_op(name, op_type=op_type, outputs=[(shape, "float32")])
    for a, b in [("x", "m"), ("w", "m"), ("m", "add"), ("b", "add"), ("m", "shape"),
                 ("x", "m2"), ("w", "m2"), ("m2", "residual"), ("add", "residual")]:
        g.add_edge(a, b, bytes=4)
    # an add of two matrices is no bias: the second matmul stays apart
    assert table_fusion_groups(g) == [["add", "m"]]
