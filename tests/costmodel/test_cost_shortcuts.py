"""The shortcuts that build cost models faster give what the long way gives, bit for
bit: a split graph's times copied for the ops it leaves alone, the roofline computed
once for ops alike, and a graph built from tables equal to one built op by op."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel
from costmodel.pipeline import microbatch_graph
from costmodel.roofline import _kind_time
from costmodel.splits import split_cost, split_graph
from tests.partitioner.test_filter_split import matmul_chains
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.graph import OpGraph


def one_by_one(graph):
    """``graph`` rebuilt with add_op and add_edge."""
    rebuilt = OpGraph()
    for op, attrs in graph.ops.items():
        rebuilt.add_op(op, **attrs)
    for src, dst, edge in graph.edges():
        rebuilt.add_edge(src, dst, bytes=edge["bytes"], control=edge["control"],
                         comm=edge.get("comm"))
    return rebuilt


def layout(graph):
    """Every op with its attributes, every op's consumers and producers with their
    edges, all in order (key order too)."""
    nx_graph = graph.nx_graph
    return [[(u, list(nx_graph._node[u].items()),
              [(v, list(edge.items())) for v, edge in adjacency[u].items()])
             for u in nx_graph._node] for adjacency in (nx_graph._succ, nx_graph._pred)]


@settings(max_examples=15, deadline=None)
@given(matmul_chains(), random_clusters(min_devices=2), st.data())
def test_a_split_cost_is_the_cost_of_its_split_graph(graph, cluster, data):
    cost = CostModel(graph, cluster)
    splittable = [op for op in graph.ops if graph.ops[op].get("sliced")]
    ops = data.draw(st.lists(st.sampled_from(splittable), min_size=1, unique=True))
    splits = {op: ((0, 1), (1, graph.ops[op]["outputs"][0][0][-1] - 1)) for op in ops
              if graph.ops[op]["outputs"][0][0][-1] > 1}
    device_of = np.array([data.draw(st.integers(0, len(cluster) - 1)) for _ in cost.ops])
    split, _ = split_graph(graph, splits, dict(zip(cost.ops, map(int, device_of))))
    assert layout(split) == layout(one_by_one(split))
    quick, _ = split_cost(cost, splits, device_of)
    assert layout(quick.graph) == layout(split)
    assert quick.compute.tobytes() == CostModel(split, cluster).compute.tobytes()


@settings(max_examples=15, deadline=None)
@given(random_dags(restricted=True), random_clusters(), st.integers(1, 4))
def test_ops_alike_get_the_times_computed_op_by_op(graph, cluster, microbatches):
    micro = microbatch_graph(graph, microbatches)
    for op in list(graph.ops)[::2]:  # ops alike but for their names, or in one respect
        attrs = micro.ops[op]
        for change in ({}, {"flops": 2 * attrs["flops"]}, {"bytes_accessed": 0.0},
                       {"op_type": "Relu" if attrs["op_type"] != "Relu" else "MatMul"},
                       {"outputs": [((4,), "bfloat16")]}, {"allowed_kinds": frozenset()}):
            name = f"{op}/{sorted(change)}"
            micro.add_op(name, **dict(attrs, colocation=name, **change))
    cost = CostModel(micro, cluster)
    kinds = {}
    for d, device in enumerate(cluster.devices):
        kinds.setdefault(id(device.kind), (device.kind, d))
    for i, op in enumerate(cost.ops):
        for kind, d in kinds.values():
            dispatch = float(cost.host_dispatch[d]) if cost.accelerator[d] else None
            alone = _kind_time(micro.ops[op], kind, None, cost.tf32, dispatch)
            assert np.float64(alone).tobytes() == cost.compute[i, d].tobytes()
