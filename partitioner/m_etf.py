"""m-ETF (Baechi, SoCC 2020): earliest-task-first list scheduling with memory limits.

At every step, among all ready ops and all devices with room, the pair with the earliest
start time is scheduled (ties: the op with the longer path to the end). A colocation
group follows its first op. Unlike the greedy (HEFT-like), ETF looks at start rather than
finish times and ignores how fast a device is.

References: Hwang et al., SIAM J. Comput. 18(2), 1989 (ETF); Jeon et al., SoCC 2020
(m-ETF, ``placer/m_etf.py`` in Baechi).

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> from costmodel import CostModel
>>> g = OpGraph()
>>> for i in range(2): g.add_op(f"op{i}", op_type="MatMul", flops=1e10)
>>> cluster = cluster_of_devices(["cpu", "cpu"])
>>> len(partition(g, CostModel(g, cluster), cluster).devices_used())
2
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.simulate import data_ready_time, upward_rank
from partitioner.finish import make_plan
from partitioner.units import MemoryLedger, no_device_error, placement_units


@dataclass(frozen=True)
class METFOptions:
    pass


def partition(graph, cost, cluster, *, options=METFOptions()):
    nxg = graph.nx_graph
    units = placement_units(graph, cost)
    unit_of = {i: k for k, u in enumerate(units) for i in u.members}
    ledger = MemoryLedger(cluster)
    level = upward_rank(cost)
    n_ops = len(cost.ops)
    device_of, end = np.full(n_ops, -1), np.zeros(n_ops)
    free = np.zeros(len(cluster))
    unit_device = {}
    waiting = {i: nxg.in_degree(cost.ops[i]) for i in range(n_ops)}
    ready = {i for i, count in waiting.items() if count == 0}
    while ready:
        best = None
        for i in ready:
            k = unit_of[i]
            devices = [unit_device[k]] if k in unit_device else \
                [d for d in range(len(cluster)) if ledger.fits(units[k], d)]
            for d in devices:
                start = max(free[d], data_ready_time(cost, i, d, end, device_of))
                key = (start, -level[i], graph.structural_key(cost.ops[i]), d)
                if best is None or key < best[0]:
                    best = (key, i, d)
        if best is None:
            raise no_device_error(units[unit_of[min(ready)]], cost)
        (start, _, _, d), i, _ = best
        k = unit_of[i]
        if k not in unit_device:
            unit_device[k] = d
            ledger.take(units[k], d)
        device_of[i], end[i] = d, start + cost.compute[i, d]
        free[d] = end[i]
        ready.remove(i)
        for succ in nxg.successors(cost.ops[i]):
            j = cost.index[succ]
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.add(j)
    return make_plan(graph, cost, cluster, device_of, "m_etf", options)
