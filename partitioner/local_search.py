"""The greedy's local search (:mod:`partitioner.greedy_placement`) and the judge it
asks: simulated step times of placements, each found once.

It moves the heaviest groups, one at a time, to whichever other device lowers the
simulated step time; once no single move helps, it kicks the placement (two groups
moved at random, seeded) and descends again, keeping the fastest placement found (an
iterated local search, :func:`refine`). It starts from the better of the list
schedule's placement and m-ETF's (:func:`better_start`).

Examples
--------
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder")
>>> for n in ("left", "right"): g.add_op(n, op_type="MatMul", flops=1e11)
>>> for n in ("left", "right"): g.add_edge("x", n, bytes=1e3)
>>> from costmodel.simulate import upward_rank
>>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
>>> judge = Judge(cost, upward_rank(cost))
>>> device_of = np.zeros(3, dtype=np.int64)
>>> refine(cost, device_of, judge, evaluations=50)
>>> judge(device_of)[0] < judge(np.zeros(3, dtype=np.int64))[0]  # a branch moved
True
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from costmodel.arrays import graph_arrays
from costmodel.simulate import fits_memory, simulated_step
from partitioner.units import placement_units


class Judge:
    """Simulated (step time, bytes moved, devices used) of placements, and whether they
    fit in memory, each found once: the search meets the same placements again (a
    faster move that does not fit is met again on every sweep)."""

    def __init__(self, cost, priority):
        self.cost, self.priority, self.seen, self.fitting = cost, priority, {}, {}

    def __call__(self, placement):
        return self._once(self.seen, placement, lambda p: (
            *simulated_step(self.cost, p, self.priority),
            int(np.count_nonzero(np.bincount(p)))))

    def fits(self, placement):
        """:func:`~costmodel.simulate.fits_memory` of ``placement``."""
        return self._once(self.fitting, placement, lambda p: fits_memory(self.cost, p))

    @staticmethod
    def _once(found, placement, judge):
        placement = np.asarray(placement, dtype=np.int64)
        key = placement.tobytes()
        if key not in found:
            found[key] = judge(placement)
        return found[key]

def better_start(judge, device_of, alternative):
    """For the local search, the better of this schedule and m-ETF's (earliest start
    rather than earliest finish: better when transfers dominate), if it has one."""
    if alternative is None:
        return device_of
    return alternative if judge(alternative)[0] < judge(device_of)[0] else device_of


def refine(cost, device_of, judge, evaluations):
    """Iterated local search: :func:`_descend` from ``device_of``; then, while the
    budget lasts, kick a copy of the current placement (two groups moved to other
    devices at random, seeded) and descend from it, keeping the fastest placement
    found. The walk moves on to the kicked descent if it is at most ``WANDER`` slower
    than the current one, which lets it leave a basin. When the budget allows kicks,
    chains (:func:`_chains`) are moved whole too, before single groups: one op of a
    branch moved alone gains nothing, as it adds two transfers. Changes ``device_of``
    in place."""
    units = placement_units(cost)  # topological order
    sizes = [len(unit.members) for unit in units]
    mean_time = np.add.reduceat(cost.mean_time()[np.concatenate([u.members for u in units])],
                                np.cumsum([0] + sizes[:-1])) if units else np.zeros(0)
    heaviest = np.argsort(-mean_time, kind="stable")  # ties keep the topological order
    kept = heaviest[mean_time[heaviest] > 0]
    groups = [units[k].members for k in kept]
    a = graph_arrays(cost)
    runnable = a.group_runnable[a.group_of[[members[0] for members in groups]]]
    one_pass = int(runnable.sum()) - len(groups)  # evaluations of one sweep of the search
    if evaluations >= 2 * one_pass:  # room for kicks: chains move whole too
        chains, chain_runnable = _chains(cost, groups, runnable)
        groups, runnable = chains + groups, np.concatenate([chain_runnable, runnable])
        one_pass = int(runnable.sum()) - len(groups)
    choices = [np.flatnonzero(devices) for devices in runnable]
    evaluations = _descend(device_of, judge, groups, choices, evaluations)
    movable = np.flatnonzero(runnable.sum(axis=1) > 1)
    rng = np.random.default_rng(0)
    current = device_of.copy()
    best_step = current_step = judge(device_of)[0]
    while len(movable) and evaluations >= one_pass:
        trial = current.copy()
        for k in rng.choice(movable, size=min(KICK_GROUPS, len(movable)), replace=False):
            trial[groups[k]] = rng.choice(choices[k][choices[k] != trial[groups[k][0]]])
        evaluations -= 1
        if not judge.fits(trial):
            continue
        evaluations = _descend(trial, judge, groups, choices, evaluations)
        step = judge(trial)[0]
        if step < best_step * (1 - 1e-9):
            device_of[:], best_step = trial, step
        if step <= current_step * (1 + WANDER):
            current, current_step = trial, step


def _chains(cost, groups, runnable):
    """The chains of ``groups`` (ops joined along edges from an op with one successor
    to an op with one predecessor: a branch between a fork and a join), each as its
    members and the devices that can run all of them, heaviest first."""
    a = graph_arrays(cost)
    index_of = np.full(len(cost.ops), -1)
    for k, members in enumerate(groups):
        index_of[members] = k
    producer = np.repeat(np.arange(len(cost.ops)), np.diff(a.succ_ptr))
    link = (np.diff(a.succ_ptr)[producer] == 1) & (np.diff(a.pred_ptr)[a.succ_op] == 1)
    pairs = [(int(index_of[p]), int(index_of[c])) for p, c in
             zip(producer[link], a.succ_op[link]) if index_of[p] >= 0 and index_of[c] >= 0
             and index_of[p] != index_of[c]]
    chains = [sorted(component) for component in
              nx.connected_components(nx.Graph(pairs)) if len(component) > 1]
    chains.sort(key=lambda component: component[0])  # groups are heaviest first
    members = [np.concatenate([groups[k] for k in component]) for component in chains]
    allowed = np.array([runnable[component].all(axis=0) for component in chains],
                       dtype=bool).reshape(len(chains), runnable.shape[1])
    return members, allowed


KICK_GROUPS = 2  # groups moved at random before each further descent
WANDER = 0.02  # how much slower a kicked descent may be for the walk to move there


def _descend(device_of, judge, groups, choices, evaluations):
    """First-improvement local search: move a group (``groups``, heaviest first) to the
    device among its ``choices`` (device indices) that most lowers the simulated
    makespan, within memory; repeat while it helps and ``evaluations`` last. Changes
    ``device_of`` in place; returns the evaluations left."""
    best = judge(device_of)[0]
    improved = True
    while improved and evaluations > 0:
        improved = False
        for members, devices in zip(groups, choices):
            choice = None
            now = device_of[members]
            alone_on = int(now[0]) if (now == now[0]).all() else -1  # all on one device
            for d in devices:
                if evaluations <= 0 or d == alone_on:
                    continue
                trial = device_of.copy()
                trial[members] = d
                evaluations -= 1
                makespan = judge(trial)[0]
                if makespan < best * (1 - 1e-9) and (choice is None or makespan < choice[1]):
                    if judge.fits(trial):
                        choice = (d, makespan)
            if choice is not None:
                device_of[members] = choice[0]
                best = choice[1]
                improved = True
            if evaluations <= 0:
                break
    return evaluations
