"""Hypothesis strategies: random DAGs with op costs, and random heterogeneous clusters."""
from hypothesis import strategies as st

from tfpart.core.cluster import cluster_from_dict
from tfpart.core.graph import OpGraph

KINDS = ["cpu", "V100", "T4", "A100-40GB", "L4"]


@st.composite
def random_dags(draw, min_ops=2, max_ops=30, control=False, restricted=False):
    """Random DAGs; with ``control``, some edges are control edges; with
    ``restricted``, some ops have a kernel only on some device kinds."""
    n = draw(st.integers(min_ops, max_ops))
    graph = OpGraph()
    for i in range(n):
        allowed = None
        if restricted and draw(st.integers(0, 5)) == 0:
            allowed = frozenset(draw(st.sets(st.sampled_from(KINDS), min_size=2, max_size=4)))
        graph.add_op(f"op{i}", op_type=draw(st.sampled_from(["MatMul", "Relu", "Conv2D"])),
                     flops=draw(st.floats(1e6, 1e11)),
                     bytes_accessed=draw(st.floats(1e3, 1e8)),
                     # equal sizes now and then: element-wise ops reuse their input's buffer
                     outputs=[((draw(st.sampled_from([1024, 4096]) | st.integers(1, 10_000)),),
                               "float32")],
                     param_bytes=draw(st.sampled_from([0, 0, 1_000, 100_000])),
                     allowed_kinds=allowed)
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            is_control = control and draw(st.integers(0, 4)) == 0
            graph.add_edge(f"op{i}", f"op{j}", bytes=0.0 if is_control else
                           draw(st.floats(0, 1e7)), control=is_control)
    # a few colocation constraints between random ops
    for _ in range(draw(st.integers(0, 3))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        graph.ops[f"op{b}"]["colocation"] = graph.ops[f"op{a}"]["colocation"]
    return graph


@st.composite
def random_clusters(draw, min_devices=1, max_devices=4, slow_links=False, tight_memory=False):
    """Random clusters over one or two hosts; with ``slow_links`` the links are slow
    enough that transfers queue; with ``tight_memory`` some devices hold little."""
    n = draw(st.integers(min_devices, max_devices))
    hosts = draw(st.integers(1, 2))
    devices = [{"name": f"/job:worker/task:{i % hosts}/device:GPU:{i}",
                "kind": draw(st.sampled_from(KINDS))} for i in range(n)]
    if tight_memory:
        for device in devices:
            if draw(st.booleans()):
                device["memory"] = draw(st.sampled_from([2e5, 1e6, 5e6]))
    spec = {"devices": devices, "cluster": {"worker": [f"h{h}:1" for h in range(hosts)]}}
    if slow_links:
        bandwidth = draw(st.sampled_from(["100MB/s", "1GB/s"]))
        spec["links"] = {"same_host": {"bandwidth": bandwidth, "latency": "20us"},
                         "cross_host": {"bandwidth": bandwidth, "latency": "200us"}}
    return cluster_from_dict(spec)
