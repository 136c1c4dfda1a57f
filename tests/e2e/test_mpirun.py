"""``mpirun -n 3 tfpart worker --cluster cluster.json`` with Open MPI from Debian's
``openmpi-bin``: the three ranks agree on a cluster file with no address written by
hand; the example compiled for it verifies on those tasks; 20 synchronous
data-parallel training steps on them end with the weights of plain SGD over the same
batches; a rank killed mid-run takes the launch down with no task left behind; and a
launch whose ranks would share one address ends with one line naming them."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from profiles import DEFAULT_MODEL_DIR
from tests.e2e.test_async_training import sgd_by_hand, tfpart_train
from tests.test_launchers import MPI_AS_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn, pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="Open MPI (Debian's openmpi-bin) is not installed; .ci/run installs it")]


def mpirun(cluster, *extra, ranks=3):
    """``mpirun -n ranks tfpart worker --cluster cluster``, in its own process group."""
    command = ["mpirun", "--oversubscribe", "-n", str(ranks), sys.executable, "-m",
               "tfpart.cli", "worker", "--cluster", str(cluster), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env={**os.environ, **MPI_AS_ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"})


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def serving_pids(cluster):
    return [json.loads(path.read_text())["pid"]
            for path in sorted(cluster.with_name(f"{cluster.name}.tasks").glob("*.serving.*"))]


@pytest.fixture
def launch(tmp_path):
    cluster = tmp_path / "cluster.json"
    process = mpirun(cluster)
    deadline = time.time() + 180
    while not cluster.exists():
        assert process.poll() is None and time.time() < deadline, process.communicate()
        time.sleep(0.5)
    yield cluster, process
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_mpirun_tasks_compile_verify_train_and_go_down_together(launch, tmp_path):
    from examples.models import blobs, export_classifier_step
    from tfpart.trainer.loop import trained_weights

    cluster, process = launch
    data = json.loads(cluster.read_text())
    addresses = data["cluster"]["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert [d["name"] for d in data["devices"]] == [
        f"/job:worker/task:{k}/device:CPU:0" for k in range(3)]
    out = tmp_path / "compiled"
    tfpart = [sys.executable, "-m", "tfpart.cli"]
    done = subprocess.run([*tfpart, "compile", "--cluster", str(cluster), "--batch-size", "4",
                           "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run([*tfpart, "verify", str(DEFAULT_MODEL_DIR), str(out), "--cluster",
                           str(cluster)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Outputs equal" in done.stdout, done.stderr[-2000:]
    assert "0 on another device" in done.stdout

    model = export_classifier_step(tmp_path / "model", features=16, classes=4, hidden=32)
    samples = blobs(tmp_path / "blobs.npz")
    run = tfpart_train(model, cluster, samples, tmp_path / "run", "--mode", "sync",
                       "--steps", 20, "--batch-size", 3, "--seed", 3, "--eval-every", 10)
    assert run.returncode == 0, run.stderr[-2000:]
    expected = sgd_by_hand(model, samples, 20, 9, 0.05, 0.0, seed=3)  # 3 samples x 3 ranks
    got = trained_weights(tmp_path / "run")
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)

    pids = serving_pids(cluster)
    assert len(pids) == 3 and all(map(alive, pids))
    os.kill(pids[1], signal.SIGKILL)
    process.wait(timeout=60)  # mpirun aborts the launch: the others are stopped
    assert process.returncode != 0
    deadline = time.time() + 30
    while any(map(alive, pids)) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, pids))


def test_ranks_that_would_share_an_address_end_the_launch_naming_them(tmp_path):
    from tfpart.local_workers import free_port

    cluster = tmp_path / "cluster.json"
    process = mpirun(cluster, "--port", str(free_port()))
    _, stderr = process.communicate(timeout=180)
    assert process.returncode != 0 and not cluster.exists()
    # mpirun may interleave the ranks' lines: count whole messages in the whole text
    named = re.findall(r"tfpart: error: rank \d of the Open MPI launch: ranks \d and \d of "
                       r"the Open MPI launch would both serve on 127\.0\.0\.1:\d+: give each "
                       r"task of a host its own --port", stderr)
    assert named and len(named) == stderr.count("tfpart: error:"), stderr
