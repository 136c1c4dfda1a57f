"""``tfpart train``'s output folder: a run killed mid-way resumes from its checkpoint
(sync: to the weights of a run never stopped; async: within the usual spread), an
output that holds an input or that tfpart did not write is refused and kept, and a run
that fails before its first step leaves nothing."""
import hashlib
import json
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.test_async_training import START_S, failure, rows, tfpart_train, \
    wait_for_evaluations
from tfpart.local_workers import LocalWorkers, free_port

# one xdist worker starts the module's workers and parameter servers, once
pytestmark = pytest.mark.xdist_group("train_output")


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    """A classifier whose exported SGD has momentum (sync's optimizer: its slots must
    be checkpointed for a resumed run to end where an uninterrupted one does)."""
    from examples.models import blobs, export_classifier_step

    directory = tmp_path_factory.mktemp("resume")
    model = export_classifier_step(directory / "model", features=16, classes=4, hidden=32,
                                   momentum=0.5)
    return model, blobs(directory / "blobs.npz")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Two workers and two parameter servers, shared by the runs of this module (a
    killed client leaves them running, as a crashed coordinator would)."""
    with LocalWorkers(2, tmp_path_factory.mktemp("tasks"), ps=2, pin=False,
                      timeout=START_S) as workers:
        yield workers


def tfpart_train_here(capfd, model, cluster, data, out, *extra, log):
    """``tfpart train`` in this process, as the command runs it (TensorFlow's own
    output to ``log``, tfpart's to file descriptors 1 and 2, which ``capfd`` reads), for
    a run refused before it connects to the cluster: a subprocess would import
    TensorFlow again (5-10 s). The ``subprocess.CompletedProcess`` :func:`tfpart_train`
    would give. (Not for a run that succeeds: the command ends its process.)"""
    from tfpart import servers
    from tfpart.cli import main
    from tfpart.core.quiet import library_output_captured

    # a connected process ends itself on an error (tfpart.cli.main): never pytest's
    assert not servers.connected
    argv = ["train", str(model), "--cluster", str(cluster), "--data", str(data), "-o",
            str(out), *map(str, extra)]
    capfd.readouterr()
    with library_output_captured(log):
        code = main(argv)
    captured = capfd.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


def killed_after(process, out, evaluations, timeout=300):
    """SIGKILL ``process`` (a ``tfpart train``) once ``out`` has ``evaluations``
    evaluations; the update of the checkpoint it left."""
    from tfpart.trainer.loop import checkpointed_update

    wait_for_evaluations(out, evaluations, process, timeout)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    return checkpointed_update(out)


def resumed_like_an_uninterrupted_run(model, data, tasks, tmp_path, steps, *options):
    """Train ``steps`` updates whole, and again killed after three evaluations and
    rerun with the same command; (the whole run's folder, the resumed one's, the
    update it resumed at)."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ("--steps", steps, *options)
    run = tfpart_train(model, tasks.path, data, whole, *args)
    assert run.returncode == 0, failure(run.stderr, tmp_path)
    at = killed_after(tfpart_train(model, tasks.path, data, cut, *args, wait=False), cut, 3)
    assert 0 < at < steps, at
    run = tfpart_train(model, tasks.path, data, cut, *args)
    assert run.returncode == 0, failure(run.stderr, tmp_path)
    assert f"Resumed at update {at}" in run.stdout
    summary = json.loads((cut / "train.json").read_text())
    assert summary["resumed_at"] == [at] and summary["updates"] == steps
    updates = rows(cut / "updates.csv")
    assert [int(u["update"]) for u in updates] == list(range(1, steps + 1))
    walls = [float(u["wall_s"]) for u in updates]
    assert walls == sorted(walls)  # the clock went on from the checkpoint's time
    evaluated = [int(e["update"]) for e in rows(cut / "evaluations.csv")]
    assert evaluated == sorted(set(evaluated)) and evaluated[0] == 0
    assert at in evaluated and evaluated[-1] == steps
    return whole, cut, at


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_killed_sync_run_resumes_to_the_weights_of_an_uninterrupted_one(
        model_and_data, tasks, tmp_path, capfd):
    """Sync on two workers, SGD with momentum: the client killed (SIGKILL) after three
    evaluations, the same command resumes at the checkpoint's update and ends with
    exactly the weights, and the losses, of a run never stopped. Then: a rerun of a
    finished run changes nothing, and other options or data are refused in one line
    (these three in this process: they end before connecting to the cluster)."""
    from tfpart.trainer.loop import trained_weights

    model, data = model_and_data
    steps = 300
    whole, cut, at = resumed_like_an_uninterrupted_run(
        model, data, tasks, tmp_path, steps, "--mode", "sync", "--batch-size", 8,
        "--seed", 5, "--eval-every", 20)
    expected, got = trained_weights(whole), trained_weights(cut)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert [u["loss"] for u in rows(cut / "updates.csv")] == \
        [u["loss"] for u in rows(whole / "updates.csv")]

    again = tfpart_train(model, tasks.path, data, cut, "--mode", "sync", "--steps", steps,
                         "--batch-size", 8, "--seed", 5, "--eval-every", 20)
    assert again.returncode == 0, failure(again.stderr, tmp_path)
    assert "Nothing to do" in again.stdout and f"all {steps} updates" in again.stdout
    assert json.loads((cut / "train.json").read_text())["resumed_at"] == [at]
    for name, value in trained_weights(cut).items():
        np.testing.assert_array_equal(value, got[name])
    other_data = tmp_path / "other.npz"
    shutil.copy(data, other_data)
    with np.load(other_data) as arrays:
        np.savez(other_data, x=arrays["x"] + 1, y=arrays["y"])
    for extra, says in [(("--seed", 6), "its checkpointed run had --seed 5, not 6"),
                        (("--batch-size", 4), "had --batch-size 8, not 4"),
                        (("--data", other_data), "other.npz has changed since")]:
        options = dict(zip(["--mode", "--steps", "--batch-size", "--seed"],
                           ["sync", steps, 8, 5]))
        options.update(zip(extra[::2], extra[1::2]))
        given_data = options.pop("--data", data)
        run = tfpart_train_here(capfd, model, tasks.path, given_data, cut,
                                *[item for pair in options.items() for item in pair],
                                log=tmp_path / "refused.log")
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
        assert "cannot resume" in lines[0] and says in lines[0], lines[0]
    for name, value in trained_weights(cut).items():
        np.testing.assert_array_equal(value, got[name])


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_killed_async_run_resumes_within_the_usual_spread(model_and_data, tasks,
                                                            tmp_path):
    """DDC-ASGD on two workers, every weight cut into a piece on each of two servers:
    the client killed after three evaluations, the same command resumes from the
    servers' checkpointed state and count (velocities, mean squares and mean freshness
    included, saved whole) and ends as well trained as a run never stopped."""
    model, data = model_and_data
    # 300: the held-out accuracy is 1.0 from about update 60, and the loss within a
    # few thousandths of its value at 600 (the bounds below are set by their 0.05)
    steps = 300
    whole, cut, at = resumed_like_an_uninterrupted_run(
        model, data, tasks, tmp_path, steps, "--mode", "ddc-asgd", "--batch-size", 16,
        "--lr", 0.05, "--momentum", 0.5, "--seed", 2, "--eval-every", 20,
        "--min-shard-bytes", 0)
    import tensorflow as tf

    saved = tf.train.load_checkpoint(str(cut / "checkpoint"))
    state = {key.split("/.ATTRIBUTES")[0]: saved.get_tensor(key)
             for key in saved.get_variable_to_shape_map() if key.startswith("optimizer/")}
    assert {"optimizer/w000_velocity", "optimizer/w000_ms", "optimizer/mean_freshness"} \
        <= set(state), sorted(state)
    assert np.abs(state["optimizer/w000_velocity"]).max() > 0
    assert 0 < state["optimizer/mean_freshness"] <= 1
    first, *_, last = rows(cut / "evaluations.csv")
    reference = rows(whole / "evaluations.csv")[-1]
    assert float(last["accuracy"]) > float(first["accuracy"]) + 0.3
    assert float(last["accuracy"]) > float(reference["accuracy"]) - 0.1
    assert float(last["loss"]) < 2 * float(reference["loss"]) + 0.05


def checksums(folder):
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(Path(folder).rglob("*")) if path.is_file()}


def one_line_error(run, *says):
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith("tfpart: error:") and all(s in lines[0] for s in says), lines[0]


@pytest.mark.slow
@pytest.mark.any_onednn
def test_an_output_that_holds_or_lies_in_an_input_is_refused(model_and_data, tmp_path):
    """``-o`` the folder holding the model, the data and a notes file, with --force or
    --restart (the probe's run deleted all three), or a folder inside the model: one
    line, and no input changed."""
    model, data = model_and_data
    folder = tmp_path / "project"
    shutil.copytree(model, folder / "model")
    shutil.copy(data, folder / "data.npz")
    (folder / "notes.txt").write_text("my notes")
    cluster = folder / "cluster.json"
    cluster.write_text(json.dumps({
        "cluster": {"worker": [f"localhost:{free_port()}"]},
        "devices": [{"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    before = checksums(folder)
    for out, flag, says in [(folder, "--force", "holds the input"),
                            (folder, "--restart", "holds the input"),
                            (folder / "model", "--restart", "holds the input"),
                            (folder / "model" / "run", None, "lies inside the input")]:
        run = tfpart_train(folder / "model", cluster, folder / "data.npz", out, "--mode",
                           "sync", *([flag] if flag else []), log=tmp_path / "train.log")
        one_line_error(run, str(out), says)
        assert checksums(folder) == before
    assert not (folder / "model" / "run").exists()


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.parametrize("restart", [False, True])
def test_a_folder_tfpart_did_not_write_is_refused_and_kept(model_and_data, tmp_path,
                                                           restart):
    """An existing ``-o`` that has no tfpart train marker (a user's folder, or another
    command's output) is refused in one line, with or without --restart, and kept."""
    model, data = model_and_data
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "cluster": {"worker": [f"localhost:{free_port()}"]},
        "devices": [{"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("chapter 1")
    compiled = tmp_path / "compiled"
    compiled.mkdir()
    (compiled / ".tfpart-output").write_text(json.dumps({"tool": "tfpart",
                                                         "command": "compile"}))
    (compiled / "plan.json").write_text("{}")
    for out, says in [(mine, "was not written by tfpart train"),
                      (compiled, "output of another tfpart command")]:
        before = checksums(out)
        run = tfpart_train(model, cluster, data, out, "--mode", "sync",
                           *(["--restart"] if restart else []))
        one_line_error(run, str(out), says)
        assert checksums(out) == before


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_whose_task_is_down_at_start_leaves_nothing(model_and_data, tmp_path, mode):
    """A worker that does not answer at the start: one line naming it, and no output
    folder (the run created it); an empty folder given as ``-o`` is left empty."""
    model, data = model_and_data
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "cluster": {"worker": [f"localhost:{free_port()}"],
                    **({"ps": [f"localhost:{free_port()}"]} if mode == "async" else {})},
        "devices": [{"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    out = tmp_path / "run"
    run = tfpart_train(model, cluster, data, out, "--mode", mode)
    one_line_error(run, "task 0", "is not reachable")
    assert not out.exists()
    out.mkdir()
    run = tfpart_train(model, cluster, data, out, "--mode", mode)
    one_line_error(run, "is not reachable")
    assert out.is_dir() and not any(out.iterdir())
