"""Faults mid-way end in one line (issue 54): a task lost while ``cluster probe`` runs, a
truncated or corrupted checkpoint (the file named, and the cluster not blamed for it),
and Ctrl-C on any command (exit 130, nothing after the line that says so). Real
processes on loopback and real files, no mocks."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiles import DEFAULT_MODEL_DIR
from tests.e2e.test_multihost import FAST_LINKS
from tests.e2e.test_worker_safety import connections
from tfpart.local_workers import LocalWorkers, free_port

# about processes and files; one xdist worker builds the module's tasks and runs once
pytestmark = [pytest.mark.slow, pytest.mark.any_onednn, pytest.mark.xdist_group("faults")]
ROOT = Path(__file__).resolve().parents[2]
START_S = 180  # a task's start-up: TensorFlow's import on a loaded machine
FAULT_LIMIT_S = 60  # from a fault or a signal to the exit
INTERRUPTED = "tfpart: interrupted (SIGINT)"


class Tasks:
    """Two local workers shared by the module, started again when a test killed one."""

    def __init__(self, directory):
        self.directory, self.workers = directory, None

    def live(self):
        if self.workers is None or any(p.poll() is not None for p in self.workers.processes):
            if self.workers is not None:
                self.workers.stop()
            self.workers = LocalWorkers(2, self.directory, links=FAST_LINKS, pin=False,
                                        timeout=START_S)
        return self.workers

    def port(self, task):
        return int(self.live().cluster["cluster"]["worker"][task].rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    shared = Tasks(tmp_path_factory.mktemp("tasks"))
    yield shared
    if shared.workers is not None:
        shared.workers.stop()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The shipped example compiled (as ``tfpart compile`` does: the fastest strategy)
    for two devices named as the local workers' are; its output folder."""
    from tfpart.compile import compile_model

    folder = tmp_path_factory.mktemp("compiled")
    cluster = folder / "two.json"
    cluster.write_text(json.dumps({"links": FAST_LINKS, "devices": [
        {"name": f"/job:worker/task:{k}/device:CPU:0", "kind": "cpu"} for k in range(2)]}))
    compile_model(DEFAULT_MODEL_DIR, cluster, folder / "out", strategy="auto")
    return folder / "out"


def started(*args, log):
    """``tfpart ARGS`` in a process of its own, stdout and stderr in one pipe (so that
    what comes after what is seen); TensorFlow's log to ``log``."""
    return subprocess.Popen([sys.executable, "-m", "tfpart.cli", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TFPART_TF_LOG": str(log)})


def tfpart(*args, log):
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TFPART_TF_LOG": str(log)})
    return done.returncode, done.stdout, done.stderr


def wait_until(ready, process, timeout=START_S):
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the command never got under way"
        time.sleep(0.1)


def tensorflow_loaded(pid):
    """Whether process ``pid`` has TensorFlow's library mapped: its import is under way."""
    try:
        return "_pywrap_tensorflow_internal" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def interrupted(process):
    """SIGINT ``process`` now; its exit code, its output and the seconds it took."""
    start = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=FAULT_LIMIT_S)
    finally:
        process.kill()
    return process.returncode, output, time.monotonic() - start


def check_the_last_line(code, output, line=INTERRUPTED):
    lines = [text for text in output.splitlines() if text.strip()]
    assert (code, lines[-1:]) == (130, [line]), output[-3000:]
    assert lines.count(line) == 1 and "Traceback" not in output, output[-3000:]


def one_line(stderr):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfpart: error: "), stderr[-3000:]
    return lines[0]


# -- Ctrl-C ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sync_run(tasks, tmp_path_factory):
    """A sync ``tfpart train`` on the two workers, Ctrl-C'd once it has evaluated twice
    (a checkpoint each time): (exit code, output, seconds to exit, the command's
    arguments, its output folder)."""
    from examples.models import blobs, export_classifier_step

    folder = tmp_path_factory.mktemp("train")
    model = export_classifier_step(folder / "model", features=16, classes=4, hidden=32)
    out = folder / "out"
    args = ["train", model, "--cluster", tasks.live().path, "--data",
            blobs(folder / "blobs.npz"), "--mode", "sync", "--steps", 10**6,
            "--eval-every", 5]
    process = started(*args, "-o", out, log=folder / "train.log")

    from tfpart.trainer.loop import checkpointed_update

    def evaluated_twice():  # and checkpointed past update 0: else the run removes its output
        path = out / "evaluations.csv"
        return path.exists() and len(path.read_text().splitlines()) >= 3 and \
            (checkpointed_update(out) or 0) > 0  # a header, two rows
    wait_until(evaluated_twice, process)
    return (*interrupted(process), args, out)


def test_ctrl_c_on_a_sync_train_run_is_the_last_line(sync_run):
    """Before, TensorFlow's teardown of the cluster connection logged after the line."""
    code, output, seconds, _, _ = sync_run
    check_the_last_line(code, output)
    assert seconds < FAULT_LIMIT_S
    print(f"sync train: exit 130 {seconds:.1f} s after SIGINT")


@pytest.mark.parametrize("command", ["compile", "run", "worker", "cluster probe"])
def test_ctrl_c_on_a_command_under_way_is_the_last_line(command, tasks, compiled, tmp_path):
    out = compiled
    if command == "cluster probe":
        args = ["cluster", "probe", tasks.live().path, "-o", tmp_path / "probed.json",
                "--rounds", 1000, "--repeats", 5]
    else:
        cluster = tmp_path / "one.json"
        cluster.write_text(json.dumps({"cluster": {"worker": [f"localhost:{free_port()}"]},
                                       "devices": [{"name": "/job:worker/task:0/device:CPU:0",
                                                    "kind": "cpu"}]}))
        args = {"compile": ["compile", "-o", tmp_path / "out"],
                "run": ["run", out, "--repeats", 10**7],
                "worker": ["worker", "--cluster", cluster, "--task", 0]}[command]
    process = started(*args, log=tmp_path / "tf.log")
    if command == "cluster probe":  # connected to the tasks, probing
        port = tasks.port(1)
        wait_until(lambda: connections(process.pid, port) >= 2, process)
        time.sleep(1)
    else:  # importing TensorFlow (a worker's start-up), or past it
        wait_until(lambda: tensorflow_loaded(process.pid), process)
        time.sleep(0 if command == "worker" else 1.5)
    code, output, seconds = interrupted(process)
    check_the_last_line(code, output)
    assert seconds < FAULT_LIMIT_S
    assert not (tmp_path / "out").exists() and not (tmp_path / "probed.json").exists()


# -- checkpoints ---------------------------------------------------------------------------

def truncated(prefix):
    data = Path(f"{prefix}.data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:len(data.read_bytes()) // 2])
    return data


def corrupted(prefix, name=".index"):
    """Flip bytes in the middle of a checkpoint's file (its index by default)."""
    path = Path(f"{prefix}{name}")
    content = bytearray(path.read_bytes())
    for at in range(len(content) // 2, len(content) // 2 + 8):
        content[at] ^= 0x55
    path.write_bytes(bytes(content))
    return path


def test_a_corrupted_index_is_the_model_s_fault_not_the_cluster_s(tasks, compiled, tmp_path):
    """Before, ``run --cluster`` called it a failed run across the cluster file."""
    out = compiled
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    index = corrupted(broken / "variables" / "variables")
    workers = tasks.live()
    code, stdout, stderr = tfpart("run", broken, "--cluster", workers.path,
                                  log=tmp_path / "tf.log")
    assert (code, stdout) == (2, ""), stderr[-3000:]
    line = one_line(stderr)
    assert line.startswith(f"tfpart: error: {index}: cannot read the variables: not a "
                           "checkpoint index TensorFlow can read, or corrupt (")
    assert str(workers.path) not in line


def test_resuming_from_a_truncated_checkpoint_is_one_line(sync_run, tasks, tmp_path):
    """Before, the restore's ``IndexError: Read less bytes than requested`` traceback."""
    from tfpart.trainer.loop import checkpointed_update

    _, _, _, args, out = sync_run
    tasks.live()  # the run it resumes needs its tasks
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    data = truncated(copy / "checkpoint" / f"ckpt-{checkpointed_update(copy)}")
    code, _, stderr = tfpart(*args, "-o", copy, log=tmp_path / "tf.log")
    assert code == 2, stderr[-3000:]
    assert one_line(stderr).startswith(f"tfpart: error: {data}: cannot read the variables: "
                                       "the file is truncated")


@pytest.mark.parametrize("fault, file, words", [
    ("corrupt index", ".index", "not a checkpoint index TensorFlow can read, or corrupt"),
    ("no index", ".index", "no such file"),
    ("no data", ".data-*", "no data file (variables.index lists values in one)"),
    ("corrupt data", ".data-00000-of-00001", ": Checksum does not match"),
    ("truncated data", ".data-00000-of-00001", "the file is truncated (it ends before the "
                                               "value of "),
    ("data a FIFO", ".data-00000-of-00001", "not a regular file (a FIFO)"),  # not a hang
])
def test_what_is_wrong_with_a_checkpoint_names_its_file(fault, file, words, tmp_path):
    from tfpart.checkpoints import check_checkpoint_input
    from tfpart.core.errors import ModelError

    shutil.copytree(DEFAULT_MODEL_DIR / "variables", tmp_path / "variables")
    prefix = tmp_path / "variables" / "variables"
    if fault == "corrupt index":
        corrupted(prefix)
    elif fault == "no index":
        Path(f"{prefix}.index").unlink()
    elif fault == "no data":
        Path(f"{prefix}.data-00000-of-00001").unlink()
    elif fault == "truncated data":
        truncated(prefix)
    elif fault == "data a FIFO":
        Path(f"{prefix}.data-00000-of-00001").unlink()
        os.mkfifo(f"{prefix}.data-00000-of-00001")
    else:
        corrupted(prefix, ".data-00000-of-00001")
    with pytest.raises(ModelError) as error:
        check_checkpoint_input(prefix)
    assert str(error.value).startswith(f"{prefix}{file}: ") and words in str(error.value)


# -- a task lost (last: the tests before share the tasks it kills) ------------------------

def test_a_task_killed_during_cluster_probe_is_one_line(tasks, tmp_path):
    """Before, TensorFlow's UnavailableError came out as a 35-line traceback."""
    workers, port = tasks.live(), tasks.port(1)
    probed = tmp_path / "probed.json"
    process = started("cluster", "probe", workers.path, "-o", probed, "--rounds", 1000,
                      "--repeats", 5, log=tmp_path / "tf.log")
    try:
        wait_until(lambda: connections(process.pid, port) >= 2, process)
        time.sleep(1)  # probing
        workers.kill(1)
        start = time.monotonic()
        output, _ = process.communicate(timeout=FAULT_LIMIT_S)
        seconds = time.monotonic() - start
    finally:
        process.kill()
    assert process.returncode == 2, output[-3000:]
    line = one_line(output)
    assert f"{workers.path}: worker task 1 at localhost:{port} is not" in line
    assert not probed.exists()
    print(f"task killed mid-probe: exit 2 after {seconds:.1f} s: {line}")
