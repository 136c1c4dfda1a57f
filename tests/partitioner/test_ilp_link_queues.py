"""The ILP queues transfers on links as the simulator does, so its optimum is a lower
bound on every simulated step."""
import numpy as np
import pytest
from hypothesis import given, settings

from costmodel import CostModel
from costmodel.simulate import simulate
from partitioner import greedy, ilp
from partitioner.greedy_placement import greedy_placement
from partitioner.ilp import ILPOptions
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.cluster import cluster_of_devices
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph


def two_copies_on_one_link():
    """Two cheap producers only a CPU runs, each sending 1 GB to a consumer only a T4
    runs: the copies share the CPU -> T4 link, so the second waits for the first."""
    g = OpGraph()
    for producer, consumer in (("a", "c"), ("b", "d")):
        g.add_op(producer, op_type="Relu", bytes_accessed=1e3, allowed_kinds=frozenset({"cpu"}))
        g.add_op(consumer, op_type="Relu", bytes_accessed=1e3, allowed_kinds=frozenset({"T4"}))
        g.add_edge(producer, consumer, bytes=1e9)
    return CostModel(g, cluster_of_devices(["cpu", "T4"]))


@pytest.mark.parametrize("link_queues", [True, False])
def test_copies_that_share_a_link_queue_behind_each_other(link_queues):
    cost = two_copies_on_one_link()
    result = ilp.solve(cost.graph, cost, cost.cluster, ILPOptions(link_queues=link_queues))
    simulated = simulate(cost, np.array([0, 1, 0, 1])).makespan  # the only placement
    on_link = 1e9 * cost.inverse_bandwidth[0, 1]
    assert result.status == "optimal"
    if link_queues:
        assert result.objective == pytest.approx(simulated, rel=1e-3)
    else:  # both copies at once: one copy's time on the link less
        assert result.objective == pytest.approx(simulated - on_link, rel=0.05)


@settings(max_examples=12, deadline=None)
@given(random_dags(min_ops=3, max_ops=10, control=True),
       random_clusters(min_devices=2, max_devices=3, slow_links=True))
def test_the_optimum_bounds_the_simulated_step_of_any_placement(graph, cluster):
    """Every simulated schedule is feasible for the ILP (the simulator's Send/Recv
    executor time, which the ILP leaves out, only delays it), so a proven optimum is
    at most the simulated step of the greedy's plan and of the ILP's own placement."""
    cost = CostModel(graph, cluster)
    try:
        mine = greedy.partition(cost)
    except PlacementError:
        return
    plan = ilp.partition(cost, ILPOptions(time_limit=10))
    solver = plan.predicted.solver
    if solver["status"] != "optimal":
        return
    assert solver["objective"] <= mine.step_time * (1 + 1e-6) + 1e-12
    assert solver["objective"] <= solver["own_step_time"] * (1 + 1e-6) + 1e-12


@settings(max_examples=20, deadline=None)
@given(random_dags(min_ops=2, max_ops=14, control=True, restricted=True),
       random_clusters(min_devices=2, max_devices=4, slow_links=True))
def test_every_simulated_schedule_satisfies_the_model(graph, cluster):
    """The greedy's placement as the simulator runs it (link queues, Send/Recv time,
    copies of the largest tensor) breaks no constraint of the ILP: what makes the
    optimum a lower bound."""
    cost = CostModel(graph, cluster)
    try:
        placement, _ = greedy_placement(cost)
    except PlacementError:
        return
    prob, _, _, values = ilp.model(graph, cost, cluster, ILPOptions(), placement)
    for variable in prob.variables():
        variable.varValue = values[variable.name]
    broken = [str(c) for c in prob.constraints() if not c.valid(1e-6)]
    assert broken == []
