"""``tfpart train`` on local ``tfpart worker`` and ``ps`` processes: the asynchronous
modes against plain SGD, a worker lost mid-run, and bad input."""
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from examples.models import blobs, export_classifier_step
from tfpart.local_workers import LocalWorkers

ROOT = Path(__file__).resolve().parents[2]
START_S = 180  # a task's start-up: TensorFlow's import takes a minute on a loaded machine


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("async")
    model = export_classifier_step(directory / "model", features=16, classes=4, hidden=32)
    return model, blobs(directory / "blobs.npz")


@pytest.fixture(scope="module")
def _tasks_left_running(tmp_path_factory):
    """The tasks :func:`live_tasks` started last (none or one ``LocalWorkers``)."""
    running = []
    yield running
    for tasks in running:
        tasks.stop()


@pytest.fixture
def live_tasks(_tasks_left_running, tmp_path_factory):
    """``live_tasks(workers, ps)``: local tasks, that many workers and parameter
    servers, every one up: those a test before left running (the xdist group
    ``local_tasks`` runs the tests that take them on one xdist worker, in turn), or new
    ones where a test killed one of them or asked for other numbers. (A task starts in
    10-20 s: it imports TensorFlow.)"""
    running = _tasks_left_running

    def live(workers, ps):
        if running and (running[0].ps, len(running[0].processes)) == (ps, workers + ps) \
                and all(process.poll() is None for process in running[0].processes):
            return running[0]
        while running:
            running.pop().stop()
        running.append(LocalWorkers(workers, tmp_path_factory.mktemp("tasks"), ps=ps,
                                    pin=False, timeout=START_S))
        return running[0]

    return live


def tfpart_train(model, cluster, data, out, *extra, wait=True, log=None):
    """Run ``tfpart train``; TensorFlow's log (with the full error behind a one-line
    message) goes to ``log`` (default: ``train.log`` beside ``out``), for
    :func:`failure`."""
    command = [sys.executable, "-m", "tfpart.cli", "train", str(model), "--cluster",
               str(cluster), "--data", str(data), "-o", str(out), *map(str, extra)]
    env = {**os.environ, "TFPART_TF_LOG": str(log or Path(out).parent / "train.log")}
    if not wait:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)


def failure(stderr, directory):
    """What to show when a run failed: its stderr, then the end of each log in
    ``directory`` (the client's ``train.log``, each task's log)."""
    logs = [f"--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}"
            for log in sorted(Path(directory).glob("*.log"))]
    return "\n".join([stderr[-2000:], *logs])


def rows(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def sgd_by_hand(model_dir, data, steps, batch, learning_rate, momentum, seed):
    """Plain SGD with momentum over the batches worker 0 draws, in this process."""
    import tensorflow as tf

    from tfpart.trainer.asynchronous import sample_orders
    from tfpart.trainer.loop import load_data

    model = tf.saved_model.load(str(model_dir))
    (x, y), _ = load_data(data, model.signatures["gradients"], 0.2, seed)
    order = np.tile(sample_orders(len(x), 1, seed)[0], 2)
    weights = {k: v.numpy() for k, v in model.signatures["weights"]().items()}
    states = {k: v.numpy() for k, v in model.signatures["states"]().items()} \
        if "states" in model.signatures else {}
    velocity = {k: np.zeros_like(v) for k, v in weights.items()}
    for step in range(steps):
        take = order[step * batch:(step + 1) * batch]
        grads = model.signatures["gradients"](x=x[take], y=y[take], **weights, **states)
        for k in weights:
            velocity[k] = momentum * velocity[k] + grads[f"g{k[1:]}"].numpy()
            weights[k] = weights[k] - learning_rate * velocity[k]
        states = {k: grads[k].numpy() for k in states}  # the step's moving statistics
    return {**weights, **states}


def assert_trains_like_sgd(model, data, workers, out, mode, expected, steps, *extra):
    """``tfpart train`` with one worker, lambda0 = 0 and ``sgd_by_hand``'s settings
    ends with the ``expected`` weights (and states)."""
    from tfpart.trainer.loop import trained_weights

    run = tfpart_train(model, workers.path, data, out, "--mode", mode, "--steps", steps,
                       "--batch-size", 8, "--lr", 0.1, "--momentum", 0.5, "--lambda0", 0,
                       "--seed", 3, "--eval-every", steps // 2, *extra)
    assert run.returncode == 0, failure(run.stderr, out.parent)
    got = trained_weights(out)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("local_tasks")
def test_one_worker_every_async_mode_is_plain_sgd(model_and_data, live_tasks, tmp_path):
    """One worker, so every delay is zero; lambda0 = 0: the asynchronous modes give the
    weights of plain SGD with momentum after 20 updates. Two parameter servers share the
    variables by size, as plan.json records; with ``--min-shard-bytes 0`` (DDC-ASGD
    here) every weight of two rows or more is cut into a piece on each server, and the
    checkpoint still holds it whole. A scheduled call makes 1, 3 (the last call 2) or 4
    updates. plan.json records the op library given (any module: ``json``)."""
    from tfpart.core.plan import Plan

    model, data = model_and_data
    expected = sgd_by_hand(model, data, 20, 8, 0.1, 0.5, seed=3)
    workers = live_tasks(1, ps=2)
    for mode in ("async", "dc-asgd", "ddc-asgd"):
        out = tmp_path / mode
        cut = mode == "ddc-asgd"
        calls = {"async": 1, "dc-asgd": 3}.get(mode, 4)  # 20 = 6 × 3 + 2 for DC-ASGD
        assert_trains_like_sgd(model, data, workers, out, mode, expected, 20,
                               "--updates-per-call", calls, "--op-library", "json",
                               *(["--min-shard-bytes", 0] if cut else []))
        updates = rows(out / "updates.csv")
        assert len(updates) == 20 and {u["delay"] for u in updates} == {"0"}
        evaluated = [int(e["update"]) for e in rows(out / "evaluations.csv")]
        # evaluated once the servers' count reaches 10, and at the end
        assert evaluated[0] == 0 and evaluated[-1] == 20 and len(evaluated) >= 2
        assert evaluated == sorted(set(evaluated)) and all(
            count >= 10 for count in evaluated[1:])
        plan = Plan.load(out / "plan.json")
        assert plan.algorithm == "ps_shards" and plan.op_libraries == ["json"]
        assert set(plan.assignment.values()) == {
            "/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"}
        pieces = plan.context["pieces"]
        if cut:  # every weight, its rows halved over the two servers
            assert sorted(pieces) == sorted(expected) and all(
                rows_ == [-(-len(expected[name]) // 2), len(expected[name]) // 2]
                for name, rows_ in pieces.items())
            assert len(plan.assignment) == 2 * len(expected)
            assert all(plan.assignment[f"{name}/part_0"] !=
                       plan.assignment[f"{name}/part_1"] for name in expected)
        else:  # weights of a few KB: whole
            assert pieces == {} and sorted(plan.assignment) == sorted(expected)
        summary = json.loads((out / "train.json").read_text())
        assert summary["delays"]["0"]["max"] == 0 and summary["updates"] == 20


@pytest.mark.slow
@pytest.mark.any_onednn
def test_one_worker_sync_is_plain_sgd_after_its_warm_up(model_and_data, tmp_path):
    """Sync on one worker runs the compiled ``train_step`` (the export's SGD, learning
    rate 0.05, no momentum) on the batches plain SGD draws: the weights equal it after
    20 steps, so the warm-up step before the clock left no trace. The op library
    given (any module: ``json``) is loaded by the workers and recorded in plan.json."""
    from tfpart.core.plan import Plan
    from tfpart.trainer.loop import trained_weights

    model, data = model_and_data
    expected = sgd_by_hand(model, data, 20, 8, 0.05, 0.0, seed=3)
    out = tmp_path / "sync"
    with LocalWorkers(1, tmp_path, pin=False, timeout=START_S,
                      op_libraries=["json"]) as workers:
        assert "--op-library json" in " ".join(workers.processes[0].args)
        run = tfpart_train(model, workers.path, data, out, "--mode", "sync", "--steps", 20,
                           "--batch-size", 8, "--seed", 3, "--eval-every", 10,
                           "--op-library", "json")
    assert run.returncode == 0, failure(run.stderr, out.parent)
    assert Plan.load(out / "plan.json").op_libraries == ["json"]
    got = trained_weights(out)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("local_tasks")
def test_batch_norm_statistics_train_on_the_servers(live_tasks, tmp_path):
    """A classifier with batch normalisation: with one worker and lambda0 = 0, DC-ASGD
    gives plain SGD's weights and the moving statistics its steps leave (kept on the
    parameter servers, written back by every step), and they moved from the export's."""
    model = export_classifier_step(tmp_path / "model", features=16, classes=4, hidden=32,
                                   batch_norm=True)
    data = blobs(tmp_path / "blobs.npz")
    expected = sgd_by_hand(model, data, 12, 8, 0.1, 0.5, seed=3)
    assert sum(name.startswith("s") for name in expected) == 2  # the moving mean, variance
    got = assert_trains_like_sgd(model, data, live_tasks(1, ps=2), tmp_path / "run",
                                 "dc-asgd", expected, 12)
    import tensorflow as tf
    exported = tf.saved_model.load(str(model)).signatures["states"]()
    assert all(not np.allclose(got[name], value.numpy()) for name, value in exported.items())


def wait_for_evaluations(out, count, process, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = out / "evaluations.csv"
        if path.exists() and len(rows(path)) >= count:
            return
        assert process.poll() is None, failure(process.communicate()[1], out.parent)
        time.sleep(0.1)
    raise AssertionError(f"no {count} evaluations within {timeout} s")


def killed_mid_run(model, data, tmp_path, tasks, kill, *options, wait=300):
    """Run ``tfpart train`` on the local ``tasks``; after three evaluations call
    ``kill(tasks)``. Returns (return code, stderr, output folder, evaluations written
    when the task was killed)."""
    out = tmp_path / "run"
    process = tfpart_train(model, tasks.path, data, out, *options, wait=False)
    wait_for_evaluations(out, 3, process, timeout=wait)
    kill(tasks)
    killed_at = len(rows(out / "evaluations.csv"))
    _, stderr = process.communicate(timeout=600)
    return process.returncode, stderr, out, killed_at


def export_constant_gradient_step(path, width):
    """A linear layer (zero weights) whose loss is the mean of its outputs ``p``: on
    inputs of ones, every weight's gradient is ``1 / width`` whatever the weights. The
    loss adds ``0 * p * p`` so that the gradient is computed from the weights read, as
    a real model's is (else the update need not wait for the read)."""
    import keras
    import tensorflow as tf

    from tfpart.training import export_train_step

    model = keras.Sequential([keras.Input((width,)),
                              keras.layers.Dense(width, kernel_initializer="zeros")])
    return export_train_step(model, keras.optimizers.SGD(0.01),
                             lambda y, p: tf.reduce_mean(p + 0.0 * p * p), path,
                             y_spec=tf.TensorSpec([None], tf.int32, name="y"))


@pytest.mark.slow
@pytest.mark.any_onednn
# DC-ASGD as async (weights cut over two servers: test_train_output.py's killed async run)
@pytest.mark.parametrize("mode, ps", [("dc-asgd", 1)])
@pytest.mark.xdist_group("local_tasks")
def test_no_update_is_lost_when_workers_update_at_once(mode, ps, live_tasks, tmp_path):
    """Three workers update a 1 MB weight whose gradient is the same at every step, so
    after N updates of plain SGD it is exactly ``-N * lr / width`` (DC-ASGD too, with
    ``lambda0 = 0``: else it would compensate the stale copies of that gradient).
    Without the servers' locks two updates that overlap read the same weight and the
    later assignment drops the earlier one: before the locks, the bias ended at 0.43 of
    its value here (138 of the 240 updates dropped). With two servers the weight is cut
    into a piece on each, each under its own server's lock."""
    from tfpart.core.plan import Plan
    from tfpart.trainer.loop import trained_weights

    width, steps, lr = 512, 240, 0.01
    model = export_constant_gradient_step(tmp_path / "model", width)
    np.savez(tmp_path / "ones.npz", x=np.ones((1024, width), np.float32),
             y=np.zeros(1024, np.int32))
    run = tfpart_train(model, live_tasks(3, ps).path, tmp_path / "ones.npz",
                       tmp_path / "out", "--mode", mode, "--steps", steps, "--batch-size",
                       256, "--lr", lr, "--momentum", 0, "--lambda0", 0, "--eval-every",
                       steps)
    assert run.returncode == 0, failure(run.stderr, tmp_path)
    delays = [int(u["delay"]) for u in rows(tmp_path / "out" / "updates.csv")]
    assert len(delays) == steps and max(delays) > 0  # the workers did overlap
    servers = set(Plan.load(tmp_path / "out" / "plan.json").assignment.values())
    assert len(servers) == ps
    for name, value in trained_weights(tmp_path / "out").items():
        np.testing.assert_allclose(value, -steps * lr / width, rtol=1e-4, err_msg=name)


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("local_tasks")
def test_async_training_goes_on_without_a_lost_worker(model_and_data, live_tasks, tmp_path):
    """Three workers, DDC-ASGD; worker 2 is killed after two evaluations: the run
    finishes on the other two, learns, and its checkpoint loads."""
    from tfpart.trainer.loop import trained_weights

    model, data = model_and_data
    code, stderr, out, killed_at = killed_mid_run(
        model, data, tmp_path, live_tasks(3, ps=1), lambda tasks: tasks.kill(2),
        "--mode", "ddc-asgd", "--steps", 600, "--batch-size", 16, "--lr", 0.05,
        "--eval-every", 20)
    assert code == 0, failure(stderr, out.parent)
    updates = rows(out / "updates.csv")
    assert len(updates) == 600
    assert "2" in {u["worker"] for u in updates}
    assert "2" not in {u["worker"] for u in updates[-100:]}
    evaluations = rows(out / "evaluations.csv")
    assert len(evaluations) > killed_at
    assert int(evaluations[-1]["update"]) == 600  # none lost with the worker, none extra
    assert float(evaluations[-1]["accuracy"]) > float(evaluations[0]["accuracy"]) + 0.3
    assert len(trained_weights(out)) == 4


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("local_tasks")
def test_sync_training_ends_naming_a_lost_worker(model_and_data, live_tasks, tmp_path):
    """The data-parallel compile, run synchronously: worker 1 killed mid-run ends it
    with one line naming the task and exit code 2; the checkpoint so far loads and
    holds the weights of an evaluation."""
    from tfpart.trainer.loop import trained_weights

    model, data = model_and_data
    code, stderr, out, _ = killed_mid_run(
        model, data, tmp_path, live_tasks(3, ps=1), lambda tasks: tasks.kill(1),
        "--mode", "sync", "--steps", 5000, "--batch-size", 8, "--eval-every", 10,
        wait=300)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "worker task 1" in lines[0], stderr[-2000:]
    weights = trained_weights(out)
    assert len(weights) == 4 and all(np.isfinite(w).all() for w in weights.values())
    assert not (out / "updates.csv").exists() or len(rows(out / "updates.csv")) < 5000


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("local_tasks")
def test_sync_mode_trains_with_the_data_parallel_compile(model_and_data, live_tasks,
                                                         tmp_path):
    """Sync runs the data-parallel compile: one replica per worker, and the held-out
    accuracy rises."""
    from tfpart.core.plan import Plan

    model, data = model_and_data
    out = tmp_path / "run"
    run = tfpart_train(model, live_tasks(2, ps=1).path, data, out, "--mode", "sync",
                       "--steps", 60, "--batch-size", 16, "--eval-every", 30)
    assert run.returncode == 0, failure(run.stderr, out.parent)
    plan = Plan.load(out / "plan.json")
    assert plan.algorithm == "data_parallel" and len(plan.replicas.devices) == 2
    evaluations = rows(out / "evaluations.csv")
    assert [int(e["update"]) for e in evaluations] == [0, 30, 60]
    assert float(evaluations[-1]["accuracy"]) > float(evaluations[0]["accuracy"]) + 0.2
    assert "sync: 60 updates" in run.stdout


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.parametrize("problem", ["no data", "no labels", "no ps", "bad mode",
                                     "negative shard size", "nothing held out", "an .npy",
                                     "a damaged zip"])
def test_bad_input_is_one_line_and_no_output(model_and_data, tmp_path, problem, capsys):
    from tfpart.cli import main

    model, data = model_and_data
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "cluster": {"worker": ["localhost:1"]},
        "devices": [{"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    mode = "async"
    if problem == "no data":
        data = tmp_path / "missing.npz"
    elif problem == "no labels":
        np.savez(tmp_path / "x_only.npz", x=np.zeros((4, 16), np.float32))
        data = tmp_path / "x_only.npz"
    elif problem == "bad mode":
        mode = "hogwild"
    elif problem == "an .npy":  # numpy.load gives an array: was a TypeError's traceback
        np.save(tmp_path / "x.npy", np.zeros((4, 16), np.float32))
        data = tmp_path / "x.npy"
    elif problem == "a damaged zip":  # was zipfile.BadZipFile's traceback
        data = tmp_path / "damaged.npz"
        data.write_bytes(b"PK\x03\x04" + bytes(60))
    extra = {"negative shard size": ["--min-shard-bytes", -1],
             "nothing held out": ["--eval-fraction", 0]}.get(problem, [])
    out = tmp_path / "out"
    try:  # in this process: no second TensorFlow import
        code = main(["train", str(model), "--cluster", str(cluster), "--data", str(data),
                     "-o", str(out), "--mode", mode, *map(str, extra)])
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    stderr = capsys.readouterr().err
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfpart: error:"), stderr
    expected = {"no data": "missing.npz: no such file", "no labels": "has no array 'y'",
                "no ps": "needs a 'ps' job", "bad mode": "invalid choice",
                "negative shard size": "--min-shard-bytes must be at least 0, not -1",
                "nothing held out": "--eval-fraction must be between 0 and 1",
                "an .npy": "x.npy: not an .npz file",
                "a damaged zip": "damaged.npz: not an .npz file"}[problem]
    assert expected in lines[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("local_tasks")
def test_async_training_ends_naming_a_lost_parameter_server(model_and_data, live_tasks,
                                                            tmp_path):
    """The weights are gone with their server: one line naming it, exit code 2, and the
    checkpoint written before loads."""
    from tfpart.trainer.loop import trained_weights

    model, data = model_and_data
    code, stderr, out, _ = killed_mid_run(
        model, data, tmp_path, live_tasks(2, ps=1), lambda tasks: tasks.kill(0, job="ps"),
        "--mode", "dc-asgd", "--steps", 20000, "--batch-size", 16, "--eval-every", 20)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "ps task 0" in lines[0], stderr[-2000:]
    assert len(trained_weights(out)) == 4
