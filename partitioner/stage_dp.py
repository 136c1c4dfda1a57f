"""Exact pipeline-stage partitioning by dynamic programming over ideals.

A pipeline runs stages on devices concurrently, one micro-batch after another, so its
steady-state time per micro-batch is the largest *load* of any device: the time of the
ops of its stage plus the cost of every tensor that crosses the stage's border. A stage
must be *convex* (no path leaves it and comes back), which makes the pipeline a chain.

Following Tarnawski et al. (NeurIPS 2020), the convex sets of a DAG are the differences
``I \\ J`` of two *ideals* (down-closed sets) ``J ⊂ I``, and a chain of stages is a chain
of ideals ``∅ = I0 ⊂ I1 ⊂ … ⊂ Ik = all``. The DP extends theirs (identical
accelerators) to heterogeneous devices: its state is the ideal covered so far and how
many devices of each *kind* were used, so which stage lands on which kind of device is
part of the optimum.

Kernel inputs are plain arrays (:class:`StageProblem`), so it is tested with random
costs and no model, and used both on Tarnawski's published graphs and on OpGraphs.

Speed: an upper bound ``UB`` from the same DP restricted to the prefixes of one
topological order (a chain, ``n + 1`` ideals, PipeDream's setting) prunes every stage
whose compute, at each unit's fastest kind, already exceeds ``UB``; subset tests and
crossing costs run in compiled loops (numba). When a graph has more than
``ideal_limit`` ideals the chain solution is returned, marked not exact.

Examples
--------
A chain of four unit-time ops on two identical devices, each crossing tensor costing
0.5 on both sides: two stages of two ops, each loaded 2 + 0.5.

>>> import numpy as np
>>> problem = StageProblem(preds=[[], [0], [1], [2]],
...                        time=np.ones((1, 4)), size=np.zeros(4),
...                        groups=[(0, 1), (1, 2), (2, 3)], comm=np.full((1, 3), 0.5),
...                        capacity=np.array([1.0]), count=(2,))
>>> solution = solve(problem)
>>> solution.max_load, [units for _, units in solution.stages], solution.exact
(2.5, [(0, 1), (2, 3)], True)
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from tfpart.core.errors import PlacementError

IDEAL_LIMIT = 20_000


@dataclass
class StageProblem:
    """A stage-partitioning instance over ``n`` units and device kinds.

    Attributes
    ----------
    preds : list of list of int
        Units each unit depends on (must be a DAG).
    time : ndarray, shape (kinds, n)
        Time of each unit on a device of each kind (``inf``: cannot run there).
    size : ndarray, shape (n,)
        Memory each unit needs on its device.
    groups : list of tuple of int
        Units touched by one tensor: its producer's unit first, then its consumers'.
    comm : ndarray, shape (kinds, len(groups))
        What a stage on a device of each kind pays when it splits a group (holds some
        but not all of its units).
    capacity : ndarray, shape (kinds,)
        Memory of a device of each kind.
    count : tuple of int
        Devices of each kind.
    """

    preds: list
    time: np.ndarray
    size: np.ndarray
    groups: list
    comm: np.ndarray
    capacity: np.ndarray
    count: tuple

    @property
    def n(self):
        return len(self.preds)


@dataclass
class StageSolution:
    """Stages in pipeline order, each ``(kind, units)``, and their loads."""

    max_load: float
    stages: list
    loads: list
    exact: bool
    ideals: int


def load_of(problem, units, kind):
    """Load of a stage holding ``units`` on a device of ``kind`` (``inf`` if it does not
    fit or cannot run there)."""
    members = np.zeros(problem.n, dtype=bool)
    members[list(units)] = True
    if problem.size[members].sum() > problem.capacity[kind]:
        return float("inf")
    split = [0 < sum(members[u] for u in g) < len(g) for g in problem.groups]
    return float(problem.time[kind, members].sum() + problem.comm[kind, split].sum())


def solve(problem, *, ideal_limit=IDEAL_LIMIT):
    """Stages and devices minimising the largest load (see the module docstring)."""
    order = _topological_order(problem.preds)
    chain_ideals = [0]
    for u in order:
        chain_ideals.append(chain_ideals[-1] | (1 << u))
    try:
        best = _run(problem, chain_ideals, upper_bound=np.inf)
    except PlacementError:
        best = None  # no chain split fits; a non-chain one still may
    ideals = _enumerate_ideals(problem.preds, order, ideal_limit)
    if ideals is None:
        if best is None:
            raise PlacementError("", "no split into pipeline stages fits the devices' "
                                 "memory (among the splits of one topological order)")
        best.exact = False
        best.ideals = len(chain_ideals)
        return best
    exact = _run(problem, ideals, upper_bound=np.inf if best is None else best.max_load)
    if exact is not None and (best is None or exact.max_load <= best.max_load):
        best = exact
    best.exact, best.ideals = True, len(ideals)
    return best


def _topological_order(preds):
    indegree = [len(set(p)) for p in preds]
    succs = [[] for _ in preds]
    for v, ps in enumerate(preds):
        for u in set(ps):
            succs[u].append(v)
    ready = [u for u, d in enumerate(indegree) if d == 0]
    order = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in succs[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    if len(order) != len(preds):
        raise PlacementError("", "the unit graph has a cycle")
    return order


def _enumerate_ideals(preds, order, limit):
    """All down-closed sets as bit masks, or None when there are more than ``limit``.

    Each entry on the stack carries the units that could be added to its ideal, so a
    new ideal only checks the successors of the unit just added.
    """
    pred_mask = [sum(1 << p for p in set(ps)) for ps in preds]
    succs = [[] for _ in preds]
    for v, ps in enumerate(preds):
        for u in set(ps):
            succs[u].append(v)
    seen = {0}
    stack = [(0, frozenset(u for u in order if not pred_mask[u]))]
    while stack:
        mask, addable = stack.pop()
        for u in addable:
            grown = mask | (1 << u)
            if grown in seen:
                continue
            seen.add(grown)
            if len(seen) > limit:
                return None
            opened = {v for v in succs[u] if pred_mask[v] & grown == pred_mask[v]}
            stack.append((grown, (addable - {u}) | opened))
    return sorted(seen, key=lambda m: (m.bit_count(), m))


def _membership(ideals, n):
    words = (n + 63) // 64
    packed = np.array([[(mask >> (64 * w)) & 0xFFFFFFFFFFFFFFFF for w in range(words)]
                       for mask in ideals], dtype=np.uint64)
    members = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")[:, :n]
    return members.astype(bool), packed


def _run(problem, ideals, upper_bound):
    """The DP over ``ideals`` (sorted so that every ideal comes after its subsets)."""
    members, packed = _membership(ideals, problem.n)
    weights = members.astype(float)
    runnable = np.isfinite(problem.time)
    prefix_time = np.where(runnable, problem.time, 0.0) @ weights.T
    blocked = np.rint((~runnable).astype(float) @ weights.T).astype(np.int64)
    prefix_size = weights @ problem.size
    # The sum of each unit's fastest time is a lower bound on any stage's compute on any
    # kind, so it both orders ideals (subsets first) and bounds the search window.
    # Summed in integer ticks, so a superset never sorts before a subset through
    # rounding (zero-time units leave the two sums equal).
    unit_fastest = np.where(runnable, problem.time, np.inf).min(axis=0)
    unit_fastest = np.where(np.isfinite(unit_fastest), unit_fastest, 0.0)
    scale = max(float(unit_fastest.sum()), 1e-300) / 2.0 ** 50
    ticks = members.astype(np.int64) @ np.rint(unit_fastest / scale).astype(np.int64)
    order = np.lexsort((members.sum(axis=1), ticks))
    fastest = ticks[order] * scale
    ideals = [ideals[i] for i in order]
    members, packed = members[order], packed[order]
    prefix_time, prefix_size = prefix_time[:, order], prefix_size[order]
    blocked = np.ascontiguousarray(blocked[:, order])
    incidence = np.zeros((problem.n, len(problem.groups)), dtype=np.int32)
    for g, units in enumerate(problem.groups):
        incidence[list(set(units)), g] = 1
    touched = np.rint(members.astype(np.float32) @ incidence.astype(np.float32))
    radix = np.array(problem.count, dtype=np.int64) + 1
    tables = (packed, fastest, prefix_time, blocked, prefix_size, touched.astype(np.int32),
              incidence.sum(axis=0).astype(np.int32),
              np.ascontiguousarray(problem.comm, dtype=float),
              np.asarray(problem.capacity, dtype=float), radix, float(upper_bound))
    dp = _dp(*tables)
    full = len(ideals) - 1
    top = int(np.prod(radix)) - 1
    if not np.isfinite(dp[top, full]):
        if np.isfinite(upper_bound):
            return None
        raise PlacementError("", "no split into pipeline stages fits the devices' memory "
                             "(each stage holds its variables and its activations)")
    steps = _backtrack(dp, top, full, *tables)
    stages, loads = [], []
    for inner, outer, kind, load in steps[::-1]:
        units = ideals[outer] & ~ideals[inner]
        stages.append((int(kind), tuple(u for u in range(problem.n) if units >> u & 1)))
        loads.append(float(load))
    return StageSolution(max_load=float(dp[top, full]), stages=stages, loads=loads,
                         exact=True, ideals=len(ideals))


@numba.njit(cache=True)
def _window_start(fastest, outer, upper_bound):
    """First ideal (in order) whose stage up to ``outer`` could fit in the bound."""
    lo, hi = 0, outer
    while lo < hi:
        mid = (lo + hi) // 2
        if fastest[mid] < fastest[outer] - upper_bound - 1e-9:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True)
def _is_subset(packed, inner, outer):
    for w in range(packed.shape[1]):
        if packed[inner, w] & ~packed[outer, w]:
            return False
    return True


@numba.njit(cache=True)
def _stage_cost(outer, inner, kind, prefix_time, blocked, prefix_size, touched, group_size,
                comm, capacity, bound=np.inf):
    """Load of the stage ``I \\ J`` on ``kind``, or any value above ``bound`` when its
    compute alone exceeds it."""
    if blocked[kind, outer] != blocked[kind, inner]:
        return np.inf  # a unit the kind cannot run
    if prefix_size[outer] - prefix_size[inner] > capacity[kind] * (1 + 1e-12):
        return np.inf
    cost = prefix_time[kind, outer] - prefix_time[kind, inner]
    if cost > bound:
        return cost
    for g in range(touched.shape[1]):
        t = touched[outer, g] - touched[inner, g]
        if 0 < t < group_size[g]:
            cost += comm[kind, g]
    return cost


@numba.njit(cache=True)
def _dp(packed, fastest, prefix_time, blocked, prefix_size, touched, group_size, comm,
        capacity, radix, upper_bound):
    """dp[state, I]: least max load covering ideal I with the devices counted by state
    (mixed radix over kinds), using only stages whose compute fits in ``upper_bound``."""
    n_states = 1
    for r in radix:
        n_states *= r
    kinds = len(radix)
    n_ideals = packed.shape[0]
    dp = np.full((n_states, n_ideals), np.inf)
    stride = np.ones(kinds, dtype=np.int64)
    for k in range(1, kinds):
        stride[k] = stride[k - 1] * radix[k - 1]
    digits = np.zeros((n_states, kinds), dtype=np.int64)
    for s in range(n_states):
        for k in range(kinds):
            digits[s, k] = (s // stride[k]) % radix[k]
        dp[s, 0] = 0.0
    for outer in range(1, n_ideals):
        for s in range(1, n_states):  # a device may stay unused
            for k in range(kinds):
                if digits[s, k] > 0:
                    dp[s, outer] = min(dp[s, outer], dp[s - stride[k], outer])
        for inner in range(_window_start(fastest, outer, upper_bound), outer):
            if not _is_subset(packed, inner, outer):
                continue
            best_before = np.inf
            for s in range(n_states - 1):
                best_before = min(best_before, dp[s, inner])
            if best_before >= upper_bound * (1 + 1e-12) and upper_bound < np.inf:
                continue
            for k in range(kinds):
                # The compute alone bounds the load from below: skip the crossing costs
                # when even that cannot improve any state.
                compute = prefix_time[k, outer] - prefix_time[k, inner]
                useful = False
                for s in range(1, n_states):
                    if digits[s, k] > 0 and max(dp[s - stride[k], inner], compute) < dp[s, outer]:
                        useful = True
                        break
                if not useful:
                    continue
                cost = _stage_cost(outer, inner, k, prefix_time, blocked, prefix_size, touched,
                                   group_size, comm, capacity, upper_bound)
                for s in range(1, n_states):
                    if digits[s, k] > 0:
                        dp[s, outer] = min(dp[s, outer], max(dp[s - stride[k], inner], cost))
    return dp


@numba.njit(cache=True)
def _backtrack(dp, state, outer, packed, fastest, prefix_time, blocked, prefix_size, touched,
               group_size, comm, capacity, radix, upper_bound):
    """(inner, outer, kind, load) of each stage, last stage first."""
    kinds = len(radix)
    stride = np.ones(kinds, dtype=np.int64)
    for k in range(1, kinds):
        stride[k] = stride[k - 1] * radix[k - 1]
    target = dp[state, outer]
    steps = []
    while outer != 0:
        moved = False
        for k in range(kinds):
            if (state // stride[k]) % radix[k] > 0 and dp[state - stride[k], outer] <= target:
                state -= stride[k]
                moved = True
                break
        if moved:
            continue
        for inner in range(outer - 1, -1, -1):
            if not _is_subset(packed, inner, outer):
                continue
            for k in range(kinds):
                if (state // stride[k]) % radix[k] == 0:
                    continue
                cost = _stage_cost(outer, inner, k, prefix_time, blocked, prefix_size,
                                   touched, group_size, comm, capacity)
                if max(dp[state - stride[k], inner], cost) <= target:
                    steps.append((inner, outer, k, cost))
                    state -= stride[k]
                    outer = inner
                    moved = True
                    break
            if moved:
                break
        if not moved:
            raise AssertionError("stage DP backtrack lost its way")
    return steps
