"""m-ETF (Baechi, SoCC 2020): earliest-task-first list scheduling with memory limits.

The schedule itself is :func:`partitioner.list_schedules.earliest_task_first`, which
the greedy also starts from.

Examples
--------
>>> g = OpGraph()
>>> for i in range(2): g.add_op(f"op{i}", op_type="MatMul", flops=1e10)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> len(partition(CostModel(g, cluster)).devices_used())
2
"""
from __future__ import annotations

from dataclasses import dataclass

from partitioner.finish import make_plan
from partitioner.list_schedules import earliest_task_first


@dataclass(frozen=True)
class METFOptions:
    pass


def partition(cost, options=METFOptions()):
    """m-ETF's placement as a checked Plan.

    Parameters
    ----------
    cost : costmodel.CostModel
    options : METFOptions

    Returns
    -------
    tfpart.core.plan.Plan
    """
    return make_plan(cost, earliest_task_first(cost), "m_etf", options)
