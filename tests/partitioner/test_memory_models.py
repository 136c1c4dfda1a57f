"""Models bigger than a device, on graphs built to the shape of the issue's cases: every
plan is held to the simulated live-range peak, so a model whose all-alive figure is far
above the cluster still gets a plan from the greedy, the ILP and the pipeline search;
and when nothing can fit, the error says how much memory would."""
import numpy as np
import pytest

from costmodel import CostModel, all_alive_memory, live_peak
from partitioner import greedy, ilp
from partitioner.pipeline import PipelineOptions
from partitioner.pipeline import partition as pipeline_partition
from partitioner.validate import check_plan
from tfpart.core.cluster import cluster_of_devices
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph

MB = 1_000_000


def layered(layers=12, weight_mb=2.0, activation_mb=1.5):
    """A chain of dense layers, each reading its own variable (read by a ReadVariableOp
    colocated with it), and a NoOp with a control input from every read (as a Keras
    export's ``StatefulPartitionedCall/NoOp``) before the output."""
    g = OpGraph()
    width = int(activation_mb * MB / 4)
    g.add_op("x", op_type="Placeholder", outputs=[((width,), "float32")])
    g.add_op("done", op_type="NoOp")
    previous = "x"
    for i in range(layers):
        g.add_op(f"w{i}", op_type="VarHandleOp", param_bytes=int(weight_mb * MB),
                 outputs=[((), "resource")])
        g.add_op(f"read{i}", op_type="ReadVariableOp", colocation=f"w{i}",
                 outputs=[((int(weight_mb * MB / 4),), "float32")])
        g.add_op(f"layer{i}", op_type="MatMul", flops=2e9, bytes_accessed=4 * MB,
                 outputs=[((width,), "float32")])
        g.add_edge(f"w{i}", f"read{i}")
        g.add_edge(f"read{i}", f"layer{i}", bytes=weight_mb * MB)
        g.add_edge(previous, f"layer{i}", bytes=activation_mb * MB)
        g.add_edge(f"read{i}", "done", control=True)
        previous = f"layer{i}"
    g.add_op("y", op_type="Identity", outputs=[((width,), "float32")])
    g.add_edge(previous, "y", bytes=activation_mb * MB)
    g.add_edge("done", "y", control=True)
    return g


def small_cluster(graph, fraction=0.6):
    """Three CPUs each holding ``fraction`` of the graph's single-device peak."""
    alone = CostModel(graph, cluster_of_devices(["cpu"]))
    peak = float(live_peak(alone, np.zeros(len(graph), dtype=np.int64))[0])
    return cluster_of_devices(["cpu"] * 3, memory=f"{int(fraction * peak)}B"), peak


def test_the_all_alive_figure_would_refuse_what_live_ranges_place():
    graph = layered()
    cluster, peak = small_cluster(graph)
    names = cluster.device_names
    capacity = cluster.devices[0].memory
    for name, plan in {"greedy": greedy.partition(CostModel(graph, cluster)),
                       "ilp": ilp.partition(CostModel(graph, cluster)),
                       "pipeline": pipeline_partition(CostModel(graph, cluster),
                                                      PipelineOptions(batch_size=4))}.items():
        check_plan(plan, graph, cluster)
        peaks = [plan.predicted.devices[n].peak_memory_bytes for n in names]
        assert max(peaks) <= capacity and sum(p > 0 for p in peaks) >= 2, (name, peaks)
        if not plan.stages:  # the same placement's all-alive figure breaks a device
            old = all_alive_memory(graph, plan.assignment, names)
            assert max(old.values()) > capacity, (name, old)
    assert 3 * capacity < 1.9 * peak  # the cluster holds well under two copies


def test_the_ilp_solves_with_every_variable_in_its_readers_unit():
    """The NoOp reading every variable is no colocation: the coarsened ILP keeps the
    variables apart and solves, rather than failing on one unit holding them all."""
    graph = layered(layers=60)
    cluster, _ = small_cluster(graph)
    plan = ilp.partition(CostModel(graph, cluster), ilp.ILPOptions(max_units=20,
                                                                  time_limit=30))
    assert plan.predicted.solver["status"].startswith("coarse"), plan.predicted.solver
    assert plan.predicted.solver["status"] != "no solution"
    check_plan(plan, graph, cluster)


def test_nothing_fits_names_the_memory_a_plan_needs():
    graph = layered()
    cluster = cluster_of_devices(["cpu"] * 3, memory="3MB")
    with pytest.raises(PlacementError, match=r"a plan needs devices of at least 8\.0 MB "
                                             r"each \(the model's variables spread evenly "
                                             r"over 3 devices\); the largest here has 3\.0 MB"):
        greedy.partition(CostModel(graph, cluster))


def test_activations_that_no_device_holds_are_refused_with_the_op():
    """An op's inputs and outputs are on its device at once: when they alone exceed
    every device, the message names the op (the small example CNNs at 0.6 x their
    peak are such models)."""
    graph = layered(layers=4, weight_mb=0.1, activation_mb=6.0)
    cluster = cluster_of_devices(["cpu"] * 3, memory="10MB")
    with pytest.raises(PlacementError, match=r"at least 12\.\d MB each \(layer\d \(MatMul\) "
                                             r"with its inputs, outputs"):
        greedy.partition(CostModel(graph, cluster))
