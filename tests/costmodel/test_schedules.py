"""The pipeline schedules' task tables (costmodel.schedules): every task once, in an
order that runs without deadlock, bubbles as the schedules promise, and one list of
names for the registry, the CLI and plan.json's schema."""
import json
from importlib import resources

import pytest

from costmodel.schedules import REGISTRY, SCHEDULES, bubble, in_flight, table


def _run(lanes, stages, duration):
    """Each lane's tasks in its order, each when its lane is free and what it reads is
    done (a forward the previous stage's forward, a backward its own forward and the
    next stage's backward); the makespan, or AssertionError on a deadlock."""
    done, free, heads = {}, [0.0] * len(lanes), [0] * len(lanes)
    while any(head < len(lane) for head, lane in zip(heads, lanes)):
        progressed = False
        for i, lane in enumerate(lanes):
            while heads[i] < len(lane):
                m, k, phase = lane[heads[i]]
                needs = [(m, k - 1, "forward")] if phase == "forward" and k else []
                if phase == "backward":
                    needs = [(m, k, "forward")] + \
                        ([(m, k + 1, "backward")] if k + 1 < stages else [])
                if any(need not in done for need in needs):
                    break
                start = max([free[i]] + [done[need] for need in needs])
                done[(m, k, phase)] = free[i] = start + duration[phase]
                heads[i] += 1
                progressed = True
        assert progressed, ("deadlock", [lane[h] for h, lane in zip(heads, lanes)
                                         if h < len(lane)])
    return max(done.values())


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("devices", [2, 3, 4])
@pytest.mark.parametrize("microbatches", [1, 2, 3, 4, 6, 8])
def test_every_schedule_runs_every_task_once_without_deadlock(name, devices, microbatches):
    chunks = REGISTRY[name].CHUNKS
    stages = devices * chunks
    lanes = table({k: k % devices for k in range(stages)}, microbatches, name)
    tasks = [task for lane in lanes for task in lane]
    assert sorted(tasks) == sorted((m, k, phase) for m in range(microbatches)
                                   for k in range(stages)
                                   for phase in ("forward", "backward"))
    _run(lanes, stages, {"forward": 1.0 / chunks, "backward": 2.0 / chunks})


@pytest.mark.parametrize("devices, microbatches", [(2, 4), (4, 8), (3, 6)])
def test_interleaving_shrinks_the_bubble_as_its_formula_says(devices, microbatches):
    """Unit work per micro-batch and device (a forward 1/3, a backward 2/3, split over
    the chunks): the idle share of the step is each schedule's ``bubble``."""
    idle = {}
    for name in SCHEDULES:
        chunks = REGISTRY[name].CHUNKS
        stages = devices * chunks
        lanes = table({k: k % devices for k in range(stages)}, microbatches, name)
        span = _run(lanes, stages, {"forward": 1 / 3 / chunks, "backward": 2 / 3 / chunks})
        idle[name] = 1 - microbatches / span
        assert idle[name] == pytest.approx(bubble(name, devices, chunks, microbatches))
    assert idle["interleaved"] < idle["1f1b"] == pytest.approx(idle["gpipe"])


def test_in_flight_1f1b_holds_fewer_than_fill_drain():
    stages = {k: k for k in range(4)}
    assert in_flight(stages, 8, "gpipe") == [8] * 4
    assert in_flight(stages, 8, "1f1b") == [4, 3, 2, 1]


def test_interleaved_refuses_stages_not_round_robin():
    with pytest.raises(ValueError, match="stage k on the device of stage k mod 2"):
        table({0: "a", 1: "a", 2: "b", 3: "b"}, 2, "interleaved")


def test_the_schema_and_the_cli_name_the_registered_schedules():
    from tfpart.cli import build_parser

    schema = json.loads(resources.files("tfpart.core").joinpath("plan_schema.json").read_text())
    assert schema["$defs"]["schedule"]["enum"] == [*SCHEDULES, None], (
        "tfpart/core/plan_schema.json's $defs.schedule.enum must be "
        f"{json.dumps([*SCHEDULES, None])} (costmodel.schedules.SCHEDULES)")
    compile_ = build_parser()._subparsers._group_actions[0].choices["compile"]
    option = next(a for a in compile_._actions if "--schedule" in a.option_strings)
    assert tuple(option.choices) == SCHEDULES
