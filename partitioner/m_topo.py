"""m-TOPO (Baechi, SoCC 2020): topological order, filling one device up to its share of
the model's memory before moving to the next.

Reference: Jeon et al. "Baechi: fast device placement of machine learning graphs",
SoCC 2020 (``placer/m_topo.py`` in their code).

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
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
from partitioner.units import MemoryLedger, expand, no_device_error, placement_units


@dataclass(frozen=True)
class MTopoOptions:
    pass


def partition(cost, options=MTopoOptions()):
    graph, cluster = cost.graph, cost.cluster
    units = placement_units(graph, cost)
    ledger = MemoryLedger(cluster)
    n = len(cluster)
    share = sum(u.footprint for u in units) / n
    cursor, chosen = 0, []
    for unit in units:
        d = cursor
        while d < n and not (ledger.fits(unit, d) and (
                d == n - 1 or ledger.used[d] == 0 or
                ledger.used[d] + unit.footprint <= share * 1.0001)):
            d += 1
        if d == n:  # no device from the cursor on has room: the first that does
            fits = [k for k in range(n) if ledger.fits(unit, k)]
            if not fits:
                raise no_device_error(unit, cost)
            d = fits[0]
        else:
            cursor = d
        ledger.take(unit, d)
        chosen.append(d)
    return make_plan(cost, expand(units, chosen, len(cost.ops)), "m_topo",
                     options)
