"""The interleaved 1F1B schedule (costmodel/schedules/interleaved.py) end to end: a
training step forced to it is planned with two stages on each device, verified, and
trains like the original (tests/train_compare.py, in a process of its own); so do
replicas of such a pipeline."""
import pytest

from tests.e2e.test_training import assert_split_batches_train_like_the_original, compare


@pytest.mark.slow
@pytest.mark.any_onednn
def test_an_interleaved_training_step_trains_like_the_original(tmp_path, training_step):
    run = compare(tmp_path, training_step, "cnn", "sgd_momentum", microbatches=4,
                  schedule="interleaved")
    assert (run["microbatches"], run["schedule"]) == (4, "interleaved")
    assert run["devices_used"] > 1 and run["stages"] == 2 * run["devices_used"]
    assert_split_batches_train_like_the_original(run)


@pytest.mark.slow
@pytest.mark.any_onednn
def test_replicas_of_an_interleaved_pipeline_train_like_the_original(tmp_path, training_step):
    """Hybrid: two replicas on four equal CPUs, each an interleaved pipeline over its
    pair (two stages on each CPU), the gradients all-reduced among the copies."""
    run = compare(tmp_path, training_step, "cnn", "sgd_momentum", microbatches=2,
                  schedule="interleaved", hybrid="pipeline")
    replicas = run["replicas"]
    assert (run["schedule"], replicas["microbatches"]) == ("interleaved", 2)
    assert run["stages"] == 4 and run["devices_used"] == 4
    groups = [set(placement.values()) for placement in replicas["placements"]]
    assert len(groups) == 2 and not groups[0] & groups[1]
    assert replicas["reduce"] == "all_reduce" and run["copies_apart"] == 0.0
    assert_split_batches_train_like_the_original(run)
