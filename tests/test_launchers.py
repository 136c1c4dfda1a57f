"""Tasks a launcher starts (``tfpart.launcher``): the environments Open MPI, MPICH and
SLURM's ``srun`` set, read into rank, size and hosts (the SLURM ones as a real ``srun``
sets them, in several node-list forms; the Open MPI one from a real ``mpirun``); the
tasks' rendezvous; and ``tfpart cluster detect`` on this machine. The launch of real
workers by ``mpirun`` is in tests/e2e/test_mpirun.py."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.test_cli_errors import assert_clean_failure, run_cli
from tfpart.core.errors import TfpartError
from tfpart.launcher import LaunchedTask, launched_task
from tfpart.rendezvous import cluster_of, report, wait_for

# What srun sets, as seen in real allocations: `srun -N2 -n4` on node01..node02, and
# `srun -n5` over three nodes of two partitions' naming with uneven tasks per node.
SRUN_TWO_NODES = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
                  "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242",
                  "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[01-02]",
                  "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)",
                  "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "node02"}
SRUN_UNEVEN = {"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0",
               "SLURM_JOB_NODELIST": "gpu-[1-2],cpu7", "SLURM_TASKS_PER_NODE": "2(x2),1"}


def test_srun_tasks_and_their_hosts():
    task = launched_task(SRUN_TWO_NODES)
    assert (task.launcher, task.rank, task.size, task.local_rank) == ("slurm", 2, 4, 0)
    assert task.hosts == ("node01", "node01", "node02", "node02") and task.host == "node02"
    task = launched_task(SRUN_UNEVEN)  # no step variables: the job's
    assert task.hosts == ("gpu-1", "gpu-1", "gpu-2", "gpu-2", "cpu7")
    assert task.host == "cpu7"  # from the block distribution, without SLURMD_NODENAME


@pytest.mark.parametrize("changed,words", [
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "tasks for 3 nodes but the node list has 2"),
    ({"SLURM_STEP_NODELIST": "node[01-"}, "cannot read the node list"),
    ({"SLURM_STEP_NUM_TASKS": "3"}, "is 3 but the nodes hold 4 tasks"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID: is 'x', not a number"),
    ({"SLURM_PROCID": "4"}, "rank 4 of 4"),
])
def test_a_malformed_srun_environment_is_named(changed, words):
    with pytest.raises(TfpartError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        launched_task({**SRUN_TWO_NODES, **changed})


def test_mpich_tasks():
    task = launched_task({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1"})
    assert task == LaunchedTask("MPICH", 1, 3, 1)


@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="Open MPI (Debian's openmpi-bin) is not installed; .ci/run "
                    "installs it")
def test_the_tasks_a_real_mpirun_starts(tmp_path):
    # each rank writes a file of its own: mpirun interleaves the ranks' output lines
    code = ("import json, os, sys; from pathlib import Path; "
            "from tfpart.launcher import launched_task; t = launched_task(os.environ); "
            "Path(sys.argv[1], f'rank{t.rank}.json').write_text("
            "json.dumps([t.launcher, t.rank, t.size]))")
    done = subprocess.run(["mpirun", "--oversubscribe", "-n", "3", sys.executable, "-c", code,
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **MPI_AS_ROOT})
    assert done.returncode == 0, done.stderr
    tasks = sorted(json.loads(path.read_text()) for path in tmp_path.glob("rank*.json"))
    assert tasks == [["Open MPI", rank, 3] for rank in range(3)]


# mpirun refuses to run as root (as CI does) unless told both of these
MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_the_tasks_wait_for_each_other_and_name_the_one_missing(tmp_path):
    for rank in (0, 2):
        report(tmp_path, "launch7", rank, "address", {
            "address": f"127.0.0.1:{7000 + rank}", "kinds": {},
            "devices": [{"name": f"/job:worker/task:{rank}/device:CPU:0", "kind": "cpu"}]})
    with pytest.raises(TfpartError, match="rank 1 of the Open MPI launch did not report"):
        wait_for(tmp_path, "launch7", 3, "address", 0.3, "Open MPI")
    report(tmp_path, "launch6", 1, "address", {})  # another launch's file is not read
    with pytest.raises(TfpartError, match="rank 1 "):
        wait_for(tmp_path, "launch7", 3, "address", 0.3, "Open MPI")
    report(tmp_path, "launch7", 1, "address", {
        "address": "127.0.0.1:7001", "kinds": {},
        "devices": [{"name": "/job:worker/task:1/device:CPU:0", "kind": "cpu"}]})
    cluster = cluster_of(wait_for(tmp_path, "launch7", 3, "address", 0.3, "Open MPI"),
                         "Open MPI")
    assert cluster["cluster"]["worker"] == [f"127.0.0.1:{7000 + r}" for r in range(3)]


def test_cluster_detect_writes_a_file_the_example_compiles_on(capsys, tmp_path):
    from tfpart.cli import main

    path = tmp_path / "cluster.json"
    assert main(["cluster", "detect", "-o", str(path)]) == 0, capsys.readouterr().err
    data = json.loads(path.read_text())
    assert [d["kind"] for d in data["devices"]][:1] == ["cpu"]
    assert data["devices"][0]["memory"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf(
        "SC_PHYS_PAGES")
    assert_clean_failure(*run_cli(capsys, "cluster", "detect", "-o", str(path)),
                         "exists; give --force")
    out = tmp_path / "out"
    assert main(["compile", "--cluster", str(path), "--batch-size", "2", "-o", str(out),
                 "--verify"]) == 0, capsys.readouterr().err
    assert (out / "plan.json").exists()


@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="Open MPI (Debian's openmpi-bin) is not installed; .ci/run "
                    "installs it")
def test_cluster_detect_under_mpirun_writes_every_tasks_devices_once(tmp_path):
    path = tmp_path / "cluster.json"
    done = subprocess.run(["mpirun", "--oversubscribe", "-n", "2", sys.executable, "-m",
                           "tfpart.cli", "cluster", "detect", "-o", str(path)],
                          capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, **MPI_AS_ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr
    data = json.loads(path.read_text())
    assert [d["name"] for d in data["devices"]] == [
        f"/job:worker/task:{rank}/device:CPU:0" for rank in range(2)]
    assert data["name"].startswith("the 2 tasks Open MPI started")
    assert done.stdout.count("Wrote ") == 1  # rank 0 alone
