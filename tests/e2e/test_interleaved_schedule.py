"""The interleaved 1F1B schedule (costmodel/schedules/interleaved.py) end to end: a
training step forced to it is planned with two stages on each device, verified, and
trains like the original (tests/train_compare.py, in a process of its own)."""
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
