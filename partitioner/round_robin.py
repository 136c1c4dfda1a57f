"""Baseline: colocation groups dealt to the devices in turn, in topological order
(skipping a device that cannot run or hold the group).

Examples
--------
>>> g = OpGraph()
>>> for i in range(4): g.add_op(f"op{i}", op_type="Relu", bytes_accessed=1e6)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> plan = partition(CostModel(g, cluster))
>>> [plan.assignment[f"op{i}"][-1] for i in range(4)]
['0', '1', '0', '1']
"""
from __future__ import annotations

from dataclasses import dataclass

from partitioner.finish import make_plan
from partitioner.units import MemoryLedger, expand, no_device_error, placement_units


@dataclass(frozen=True)
class RoundRobinOptions:
    pass


def partition(cost, options=RoundRobinOptions()):
    cluster = cost.cluster
    units = placement_units(cost)
    ledger = MemoryLedger(cost)
    n, turn, chosen = len(cluster), 0, []
    for unit in units:
        for step in range(n):
            d = (turn + step) % n
            if ledger.fits(unit, d):
                break
        else:
            raise no_device_error(unit, cost)
        ledger.take(unit, d)
        chosen.append(d)
        turn = d + 1
    return make_plan(cost, expand(units, chosen, len(cost.ops)),
                     "round_robin", options)
