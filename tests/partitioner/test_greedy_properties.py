"""Invariants of the greedy partitioner on random DAGs and heterogeneous clusters."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, simulate
from partitioner import greedy, single_device
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.cluster import cluster_from_dict, cluster_of_devices
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph
from tfpart.core.plan import Plan
from partitioner.validate import check_plan

PROPERTY = settings(max_examples=20, deadline=None)


@PROPERTY
@given(random_dags(), random_clusters())
def test_plan_is_valid_and_not_below_the_lower_bound(graph, cluster):
    cost = CostModel(graph, cluster)
    plan = greedy.partition(cost)
    check_plan(plan, graph, cluster)  # raises on any violation
    assert plan.step_time >= plan.lower_bound * (1 - 1e-9)


@PROPERTY
@given(random_dags(), random_clusters())
def test_deterministic(graph, cluster):
    cost = CostModel(graph, cluster)
    assert greedy.partition(cost).assignment == \
        greedy.partition(cost).assignment


@PROPERTY
@given(random_dags(), st.sampled_from(["cpu", "V100", "T4"]))
def test_one_device_makespan_is_the_one_device_step(graph, kind):
    cluster = cluster_of_devices([kind])
    cost = CostModel(graph, cluster)
    plan = greedy.partition(cost)
    alone = simulate(cost, np.zeros(len(graph), dtype=int)).makespan  # on a CPU, the sum
    assert plan.step_time == pytest.approx(alone)


@PROPERTY
@given(random_dags(min_ops=3), random_clusters(min_devices=2))
def test_never_slower_than_any_single_device_that_holds_the_model(graph, cluster):
    cost = CostModel(graph, cluster)
    plan = greedy.partition(cost)
    for d, device in enumerate(cluster.device_names):
        alone = Plan(assignment={op: device for op in cost.ops})
        try:
            check_plan(alone, graph, cluster)  # kernels and memory
        except PlacementError:
            continue
        assert plan.step_time <= simulate(cost, np.full(len(cost.ops), d)).makespan * (1 + 1e-9)


def test_independent_branches_run_in_parallel():
    graph = OpGraph()
    for i in range(4):
        graph.add_op(f"branch{i}", op_type="MatMul", flops=1e11)
    cluster = cluster_of_devices(["cpu"] * 4)
    plan = greedy.partition(CostModel(graph, cluster))
    assert len(plan.devices_used()) == 4
    assert plan.step_time == pytest.approx(plan.lower_bound)


def test_prefers_the_faster_device_for_heavy_work():
    graph = OpGraph()
    graph.add_op("conv", op_type="Conv2D", flops=1e12)
    cluster = cluster_of_devices(["T4", "A100-40GB"])
    plan = greedy.partition(CostModel(graph, cluster))
    assert plan.assignment["conv"].endswith("CPU:1")


def test_host_only_op_goes_to_a_cpu_and_fails_without_one():
    graph = OpGraph()
    graph.add_op("fmt", op_type="StringFormat", allowed_kinds=frozenset({"cpu"}))
    cluster = cluster_of_devices(["T4", "cpu"])
    plan = greedy.partition(CostModel(graph, cluster))
    assert plan.assignment["fmt"].endswith("CPU:1")
    gpus = cluster_of_devices(["T4", "T4"])
    with pytest.raises(PlacementError, match="no device can run"):
        greedy.partition(CostModel(graph, gpus))


def test_memory_forces_a_split_and_lookahead_keeps_room_for_big_variables():
    graph = OpGraph()
    # MB. Filling device 0 in chain order (40, 30) would leave no device for 50 + 40;
    # only {40, 40} and {30, 50} fit two 80 MB devices.
    sizes = [40, 30, 50, 40]
    for i, size in enumerate(sizes):
        graph.add_op(f"layer{i}", op_type="MatMul", flops=1e9, param_bytes=size * 10**6)
        if i:
            graph.add_edge(f"layer{i - 1}", f"layer{i}", bytes=1e3)
    cluster = cluster_of_devices(["cpu", "cpu"], memory="80MB")
    plan = greedy.partition(CostModel(graph, cluster))
    used = plan.predicted.devices
    assert all(d.peak_memory_bytes <= d.memory_bytes for d in used.values())
    assert len(plan.devices_used()) == 2


def test_single_device_baseline_picks_the_fastest_that_fits():
    graph = OpGraph()
    graph.add_op("w", op_type="MatMul", flops=1e12, param_bytes=20 * 10**9)
    cluster = cluster_of_devices(["V100", "A100-80GB", "H100"])  # V100 is too small
    plan = single_device.partition(CostModel(graph, cluster))
    assert plan.devices_used() == [cluster.device_names[2]]


def baseline_placements(cost):
    """Every baseline's placement that is valid here: each single device, one home
    device with spills, m-ETF, m-TOPO and the topological split, as (name, device index
    per op)."""
    from partitioner.list_schedules import (earliest_task_first, home_device_with_spills,
                                            memory_topological, topological_split)
    from costmodel.simulate import live_peak
    from partitioner.validate import check_memory

    names = cost.cluster.device_names
    found = [(f"single {d}", np.full(len(cost.ops), d)) for d in range(len(names))]
    home = home_device_with_spills(cost)
    if home is not None:
        found.append(("home device with spills", home))
    for place in (earliest_task_first, memory_topological, topological_split):
        try:
            found.append((place.__name__, place(cost)))
        except PlacementError:
            continue
    valid = []
    for name, placement in found:
        plan = Plan(assignment={op: names[d] for op, d in zip(cost.ops, placement)})
        try:
            check_plan(plan, cost.graph, cost.cluster)
            check_memory(cost.cluster, dict(zip(names, live_peak(cost, placement))))
        except PlacementError:
            continue
        valid.append((name, placement))
    return valid


@PROPERTY
@given(random_dags(min_ops=3, control=True, restricted=True),
       random_clusters(min_devices=2, slow_links=True, tight_memory=True))
def test_never_slower_than_any_baseline_with_contended_links(graph, cluster):
    cost = CostModel(graph, cluster)
    try:
        plan = greedy.partition(cost)
    except PlacementError as exc:  # restrictions and tight memory can leave no plan
        assert "no device can run" in str(exc) or "a plan needs devices of at least" in str(exc)
        return
    check_plan(plan, graph, cluster)
    for name, placement in baseline_placements(cost):
        assert plan.step_time <= simulate(cost, placement).makespan * (1 + 1e-9), name


@PROPERTY
@given(random_dags(min_ops=3, control=True), random_clusters(min_devices=2, slow_links=True))
def test_plans_count_the_copies_between_devices_and_hosts(graph, cluster):
    cost = CostModel(graph, cluster)
    plan = greedy.partition(cost)
    copies = {(src, plan.assignment[dst]) for src, dst, edge in graph.edges()
              if not edge["control"] and plan.assignment[src] != plan.assignment[dst]}
    host = {device.name: device.host for device in cluster.devices}
    assert plan.predicted.transfers == len(copies)
    assert plan.predicted.cross_host_transfers == sum(
        host[plan.assignment[src]] != host[dst] for src, dst in copies)


@PROPERTY
@given(random_dags(min_ops=3, control=True), random_clusters(min_devices=2, slow_links=True))
def test_the_prediction_is_the_simulated_step_of_the_placement_it_emits(graph, cluster):
    """The greedy's list schedules cannot price link queues exactly (they book copies
    in placement order, the simulator in time order), so it chooses among its
    candidates by simulated steps: what it predicts is the simulator's step, with every
    copy queued on its link, for the very placement the plan holds."""
    cost = CostModel(graph, cluster)
    plan = greedy.partition(cost)
    placement = np.array([cluster.device_names.index(plan.assignment[op]) for op in cost.ops])
    schedule = simulate(cost, placement)
    assert plan.step_time == schedule.makespan
    assert plan.predicted.bytes_moved == schedule.bytes_moved

def test_work_that_gains_nothing_stays_with_its_neighbours():
    """A chain on one device with a light side branch: moving the branch to the other
    device gains nothing (its copies' Send and Recv cost the CPUs' executors more than
    it), so the plan keeps one device and no copy."""
    graph = OpGraph()
    for i in range(6):
        graph.add_op(f"layer{i}", op_type="MatMul", flops=1e12)
        if i:
            graph.add_edge(f"layer{i - 1}", f"layer{i}", bytes=1e6)
    graph.add_op("side", op_type="Relu", bytes_accessed=1e3)
    graph.add_edge("layer2", "side", bytes=1e6)
    graph.add_edge("side", "layer5", bytes=1e6)
    cluster = cluster_of_devices(["cpu", "cpu"])
    plan = greedy.partition(CostModel(graph, cluster))
    assert len(plan.devices_used()) == 1 and plan.predicted.transfers == 0


def test_out_of_memory_names_the_device_that_binds():
    graph = OpGraph()
    graph.add_op("huge", op_type="MatMul", flops=1e9, param_bytes=70 * 10**6)
    cluster = cluster_from_dict({"devices": [
        {"name": "/job:worker/task:0/device:GPU:0", "kind": "T4", "memory": "60MB"},
        {"name": "/job:worker/task:0/device:GPU:1", "kind": "T4", "memory": "50MB"}]})
    with pytest.raises(PlacementError, match="GPU:0, has 60.0 MB left"):
        greedy.partition(CostModel(graph, cluster))
