"""The pipeline partitioner plans the interleaved schedule (costmodel/schedules/
interleaved.py): forced, each device holds two stages, stage k on the device of stage k
mod D, with the bubble of its formula; unforced, it is among the schedules simulated."""
import pytest
from hypothesis import given, settings

from costmodel import CostModel
from costmodel.schedules import bubble
from partitioner.pipeline import PipelineOptions, partition
from tests.partitioner.test_training_stages import training_steps
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.errors import PlacementError

CLUSTER = cluster_from_dict({"devices": [
    {"name": f"/job:worker/task:0/device:GPU:{i}", "kind": "T4"} for i in range(3)]})


@settings(max_examples=8, deadline=None)
@given(training_steps())
def test_interleaved_stages_run_round_robin_two_per_device(graph):
    cost = CostModel(graph, CLUSTER)
    try:
        plan = partition(cost, PipelineOptions(batch_size=8, microbatches=4,
                                               schedule="interleaved", target_units=16))
    except PlacementError as exc:  # too few units for two stages on two devices
        assert "stages on each of at least two devices" in str(exc)
        return
    stages = sorted(set(plan.stages.values()))
    device = {plan.stages[op]: plan.assignment[op] for op in plan.stages
              if graph.ops[op]["phase"] != "update" and graph.ops[op]["op_type"] != "VarHandleOp"}
    devices = list(dict.fromkeys(device[k] for k in stages))
    assert plan.schedule == "interleaved" and len(stages) == 2 * len(devices) >= 4
    assert [device[k] for k in stages] == devices * 2
    busy = sum(d.busy_s > 0 for d in plan.predicted.devices.values())
    assert plan.predicted.pipeline.bubble_fraction == pytest.approx(
        bubble("interleaved", busy, 2, 4))
    unforced = partition(cost, PipelineOptions(batch_size=8, microbatches=4, target_units=16))
    assert {key.split()[1] for key in unforced.predicted.pipeline.microbatch_choices} == \
        {"gpipe", "1f1b", "interleaved"}

