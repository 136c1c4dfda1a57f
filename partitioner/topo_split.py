"""Baseline: cut the topological order into one contiguous piece per device.

Pieces are balanced by mean op time (each device gets about an equal share, in
cluster order); a colocation group goes with its first op. This is the split a person
makes by hand ("first half of the layers here, second half there"), and the shape of a
pipeline stage partition.

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph()
>>> for i in range(4): g.add_op(f"l{i}", op_type="Relu", bytes_accessed=1e9)
>>> for i in range(3): g.add_edge(f"l{i}", f"l{i + 1}", bytes=1e3)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> plan = partition(CostModel(g, cluster))
>>> [plan.assignment[f"l{i}"][-1] for i in range(4)]
['0', '0', '1', '1']
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioner.finish import make_plan


@dataclass(frozen=True)
class TopoSplitOptions:
    pass


def partition(cost, options=TopoSplitOptions()):
    graph, cluster = cost.graph, cost.cluster
    n_dev = len(cluster)
    mean_time = cost.mean_time()
    order = [cost.index[name] for name in graph.topological_order()]
    total = mean_time.sum()
    device_of = np.zeros(len(cost.ops), dtype=int)
    group_device, done = {}, 0.0
    for i in order:
        group = graph.ops[cost.ops[i]]["colocation"]
        if group not in group_device:
            share = min(int(done / total * n_dev), n_dev - 1) if total > 0 else 0
            group_device[group] = share
        device_of[i] = group_device[group]
        done += mean_time[i]
    return make_plan(cost, device_of, "topo_split", options)
