"""Baseline: the whole graph on the single device where it runs fastest and fits.

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph(); g.add_op("a", op_type="MatMul", flops=1e12)
>>> cluster = cluster_of_devices(["cpu", "V100"])
>>> partition(g, CostModel(g, cluster), cluster).devices_used()
['/job:localhost/replica:0/task:0/device:CPU:1']
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.memory import device_memory
from costmodel.simulate import simulate
from partitioner.finish import make_plan
from tfpart.errors import PlacementError


@dataclass(frozen=True)
class SingleDeviceOptions:
    pass


def partition(graph, cost, cluster, *, options=SingleDeviceOptions()):
    best, best_time = None, np.inf
    for d, device in enumerate(cluster.devices):
        device_of = np.full(len(cost.ops), d)
        if not np.all(np.isfinite(cost.compute[:, d])):
            continue
        assignment = dict.fromkeys(cost.ops, device.name)
        if device_memory(graph, assignment, [device.name])[device.name] > device.memory:
            continue
        makespan = simulate(cost, device_of).makespan
        if makespan < best_time:
            best, best_time = device_of, makespan
    if best is None:
        raise PlacementError(cluster.source, "no single device can hold and run the model")
    return make_plan(graph, cost, cluster, best, "single", options)
