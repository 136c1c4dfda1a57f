"""Lower bounds on the step time of any placement.

Examples
--------
>>> import numpy as np
>>> g = OpGraph()
>>> for n in "abcd": g.add_op(n, op_type="Relu", bytes_accessed=2e10)
>>> g.add_edge("a", "b"); g.add_edge("a", "c"); g.add_edge("b", "d"); g.add_edge("c", "d")
>>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
>>> round(critical_path_bound(cost), 3), round(work_bound(cost), 3)
(3.0, 2.0)
"""
from __future__ import annotations

import numpy as np

from costmodel.arrays import graph_arrays
from costmodel.simulate import longest_path_to_exit


def critical_path_bound(cost):
    """Longest path with every op on its fastest device and free transfers (an
    accelerator's kernels only: its host issues them ahead)."""
    a = graph_arrays(cost)
    rank = longest_path_to_exit(a.topological, a.succ_ptr, a.succ_op, a.succ_edge,
                                cost.device_time().min(axis=1), np.zeros(len(a.edge_bytes)))
    return float(rank.max(initial=0.0))


def work_bound(cost):
    """All work spread perfectly: the sum of each op's time on its fastest device over
    the number of timelines of kernels (devices sharing a core group count once; an
    accelerator's kernels only)."""
    fastest = cost.device_time().min(axis=1)
    return float(fastest.sum() / len(set(cost.lane_of)))


def lp_load_bound(cost):
    """The LP relaxation of assignment: ops split fractionally over devices so that the
    busiest executor is as idle as can be. At least :func:`work_bound`; it sees that
    slow devices help less and that some ops run on some devices only.

    >>> g = OpGraph(); g.add_op("a", op_type="MatMul", flops=1e12)
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "H100"]))
    >>> lp_load_bound(cost) > work_bound(cost)
    True
    """
    import pulp

    n_ops, n_dev = cost.compute.shape
    executors = cost.lane_of
    times = cost.device_time()
    finite = times[np.isfinite(times)]
    unit = float(finite.sum()) / 1000 if finite.size and finite.sum() > 0 else 1.0
    prob = pulp.LpProblem("load", pulp.LpMinimize)
    load = prob.add_variable("load", lowBound=0)
    prob += load
    share = {(i, d): prob.add_variable(f"x_{i}_{d}", lowBound=0, upBound=1)
             for i in range(n_ops) for d in range(n_dev)
             if np.isfinite(times[i, d]) and times[i, d] > 0}
    busy = {i for i, _ in share}
    for i in busy:
        prob += pulp.lpSum(share[i, d] for d in range(n_dev) if (i, d) in share) == 1
    for e in sorted(set(executors)):
        prob += pulp.lpSum(times[i, d] / unit * var for (i, d), var in share.items()
                           if executors[d] == e) <= load
    solver = pulp.HiGHS(msg=False) if "HiGHS" in pulp.listSolvers(onlyAvailable=True) \
        else pulp.PULP_CBC_CMD(msg=False)
    if not busy or pulp.LpStatus[prob.solve(solver)] != "Optimal":
        return 0.0
    # Less the solver's tolerance, so that the bound stays a bound.
    return max(float(load.value()) - 1e-6, 0.0) * unit


LP_BOUND_MAX_OPS = 2000  # above this the LP's model building takes longer than it helps


def lower_bound(cost):
    """The tightest of the critical-path, work and (for graphs of up to
    ``LP_BOUND_MAX_OPS`` ops) LP bounds, plus the cluster's fixed per-step overhead."""
    bound = max(critical_path_bound(cost), work_bound(cost))
    if len(cost.ops) <= LP_BOUND_MAX_OPS:
        bound = max(bound, lp_load_bound(cost))
    return bound + cost.cluster.step_overhead
