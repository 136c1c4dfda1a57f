"""Baseline: the whole graph on the single device where it runs fastest and fits.

Examples
--------
>>> g = OpGraph(); g.add_op("a", op_type="MatMul", flops=1e12)
>>> cluster = cluster_of_devices(["cpu", "V100"])
>>> partition(CostModel(g, cluster)).devices_used()
['/job:localhost/replica:0/task:0/device:CPU:1']
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioner.finish import make_plan
from partitioner.list_schedules import fastest_single_device
from tfpart.core.errors import PlacementError


@dataclass(frozen=True)
class SingleDeviceOptions:
    pass


def partition(cost, options=SingleDeviceOptions()):
    """Every op on the fastest device that holds the model.

    Parameters
    ----------
    cost : costmodel.CostModel
    options : SingleDeviceOptions

    Returns
    -------
    tfpart.core.plan.Plan

    Raises
    ------
    tfpart.core.errors.PlacementError
        If no single device can hold and run the model.
    """
    best = fastest_single_device(cost)
    if best is None:
        raise PlacementError(cost.cluster.source,
                             "no single device can hold and run the model")
    return make_plan(cost, np.full(len(cost.ops), best[0]), "single", options)
