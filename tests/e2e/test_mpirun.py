"""``mpirun -n 3 tfpart worker --cluster cluster.json`` with Open MPI from Debian's
``openmpi-bin``: the three ranks agree on a cluster file with no address written by
hand; the example compiled for it verifies on those tasks; 20 synchronous
data-parallel training steps on them end with the weights of plain SGD over the same
batches; a rank killed mid-run takes the launch down with no task left behind; and a
launch whose ranks would share one address ends with one line naming them.

MPICH is not installed here: its launches are simulated as its Hydra makes them (the
environment and the PMI-1 answers of ``tests.test_launchers.FakeHydra``), with real
``tfpart worker`` processes: two launches at once beside a stale one."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from profiles import DEFAULT_MODEL_DIR
from tests.e2e.test_async_training import sgd_by_hand, tfpart_train
from tests.test_launchers import MPI_AS_ROOT, FakeHydra, publish_report
from tfpart.core.output_files import CLUSTER_FILE, write_json_output
from tfpart.launcher import LaunchedTask
from tfpart.rendezvous import Launch, folder_name, tasks_folder

pytestmark = [pytest.mark.slow, pytest.mark.any_onednn]
needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="Open MPI (Debian's openmpi-bin) is not installed; .ci/run installs it")


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
    """The tasks of ``tfpart worker --cluster cluster`` (not the mpirun that started
    them), by /proc: the launch removed its reports once every task served."""
    pids = []
    for entry in os.scandir("/proc"):
        try:
            with open(os.path.join(entry.path, "cmdline"), "rb") as file:
                command = file.read().decode(errors="replace").split("\0")
        except OSError:
            continue  # not a process, or gone
        if command[1:6] == ["-m", "tfpart.cli", "worker", "--cluster", str(cluster)]:
            pids.append(int(entry.name))
    return pids


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


@needs_mpirun
def test_mpirun_tasks_compile_verify_train_and_go_down_together(launch, tmp_path):
    from examples.models import blobs, export_classifier_step
    from tfpart.trainer.loop import trained_weights

    cluster, process = launch
    data = json.loads(cluster.read_text())
    assert data["written_by"]["command"] == "worker"
    assert not tasks_folder(cluster).exists()  # the launch removed its folder
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


@needs_mpirun
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
    # a rank that saw another fail first says so (repeating its line, or that mpirun
    # stopped it), or that rank 0 ended the launch
    relayed = re.findall(r"tfpart: error: rank \d of the Open MPI launch: (?:rank \d of the "
                         r"Open MPI launch \S+ failed: (?:ranks \d and \d of the Open MPI "
                         r"launch would both serve|interrupted)|\S+: rank 0 of the "
                         r"Open MPI launch \S+ ended it)", stderr)
    assert named and len(named) + len(relayed) == stderr.count("tfpart: error:"), stderr
    left = sorted(str(path) for path in tasks_folder(cluster).rglob("*"))
    assert not tasks_folder(cluster).exists(), (left, stderr)  # each task removed its files


def test_simulated_mpich_launches_at_once_beside_a_stale_one_each_agree_alone(tmp_path):
    cluster = tmp_path / "cluster.json"
    # an earlier launch's cluster file, and the folder of one killed half-way whose
    # rank 0 had reported a port that the next launch of old announced as its own
    write_json_output(cluster, {"name": "an earlier launch", "cluster": {"worker": [
        "127.0.0.1:7000"]}, "devices": [{"name": "/job:worker/task:0/device:CPU:0",
                                         "kind": "cpu"}]}, CLUSTER_FILE, command="worker")
    crashed = Launch(LaunchedTask("MPICH", 0, 2, 0), "kvs_1_0_1_node1",
                     tasks_folder(cluster) / folder_name("kvs_1_0_1_node1"))
    crashed.folder.mkdir(parents=True)
    publish_report(crashed, 0, address="127.0.0.1:7000")
    launches = [FakeHydra("kvs_4242_0_1804289383_node1", 2),  # three TensorFlow processes
                FakeHydra("kvs_4250_0_846930886_node1", 1)]   # on two cores: 20 s
    workers, outputs = [], []
    for hydra in launches:
        for rank in range(hydra.size):
            environ = hydra.environ(rank)
            fd = int(environ["PMI_FD"])
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "tfpart.cli", "worker", "--cluster", str(cluster)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, pass_fds=(fd,),
                env={**os.environ, **environ, "TF_CPP_MIN_LOG_LEVEL": "3"}))
            os.close(fd)  # the rank's, now
            outputs.append([])
            threading.Thread(target=outputs[-1].extend, args=(workers[-1].stdout,),
                             daemon=True).start()
    try:
        deadline = time.time() + 300
        while sum("tfpart worker: wrote" in line for out in outputs for line in out) < 2:
            assert all(w.poll() is None for w in workers) and time.time() < deadline, outputs
            time.sleep(0.5)
        written = json.loads(cluster.read_text())
        assert sorted(tasks_folder(cluster).iterdir()) == [crashed.folder]
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
    outputs = ["".join(out) for out in outputs]
    served = [re.findall(r"grpc://(\S+) serving worker task (\d)", out) for out in outputs]
    assert [task for tasks in served for _, task in tasks] == ["0", "1", "0"]
    addresses = [[served[0][0][0], served[1][0][0]], [served[2][0][0]]]
    assert len(set(addresses[0] + addresses[1])) == 3
    assert "127.0.0.1:7000" not in addresses[0] + addresses[1]
    latest = [k for k in range(2) if launches[k].kvsname in written["name"]]
    assert len(latest) == 1 and written["cluster"]["worker"] == addresses[latest[0]]
    assert [out.count("tfpart worker: wrote") for out in outputs] == [1, 0, 1]
    assert (crashed.folder / "address.0.json").exists()  # another launch's: left alone
