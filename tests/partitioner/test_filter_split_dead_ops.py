"""Filter splits skip ops TensorFlow never runs: the reader leaves such an op no work and
no outputs (:func:`rewriters.dead_ops.drop_costs`; Keras LSTM layers leave a cell
step's MatMuls behind), and the search must neither fail on it nor split it; a plan
that splits one anyway (edited by hand) is refused in one line."""
import pytest

from costmodel import CostModel
from costmodel.splits import split_graph
from partitioner import filter_split
from rewriters.dead_ops import drop_costs
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph


def _matmul(graph, name, n, source):
    graph.add_op(f"{name}/w", op_type="Const", outputs=[((n, n), "float32")])
    graph.add_op(name, op_type="MatMul", flops=2.0 * n ** 3, input_shapes=((n, n), (n, n)),
                 bytes_accessed=12.0 * n * n, outputs=[((n, n), "float32")],
                 sliced={"input": 1, "axis": 1, "producer": f"{name}/w"})
    graph.add_edge(source, name, bytes=4.0 * n * n)
    graph.add_edge(f"{name}/w", name, bytes=4.0 * n * n)


def _graph_with_a_dead_matmul(n=4096):
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", outputs=[((n, n), "float32")])
    _matmul(graph, "live", n, "x")
    _matmul(graph, "dead", n, "x")  # what an LSTM's unused cell step is
    drop_costs(graph, ["dead"])
    assert graph.ops["dead"]["outputs"] == [] and graph.ops["dead"]["sliced"]
    return graph


def test_an_op_with_no_outputs_is_never_a_split_candidate():
    graph = _graph_with_a_dead_matmul()
    cluster = cluster_from_dict({"name": "two", "devices": [
        {"name": "/device:CPU:0", "kind": "cpu"}, {"name": "/device:CPU:1", "kind": "cpu"}]})
    plan = filter_split.partition(CostModel(graph, cluster))
    assert set(plan.splits) == {"live"}


def test_a_plan_that_splits_an_op_with_no_outputs_is_refused():
    graph = _graph_with_a_dead_matmul(n=8)
    with pytest.raises(PlacementError, match="splits op dead .MatMul., which has no output"):
        split_graph(graph, {"dead": ([0, 1], [4, 4])}, dict.fromkeys(graph.ops, 0))
