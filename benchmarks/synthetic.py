"""Synthetic graphs and clusters for the partitioning benchmarks (seeded, numpy only)."""
from __future__ import annotations

from tfpart.core.cluster import cluster_from_dict
from tfpart.core.graph import OpGraph

KINDS = ["V100", "T4", "A100-40GB", "L4", "H100"]


def random_dag(n_ops, rng, max_fan_in=3, window=None):
    """A random layered-ish DAG: op j reads up to ``max_fan_in`` ops among the
    ``window`` before it (all before it when None), with random work and tensors."""
    graph = OpGraph()
    for j in range(n_ops):
        graph.add_op(f"op{j}", op_type=str(rng.choice(["MatMul", "Conv2D", "Relu", "Mean"])),
                     flops=float(rng.uniform(1e8, 5e11)),
                     bytes_accessed=float(rng.uniform(1e5, 2e8)),
                     outputs=[((int(rng.integers(1_000, 400_000)),), "float32")],
                     param_bytes=int(rng.choice([0, 0, 1e4, 1e6])))
        low = 0 if window is None else max(0, j - window)
        if j:
            for i in set(rng.integers(low, j, size=int(rng.integers(1, max_fan_in + 1)))):
                graph.add_edge(f"op{i}", f"op{j}", bytes=float(rng.uniform(1e4, 3e7)))
    return graph


def random_cluster(n_devices, rng, hosts=2):
    devices = [{"name": f"/job:worker/task:{k % hosts}/device:GPU:{k}",
                "kind": str(rng.choice(KINDS))} for k in range(n_devices)]
    return cluster_from_dict({"name": f"{n_devices} random GPUs", "devices": devices,
                              "cluster": {"worker": [f"h{h}:1" for h in range(hosts)]}})
