"""One expansion prices every plan: the step :func:`costmodel.execution.simulate_execution`
simulates for a plan, whatever strategy made it, is the step its partitioner predicted.
So ``tfpart simulate``, the report and the notebooks, which call it and ask no plan
which strategy it is, show the figures the plan was chosen by."""
import pytest
from hypothesis import given, settings

from costmodel import CostModel
from costmodel.execution import simulate_execution
from partitioner import ALGORITHMS
from tests.costmodel.test_expansion_attributes import training_steps
from tests.random_graphs import random_clusters, random_dags
from tfpart.core.errors import PlacementError

BATCH = 8
VARIANTS = {  # strategy -> the options of each of its plans checked (batch of 8)
    "pipeline": [{"microbatches": 4}, {"microbatches": 4, "schedule": "1f1b"}],
    "data_parallel": [{}, {"reduce": "all_reduce"}],
    "hybrid": [{"groups": 2, "form": "placement"}, {"groups": 2, "form": "pipeline"},
               {"groups": 2, "form": "pipeline", "reduce": "all_reduce"}],
}


def plans(cost):
    """(strategy, options, plan) of every registered strategy but the ILP, with the
    option variants above; strategies that refuse the graph or cluster are left out."""
    for name, algorithm in ALGORITHMS.items():
        if name == "ilp":
            continue
        for variant in VARIANTS.get(name, [{}]):
            fields = algorithm.options.__dataclass_fields__
            options = {key: value for key, value in {"batch_size": BATCH, **variant}.items()
                       if key in fields}
            if len(options) < len(variant):  # the variant is not of this version
                raise AssertionError(f"{name} has no option among {variant}")
            try:
                yield name, options, algorithm.partition(cost, algorithm.options(**options))
            except PlacementError:
                continue


def assert_priced_as_predicted(graph, cluster):
    cost = CostModel(graph, cluster)
    checked = 0
    for name, options, plan in plans(cost):
        run = simulate_execution(plan, cost)
        assert run.step_time == pytest.approx(plan.step_time, rel=1e-9, abs=1e-15), \
            (name, options)
        if plan.predicted.pipeline is not None and plan.microbatches > 1 \
                and not plan.replicas:
            assert run.first_result == pytest.approx(plan.predicted.pipeline.first_result,
                                                     rel=1e-9), (name, options)
        checked += 1
    assert checked >= 9  # the placements at least


@settings(max_examples=8, deadline=None)
@given(random_dags(), random_clusters(min_devices=2, max_devices=4))
def test_every_strategys_plan_simulates_to_its_prediction(graph, cluster):
    assert_priced_as_predicted(graph, cluster)


@settings(max_examples=5, deadline=None)
@given(training_steps(), random_clusters(min_devices=4, max_devices=4))
def test_every_strategys_training_plan_simulates_to_its_prediction(graph, cluster):
    for attrs in graph.ops.values():  # the ops before the update are its forward pass
        attrs["phase"] = attrs["phase"] or "forward"
    assert_priced_as_predicted(graph, cluster)
