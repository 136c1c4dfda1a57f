"""The lowering both sides read (costmodel.lowering): its order builds, its ordering
edges are the schedule's task table, and the simulator's barriers are those edges."""
import pytest

from costmodel.lowering import lower
from costmodel.pipeline import _replicate
from costmodel.schedules import SCHEDULES, table
from tfpart.core.graph import OpGraph

FOUR_STAGES = {0: "a", 1: "b", 2: "a", 3: "b"}
PIECES = {(k, phase) for k in FOUR_STAGES for phase in ("forward", "backward")}
READS = {**{(k, "forward"): {(k - 1, "forward")} for k in range(1, 4)},
         **{(k, "backward"): {(k + 1, "backward")} for k in range(3)},
         (3, "backward"): {(3, "forward")}}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_task_follows_what_it_reads_and_each_lane_is_the_schedules(schedule):
    step = lower(FOUR_STAGES, PIECES, 4, schedule, replicas=2, reads=READS,
                 devices=[FOUR_STAGES, {0: "c", 1: "d", 2: "c", 3: "d"}])
    seen = set()
    for task in step.tasks:
        assert {(task.step_microbatch, *piece) for piece in READS.get(task.piece, ())} <= seen
        seen.add((task.step_microbatch, *task.piece))
    assert len(step.tasks) == 2 * 4 * len(PIECES)
    for r, devices in ((0, "ab"), (1, "cd")):
        assert {t.device for t in step.of_replica(r)} == set(devices)
        assert [t.microbatch for t in step.of_replica(r)][:1] == [0]
    lanes = table(FOUR_STAGES, 4, schedule)
    ordered = sorted((a.replica, a.microbatch, a.piece, b.microbatch, b.piece)
                     for a, b in step.ordering)
    expected = sorted((r, m0, (k0, p0), m1, (k1, p1)) for r in range(2) for lane in lanes
                      for (m0, k0, p0), (m1, k1, p1) in zip(lane, lane[1:]))
    assert ordered == expected
    assert [step.replica_of(m) for m in range(8)] == [0] * 4 + [1] * 4


def test_replicas_that_run_their_share_at_once_are_not_ordered():
    step = lower({0: "a"}, {(0, "forward")}, None, replicas=3,
                 devices=[{0: "a"}, {0: "b"}, {0: "c"}])
    assert step.ordering == () and [t.microbatch for t in step.tasks] == [None] * 3


def test_stages_that_read_each_other_both_ways_have_no_order():
    with pytest.raises(ValueError, match="both directions"):
        lower({0: "a", 1: "b"}, {(0, "forward"), (1, "forward")}, 2,
              reads={(0, "forward"): {(1, "forward")}, (1, "forward"): {(0, "forward")}})


def test_the_simulators_barriers_are_the_lowerings_ordering_edges():
    graph = OpGraph()
    for k, op in enumerate("abcd"):
        graph.add_op(op, op_type="Relu", bytes_accessed=1e6, phase="forward")
        if k:
            graph.add_edge("abcd"[k - 1], op, bytes=8)
    stage_of = dict(zip("abcd", range(4)))
    device_of = {op: stage % 2 for op, stage in stage_of.items()}
    replicated, where = _replicate(graph, ["x", "y"], device_of, stage_of, 3, "interleaved")
    barriers = {op for op in replicated.ops if op.endswith("-waits")}
    step = lower({0: 0, 1: 1, 2: 0, 3: 1}, {(k, "forward") for k in range(4)}, 3,
                 "interleaved")
    assert barriers == {f"mb{b.step_microbatch}/stage{b.stage}-forward-waits"
                        for _, b in step.ordering}
    assert all(where[f"mb{b.step_microbatch}/stage{b.stage}-forward-waits"] == b.device
               for _, b in step.ordering)
