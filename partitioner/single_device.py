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
from partitioner.finish import make_plan
from tfpart.errors import PlacementError


@dataclass(frozen=True)
class SingleDeviceOptions:
    pass


def fastest_single_device(graph, cost, cluster):
    """``(device index, step time)`` of the fastest device that can run and hold the
    whole graph, or ``None``. Alone on one device a work-conserving executor never
    idles, so the step time is the sum of the op times (plus the step overhead)."""
    names = cluster.device_names
    totals = cost.compute.sum(axis=0) + cluster.step_overhead
    for d in np.argsort(totals, kind="stable"):
        if not np.isfinite(totals[d]):
            break
        device = cluster.devices[d]
        if device_memory(graph, dict.fromkeys(cost.ops, device.name), names)[device.name] \
                <= device.memory:
            return int(d), float(totals[d])
    return None


def partition(graph, cost, cluster, *, options=SingleDeviceOptions()):
    best = fastest_single_device(graph, cost, cluster)
    if best is None:
        raise PlacementError(cluster.source, "no single device can hold and run the model")
    return make_plan(graph, cost, cluster, np.full(len(cost.ops), best[0]), "single", options)
