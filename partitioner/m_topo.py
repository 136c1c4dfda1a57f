"""m-TOPO (Baechi, SoCC 2020): topological order, filling one device up to its share of
the model's memory before moving to the next.

Reference: Jeon et al. "Baechi: fast device placement of machine learning graphs",
SoCC 2020 (``placer/m_topo.py`` in their code).

Examples
--------
>>> g = OpGraph()
>>> for i in range(4): g.add_op(f"op{i}", op_type="MatMul", param_bytes=100)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> plan = partition(CostModel(g, cluster))
>>> [plan.assignment[f"op{i}"][-1] for i in range(4)]
['0', '0', '1', '1']
"""
from __future__ import annotations

from dataclasses import dataclass

from partitioner.finish import make_plan
from partitioner.list_schedules import memory_topological


@dataclass(frozen=True)
class MTopoOptions:
    pass


def partition(cost, options=MTopoOptions()):
    """m-TOPO's placement (:func:`partitioner.list_schedules.memory_topological`) as a
    checked Plan."""
    return make_plan(cost, memory_topological(cost), "m_topo", options)
