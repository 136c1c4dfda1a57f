"""``auto`` plans tfpart's own placements in a forked process beside the strategies that
make stages (:mod:`tfpart.core.forked`): the outcome is that of planning every
strategy in turn in one process, and a forked process that dies leaves this one to
plan its share."""
import os

import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR


def _auto_plan(monkeypatch, fork, start=None):
    import tfpart.compile

    monkeypatch.setattr(tfpart.compile, "fork_can_pay", lambda: fork)
    started = []
    start = start or tfpart.compile.start_forked

    def counted(work):
        started.append(work)
        return start(work)

    monkeypatch.setattr(tfpart.compile, "start_forked", counted)
    result = tfpart.compile.plan_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, batch_size=8,
                                       strategy="auto")
    return result, len(started)


@pytest.mark.slow
@pytest.mark.any_onednn  # both plans are made under the same setting
def test_auto_plans_the_same_with_its_placements_forked(monkeypatch):
    in_turn, forks = _auto_plan(monkeypatch, fork=False)
    assert forks == 0
    forked, forks = _auto_plan(monkeypatch, fork=True)
    assert forks == 1 and {"greedy", "filter_split", "data_parallel"} <= set(forked.compared)
    assert forked.compared == in_turn.compared and forked.refused == in_turn.refused
    assert forked.strategy == in_turn.strategy
    assert forked.plan.to_dict() == in_turn.plan.to_dict()


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_forked_planner_that_dies_leaves_its_strategies_to_this_process(monkeypatch):
    from tfpart.core.forked import start_forked

    in_turn, _ = _auto_plan(monkeypatch, fork=False)
    dying, forks = _auto_plan(monkeypatch, fork=True,
                              start=lambda work: start_forked(lambda: os._exit(9)))
    assert forks == 1 and dying.compared == in_turn.compared
    assert dying.plan.to_dict() == in_turn.plan.to_dict()
