"""The summary lines ``tfpart compile`` prints say what is true: a pipeline's copies
between hosts are counted (no clause on one host, never "None between hosts"), and a
data-parallel plan of one replica says why it has only one."""
from types import SimpleNamespace

import pytest

from costmodel import CostModel
from partitioner.data_parallel import DataParallelOptions
from partitioner.data_parallel import partition as data_parallel
from partitioner.pipeline_stages import PipelineOptions, pipeline_plan
from tfpart import cli_output
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.graph import OpGraph


def _matmul_chain(layers=4, n=512, batch=8):
    """A batch through ``layers`` matmuls, each with its weights."""
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", outputs=[((batch, n), "float32")])
    previous = "x"
    for i in range(layers):
        graph.add_op(f"w{i}", op_type="Const", outputs=[((n, n), "float32")])
        graph.add_op(f"mm{i}", op_type="MatMul", flops=2.0 * batch * n * n,
                     bytes_accessed=4.0 * (2 * batch * n + n * n),
                     input_shapes=((batch, n), (n, n)), outputs=[((batch, n), "float32")])
        graph.add_edge(previous, f"mm{i}", bytes=4.0 * batch * n)
        graph.add_edge(f"w{i}", f"mm{i}", bytes=4.0 * n * n)
        previous = f"mm{i}"
    return graph


def _cluster(names, kinds=None):
    return cluster_from_dict({"name": "test", "devices": [
        {"name": name, "kind": kind, "memory": "4GB"}
        for name, kind in zip(names, kinds or ["cpu"] * len(names))]})


@pytest.fixture
def printed(capsys, monkeypatch):
    """What ``tfpart compile`` prints of a plan, its lines unwrapped."""
    monkeypatch.setattr(cli_output.console, "width", 10_000)

    def text(plan, graph, cluster):
        plan.context = {"model": "m", "signature": "serving_default", "batch_size": 8}
        cli_output.print_plan(SimpleNamespace(plan=plan, graph=graph, cluster=cluster,
                                              timings={}, out="out"), default_cluster=False)
        return capsys.readouterr().out
    return text


ONE_HOST = ["/device:CPU:0", "/device:CPU:1"]
TWO_HOSTS = ["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"]


@pytest.mark.parametrize("names", [ONE_HOST, TWO_HOSTS], ids=["one host", "two hosts"])
def test_a_pipeline_counts_its_copies_between_hosts(names, printed):
    graph, cluster = _matmul_chain(), _cluster(names)
    plan = pipeline_plan(CostModel(graph, cluster),
                         PipelineOptions(batch_size=8, microbatches=2))
    assert len(set(plan.stages.values())) == 2 and plan.predicted.transfers > 0
    # each copy runs between the two devices: between hosts when they are two
    hosts = len({device.host for device in cluster.devices})
    assert plan.predicted.cross_host_transfers == (plan.predicted.transfers if hosts > 1 else 0)
    line = next(line for line in printed(plan, graph, cluster).splitlines()
                if "tensor cop" in line)
    if hosts > 1:
        assert f"({plan.predicted.transfers} between hosts, " in line
    else:
        assert "between hosts" not in line
    assert "None" not in line


def _string_op_graph():
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", outputs=[((8, 16), "string")],
                 allowed_kinds=frozenset({"cpu"}))
    graph.add_op("lower", op_type="StringLower", flops=1e6, outputs=[((8, 16), "string")],
                 allowed_kinds=frozenset({"cpu"}))
    graph.add_edge("x", "lower", bytes=1024)
    return graph


def _cheap_op_on_big_tensors():
    """Little work on a big input: copying half of it costs more than half the work."""
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", outputs=[((8, 2 ** 20), "float32")])
    graph.add_op("y", op_type="Relu", flops=8.0 * 2 ** 20, bytes_accessed=64.0 * 2 ** 20,
                 outputs=[((8, 2 ** 20), "float32")])
    graph.add_edge("x", "y", bytes=32.0 * 2 ** 20)
    return graph


@pytest.mark.parametrize("graph, kinds, options, why", [
    (_matmul_chain(), None, DataParallelOptions(batch_size=1), "the batch has one sample"),
    (_matmul_chain(), None, DataParallelOptions(batch_size=8, replicas=1),
     "one was asked for (replicas=1)"),
    (_string_op_graph(), ["T4", "cpu"], DataParallelOptions(batch_size=8),
     "no other device can run every op (/job:localhost/replica:0/task:0/device:GPU:0 has "
     "no kernel for x, Placeholder)"),
    (_matmul_chain(n=2048), ["A100-40GB", "cpu"], DataParallelOptions(batch_size=8),
     "the next fastest device, /job:localhost/replica:0/task:0/device:CPU:0, is too slow to "
     "get a sample of the batch of 8"),
    (_cheap_op_on_big_tensors(), None, DataParallelOptions(batch_size=8),
     "2 replicas are predicted slower ("),
], ids=["batch of one", "asked", "kernels", "too slow", "copies"])
def test_one_replica_says_why(graph, kinds, options, why, printed):
    names = ["/device:GPU:0", "/device:CPU:0"] if kinds else ONE_HOST
    cluster = _cluster(names, kinds)
    plan = data_parallel(CostModel(graph, cluster), options)
    assert len(plan.replicas.devices) == 1
    assert plan.replicas.why_one_replica.startswith(why)
    line = next(line for line in printed(plan, graph, cluster).splitlines()
                if line.startswith("Data parallel"))
    assert line.startswith("Data parallel: 1 replica (") and line.endswith(
        f"; only one: {plan.replicas.why_one_replica}")


def test_replicas_that_help_give_no_reason():
    plan = data_parallel(CostModel(_matmul_chain(n=2048), _cluster(ONE_HOST)),
                         DataParallelOptions(batch_size=8))
    assert len(plan.replicas.devices) == 2 and plan.replicas.why_one_replica is None
