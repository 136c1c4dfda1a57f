"""Filter splits: the split graph conserves the work and the bytes of what it splits,
the partitioner keeps only splits that pay (never slower than the greedy it starts
from), shares follow each device's speed, and a plan's splits simulate the same from
plan.json."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, simulate_plan
from costmodel.splits import slicer_name, split_graph
from partitioner import filter_split, greedy
from tests.random_graphs import random_clusters
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.dtypes import tensor_bytes
from tfpart.core.graph import OpGraph
from tfpart.core.plan import Plan
from tfpart.core.splits import part_name


@st.composite
def matmul_chains(draw):
    """An input through 1-4 matmuls of random sizes, each with its own weights, and a
    cheap reader at the end."""
    graph = OpGraph()
    rows = draw(st.integers(1, 2048))
    width = draw(st.integers(1, 2048))
    graph.add_op("x", op_type="Placeholder", outputs=[((rows, width), "float32")])
    previous = "x"
    for i in range(draw(st.integers(1, 4))):
        out = draw(st.integers(1, 4096))
        graph.add_op(f"w{i}", op_type="Const", outputs=[((width, out), "float32")])
        graph.add_op(f"mm{i}", op_type="MatMul", flops=2.0 * rows * width * out,
                     bytes_accessed=4.0 * (rows * width + width * out + rows * out),
                     input_shapes=((rows, width), (width, out)),
                     outputs=[((rows, out), "float32")],
                     sliced={"input": 1, "axis": 1, "producer": f"w{i}"})
        graph.add_edge(previous, f"mm{i}", bytes=4.0 * rows * width)
        graph.add_edge(f"w{i}", f"mm{i}", bytes=4.0 * width * out)
        previous, width = f"mm{i}", out
    graph.add_op("relu", op_type="Relu", bytes_accessed=8.0 * rows * width,
                 outputs=[((rows, width), "float32")])
    graph.add_edge(previous, "relu", bytes=4.0 * rows * width)
    return graph


@settings(max_examples=20, deadline=None)
@given(matmul_chains(), st.data())
def test_the_split_graph_conserves_work_and_bytes(graph, data):
    ops = [op for op in graph.ops if graph.ops[op].get("sliced")]
    op = data.draw(st.sampled_from(ops))
    channels = graph.ops[op]["outputs"][0][0][-1]
    k = data.draw(st.integers(1, min(channels, 3)))
    cuts = sorted(data.draw(st.sets(st.integers(1, channels - 1), min_size=k - 1,
                                    max_size=k - 1))) if k > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, channels])]
    split, where = split_graph(graph, {op: (list(range(k)), sizes)}, dict.fromkeys(graph.ops, 0))
    parts = [part_name(op, i) for i in range(k)]
    assert np.isclose(sum(split.ops[p]["flops"] for p in parts), graph.ops[op]["flops"])
    assert [where[p] for p in parts] == list(range(k))
    weights = graph.ops[op]["sliced"]["producer"]
    assert where[slicer_name(op)] == where[weights] == 0
    operand = tensor_bytes(graph.ops[op]["input_shapes"][1], "float32")
    assert np.isclose(sum(split.edge(slicer_name(op), p)["bytes"] for p in parts), operand)
    assert split.edge(weights, slicer_name(op))["bytes"] == operand
    output = tensor_bytes(graph.ops[op]["outputs"][0][0], "float32")
    assert np.isclose(sum(split.edge(p, op)["bytes"] for p in parts), output)
    # the activations go whole to every slice; the op's readers still read the op
    activation = next(src for src in graph.predecessors(op) if src != weights)
    assert all(split.edge(activation, p)["bytes"] == graph.edge(activation, op)["bytes"]
               for p in parts)
    assert set(split.successors(op)) == set(graph.successors(op))
    assert split.is_acyclic()


@settings(max_examples=25, deadline=None)
@given(matmul_chains(), random_clusters(min_devices=2, max_devices=4, slow_links=True))
def test_splits_are_kept_only_where_they_pay(graph, cluster):
    cost = CostModel(graph, cluster)
    plan = filter_split.partition(cost)
    placed = greedy.partition(cost)
    assert plan.step_time <= placed.step_time * (1 + 1e-9)
    assert plan.assignment == placed.assignment  # the splits start from the greedy's
    if plan.splits:
        assert plan.step_time < placed.step_time
    # plan.json round trip: the same splits simulate to the same step
    again = Plan.from_dict(plan.to_dict())
    assert np.isclose(simulate_plan(again, cost).makespan, plan.step_time)
    for split in plan.splits.values():
        assert len(split.devices) == len(set(split.devices)) >= 2
        assert min(split.sizes) >= 1


def test_shares_follow_each_device_speed_and_slow_links_forbid_splits():
    n = 8192
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", outputs=[((n, n), "float32")])
    graph.add_op("w", op_type="Const", outputs=[((n, n), "float32")])
    graph.add_op("y", op_type="MatMul", flops=2.0 * n ** 3, input_shapes=((n, n), (n, n)),
                 bytes_accessed=12.0 * n * n, outputs=[((n, n), "float32")],
                 sliced={"input": 1, "axis": 1, "producer": "w"})
    graph.add_edge("x", "y", bytes=4.0 * n * n)
    graph.add_edge("w", "y", bytes=4.0 * n * n)

    def cluster(bandwidth):
        return cluster_from_dict({"name": "two", "devices": [
            {"name": "/device:GPU:0", "kind": "V100"},
            {"name": "/device:GPU:1", "kind": "T4"}],
            "links": {"same_host": {"bandwidth": bandwidth, "latency": "5us"}}})

    fast = CostModel(graph, cluster("300GB/s"))
    plan = filter_split.partition(fast)
    sizes = plan.splits["y"].sizes
    times = fast.compute[fast.index["y"]]
    assert sizes[0] > sizes[1] and sum(sizes) == n
    assert abs(sizes[0] / n - (1 / times[0]) / (1 / times[0] + 1 / times[1])) < 1 / n + 1e-9
    assert list(plan.splits["y"].devices) == fast.cluster.device_names  # the V100 first
    assert filter_split.partition(CostModel(graph, cluster("1GB/s"))).splits == {}


def test_an_op_measured_at_no_time_is_not_split():
    """A measured profile can time a tiny op at zero: nothing to share, no speed."""
    cluster = cluster_from_dict({"name": "two", "devices": [
        {"name": "/device:CPU:0", "kind": "cpu"}, {"name": "/device:CPU:1", "kind": "cpu"}]})
    graph = OpGraph()
    graph.add_op("w", op_type="Const", outputs=[((4, 4), "float32")])
    graph.add_op("y", op_type="MatMul", input_shapes=((4, 4), (4, 4)),
                 outputs=[((4, 4), "float32")], cost=dict.fromkeys(cluster.device_names, 0.0),
                 sliced={"input": 1, "axis": 1, "producer": "w"})
    graph.add_edge("w", "y", bytes=64)
    assert filter_split.partition(CostModel(graph, cluster)).splits == {}
