"""The flat arrays the compiled loops read describe the same graph as the OpGraph: the
same edges in the same order, the same topological order and tie order."""
import numpy as np
from hypothesis import given, settings

from costmodel import CostModel
from costmodel.arrays import graph_arrays
from partitioner.list_schedules import earliest_task_first
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.errors import PlacementError

PROPERTY = settings(max_examples=60, deadline=None)


@PROPERTY
@given(random_dags(control=True, restricted=True), random_clusters())
def test_edges_orders_and_ties_match_the_op_graph(graph, cluster):
    cost = CostModel(graph, cluster)
    a = graph_arrays(cost)
    for i, name in enumerate(cost.ops):
        consumers = a.succ_op[a.succ_ptr[i]:a.succ_ptr[i + 1]]
        assert [cost.ops[j] for j in consumers] == list(graph.out_edges(name))
        producers = a.pred_op[a.pred_ptr[i]:a.pred_ptr[i + 1]]
        assert [cost.ops[j] for j in producers] == list(graph.in_edges(name))
        for k, j in zip(a.pred_edge[a.pred_ptr[i]:a.pred_ptr[i + 1]], producers):
            edge = graph.in_edges(name)[cost.ops[j]]
            assert (a.edge_bytes[k], a.edge_control[k]) == (edge["bytes"], edge["control"])
    assert [cost.ops[i] for i in a.topological] == graph.topological_order()
    by_key = sorted(range(len(cost.ops)), key=lambda i: graph.structural_key(cost.ops[i]))
    assert np.argsort(a.tie).tolist() == by_key
    assert [a.group_names[g] for g in a.group_of] == \
        [graph.ops[name]["colocation"] for name in cost.ops]


@PROPERTY
@given(random_dags(control=True, restricted=True), random_clusters())
def test_m_etf_places_every_op_where_it_can_run_and_keeps_groups_together(graph, cluster):
    cost = CostModel(graph, cluster)
    try:
        device_of = earliest_task_first(cost)
    except PlacementError:  # no device has room
        return
    assert device_of.min() >= 0
    assert np.isfinite(cost.compute[np.arange(len(device_of)), device_of]).all()
    for members in graph.colocation_groups().values():
        assert len({device_of[cost.index[m]] for m in members}) == 1
