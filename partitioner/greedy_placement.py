"""The greedy's placement (a library: the greedy plug-in and the ILP's warm start use
it): memory-aware earliest-finish-time list scheduling with insertion (the HEFT
family), then a local search on the simulated step time.

The list schedule (:mod:`partitioner.earliest_finish`) takes ops in upward-rank order
and gives each colocation group the device where its first op would finish earliest,
among those with a kernel for the group and room for its variables and the tensors
alive there. It is made twice: with each transfer taking its own alpha-beta time, and
with transfers queued as the simulator queues them; the placement that simulates faster
is kept. Where the simulated live-range peak breaks a device's memory, it is made again
with less room there, then groups are moved off the device that overflows most.

The local search starts from the better of this placement and m-ETF's (Baechi's
earliest-start rule does better where transfers dominate). It moves the heaviest
groups, one at a time, to whichever other device lowers the simulated step time; once
no single move helps, it kicks the placement (two groups moved at random, seeded) and
descends again, keeping the fastest placement found (an iterated local search). It
spends at most ``refine_evaluations`` simulations, fewer on large graphs
(``search_budget``: a few simulations, and no kick, on the largest). The loops of the
list schedules, the simulator and m-ETF are compiled (numba), which is what makes this
affordable at 100,000 ops.

Last, the plan is judged by simulation against gathered variants of itself (the groups
of its least busy devices, then single groups, moved to the devices they exchange the
most bytes with) and the baselines: the fastest single device (when none holds the
model, one home device with the variables it has no room for spilled to others), m-ETF,
m-TOPO and the topological split. The fastest wins; among placements within 1% of it
and no slower than any baseline, the one moving the fewest bytes between devices, then
using the fewest devices (a transfer off the critical path is not free in TensorFlow:
each is a Send/Recv pair). So the greedy is never slower than a baseline by
simulation, on graphs of any size. Everything is deterministic.

References
----------
Topcuoglu, Hariri, Wu. "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002 (HEFT).
Hwang, Chow, Anger, Lee. "Scheduling precedence graphs in systems with interprocessor
communication times", SIAM J. Comput. 18(2), 1989 (ETF).

The local search is :mod:`partitioner.local_search`, the last judgement
:mod:`partitioner.gathering`.

Examples
--------
A chain of two matmuls runs on the faster device, and the placement comes with the
priority the simulator judged it with:

>>> g = OpGraph()
>>> g.add_op("a", op_type="MatMul", flops=1e12); g.add_op("b", op_type="MatMul", flops=1e12)
>>> g.add_edge("a", "b", bytes=1e6)
>>> device_of, priority = greedy_placement(CostModel(g, cluster_of_devices(["T4", "A100-40GB"])))
>>> device_of.tolist(), len(priority)
([1, 1], 2)
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.simulate import upward_rank
from partitioner.earliest_finish import list_schedule, move_free_groups_to_consumers
from partitioner.gathering import baseline_placements, no_worse_than_baselines
from partitioner.local_search import Judge, better_start, refine


@dataclass(frozen=True)
class GreedyOptions:
    """``memory_headroom``: fraction of each device's memory kept free;
    ``insertion``: fill idle slots; ``refine_evaluations``: the most simulations the
    local search (and again the gathering) may spend (0 turns both off);
    ``search_budget``: evaluations = ``search_budget`` / ops², at least 2: a
    simulation costs time in proportion to the ops, so the search's time falls as
    1 / ops (about 1 s at 500 ops, 0.1 s at 10,000) and large graphs stay fast.

    >>> [GreedyOptions().evaluations(n) for n in (20, 500, 2_000, 10_000, 100_000)]
    [20000, 4000, 250, 10, 2]
    """

    memory_headroom: float = 0.0
    insertion: bool = True
    refine_evaluations: int = 20000
    search_budget: float = 1e9

    def evaluations(self, n_ops):
        """Simulations the local search may spend on a graph of ``n_ops`` ops."""
        return int(min(self.refine_evaluations, max(2, self.search_budget / max(n_ops, 1) ** 2)))


def greedy_placement(cost, options=GreedyOptions()):
    """The device index of every op of ``cost.ops``, and the simulator priority the
    placement was judged with.

    The list schedule is made twice, with transfers queued per link and with each
    transfer alone (the simulator's queues are in time order, the list schedule's in
    placement order, so neither estimate is exact), and the one whose placement
    simulates faster is kept.

    Raises
    ------
    tfpart.core.errors.PlacementError
        If an op runs on no device, or memory runs out (naming the roomiest device).
    """
    # made once per cost model and options: the greedy and the filter splits' start
    # (both tried by --strategy auto) are the same placement
    device_of, priority = cost.derived(("greedy_placement", options),
                                       lambda: _greedy_placement(cost, options))
    return device_of.copy(), priority.copy()


def _greedy_placement(cost, options):
    graph, cluster = cost.graph, cost.cluster
    priority = upward_rank(cost)
    device_of = list_schedule(cost, options, priority, contended=False)
    queued = list_schedule(cost, options, priority, contended=True)
    judge = Judge(cost, priority)
    if judge(queued)[0] < judge(device_of)[0]:
        device_of = queued
    baselines = baseline_placements(cost)
    evaluations = options.evaluations(len(cost.ops))
    if evaluations:
        # a copy: the search changes it in place, and m-ETF's stays a baseline
        device_of = better_start(judge, device_of, baselines.get("m-ETF")).copy()
        refine(cost, device_of, judge, evaluations)
        # TensorFlow's placer puts a lone generator op (a constant read by one op) beside
        # its reader whatever the plan says, so the plan must too; other free groups
        # follow their readers again only if that is no slower.
        searched = device_of.copy()
        move_free_groups_to_consumers(graph, cost, cluster, device_of)
        move_free_groups_to_consumers(graph, cost, cluster, searched, generators_only=True)
        if judge(searched)[0] < judge(device_of)[0]:
            device_of[:] = searched
    gather = (len(cluster), evaluations)
    device_of = no_worse_than_baselines(cost, device_of, judge, list(baselines.values()),
                                        gather)
    return device_of, priority
