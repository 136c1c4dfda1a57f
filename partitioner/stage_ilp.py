"""ILP check of the stage DP: the same max-load objective as an integer program (pulp).

Pipeline positions ``p = 0 … P-1`` (one per device); ``x[u, p]`` puts unit ``u`` at
position ``p`` and ``y[p, k]`` gives position ``p`` a device of kind ``k``. Every
dependency goes to the same or a later position, so each position's units form a
convex stage; ``s[g, p]`` is 1 when stage ``p`` splits group ``g`` (holds some of its
units but not all). The objective is the largest stage load, as in
:mod:`partitioner.stage_dp`, whose exact answers this checks on small instances.

Examples
--------
>>> import numpy as np
>>> from partitioner.stage_dp import StageProblem
>>> problem = StageProblem(preds=[[], [0], [1], [2]], time=np.ones((1, 4)),
...                        size=np.zeros(4), groups=[(0, 1), (1, 2), (2, 3)],
...                        comm=np.full((1, 3), 0.5), capacity=np.array([1.0]), count=(2,))
>>> round(solve_ilp(problem), 6)
2.5
"""
from __future__ import annotations

import numpy as np
import pulp

from partitioner.stage_dp import load_of
from tfpart.core.errors import PlacementError


def solve_ilp(problem, time_limit=60.0):
    """The largest stage load of the optimal stages of ``problem`` (a StageProblem),
    recomputed from the stages the solver chose."""
    n, kinds = problem.n, len(problem.count)
    positions = range(sum(problem.count))
    finite = np.isfinite(problem.time)
    big_time = float(np.where(finite, problem.time, 0).sum() + problem.comm.sum()) + 1.0
    big_size = float(problem.size.sum()) + 1.0
    prob = pulp.LpProblem("stages", pulp.LpMinimize)
    load = prob.add_variable("max_load", lowBound=0)
    x = {(u, p): prob.add_variable(f"x_{u}_{p}", cat="Binary") for u in range(n)
         for p in positions}
    y = {(p, k): prob.add_variable(f"y_{p}_{k}", cat="Binary") for p in positions
         for k in range(kinds)}
    s = {(g, p): prob.add_variable(f"s_{g}_{p}", lowBound=0) for g in range(len(problem.groups))
         for p in positions}
    prob += load
    for u in range(n):
        prob += pulp.lpSum(x[u, p] for p in positions) == 1
        for v in problem.preds[u]:  # v before u: position(v) <= position(u)
            prob += pulp.lpSum(p * x[v, p] for p in positions) <= \
                pulp.lpSum(p * x[u, p] for p in positions)
    for k in range(kinds):
        prob += pulp.lpSum(y[p, k] for p in positions) <= problem.count[k]
    for p in positions:
        prob += pulp.lpSum(y[p, k] for k in range(kinds)) <= 1
        for u in range(n):
            prob += x[u, p] <= pulp.lpSum(y[p, k] for k in range(kinds))
            for k in range(kinds):
                if not finite[k, u]:
                    prob += x[u, p] + y[p, k] <= 1
        for g, units in enumerate(problem.groups):
            for a in set(units):
                for b in set(units):
                    if a != b:
                        prob += s[g, p] >= x[a, p] - x[b, p]
        for k in range(kinds):
            work = pulp.lpSum(float(problem.time[k, u]) * x[u, p] for u in range(n)
                              if finite[k, u])
            comm = pulp.lpSum(float(problem.comm[k, g]) * s[g, p]
                              for g in range(len(problem.groups)))
            prob += load >= work + comm - big_time * (1 - y[p, k])
            if np.isfinite(problem.capacity[k]):
                prob += pulp.lpSum(float(problem.size[u]) * x[u, p] for u in range(n)) <= \
                    float(problem.capacity[k]) + big_size * (1 - y[p, k])
    # A zero gap: this is the reference the exact DP is checked against (HiGHS stops
    # within 1e-4 of the optimum by default).
    status = prob.solve(pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=0.0)
                        if "HiGHS" in pulp.listSolvers(onlyAvailable=True)
                        else pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=0.0))
    if pulp.LpStatus[status] != "Optimal":
        raise PlacementError("stage ILP", f"no optimum found ({pulp.LpStatus[status]})")
    # The solver's own objective can sit up to its tolerances (scaled by the big-M
    # terms) below the loads its stages really have: report the stages' true loads.
    stages = [([u for u in range(n) if x[u, p].value() > 0.5],
               next(k for k in range(kinds) if y[p, k].value() > 0.5)) for p in positions
              if any(x[u, p].value() > 0.5 for u in range(n))]
    return max(load_of(problem, units, kind) for units, kind in stages)
