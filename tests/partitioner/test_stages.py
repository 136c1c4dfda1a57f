"""Stage partitioning: the DP is exact (equal to the ILP on heterogeneous instances),
its stages are convex and its loads are what it claims; it reaches the published
optima of Tarnawski et al.; pipelined plans are valid and simulated."""
import time
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from costmodel import CostModel
from costmodel.pipeline import microbatch_graph, simulate_pipeline
from partitioner.pipeline import PipelineOptions, partition
from partitioner.stage_dp import StageProblem, load_of, solve
from partitioner.stage_ilp import solve_ilp
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.errors import PlacementError
from tfpart.importers import load_tarnawski_stages
from partitioner.validate import check_plan

SHARED = Path(__file__).resolve().parents[3] / "shared" / "benchmarks"


@st.composite
def stage_problems(draw, max_units=7):
    n = draw(st.integers(1, max_units))
    preds = [sorted(draw(st.sets(st.integers(0, u - 1), max_size=2))) if u else []
             for u in range(n)]
    kinds = draw(st.integers(1, 2))
    time_ = np.array([[draw(st.floats(0.1, 10) | st.just(0.0)) for _ in range(n)]
                      for _ in range(kinds)])
    if kinds == 2 and draw(st.booleans()):
        time_[1, draw(st.integers(0, n - 1))] = np.inf  # a unit kind 1 cannot run
    groups = [(u, *sorted({v for v in range(n) if u in preds[v]}))
              for u in range(n) if any(u in preds[v] for v in range(n))]
    comm = np.array([[draw(st.floats(0, 3)) for _ in groups] for _ in range(kinds)])
    size = np.array([draw(st.floats(0, 4)) for _ in range(n)])
    capacity = np.array([draw(st.floats(4, 30)) for _ in range(kinds)])
    count = tuple(draw(st.integers(1, 2)) for _ in range(kinds))
    return StageProblem(preds=preds, time=time_, size=size, groups=groups,
                        comm=comm.reshape(kinds, len(groups)), capacity=capacity, count=count)


def is_convex(preds, units):
    graph = nx.DiGraph([(p, u) for u, ps in enumerate(preds) for p in ps])
    graph.add_nodes_from(range(len(preds)))
    inside = set(units)
    after = set().union(*(nx.descendants(graph, u) for u in inside)) - inside
    return not any(nx.descendants(graph, v) & inside for v in after)


@settings(max_examples=40, deadline=None)
@given(stage_problems())
@example(StageProblem(preds=[[], []], time=np.array([[0.5, 0.5], [0.0, 0.5]]), size=np.zeros(2),
                      groups=[], comm=np.zeros((2, 0)), capacity=np.array([4.0, 4.0]),
                      count=(2, 2)))  # HiGHS once reported 0.499999 for a true 0.5
@example(StageProblem(preds=[[], [0]], time=np.zeros((1, 2)), size=np.zeros(2), groups=[(0, 1)],
                      comm=np.array([[2.26e-48]]), capacity=np.array([4.0]),
                      count=(2,)))  # the ILP cut the graph for a copy HiGHS rounds to nothing
def test_dp_is_exact_convex_and_reports_true_loads(problem):
    try:
        solution = solve(problem)
    except PlacementError as exc:  # infeasible instances must be infeasible for the ILP too
        with pytest.raises(PlacementError):
            solve_ilp(problem, time_limit=30)
        assert "memory" in str(exc)
        return
    assert solution.exact
    covered = sorted(u for _, units in solution.stages for u in units)
    assert covered == list(range(problem.n))
    used = np.bincount([k for k, _ in solution.stages], minlength=len(problem.count))
    assert all(used <= problem.count)
    for (kind, units), load in zip(solution.stages, solution.loads):
        assert is_convex(problem.preds, units)
        assert load == pytest.approx(load_of(problem, units, kind))
    assert solution.max_load == pytest.approx(max(solution.loads))
    # The ILP's stages are one feasible answer: the exact DP is never worse. The solver's
    # tolerances (about 1e-7 of the instance's scale) may leave its stages that much worse,
    # and HiGHS drops coefficients below 1e-9 (a 2e-48 copy it then does not avoid).
    scale = max(float(np.max(problem.time, initial=0)), float(np.max(problem.comm, initial=0)))
    ilp = solve_ilp(problem, time_limit=30)
    assert solution.max_load <= ilp + 1e-12 * max(scale, 1.0)
    assert solution.max_load == pytest.approx(ilp, rel=1e-6, abs=1e-6 * scale + 1e-9)


def test_zero_time_units_after_the_last_op_still_get_a_stage():
    """Regression: the residual CNN's coarse units, whose float sums of unit times left
    the whole graph sorted before one of its subsets (its zero-time sinks unstaged)."""
    preds = [[13], [8], [1, 4], [1], [3], [7, 11], [11], [6], [], [10], [0], [2],
             [1, 2, 3, 4, 5, 6, 7, 9, 10], [5], [9, 12], [14], [14, 15]]
    time_ = np.array([[1.83124e-05, 7.293488e-04, 1.1738496e-03, 3.5801648e-03,
                       3.3654496e-03, 5.61777067e-04, 1.797592e-03, 3.2605984e-03, 0.0,
                       1.14612e-05, 2.11696e-05, 1.36072e-04, 0.0, 7.0536e-05, 0.0, 0.0,
                       0.0]])
    problem = StageProblem(preds=preds, time=time_, size=np.zeros(17), groups=[],
                           comm=np.zeros((1, 0)), capacity=np.array([1.0]), count=(3,))
    solution = solve(problem)
    assert sorted(u for _, units in solution.stages for u in units) == list(range(17))


@settings(max_examples=15, deadline=None)
@given(stage_problems(max_units=9))
def test_chain_fallback_is_valid_and_never_better_than_exact(problem):
    try:
        exact = solve(problem)
    except PlacementError:
        return
    try:
        chain = solve(problem, ideal_limit=1)
    except PlacementError as exc:  # the chain's fewer splits can all overflow memory
        assert "among the splits of one topological order" in str(exc)
        return
    assert not chain.exact
    assert chain.max_load >= exact.max_load - 1e-9
    for (kind, units), load in zip(chain.stages, chain.loads):
        assert is_convex(problem.preds, units)
        assert load == pytest.approx(load_of(problem, units, kind))


LISTED = {"LayerGraphs/bert24_inference": 17.7899, "LayerGraphs/bert24_training": 41.7458,
          "LayerGraphs/resnet50_inference": 33.7747, "LayerGraphs/resnet50_training": 78.6318,
          "OperatorGraphs/bert_l-3_inference": 27.9186}


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/benchmarks is not checked out")
@pytest.mark.parametrize("name", sorted(LISTED))
def test_reaches_tarnawski_published_optimum(name):
    problem, members = load_tarnawski_stages(SHARED / "tarnawski" / f"{name}.json")
    solution = solve(problem)
    assert solution.exact
    assert solution.max_load == pytest.approx(LISTED[name], abs=5e-5)
    assert sorted(i for u in range(problem.n) for i in members[u]) == sorted(
        i for m in members for i in m)


@settings(max_examples=25, deadline=None)
@given(random_dags(min_ops=3, max_ops=25), random_clusters(), st.integers(1, 16))
def test_pipelined_plans_are_valid_and_simulated(graph, cluster, batch):
    cost = CostModel(graph, cluster)
    try:
        plan = partition(cost, options=PipelineOptions(batch_size=batch))
    except PlacementError as exc:
        assert "memory" in str(exc) or "fits" in str(exc), exc
        return
    check_plan(plan, graph, cluster)  # every op placed, groups kept, memory within bounds
    assert set(plan.stages) == set(graph.ops)
    assert 1 <= plan.microbatches <= batch
    stage_devices = {}
    for op, stage in plan.stages.items():
        stage_devices.setdefault(stage, set()).add(plan.assignment[op])
    assert all(len(d) == 1 for d in stage_devices.values())  # one device per stage
    order = {op: plan.stages[op] for op in graph.ops}
    assert all(order[u] <= order[v] for u, v, _ in graph.edges())  # stages in order
    assert plan.step_time >= plan.lower_bound - 1e-12
    choices = plan.predicted.pipeline.microbatch_choices  # coarse-unit estimates
    best = min(choices, key=lambda m: (choices[m]["batch_time"], int(m)))
    assert plan.microbatches == int(best)


def test_a_unit_with_no_edges_out_is_placed_outside_the_stage_search():
    from tfpart.core.cluster import cluster_of_devices
    from tfpart.core.graph import OpGraph

    graph = OpGraph()
    for i in range(4):  # op0 -> op1 between units; op2 -> op3 inside one colocation group
        graph.add_op(f"op{i}", op_type="Relu", bytes_accessed=1e9,
                     outputs=[((8, 10), "float32")], colocation="g" if i >= 2 else f"op{i}")
    graph.add_edge("op0", "op1", bytes=8)
    graph.add_edge("op2", "op3", bytes=8)
    cluster = cluster_of_devices(["cpu", "cpu"])
    plan = partition(CostModel(graph, cluster),
                     options=PipelineOptions(batch_size=4))
    assert set(plan.stages) == set(graph.ops)
    assert plan.stages["op2"] == plan.stages["op3"]
    assert plan.predicted.pipeline.units == 2  # op0 and op1 only
    check_plan(plan, graph, cluster)


def test_pipelining_beats_one_batch_when_stages_balance():
    from tfpart.core.cluster import cluster_of_devices
    from tfpart.core.graph import OpGraph

    graph = OpGraph()
    for i in range(6):
        graph.add_op(f"op{i}", op_type="Conv2D", flops=6e10, bytes_accessed=1e6,
                     outputs=[((64, 100), "float32")])
    for i in range(5):
        graph.add_edge(f"op{i}", f"op{i + 1}", bytes=25600)
    cluster = cluster_of_devices(["cpu", "cpu", "cpu"])
    placement = {f"op{i}": i // 2 for i in range(6)}
    one = simulate_pipeline(graph, cluster, placement, placement, 1)
    eight = simulate_pipeline(microbatch_graph(graph, 8), cluster, placement, placement, 8)
    assert eight.batch_time < 0.6 * one.batch_time
    assert eight.first_result < one.first_result
    assert eight.interval == pytest.approx(eight.first_result / 3, rel=0.05)


def test_dp_on_a_published_graph_is_fast_enough_to_time():
    if not SHARED.is_dir():
        pytest.skip("../shared/benchmarks is not checked out")
    problem, _ = load_tarnawski_stages(SHARED / "tarnawski/LayerGraphs/resnet50_inference.json")
    solve(problem)  # load the compiled kernels
    start = time.perf_counter()
    solution = solve(problem)
    assert solution.exact and time.perf_counter() - start < 5  # a sanity limit, not a benchmark


def test_the_whole_batch_stays_on_the_first_stage_until_its_last_slice_is_read():
    """The rewriter sends the client's whole batch to the first stage and slices it
    there: the slices share its buffer, so it is alive until the last micro-batch's
    first op has run, and the outputs are joined into one batch where they end."""
    from tfpart.core.cluster import cluster_of_devices
    from tfpart.core.graph import OpGraph

    rows = 4 * 1000
    graph = OpGraph()
    graph.add_op("x", op_type="Placeholder", outputs=[((rows, 250), "float32")])  # 4 MB
    graph.add_op("small", op_type="Conv2D", flops=6e10, bytes_accessed=1e6,
                 outputs=[((rows, 1), "float32")])  # 16 KB
    graph.add_op("out", op_type="Conv2D", flops=6e10, bytes_accessed=1e6,
                 outputs=[((rows, 1), "float32")])
    graph.add_edge("x", "small", bytes=4e6)
    graph.add_edge("small", "out", bytes=16e3)
    cluster = cluster_of_devices(["cpu", "cpu"])
    placement = {"x": 0, "small": 0, "out": 1}
    run = simulate_pipeline(microbatch_graph(graph, 4), cluster, placement, placement, 4,
                            memory=True)
    first, last = run.peak_memory.values()
    assert first >= 4e6  # the whole batch, not a quarter of it at a time
    assert first < 4e6 + 4 * 16e3 + 1  # and no copy of it
    assert last >= 2 * 16e3  # each micro-batch's output, then the joined batch
