"""Data-parallel replicas' two reductions, as the cost model prices them: the
all-reduce sends no weights out, and from each device a ring's share of the
gradients, 2 (k - 1) / k of them, where reducing to one device has the home send
k - 1 copies of the weights; but it needs a copy of the variables (and optimizer
slots) on every device. The partitioner picks the faster one that fits."""
import pytest

from costmodel import CostModel
from costmodel.pipeline import all_reduce_replicas_graph, replicas_graph
from partitioner.data_parallel import DataParallelOptions, partition
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph

WEIGHT_BYTES = 400e6


def training_step(weight_bytes=WEIGHT_BYTES):
    """A one-layer training step: a weight read, forward and backward matmuls, an
    SGD update of the weight."""
    g = OpGraph()
    g.add_op("x", op_type="Placeholder")
    g.add_op("w", op_type="VarHandleOp", param_bytes=weight_bytes)
    g.add_op("read", op_type="ReadVariableOp", colocation="w")
    g.add_op("y", op_type="MatMul", flops=4e11, input_shapes=[(64, 1000)])
    g.add_op("grad", op_type="MatMul", flops=4e11, phase="backward")
    g.add_op("apply", op_type="ResourceApplyGradientDescent", phase="update", colocation="w",
             flops=weight_bytes / 4)
    g.add_edge("x", "y", bytes=256e3)
    g.add_edge("w", "read", bytes=weight_bytes)
    g.add_edge("read", "y", bytes=weight_bytes)
    g.add_edge("y", "grad", bytes=256e3)
    g.add_edge("x", "grad", bytes=256e3)
    g.add_edge("grad", "apply", bytes=weight_bytes)
    g.add_edge("w", "apply")
    g.add_op("slot", op_type="VarHandleOp", param_bytes=2 * weight_bytes)  # Adam's m, v
    g.add_edge("slot", "apply")
    return g


def gpus(memories):
    return cluster_from_dict({"name": "gpus", "devices": [
        {"name": f"/device:GPU:{i}", "kind": "V100", "memory": memory}
        for i, memory in enumerate(memories)],
        "links": {"same_host": {"bandwidth": "10GB/s", "latency": "10us"}}})


def most_sent_by_one_device(graph, where):
    sent = {}
    for src, dst, edge in graph.edges():
        if where[src] != where[dst]:
            sent[where[src]] = sent.get(where[src], 0.0) + edge["bytes"]
    return max(sent.values())


def test_the_all_reduce_sends_less_and_copies_the_variables_and_the_update():
    g = training_step()
    thirds = [1 / 3] * 3
    one, one_where = replicas_graph(g, thirds, [0, 1, 2], 0, {"read"})
    ring, ring_where = all_reduce_replicas_graph(g, thirds, [0, 1, 2], {"read"})
    # the batch arrives on the first replica's device, which sends the others their rows
    # (x feeds two ops): 2 replicas x 2 edges x a third of 256 kB
    rows = 2 * 2 * 256e3 / 3
    assert most_sent_by_one_device(one, one_where) == pytest.approx(2 * WEIGHT_BYTES + rows)
    assert most_sent_by_one_device(ring, ring_where) == pytest.approx(
        4 / 3 * WEIGHT_BYTES + rows)
    assert sorted(op for op in ring.ops if op.endswith("/slot")) == [
        "rep0/slot", "rep1/slot", "rep2/slot"]
    assert {ring_where[f"rep{r}/apply"] for r in range(3)} == {0, 1, 2}
    assert {one_where["apply"], one_where["rep1/read"], one_where["rep2/read"]} == {0}


def test_the_partitioner_all_reduces_heavy_weights_when_both_copies_fit():
    cost = CostModel(training_step(), gpus(["16GB", "16GB"]))
    steps = {reduce: partition(cost, DataParallelOptions(batch_size=64, replicas=2,
                                                         reduce=reduce)).step_time
             for reduce in ("one_device", "all_reduce")}
    assert steps["all_reduce"] < steps["one_device"]
    chosen = partition(cost, DataParallelOptions(batch_size=64, replicas=2))
    assert chosen.replicas.reduce == "all_reduce" and chosen.replicas.pinned == ()
    assert chosen.step_time == pytest.approx(steps["all_reduce"])


def test_a_copy_per_device_that_does_not_fit_leaves_one_copy():
    """The weight and its slots (1.2 GB) fit on the first device, not on the second."""
    cost = CostModel(training_step(), gpus(["16GB", "1GB"]))
    with pytest.raises(PlacementError):
        partition(cost, DataParallelOptions(batch_size=64, replicas=2, reduce="all_reduce"))
    chosen = partition(cost, DataParallelOptions(batch_size=64, replicas=2))
    assert chosen.replicas.reduce == "one_device"


def test_an_unknown_reduction_is_refused():
    with pytest.raises(PlacementError, match="reduce must be one of"):
        partition(CostModel(training_step(), gpus(["16GB", "16GB"])),
                  DataParallelOptions(batch_size=64, replicas=2, reduce="ring"))
