"""Compiled (pipelined) models run across real ``tfpart worker`` processes on loopback,
through TensorFlow's distributed runtime; a worker that is absent, dies mid-run, or
cannot get its port ends the run with a one-line error and exit code 2, quickly."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tfpart.compile import compile_model
from tfpart.local_workers import LocalWorkers, free_port, worker_command

# one xdist worker starts the module's two- and three-server clusters, once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multihost")]
FAST_LINKS = {"cross_host": {"bandwidth": "50GB/s", "latency": "1us"}}
FAULT_LIMIT_S = 60


def tfpart(*args, timeout=300, **kwargs):
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    return done, time.monotonic() - start


def one_line_error(stderr):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("tfpart: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    with LocalWorkers(2, tmp_path_factory.mktemp("two"), links=FAST_LINKS) as workers:
        yield workers


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    with LocalWorkers(3, tmp_path_factory.mktemp("three"), links=FAST_LINKS) as workers:
        yield workers


def check_verified(done):
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "Outputs equal" in done.stdout
    assert ", 0 on another device; 0 variables misplaced" in done.stdout


# oneDNN changes the model's fusions, not how its micro-batches cross the servers: the
# run with oneDNN off (CI's second pass) repeats one micro-batch count
# (1: no cut; 8: more micro-batches than the 7 rows verified)
@pytest.mark.parametrize("microbatches", [pytest.param(1, marks=pytest.mark.any_onednn), 4,
                                          pytest.param(8, marks=pytest.mark.any_onednn)])
def test_pipelined_mlp_runs_across_two_servers(microbatches, exported, two_workers, tmp_path):
    model, out = exported("mlp_module"), tmp_path / "out"
    result = compile_model(model, two_workers.path, out, batch_size=16,
                           microbatches=microbatches)
    tasks = {device.split("/device")[0] for device in result.plan.assignment.values()}
    assert len(tasks) == 2  # both tasks hold stages
    done, _ = tfpart("verify", model, out, "--cluster", two_workers.path, "--batch-size", 7)
    check_verified(done)
    assert "/job:worker/replica:0/task:0" in done.stdout
    assert "/job:worker/replica:0/task:1" in done.stdout


@pytest.mark.any_onednn  # about timing plans in turn, not kernels
def test_plans_timed_in_turn_on_one_connection(exported, two_workers, tmp_path):
    model = exported("mlp_module")
    placed = compile_model(model, two_workers.path, tmp_path / "placed", batch_size=16)
    piped = compile_model(model, two_workers.path, tmp_path / "piped", batch_size=16,
                          microbatches=2)
    done = subprocess.run([sys.executable, "-m", "benchmarks.run_compiled", placed.out,
                           piped.out, "--cluster", two_workers.path, "--rounds", "2",
                           "--repeats", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    times = json.loads(done.stdout.strip().splitlines()[-1])["times_s"]
    assert sorted(times) == sorted([str(placed.out), str(piped.out)])
    assert all(len(seconds) == 6 and min(seconds) > 0 for seconds in times.values())


# Grappler's convolution fusions in both oneDNN modes (a transformer's pipeline is held
# to the original on logical devices: tests/e2e/test_pipeline.py)
@pytest.mark.parametrize("name", ["residual_cnn"])
def test_pipelined_models_run_across_three_servers(name, exported, three_workers, tmp_path):
    model, out = exported(name), tmp_path / "out"
    result = compile_model(model, three_workers.path, out, batch_size=16, microbatches=4)
    assert len(set(result.plan.stages.values())) >= 2
    for batch in (7, 16):
        done, _ = tfpart("verify", model, out, "--cluster", three_workers.path,
                         "--batch-size", batch)
        check_verified(done)
    done, _ = tfpart("run", out, "--cluster", three_workers.path, "--repeats", 3, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["samples_per_s"] > 0


@pytest.mark.any_onednn  # about processes, not kernels
def test_absent_worker_is_a_clean_error(exported, tmp_path):
    with LocalWorkers(1, tmp_path) as one:
        cluster = dict(one.cluster)
        missing = free_port()
        cluster["cluster"] = {"worker": [*cluster["cluster"]["worker"], f"localhost:{missing}"]}
        cluster["devices"] = [*cluster["devices"],
                              {"name": "/job:worker/task:1/device:CPU:0", "kind": "cpu"}]
        cluster["links"] = FAST_LINKS
        path = tmp_path / "absent.json"
        path.write_text(json.dumps(cluster))
        model, out = exported("mlp_module"), tmp_path / "out"
        compile_model(model, path, out, batch_size=16, microbatches=2)
        done, seconds = tfpart("verify", model, out, "--cluster", path)
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert f"task 1 at localhost:{missing} is not reachable" in line and str(path) in line
    assert seconds < FAULT_LIMIT_S
    print(f"absent worker: exit 2 after {seconds:.1f} s")


@pytest.mark.any_onednn  # about processes, not kernels
@pytest.mark.parametrize("model, how", [
    ("mlp_module", {"microbatches": 2}),  # pipelined
    ("mlp_module", {"algorithm": "data_parallel", "options": {"replicas": 2}}),
    # a training step whose replicas all-reduce their gradients: the worker dies while
    # the other waits in a collective
    ("training_step", {"algorithm": "data_parallel", "signature": "train_step",
                       "options": {"replicas": 2, "reduce": "all_reduce"}})])
def test_worker_killed_mid_run_is_a_clean_error(model, how, exported, tmp_path):
    with LocalWorkers(2, tmp_path, links=FAST_LINKS) as workers:
        model, out = exported(model), tmp_path / "out"
        plan = compile_model(model, workers.path, out, batch_size=16, **how).plan
        assert len({plan.assignment[op] for op in plan.stages} |
                   set(plan.replicas.devices if plan.replicas else ())) == 2
        reduce = how.get("options", {}).get("reduce")
        if reduce:
            assert plan.replicas.reduce == reduce
            assert b"CollectiveReduceV2" in (out / "saved_model.pb").read_bytes()
        run = subprocess.Popen([sys.executable, "-m", "tfpart.cli", "run", str(out),
                                "--cluster", str(workers.path), "--repeats", "10000000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(12)  # past start-up: the model is loaded and being called
        assert run.poll() is None, run.communicate()
        workers.kill(1)
        killed = time.monotonic()
        try:
            _, stderr = run.communicate(timeout=FAULT_LIMIT_S)
        finally:
            run.kill()
        seconds = time.monotonic() - killed
    assert run.returncode == 2
    line = one_line_error(stderr)
    assert "task 1" in line
    assert seconds < FAULT_LIMIT_S
    print(f"worker killed mid-run: exit 2 {seconds:.1f} s after the kill: {line}")


@pytest.mark.any_onednn  # about processes, not kernels
def test_port_already_taken_is_a_clean_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("localhost", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "c.json"
        path.write_text(json.dumps({"cluster": {"worker": [f"localhost:{port}"]}, "devices": [
            {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
        done, seconds = tfpart("worker", "--cluster", path, "--task", 0, timeout=FAULT_LIMIT_S)
    assert done.returncode == 2
    assert "already in use" in one_line_error(done.stderr)
    assert seconds < FAULT_LIMIT_S


@pytest.mark.any_onednn  # about processes, not kernels
def test_worker_started_from_tf_config(tmp_path):
    port = free_port()
    config = {"cluster": {"worker": [f"localhost:{port}"]}, "task": {"type": "worker",
                                                                    "index": 0}}
    command = worker_command("unused", 0)[:4]  # python -m tfpart.cli worker
    process = subprocess.Popen(command, env={**os.environ, "TF_CONFIG": json.dumps(config)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(timeout=30)
