"""Stages of training steps: on random layered training graphs every stage split keeps
each backward op with its forward op, sends gradients only back towards the first
stage, keeps each variable with its slots and update, and fits every device's memory;
1F1B holds fewer activations than fill-drain."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel
from costmodel.pipeline import SCHEDULES, microbatch_graph, simulate_pipeline
from partitioner.pipeline import PipelineOptions, partition
from partitioner.training_stages import forward_partners
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.dtypes import chunk_bytes, tensor_bytes
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph


@st.composite
def training_steps(draw):
    """A random MLP-like training step: L layers (some reading an earlier layer too),
    a loss, each layer's gradients named after its forward ops, shape ops of the
    gradient seed, and an optimizer with one slot per weight."""
    layers = draw(st.integers(2, 8))
    batch = draw(st.sampled_from([8, 32]))
    g = OpGraph()

    def op(name, phase, op_type="MatMul", width=64, **attrs):
        g.add_op(name, op_type=op_type, phase=phase, flops=draw(st.floats(1e6, 1e9)),
                 bytes_accessed=draw(st.floats(1e4, 1e7)),
                 outputs=[((batch, width), "float32")], **attrs)

    g.add_op("x", op_type="Placeholder", phase="forward", outputs=[((batch, 64), "float32")])
    inputs = {0: "x"}
    for i in range(1, layers + 1):
        size = draw(st.sampled_from([4_000, 400_000]))
        g.add_op(f"variables/{i}/kernel", op_type="VarHandleOp", phase="forward",
                 param_bytes=size, colocation=f"variables/{i}/kernel")
        g.add_op(f"variables/{i}/kernel_momentum", op_type="VarHandleOp", phase="update",
                 param_bytes=size, colocation=f"variables/{i}/kernel")
        op(f"model/dense_{i}/ReadVariableOp", "forward", "ReadVariableOp",
           colocation=f"variables/{i}/kernel")
        op(f"model/dense_{i}/MatMul", "forward")
        op(f"model/dense_{i}/Relu", "forward", "Relu")
        g.add_edge(f"variables/{i}/kernel", f"model/dense_{i}/ReadVariableOp")
        g.add_edge(f"model/dense_{i}/ReadVariableOp", f"model/dense_{i}/MatMul", bytes=size)
        g.add_edge(inputs[i - 1], f"model/dense_{i}/MatMul", bytes=batch * 256)
        g.add_edge(f"model/dense_{i}/MatMul", f"model/dense_{i}/Relu", bytes=batch * 256)
        inputs[i] = f"model/dense_{i}/Relu"
        if i > 1 and draw(st.booleans()):  # a skip connection from an earlier layer
            g.add_edge(inputs[draw(st.integers(0, i - 2))], f"model/dense_{i}/MatMul",
                       bytes=batch * 256)
    op("loss/Mean", "forward", "Mean", width=1)
    g.add_edge(inputs[layers], "loss/Mean", bytes=batch * 256)
    op("gradient_tape/Shape", "backward", "Shape", width=1)
    g.add_edge("loss/Mean", "gradient_tape/Shape")
    upstream = "gradient_tape/Shape"
    for i in range(layers, 0, -1):
        scope = f"gradient_tape/model/dense_{i}"
        op(f"{scope}/Relu/ReluGrad", "backward", "ReluGrad")
        op(f"{scope}/MatMul/MatMul", "backward")
        op(f"{scope}/MatMul/MatMul_1", "backward")
        op(f"adam/update_{i}", "update", "AssignSubVariableOp",
           colocation=f"variables/{i}/kernel")
        for a, b in [(upstream, f"{scope}/Relu/ReluGrad"),
                     (f"model/dense_{i}/Relu", f"{scope}/Relu/ReluGrad"),
                     (f"{scope}/Relu/ReluGrad", f"{scope}/MatMul/MatMul"),
                     (f"model/dense_{i}/ReadVariableOp", f"{scope}/MatMul/MatMul"),
                     (f"{scope}/Relu/ReluGrad", f"{scope}/MatMul/MatMul_1"),
                     (inputs[i - 1], f"{scope}/MatMul/MatMul_1"),
                     (f"{scope}/MatMul/MatMul_1", f"adam/update_{i}"),
                     (f"variables/{i}/kernel_momentum", f"adam/update_{i}"),
                     (f"variables/{i}/kernel", f"adam/update_{i}")]:
            g.add_edge(a, b, bytes=batch * 256)
        upstream = f"{scope}/MatMul/MatMul"
    return g


@st.composite
def clusters(draw):
    devices = [{"name": f"/job:worker/task:0/device:GPU:{i}",
                "kind": draw(st.sampled_from(["T4", "A100-40GB", "L4"])),
                "memory": draw(st.sampled_from([None, 4e6, 1.5e6]))}
               for i in range(draw(st.integers(2, 4)))]
    for device in devices:
        if device["memory"] is None:
            del device["memory"]
    return cluster_from_dict({"devices": devices})


@settings(max_examples=30, deadline=None)
@given(training_steps(), clusters(), st.sampled_from([1, 2, 4, None]))
def test_training_stages_keep_backward_ops_with_their_forward_ops(graph, cluster, m):
    try:
        plan = partition(CostModel(graph, cluster),
                         PipelineOptions(batch_size=8, microbatches=m, target_units=16))
    except PlacementError as exc:
        assert "memory" in str(exc)
        return
    stage = plan.stages
    assert set(stage) == set(graph.ops)
    for op in graph.ops:
        if op.startswith("gradient_tape/model/"):  # named after a forward op
            forward = "/".join(op.split("/")[1:4])
            assert stage[op] == stage[forward], op
    for src, dst, _ in graph.edges():
        if graph.ops[src]["phase"] == graph.ops[dst]["phase"] == "backward":
            assert stage[src] >= stage[dst], (src, dst)  # gradients only go back
        if graph.ops[src]["phase"] == graph.ops[dst]["phase"] == "forward":
            assert stage[src] <= stage[dst], (src, dst)
    for op, attrs in graph.ops.items():  # a variable, its slot and its update together
        group = [o for o, a in graph.ops.items() if a["colocation"] == attrs["colocation"]]
        assert len({plan.assignment[o] for o in group}) == 1
    for device in cluster.devices:
        figures = plan.predicted.devices[device.name]
        assert figures.peak_memory_bytes <= device.memory
    assert plan.schedule in SCHEDULES


@settings(max_examples=20, deadline=None)
@given(training_steps(), st.integers(4, 16))
def test_1f1b_never_holds_more_than_fill_drain(graph, microbatches):
    """By the simulated live ranges: 1F1B frees each micro-batch's activations sooner;
    both keep every micro-batch's gradients until they are summed, which can make the
    peaks equal (tests/e2e/test_training.py shows 1F1B below on a real step). It may
    hold one buffer more: it starts a micro-batch's backward while the next one's
    forward still runs on the stage, so a backward op's output can be alive beside a
    forward output that fill-drain has freed by then (found by hypothesis: a stage
    holding only the last layer's 2 KB outputs, which it sends on, and the gradient
    seed's 128-byte shape, 256 bytes above fill-drain). The stages are one per device,
    as both schedules run them (left free, the partitioner may pick the interleaved
    schedule's two per device)."""
    cluster = cluster_from_dict({"devices": [
        {"name": f"/job:worker/task:0/device:GPU:{i}", "kind": "T4"} for i in range(3)]})
    plan = partition(CostModel(graph, cluster),
                     PipelineOptions(batch_size=16, microbatches=microbatches,
                                     schedule="1f1b"))
    assert plan.schedule == "1f1b" and len(set(plan.stages.values())) <= len(cluster)
    index = {name: d for d, name in enumerate(cluster.device_names)}
    device_of = {op: index[name] for op, name in plan.assignment.items()}
    cost = CostModel(graph, cluster)
    peaks = {schedule: simulate_pipeline(microbatch_graph(graph, microbatches), cluster,
                                         device_of, plan.stages, microbatches, cost, schedule,
                                         memory=True).peak_memory for schedule in ("gpipe", "1f1b")}
    names = cluster.device_names
    for device in peaks["gpipe"]:
        one_buffer = max((chunk_bytes(sum(tensor_bytes(*out) for out in attrs["outputs"]))
                          for op, attrs in graph.ops.items()
                          if attrs["phase"] == "backward" and names[device_of[op]] == device),
                         default=0)
        assert peaks["1f1b"][device] <= peaks["gpipe"][device] + one_buffer + 1e-6


def test_a_gradient_op_is_paired_by_its_name_else_by_the_deepest_op_it_reads():
    g = OpGraph()
    for name, phase in [("m/a/MatMul", "forward"), ("m/b/MatMul", "forward"),
                        ("gradient_tape/m/b/MatMul/MatMul_1", "backward"),
                        ("gradient_tape/Shape", "backward"), ("gradient_tape/Const", "backward")]:
        g.add_op(name, op_type="MatMul", phase=phase)
    g.add_edge("m/a/MatMul", "m/b/MatMul")
    g.add_edge("m/a/MatMul", "gradient_tape/Shape")
    g.add_edge("m/b/MatMul", "gradient_tape/Shape")
    g.add_edge("gradient_tape/Const", "gradient_tape/Shape")
    assert forward_partners(g) == {"gradient_tape/m/b/MatMul/MatMul_1": "m/b/MatMul",
                                   "gradient_tape/Shape": "m/b/MatMul",
                                   "gradient_tape/Const": "m/b/MatMul"}


def test_a_training_step_that_fits_no_schedule_is_refused_naming_memory():
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", phase="forward")
    graph.add_op("y", op_type="MatMul", phase="forward", flops=1e9,
                 outputs=[((1024, 1024), "float32")])
    graph.add_op("dy", op_type="MatMul", phase="backward", flops=1e9,
                 outputs=[((1024, 1024), "float32")])
    graph.add_edge("x", "y")
    graph.add_edge("y", "dy", bytes=4e6)
    cluster = cluster_from_dict({"devices": [
        {"name": f"/job:worker/task:0/device:GPU:{i}", "kind": "T4", "memory": 5e6}
        for i in range(2)]})
    with pytest.raises(PlacementError, match="memory"):
        partition(CostModel(graph, cluster), PipelineOptions(batch_size=8, microbatches=1))
