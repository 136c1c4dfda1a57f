"""Tasks a launcher starts (``tfpart.launcher``): the environments Open MPI, MPICH and
SLURM's ``srun`` set, read into rank, size and hosts (the SLURM ones as a real ``srun``
sets them, in several node-list forms; the Open MPI one from a real ``mpirun``); the
tasks' rendezvous; and ``tfpart cluster detect`` on this machine. The launch of real
workers by ``mpirun`` is in tests/e2e/test_mpirun.py."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_cli_errors import assert_clean_failure, run_cli
from tfpart.core.errors import TfpartError
from tfpart.core.output_files import CLUSTER_FILE, check_output_file, write_json_output
from tfpart.launcher import LaunchedTask, launched_task
from tfpart.rendezvous import (Launch, agree_on_cluster, announce_serving, cluster_of,
                               folder_name, join_launch, launch_id, leaving_on_failure,
                               tasks_folder, wait_for)

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
    task = LaunchedTask("Open MPI", 0, 3, 0)
    launch = join_launch(task, tmp_path / "cluster.json", {"PMIX_NAMESPACE": "7"}, 1)
    for rank in (0, 2):
        publish_report(launch, rank)
    with pytest.raises(TfpartError, match="rank 1 of the Open MPI launch did not report"):
        wait_for(launch, "address", 0.3)
    other = Launch(LaunchedTask("Open MPI", 1, 3, 0), "6", tasks_folder(
        tmp_path / "cluster.json") / folder_name("6"))
    other.folder.mkdir()
    publish_report(other, 1)  # another launch's report is not read
    with pytest.raises(TfpartError, match="rank 1 "):
        wait_for(launch, "address", 0.3)
    publish_report(launch, 1)
    cluster = cluster_of(wait_for(launch, "address", 0.3), "Open MPI")
    assert cluster["cluster"]["worker"] == [f"127.0.0.1:{7000 + r}" for r in range(3)]


def publish_report(launch, rank, stage="address", **changed):
    """Publish rank ``rank``'s report for ``stage`` in ``launch``'s folder, as that
    rank would (its address 127.0.0.1:7000+rank, one CPU), with ``changed`` fields."""
    report = {"rank": rank, "pid": os.getpid(), "host": "localhost",
              "address": f"127.0.0.1:{7000 + rank}", "kinds": {},
              "devices": [{"name": f"/job:worker/task:{rank}/device:CPU:0", "kind": "cpu"}],
              **changed}
    launch.publish(launch.path(stage, rank), report)


class FakeHydra:
    """MPICH's Hydra as the ranks of one launch see it: the environment its proxy gives
    each rank (the variables MPICH 4.0.2's hydra_pmi_proxy set, checked with a real
    ``mpiexec.hydra -n 2 env``) and, on the PMI-1 socket it passes in ``PMI_FD``, its
    answers to ``PMI_Init``, ``PMI_KVS_Get_my_name`` and ``PMI_Finalize``, word for word
    as that Hydra gave them, for a launch whose key-value space is ``kvsname``."""

    ANSWERS = {b"cmd=init": b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
               b"cmd=finalize": b"cmd=finalize_ack\n"}

    def __init__(self, kvsname, size, answer=True):
        self.kvsname, self.size, self.answer = kvsname, size, answer
        self.asked = []

    def environ(self, rank):
        """Rank ``rank``'s environment; its ``PMI_FD`` is a socket open in this process
        (inheritable: pass it to a child with ``pass_fds``), answered by a thread."""
        ours, theirs = socket.socketpair()
        threading.Thread(target=self._serve, args=(ours,), daemon=True).start()
        fd = theirs.detach()
        os.set_inheritable(fd, True)
        return {"PMI_RANK": str(rank), "PMI_SIZE": str(self.size), "PMI_FD": str(fd),
                "MPI_LOCALRANKID": str(rank), "MPI_LOCALNRANKS": str(self.size),
                "HYDI_CONTROL_FD": "7", "MPIR_CVAR_CH3_INTERFACE_HOSTNAME": "localhost",
                "GFORTRAN_UNBUFFERED_PRECONNECTED": "y"}

    def _serve(self, channel):
        with channel, channel.makefile("rb") as lines:
            for line in lines:
                command = line.split()[0]
                self.asked.append(command.decode())
                if not self.answer:
                    continue
                channel.sendall(self.ANSWERS.get(command) or
                                b"cmd=my_kvsname kvsname=%s\n" % self.kvsname.encode())
                if command == b"cmd=finalize":
                    return


def run_launch(cluster_file, environs, timeout=10.0, force=False):
    """Every rank of one launch (``environs``: each rank's environment) as a thread
    doing what ``tfpart worker --cluster cluster_file`` does, with one CPU each and no
    TensorFlow server; each rank's agreed cluster, or the error that ended it."""
    def rank(environ):
        task = launched_task(environ)
        check_output_file(cluster_file, CLUSTER_FILE, force)
        launch = join_launch(task, cluster_file, environ, timeout)
        with leaving_on_failure(launch):
            devices = [{"name": f"/job:worker/task:{task.rank}/device:CPU:0", "kind": "cpu"}]
            agreed = agree_on_cluster(launch, devices, {}, "127.0.0.1", 0, timeout)
        announce_serving(launch, agreed, cluster_file, timeout, force)
        return agreed

    def outcome(environ):
        try:
            return rank(environ)
        except TfpartError as exc:
            return exc
    with ThreadPoolExecutor(len(environs)) as pool:
        return list(pool.map(outcome, environs))


def test_two_mpich_launches_at_once_never_mix_their_ranks(tmp_path):
    cluster_file = tmp_path / "cluster.json"
    first, second = FakeHydra("kvs_4242_0_1804289383_node1", 3), \
        FakeHydra("kvs_4250_0_846930886_node1", 3)
    environs = [hydra.environ(rank) for rank in range(3) for hydra in (first, second)]
    agreed = run_launch(cluster_file, environs)
    assert not any(isinstance(result, Exception) for result in agreed), agreed
    launches = [agreed[0::2], agreed[1::2]]  # each launch's ranks, in rank order
    for ranks, hydra in zip(launches, (first, second)):
        assert all(cluster == ranks[0] for cluster in ranks)  # one cluster per launch
        assert hydra.kvsname in ranks[0]["name"]
        assert ranks[0]["devices"] == [{"name": f"/job:worker/task:{r}/device:CPU:0",
                                        "kind": "cpu"} for r in range(3)]
    addresses = [set(ranks[0]["cluster"]["worker"]) for ranks in launches]
    assert len(addresses[0] | addresses[1]) == 6  # no task of one in the other
    written = json.loads(cluster_file.read_text())  # the launch that finished last
    assert {key: value for key, value in written.items() if key != "written_by"} in (
        launches[0][0], launches[1][0])
    for hydra in (first, second):  # each rank asked once, PMI_Init to PMI_Finalize
        assert sorted(hydra.asked) == sorted(["cmd=init", "cmd=get_my_kvsname",
                                              "cmd=finalize"] * 3)
    assert not tasks_folder(cluster_file).exists()  # each launch removed its folder


def test_a_stale_mpich_launch_is_never_read_and_its_cluster_file_is_replaced(tmp_path):
    cluster_file = tmp_path / "cluster.json"
    stale_port = 7000
    write_json_output(cluster_file, {"name": "an earlier launch", "cluster": {
        "worker": [f"127.0.0.1:{stale_port}"]}, "devices": [
        {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}, CLUSTER_FILE,
        command="worker")
    tasks = tasks_folder(cluster_file)
    tasks.mkdir()
    # what the launcher of old left (every MPICH launch was "launch"), and the folder
    # of a launch killed half-way, whose ranks had reported the stale port
    old = {"address": f"127.0.0.1:{stale_port}", "kinds": {}, "devices": [
        {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}
    (tasks / "launch.address.0.json").write_text(json.dumps(old))
    crashed = Launch(LaunchedTask("MPICH", 0, 2, 0), "kvs_1_0_7_node1",
                     tasks / folder_name("kvs_1_0_7_node1"))
    crashed.folder.mkdir()
    publish_report(crashed, 0, address=f"127.0.0.1:{stale_port}")
    debris = sorted(path.relative_to(tasks) for path in tasks.rglob("*"))

    hydra = FakeHydra("kvs_2_0_9_node1", 2)
    agreed = run_launch(cluster_file, [hydra.environ(rank) for rank in range(2)])
    assert not any(isinstance(result, Exception) for result in agreed), agreed
    assert f"127.0.0.1:{stale_port}" not in agreed[0]["cluster"]["worker"]
    written = json.loads(cluster_file.read_text())
    assert written["cluster"] == agreed[0]["cluster"]
    assert written["written_by"]["command"] == "worker"
    assert sorted(path.relative_to(tasks) for path in tasks.rglob("*")) == debris


def test_forged_reports_end_the_launch_and_no_cluster_file_is_written(tmp_path):
    cluster_file = tmp_path / "cluster.json"
    hydra = FakeHydra("kvs_3_0_5_node1", 2)
    environs = [hydra.environ(rank) for rank in range(2)]
    rank0 = join_launch(launched_task(environs[0]), cluster_file, environs[0], 5)
    forger = Launch(LaunchedTask("MPICH", 1, 2, 0), rank0.id, rank0.folder)
    publish_report(forger, 1, address="10.6.6.6:7001")  # before rank 1 reports
    rank1 = join_launch(launched_task(environs[1]), cluster_file, environs[1], 5)
    with pytest.raises(TfpartError, match=r"address\.1\.json: exists already: another "
                       "task reported as this one"):
        agree_on_cluster(rank1, [], {}, "127.0.0.1")

    # a serving report that names another address than the one agreed for its rank
    devices = [{"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]
    agreed = agree_on_cluster(rank0, devices, {}, "127.0.0.1", timeout=5)
    assert agreed["cluster"]["worker"][1] == "10.6.6.6:7001"  # its report was valid
    publish_report(forger, 1, stage="serving", address="10.6.6.6:7002")
    with pytest.raises(TfpartError, match=r"serving\.1\.json: says rank 1 serves on "
                       r"10\.6\.6\.6:7002, but the tasks agreed on 10\.6\.6\.6:7001"):
        announce_serving(rank0, agreed, cluster_file, timeout=5)
    assert not cluster_file.exists()
    assert not rank0.folder.exists()  # rank 0 removed the launch's folder on failing


def test_a_rank_that_fails_ends_the_others_wait_at_once(tmp_path):
    # Hydra ends a launch when a rank dies of a signal, not when one exits with code 2
    cluster_file = tmp_path / "cluster.json"
    hydra = FakeHydra("kvs_6_0_2_node1", 3)
    environs = [hydra.environ(rank) for rank in range(3)]
    started = time.monotonic()

    def rank(environ):
        task = launched_task(environ)
        launch = join_launch(task, cluster_file, environ, 30)
        with leaving_on_failure(launch):
            host = "no-such-host.invalid" if task.rank == 2 else "127.0.0.1"
            return agree_on_cluster(launch, [{"name": f"/job:worker/task:{task.rank}/"
                                              "device:CPU:0", "kind": "cpu"}], {}, host,
                                    timeout=30)

    def outcome(environ):
        try:
            return rank(environ)
        except TfpartError as exc:
            return str(exc)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(outcome, environs))
    assert time.monotonic() - started < 10, results  # not the 30 s of the timeout
    assert "no-such-host.invalid: cannot resolve this task's host name" in results[2]
    assert results[0].startswith("rank 2 of the MPICH launch kvs_6_0_2_node1 failed: "
                                 "no-such-host.invalid: cannot resolve"), results
    assert results[1].startswith(("rank 2 of the MPICH launch kvs_6_0_2_node1 failed: ",
                                  # or rank 0 saw it first, and removed the folder
                                  f"{tasks_folder(cluster_file)}/launch-kvs_6_0_2_node1: "
                                  "rank 0 of the MPICH launch kvs_6_0_2_node1 ended it")), \
        results
    assert not tasks_folder(cluster_file).exists()


def _two_open_mpi_ranks(cluster_file):
    """Ranks 0 and 1 of an Open MPI launch of two, joined to ``cluster_file``'s launch."""
    environs = [{"PMIX_NAMESPACE": "9", "OMPI_COMM_WORLD_RANK": str(rank),
                 "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": str(rank)}
                for rank in range(2)]
    return [join_launch(launched_task(environ), cluster_file, environ, 5)
            for environ in environs]


def test_a_rank_failing_after_rank_0_left_removes_its_own_note(tmp_path):
    # ranks that fail at once: rank 0 may have removed every file before another
    # rank's failed.json appears; that rank then removes it, and the folders go
    cluster_file = tmp_path / "cluster.json"
    rank0, rank1 = _two_open_mpi_ranks(cluster_file)
    rank0.leave("ranks 0 and 1 would both serve on 127.0.0.1:7000")
    # as when rank 0's rmdir met rank 1's temporary file, which became failed.json
    rank0.folder.mkdir(parents=True)
    rank1.leave("ranks 0 and 1 would both serve on 127.0.0.1:7000")
    assert not tasks_folder(cluster_file).exists()


def test_a_rank_reporting_after_rank_0_left_says_rank_0_ended_the_launch(tmp_path):
    # rank 0 failed and removed the folder before rank 1 wrote its address
    cluster_file = tmp_path / "cluster.json"
    rank0, rank1 = _two_open_mpi_ranks(cluster_file)
    rank0.leave("no device")
    with pytest.raises(TfpartError, match=r"launch-9: rank 0 of the Open MPI launch 9 "
                       r"ended it \(this folder is gone\)"):
        agree_on_cluster(rank1, [], {}, "127.0.0.1", timeout=5)


def _fifo(path):
    os.mkfifo(path)


def _symlink_to_passwd(path):
    path.symlink_to("/etc/passwd")


def _huge(path):
    with open(path, "wb") as file:  # sparse: 400 MB on no disk
        file.truncate(400 * 2**20)


HOSTILE_FILES = {
    "bad JSON": (lambda path: path.write_text('{"rank": 1, '), "not valid JSON"),
    "a symbolic link": (_symlink_to_passwd, "is a symbolic link, not rank 1's report"),
    "deep nesting": (lambda path: path.write_text("[" * 100_000 + "]" * 100_000),
                     "nested 100000 levels deep"),
    "a FIFO": (_fifo, "not a regular file (a FIFO)"),
    "a huge file": (_huge, "400.0 MiB, more than the 1 MiB"),
    "not an object": (lambda path: path.write_text("[1]"), "is not rank 1's report"),
    "another rank's report": (lambda path: path.write_text(json.dumps({"rank": 0})),
                              "is rank 0's report, in rank 1's place"),
    "a host name": (lambda path: path.write_text(json.dumps({
        "rank": 1, "pid": 7, "host": "h", "address": "evil.example:7001"})),
        "address is 'evil.example:7001', not ip:port"),
    "another rank's device": (lambda path: path.write_text(json.dumps({
        "rank": 1, "pid": 7, "host": "h", "address": "127.0.0.1:7001", "kinds": {},
        "devices": [{"name": "/job:worker/task:0/device:GPU:0", "kind": "H100"}]})),
        "devices[0]: '/job:worker/task:0/device:GPU:0' is not a device of rank 1"),
}


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_a_hostile_file_in_the_tasks_folder_ends_the_launch_in_one_line(tmp_path, kind):
    make, words = HOSTILE_FILES[kind]
    task = LaunchedTask("MPICH", 0, 2, 0)
    launch = join_launch(task, tmp_path / "cluster.json", {"PMI_JOBID": "12"}, 1)
    publish_report(launch, 0)
    make(launch.path("address", 1))
    started = time.monotonic()
    with pytest.raises(TfpartError) as caught:
        wait_for(launch, "address", timeout=5)
    assert time.monotonic() - started < 2  # no hang, no wait for the timeout
    message = str(caught.value)
    assert message.startswith(f"{launch.path('address', 1)}: ") and words in message
    assert "\n" not in message


def test_a_launcher_without_an_id_gets_one_launch_at_a_time_per_folder(tmp_path):
    cluster_file = tmp_path / "cluster.json"
    plain = {"PMI_RANK": "0", "PMI_SIZE": "2"}  # PMI_* with no PMI_FD nor any id
    first = join_launch(launched_task(plain), cluster_file, plain, 1)
    assert first.id is None and first.folder.name == "launch"
    with pytest.raises(TfpartError, match=f"exists: another launch is using it, or one "
                       f"that ended abruptly left it \\(its rank 0: process {os.getpid()} "
                       "on .*MPICH gives no launch id, so one launch at a time may use "
                       "this folder"):
        join_launch(launched_task(plain), cluster_file, plain, 1)
    three = {"PMI_RANK": "1", "PMI_SIZE": "3"}  # a rank of another launch, of 3 tasks
    with pytest.raises(TfpartError, match="launch.json: describes another launch "
                       r"\('MPICH', 2 tasks, id None\) than this one \(the MPICH launch, "
                       "3 tasks\\): is another launch using this folder"):
        join_launch(launched_task(three), cluster_file, three, 1)
    assert (first.folder / "launch.json").exists()  # the first launch's, untouched
    first.leave()
    assert not tasks_folder(cluster_file).exists()


def test_a_users_cluster_file_is_replaced_only_with_force(tmp_path):
    cluster_file = tmp_path / "cluster.json"
    mine = '{"name": "mine", "devices": [{"name": "/device:CPU:0", "kind": "cpu"}]}'
    cluster_file.write_text(mine)
    hydra = FakeHydra("kvs_5_0_1_node1", 2)
    results = run_launch(cluster_file, [hydra.environ(rank) for rank in range(2)])
    assert all(isinstance(result, TfpartError) and "exists and tfpart did not write it: "
               "give --force" in str(result) for result in results), results
    assert cluster_file.read_text() == mine and not tasks_folder(cluster_file).exists()
    results = run_launch(cluster_file, [hydra.environ(rank) for rank in range(2)],
                         force=True)
    assert json.loads(cluster_file.read_text())["cluster"] == results[0]["cluster"]


def test_a_worker_under_mpich_leaves_a_hand_written_cluster_file_alone(
        capsys, tmp_path, monkeypatch):
    from tfpart.cli import main

    cluster_file = tmp_path / "cluster.json"
    mine = '{"name": "mine", "devices": [{"name": "/device:CPU:0", "kind": "cpu"}]}'
    cluster_file.write_text(mine)
    for name, value in {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}.items():
        monkeypatch.setenv(name, value)
    code = main(["worker", "--cluster", str(cluster_file), "--launch-timeout", "1"])
    assert_clean_failure(code, capsys.readouterr().err.strip(), "rank 0 of the MPICH "
                         "launch: ", "exists and tfpart did not write it: give --force")
    assert cluster_file.read_text() == mine and not tasks_folder(cluster_file).exists()


@pytest.mark.parametrize("changed,words", [
    ({"PMI_RANK": "\u00b2"}, "PMI_RANK: is '²', not a number (ASCII digits)"),
    ({"PMI_RANK": "\u0663"}, "PMI_RANK: is '٣', not a number"),
    ({"PMI_SIZE": "1000000000"}, "PMI_SIZE: is 1000000000: more than the 4096 tasks"),
    ({"PMI_SIZE": "9" * 5000}, "PMI_SIZE: is a number of 5000 digits: more than the 4096"),
    ({"PMI_SIZE": "0"}, "PMI_SIZE: is 0: not from 1 to 4096"),
    ({"PMI_RANK": None, "PMI_PORT": "node1:4242", "PMI_ID": "0"},
     "PMI_PORT: is set without PMI_RANK and PMI_SIZE"),
])
def test_a_malformed_mpich_environment_is_named(changed, words):
    environ = {"PMI_RANK": "1", "PMI_SIZE": "2", **changed}
    with pytest.raises(TfpartError) as caught:
        launched_task({name: value for name, value in environ.items() if value is not None})
    assert words in str(caught.value)


@pytest.mark.parametrize("changed,words", [
    ({"SLURM_STEP_NODELIST": "n[1-1000000000]"}, "names 1000000000 nodes, more than the "
     "4096 tasks a launch may have"),
    ({"SLURM_STEP_NODELIST": "a[1-1000],b[1-1000],c[1-1000],d[1-1000],e[1-97]"},
     "names 4097 nodes"),
    ({"SLURM_STEP_NODELIST": "r[1-100]-n[1-100]"}, "names 10000 nodes"),
    ({"SLURM_STEP_NODELIST": "n" * 26 + "]"}, "cannot read the node list 'nnnn"),  # was
    # exponential in its length: (?:[^\[\],]+|…)+ backtracked every way to split it
    ({"SLURM_STEP_NODELIST": "n[\u0661-\u0662]"}, "cannot read the node list"),
    ({"SLURM_STEP_NODELIST": "n[9-1]"}, "the range 9-1 is empty"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x1000000000)"}, "1000000000 tasks, more than the "
     "4096 a launch may have"),
    ({"SLURM_STEP_TASKS_PER_NODE": "\u0662(x2)"}, "cannot read '٢(x2)'"),
])
def test_a_huge_or_hostile_srun_environment_is_one_line_at_once(changed, words):
    started = time.monotonic()
    with pytest.raises(TfpartError) as caught:
        launched_task({**SRUN_TWO_NODES, **changed})
    assert words in str(caught.value) and time.monotonic() - started < 0.5


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1])
def test_a_launch_timeout_must_end(tmp_path, timeout):
    with pytest.raises(TfpartError, match="--launch-timeout: is .*: give a finite number of "
                       "seconds above 0"):
        join_launch(LaunchedTask("Open MPI", 1, 2, 0), tmp_path / "c.json",
                    {"PMIX_NAMESPACE": "1"}, timeout)


def test_the_launch_id_of_mpich_is_its_key_value_space_asked_over_pmi():
    hydra = FakeHydra("kvs_10014_0_34446074_vm", 1)
    assert launch_id(hydra.environ(0)) == "kvs_10014_0_34446074_vm"
    assert launch_id({**hydra.environ(0), "PMIX_NAMESPACE": "944701441"}) == "944701441"
    read, write = os.pipe()
    with pytest.raises(TfpartError, match=f"PMI_FD: is {read}, which is not a socket"):
        launch_id({"PMI_RANK": "0", "PMI_SIZE": "1", "PMI_FD": str(read)})
    os.close(read), os.close(write)
    silent = FakeHydra("kvs_1", 1, answer=False)
    started = time.monotonic()
    with pytest.raises(TfpartError, match="PMI_FD: the process manager did not answer"):
        launch_id(silent.environ(0), timeout=0.3)
    assert time.monotonic() - started < 2


def test_cluster_detect_writes_a_file_the_example_compiles_on(capsys, tmp_path):
    from tfpart.cli import main

    path = tmp_path / "cluster.json"
    assert main(["cluster", "detect", "-o", str(path)]) == 0, capsys.readouterr().err
    data = json.loads(path.read_text())
    assert [d["kind"] for d in data["devices"]][:1] == ["cpu"]
    assert data["devices"][0]["memory"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf(
        "SC_PHYS_PAGES")
    path.write_text(json.dumps(dict(data, name="mine")))  # edited: the user's now
    assert_clean_failure(*run_cli(capsys, "cluster", "detect", "-o", str(path)),
                         "tfpart did not write it: give --force")
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
    assert not tasks_folder(path).exists()  # the launch removed its folder


def test_a_rank_stopped_while_it_leaves_removes_its_files_first(tmp_path, monkeypatch):
    # Open MPI sends SIGTERM to every other rank once one exits with an error, often
    # while they remove their files; the signal's handler (tfpart.cli's raises) waits
    from tfpart.cli import Terminated, _raise_terminated

    cluster_file = tmp_path / "cluster.json"
    rank0, rank1 = _two_open_mpi_ranks(cluster_file)
    rank1.leave("ranks 0 and 1 would both serve on 127.0.0.1:7000")  # failed.json stays
    unlink = Path.unlink

    def unlink_stopped(path, missing_ok=False):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: mid-removal
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink_stopped)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with pytest.raises(Terminated):
            rank0.leave("interrupted")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not tasks_folder(cluster_file).exists()
