"""Hybrid replicas of a pipeline: groups of devices of matching speeds, one stage cut
shared by every replica, each replica's ops on its own group, shares by simulated
speed; and the hybrid keeps whichever form (replicas of a placement or of a pipeline)
the simulation predicts faster."""
import pytest

from costmodel import CostModel
from partitioner.hybrid import HybridOptions, partition
from tfpart.core.cluster import cluster_of_devices
from tfpart.core.errors import PlacementError
from tfpart.core.graph import OpGraph


def chain(length=12, batch=16, flops=2e12):
    """A chain of matmuls whose weights are read where the variables live."""
    g = OpGraph()
    g.add_op("x", op_type="Placeholder")
    previous = "x"
    for i in range(length):
        g.add_op(f"w{i}", op_type="VarHandleOp", param_bytes=4e6)
        g.add_op(f"read{i}", op_type="ReadVariableOp", colocation=f"w{i}")
        g.add_edge(f"w{i}", f"read{i}", bytes=4e6)
        g.add_op(f"mm{i}", op_type="MatMul", flops=flops, input_shapes=[(batch, 1000)],
                 outputs=[((batch, 1000), "float32")])
        g.add_edge(previous, f"mm{i}", bytes=batch * 4000)
        g.add_edge(f"read{i}", f"mm{i}", bytes=4e6)
        previous = f"mm{i}"
    return g


@pytest.fixture(scope="module")
def cost():
    return CostModel(chain(), cluster_of_devices(["V100", "V100", "T4", "T4"]))


@pytest.mark.parametrize("reduce", ["one_device", "all_reduce"])
def test_each_replica_pipelines_over_its_own_group_of_matching_kinds(cost, reduce):
    plan = partition(cost, HybridOptions(batch_size=16, groups=2, form="pipeline",
                                         reduce=reduce))
    replicas = plan.replicas
    kind = {d.name: d.kind.name for d in cost.cluster.devices}
    groups = [set(placement.values()) for placement in replicas.placements]
    assert len(groups) == 2 and not groups[0] & groups[1]
    stages = sorted(set(plan.stages.values()))
    assert len(stages) == 2 and all(len(group) == 2 for group in groups)
    for op, stage in plan.stages.items():  # stage k on the same kind in every replica
        if op in replicas.placements[0]:
            assert len({kind[p[op]] for p in replicas.placements}) == 1, op
    assert replicas.placements[0] == {op: plan.assignment[op]
                                         for op in replicas.placements[0]}
    assert replicas.reduce == reduce
    if reduce == "one_device":  # variables and their reads stay on the first replica's
        assert set(replicas.pinned) == {f"read{i}" for i in range(12)}
        assert not set(replicas.pinned) & set(replicas.placements[1])
    else:  # each replica reads its own copy, on the device of the stage reading it
        assert replicas.pinned == ()
        for i in range(12):
            assert [p[f"read{i}"] for p in replicas.placements] == [
                p[f"mm{i}"] for p in replicas.placements]
    assert plan.microbatches == 2 * replicas.microbatches >= 2
    assert sum(replicas.fractions) == pytest.approx(1.0)
    assert plan.step_time > 0 and plan.step_time >= plan.lower_bound


def test_shares_follow_the_replicas_simulated_speed():
    """A V100 and three T4s: the first replica pipelines over the V100 and a T4, the
    second runs the same stages on two T4s, so it is slower and takes less of the
    batch."""
    cluster = cluster_of_devices(["V100", "T4", "T4", "T4"])
    plan = partition(CostModel(chain(), cluster),
                     HybridOptions(batch_size=16, groups=2, form="pipeline"))
    placements = plan.replicas.placements
    assert cluster.device_names[0] in placements[0].values()
    assert cluster.device_names[0] not in placements[1].values()
    fractions = plan.replicas.fractions
    assert fractions[0] > fractions[1] and sum(fractions) == pytest.approx(1.0)


def test_the_hybrid_keeps_the_faster_form(cost):
    steps = {form: partition(cost, HybridOptions(batch_size=16, groups=2, form=form)).step_time
             for form in ("placement", "pipeline")}
    chosen = partition(cost, HybridOptions(batch_size=16, groups=2))
    assert chosen.step_time == pytest.approx(min(steps.values()))
    assert bool(chosen.replicas.microbatches) == (steps["pipeline"] < steps["placement"])


def test_an_unknown_form_is_refused(cost):
    with pytest.raises(PlacementError, match="form must be one of placement, pipeline"):
        partition(cost, HybridOptions(batch_size=16, form="ring"))
