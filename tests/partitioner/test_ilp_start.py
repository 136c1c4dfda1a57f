"""The ILP starts from the greedy's placement and never returns a slower plan."""
from hypothesis import given, settings

from costmodel import CostModel
from partitioner import greedy, ilp
from partitioner.ilp import ILPOptions
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.errors import PlacementError


@settings(max_examples=10, deadline=None)
@given(random_dags(min_ops=3, max_ops=14, control=True),
       random_clusters(min_devices=2, max_devices=3, slow_links=True))
def test_the_ilp_started_from_the_greedy_is_at_least_as_good_by_simulation(graph, cluster):
    cost = CostModel(graph, cluster)
    try:
        mine = greedy.partition(cost)
    except PlacementError:
        return
    plan = ilp.partition(cost, ILPOptions(time_limit=5))
    assert plan.predicted.solver["started_from"] == "greedy"
    assert plan.predicted.solver["kept"] in ("ilp", "greedy")
    assert plan.step_time <= mine.step_time * (1 + 1e-9)


def test_a_started_solve_reports_a_solution_even_with_almost_no_time():
    """With the greedy's schedule as its incumbent, HiGHS has a solution at once."""
    from tfpart.core.cluster import cluster_of_devices
    from tfpart.core.graph import OpGraph

    g = OpGraph()
    for i in range(12):
        g.add_op(f"op{i}", op_type="MatMul", flops=1e10 * (1 + i % 3))
        if i:
            g.add_edge(f"op{i // 2}", f"op{i}", bytes=1e6)
    cost = CostModel(g, cluster_of_devices(["T4", "T4", "V100"]))
    plan = ilp.partition(cost, ILPOptions(time_limit=0.01))
    assert plan.step_time <= greedy.partition(cost).step_time * (1 + 1e-9)
