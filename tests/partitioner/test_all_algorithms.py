"""Properties every placement algorithm must have, on random DAGs and random
heterogeneous clusters, and the ILP's optimality against all heuristics."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, simulate
from partitioner import HEURISTICS, ilp
from partitioner.ilp import ILPOptions
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.cluster import cluster_of_devices
from tfpart.core.graph import OpGraph
from partitioner.validate import check_plan

PROPERTY = settings(max_examples=15, deadline=None)
# each example runs every heuristic twice: 45-50 s at 25 examples on two cores
TWICE_EACH = settings(max_examples=10, deadline=None)
EXACT = ILPOptions(time_limit=60, mip_gap=0.0)


@PROPERTY
@given(random_dags(), random_clusters())
def test_every_heuristic_gives_a_valid_plan_above_the_lower_bound(graph, cluster):
    cost = CostModel(graph, cluster)
    for name, algorithm in HEURISTICS.items():
        plan = algorithm.partition(cost)
        check_plan(plan, graph, cluster)
        assert plan.step_time >= plan.lower_bound * (1 - 1e-9), name


@settings(max_examples=8, deadline=None)
@given(random_dags(min_ops=3, max_ops=8), random_clusters(min_devices=2, max_devices=3))
def test_the_ilp_optimum_is_at_most_every_heuristic(graph, cluster):
    cost = CostModel(graph, cluster)
    plan = ilp.partition(cost, options=EXACT)
    check_plan(plan, graph, cluster)
    result = plan.predicted.solver
    assert result["status"] == "optimal"
    assert result["objective"] <= plan.step_time * (1 + 1e-6)
    assert plan.lower_bound <= result["objective"] * (1 + 1e-6)
    for name, algorithm in HEURISTICS.items():
        assert result["objective"] <= algorithm.partition(cost).step_time * \
            (1 + 1e-6), name


@PROPERTY
@given(random_dags(), st.sampled_from(["cpu", "T4", "A100-40GB"]))
def test_on_one_device_every_algorithm_gives_the_one_device_step(graph, kind):
    cluster = cluster_of_devices([kind])
    cost = CostModel(graph, cluster)
    alone = simulate(cost, np.zeros(len(graph), dtype=int)).makespan  # on a CPU, the sum
    for name, algorithm in dict(HEURISTICS, ilp=ilp).items():
        plan = algorithm.partition(cost)
        assert plan.step_time == pytest.approx(alone), name


def relabelled(graph, permutation):
    names = {op: f"renamed{permutation[k]}" for k, op in enumerate(graph.ops)}
    copy = graph.relabeled(names)
    for op in copy.ops:
        copy.ops[op]["colocation"] = names[copy.ops[op]["colocation"]]
    return copy


@TWICE_EACH
@given(random_dags(), random_clusters(), st.randoms())
def test_results_do_not_depend_on_op_names(graph, cluster, rng):
    permutation = list(range(len(graph)))
    rng.shuffle(permutation)
    other = relabelled(graph, permutation)
    cost, other_cost = CostModel(graph, cluster), CostModel(other, cluster)
    for name, algorithm in HEURISTICS.items():
        assert algorithm.partition(cost).step_time == pytest.approx(
            algorithm.partition(other_cost).step_time), name


@TWICE_EACH
@given(random_dags(), random_clusters())
def test_same_inputs_same_plan(graph, cluster):
    cost = CostModel(graph, cluster)
    for name, algorithm in HEURISTICS.items():
        assert algorithm.partition(cost).assignment == \
            algorithm.partition(cost).assignment, name


def test_ilp_infeasible_memory_names_the_binding_limit():
    from tfpart.core.errors import PlacementError

    graph = OpGraph()
    graph.add_op("big", op_type="MatMul", flops=1e9, param_bytes=5 * 10**6)
    cluster = cluster_of_devices(["cpu", "cpu"], memory="1MB")
    with pytest.raises(PlacementError, match="big needs 5.0 MB"):
        ilp.partition(CostModel(graph, cluster))


@st.composite
def graphs_with_host_ops(draw):
    """Random DAGs in which some ops (strings, hash tables) run on a host CPU only,
    some of them colocated with their first input (a table and its lookups)."""
    graph = draw(random_dags(min_ops=2, max_ops=10, restricted=True))
    for op in graph.ops:
        if draw(st.integers(0, 3)) == 0:
            graph.ops[op]["allowed_kinds"] = frozenset({"cpu"})
            inputs = list(graph.in_edges(op))
            if inputs and draw(st.booleans()):
                graph.ops[op]["colocation"] = graph.ops[inputs[0]]["colocation"]
    return graph


@settings(max_examples=8, deadline=None)
@given(graphs_with_host_ops(), random_clusters(min_devices=1, max_devices=5),
       st.integers(1, 8))
def test_every_strategy_copes_with_devices_that_cannot_run_some_ops(graph, cluster, batch):
    """Each strategy of ``--strategy auto`` gives a valid plan, every replica's ops on
    devices with their kernels, or a PlacementError; nothing else escapes."""
    import dataclasses

    from partitioner.registry import get
    from partitioner.validate import kernel_problem
    from tfpart.strategy_request import auto_strategies
    from tfpart.core.errors import PlacementError

    cost = CostModel(graph, cluster)
    kind = {d.name: d.kind.name for d in cluster.devices}
    for name in auto_strategies():
        algorithm = get(name)
        options = algorithm.options()
        if "batch_size" in {f.name for f in dataclasses.fields(options)}:
            options = dataclasses.replace(options, batch_size=batch)
        try:
            plan = algorithm.partition(cost, options=options)
        except PlacementError as exc:
            assert str(exc.problem).strip() and "\n" not in exc.problem
            continue
        assert kernel_problem(cost) is None, name
        check_plan(plan, graph, cluster)
        for placement in (plan.replicas.placements if plan.replicas else None) or ():
            for op, device in placement.items():
                allowed = graph.ops[op]["allowed_kinds"]
                assert allowed is None or kind[device] in allowed, (name, op, device)
