"""``tfpart train``'s output folder without a cluster: which ``-o`` it takes, what a
run that fails leaves, when it resumes, and the rows it goes on from."""
import json
import math
import threading

import pytest

from tfpart.core.errors import OutputError
from tfpart.core.output_folders import MARKER, write_marker
from tfpart.trainer.loop import check_output, continued_rows, training_output

IDENTITY = {"options": {"mode": "sync", "seed": 3, "batch_size": 8}, "data_sha256": "d",
            "model_sha256": "m", "workers": 2, "ps": 0}


def describe(saved):
    from tfpart.trainer.loop import identity_difference

    return identity_difference(saved, IDENTITY, "data.npz", "model/")


def checkpoint_at(out, update):
    """What ``tf.train.CheckpointManager`` leaves after saving at ``update``."""
    folder = out / "checkpoint"
    folder.mkdir(exist_ok=True)
    (folder / f"ckpt-{update}.index").write_bytes(b"")
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{update}"\n')


class Failed(Exception):
    pass


def test_a_new_output_is_created_marked_and_removed_if_no_step_was_checkpointed(tmp_path):
    out = tmp_path / "run"
    with training_output(out, IDENTITY, False, describe) as resumed:
        assert resumed is None
        assert (out / MARKER).is_file() and json.loads((out / "run.json").read_text()) == IDENTITY
    assert out.is_dir()  # a run that ends keeps it
    out2 = tmp_path / "run2"
    for failure in (Failed, KeyboardInterrupt):
        with pytest.raises(failure), training_output(out2, IDENTITY, False, describe):
            checkpoint_at(out2, 0)  # the evaluation before the first step
            raise failure()
        assert not out2.exists()


def test_a_run_that_failed_after_a_checkpoint_is_kept_and_resumed(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Failed), training_output(out, IDENTITY, False, describe):
        checkpoint_at(out, 40)
        (out / "updates.csv").write_text("update\n")
        raise Failed()
    with training_output(out, IDENTITY, False, describe) as resumed:
        assert resumed == 40 and (out / "updates.csv").exists()
    assert json.loads((out / "run.json").read_text())["resumed_at"] == [40]
    with pytest.raises(Failed), training_output(out, IDENTITY, False, describe):
        raise Failed()  # a resumed run that fails keeps what it resumed from
    assert (out / "updates.csv").exists()


@pytest.mark.parametrize("change, says", [
    ({"options": {**IDENTITY["options"], "seed": 4}}, "had --seed 4, not 3"),
    ({"options": {**IDENTITY["options"], "mode": "async"}}, "had --mode async, not sync"),
    ({"data_sha256": "other"}, "data.npz has changed"),
    ({"model_sha256": "other"}, "the model model/ has changed"),
    ({"workers": 3}, "had 3 worker tasks, not 2")])
def test_resuming_with_other_options_is_refused_and_restart_starts_over(tmp_path, change,
                                                                       says):
    out = tmp_path / "run"
    with training_output(out, {**IDENTITY, **change}, False, describe):
        checkpoint_at(out, 40)
    with pytest.raises(OutputError, match=f"cannot resume: .*{says}.*--restart"), \
            training_output(out, IDENTITY, False, describe):
        pass
    assert (out / "checkpoint").is_dir()  # refused: nothing removed
    with training_output(out, IDENTITY, True, describe) as resumed:
        assert resumed is None and sorted(p.name for p in out.iterdir()) == [MARKER, "run.json"]


def test_an_empty_folder_is_used_and_left_empty_by_a_run_that_fails(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    check_output(out, [])
    with pytest.raises(Failed), training_output(out, IDENTITY, False, describe):
        raise Failed()
    assert out.is_dir() and not any(out.iterdir())


def test_a_second_run_on_a_folder_in_use_is_refused(tmp_path):
    out, inside, release = tmp_path / "run", threading.Event(), threading.Event()

    def first():
        with training_output(out, IDENTITY, False, describe):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    with pytest.raises(OutputError, match="being written by another tfpart train"), \
            training_output(out, IDENTITY, False, describe):
        pass
    release.set()
    thread.join()
    assert (out / "run.json").is_file()


def test_an_output_tfpart_train_did_not_write_or_holding_an_input_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    with pytest.raises(OutputError, match="not written by tfpart train"):
        check_output(mine, [])
    compiled = tmp_path / "compiled"
    compiled.mkdir()
    write_marker(compiled, "compile")
    with pytest.raises(OutputError, match="another tfpart command"):
        check_output(compiled, [])
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        check_output(tmp_path / "file", [])
    (tmp_path / "link").symlink_to(tmp_path / "new")
    with pytest.raises(OutputError, match="symbolic link"):
        check_output(tmp_path / "link", [])
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(OutputError, match="holds the input"):
        check_output(tmp_path, [model])
    with pytest.raises(OutputError, match="lies inside the input"):
        check_output(model / "run", [model])
    write_marker(mine, "train")  # a train output that holds its data
    with pytest.raises(OutputError, match="holds the input"):
        check_output(mine, [mine / "notes.txt"])
    assert (mine / "notes.txt").read_text() == "x"


def test_continued_rows_keep_the_checkpoints_updates_and_fill_the_lost_ones():
    updates = [{"update": k, "worker": k % 2, "loss": 1.0, "delay": 0, "wall_s": k / 10}
               for k in range(1, 8)]
    evaluations = [{"update": u, "wall_s": u / 10, "loss": 1.0, "accuracy": 0.5}
                   for u in (0, 5, 10)]
    kept, evals, wall = continued_rows(updates, evaluations, 5)  # rows beyond: redone
    assert [r["update"] for r in kept] == [1, 2, 3, 4, 5] and kept[-1]["worker"] == 1
    assert [e["update"] for e in evals] == [0, 5] and wall == 0.5
    kept, evals, wall = continued_rows(updates, evaluations, 10)  # results lost
    assert [r["update"] for r in kept] == list(range(1, 11))
    assert all(math.isnan(r["loss"]) and r["worker"] is None for r in kept[7:])
    assert wall == 1.0
