"""Coarsening maps back exactly; the published benchmark graphs import and place."""
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel
from partitioner import HEURISTICS, greedy, ilp
from partitioner.coarsen import CoarsenOptions, coarsen
from partitioner.ilp import ILPOptions
from tests.random_graphs import random_clusters, random_dags
from tfpart.importers import load_moirai, load_tarnawski
from partitioner.validate import check_plan

SHARED = Path(__file__).resolve().parents[3] / "shared" / "benchmarks"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason="../shared/benchmarks is not checked out beside the repo")


@settings(max_examples=40, deadline=None)
@given(random_dags(min_ops=5, max_ops=30), random_clusters(), st.integers(1, 12),
       st.booleans())
def test_coarsening_is_a_dag_partition_that_keeps_groups_and_meets_its_target(
        graph, cluster, target, chains):
    cost = CostModel(graph, cluster)
    coarse = coarsen(graph, cost, CoarsenOptions(chains=chains, target_units=target))
    members = [op for ops in coarse.members.values() for op in ops]
    assert sorted(members) == sorted(graph.ops)  # every op in exactly one unit
    assert coarse.graph.is_acyclic()
    assert len(coarse.graph) <= max(target, 1)
    unit_of = {op: unit for unit, ops in coarse.members.items() for op in ops}
    for group in graph.colocation_groups().values():
        assert len({unit_of[op] for op in group}) == 1
    # a coarse placement maps back to every op, with the unit's device
    names = cluster.device_names
    assignment = coarse.expand({u: names[k % len(names)] for k, u in enumerate(coarse.members)})
    assert set(assignment) == set(graph.ops)
    # unit times are the sums of their ops' times
    coarse_cost = CostModel(coarse.graph, cluster)
    for unit, ops in coarse.members.items():
        expected = cost.compute[[cost.index[o] for o in ops]].sum(axis=0)
        assert coarse_cost.compute[coarse_cost.index[unit]] == pytest.approx(expected)
        issued = cost.dispatch_time()[[cost.index[o] for o in ops]].sum(axis=0)
        assert coarse_cost.dispatch_time()[coarse_cost.index[unit]] == pytest.approx(issued)


def test_a_coarse_chain_of_small_kernels_keeps_the_hosts_share_on_the_host():
    """A GPU's step over many small ops is the host's issuing, not kernels plus issuing:
    units of a chain carry their ops' dispatch, so the coarse simulation agrees with
    the op-by-op one (with the dispatch on the kernels' timeline it came out about
    1.3x longer: every unit's issuing and kernels in series)."""
    from costmodel.simulate import simulate
    from tfpart.core.cluster import cluster_of_devices
    from tfpart.core.graph import OpGraph

    graph = OpGraph()
    for i in range(60):
        graph.add_op(f"relu{i}", op_type="Relu", flops=4096, bytes_accessed=32768,
                     outputs=[((4096,), "float32")])
        if i:
            graph.add_edge(f"relu{i - 1}", f"relu{i}", bytes=16384)
    cluster = cluster_of_devices(["H100"])
    cost = CostModel(graph, cluster)
    coarse = coarsen(graph, cost, CoarsenOptions(target_units=6))
    fine_step = simulate(cost, [0] * len(graph), memory=False).makespan
    coarse_cost = CostModel(coarse.graph, cluster)
    coarse_step = simulate(coarse_cost, [0] * len(coarse.graph), memory=False).makespan
    assert len(coarse.graph) == 6
    assert coarse_step == pytest.approx(fine_step, rel=0.05)


@needs_shared
@pytest.mark.parametrize("name", ["GoogLeNet", "inceptionv4"])
def test_moirai_graphs_place_with_every_algorithm(name):
    graph, cluster = load_moirai(SHARED / "moirai" / f"{name}.json")
    cost = CostModel(graph, cluster)
    steps = {}
    for algorithm, module in HEURISTICS.items():
        plan = module.partition(cost)
        check_plan(plan, graph, cluster)
        steps[algorithm] = plan.step_time
    assert steps["greedy"] < steps["random"]
    # Both graphs leave room to spread (bound under 60% of one device): the greedy's
    # step is at most 0.9x the best of one device and m-ETF (issue 13's target)
    assert plan.lower_bound < 0.6 * steps["single"]
    assert steps["greedy"] <= 0.9 * min(steps["single"], steps["m_etf"])


@needs_shared
@pytest.mark.parametrize("path", sorted((SHARED / "tarnawski" / "LayerGraphs").glob(
    "*_inference.json")), ids=lambda p: p.stem)
def test_tarnawski_graphs_import_with_colocation_and_kernels(path):
    graph, cluster = load_tarnawski(path)
    cost = CostModel(graph, cluster)
    plan = greedy.partition(cost)
    check_plan(plan, graph, cluster)
    assert len(graph) > 10 and plan.step_time >= plan.lower_bound * (1 - 1e-9)


@needs_shared
def test_ilp_on_a_coarsened_published_graph_finishes_within_its_limit():
    graph, cluster = load_moirai(SHARED / "moirai" / "GoogLeNet.json")
    plan = ilp.partition(CostModel(graph, cluster),
                         options=ILPOptions(time_limit=20, max_units=25))
    record = plan.predicted.solver
    assert record["units"] <= 25 and record["solve_seconds"] < 40
    assert record["status"].startswith("coarse")
