"""Tasks a launcher started (:mod:`tfpart.launcher`) agree on one cluster file, with no
address written by hand: ``mpirun -n 3 tfpart worker --cluster cluster.json``.

Each task picks its address (its host's IP address, resolved from the launcher's host
name or this machine's, and a free port), detects its devices
(:mod:`tfpart.device_detect`) and writes both to a folder every task can read (beside
the cluster file: ``cluster.json.tasks/``; on several hosts, a shared file system),
under the launch's id (Open MPI's and SLURM's PMIx namespace, SLURM's job and step),
so that files of an earlier launch are never read. Every task waits until all have
written, then starts its TensorFlow server from the cluster they make, and says it
serves; once every task serves, rank 0 writes the cluster file, atomically. So a client
that reads the cluster file finds every task serving. A task that never reports ends
the waiting ones after ``timeout`` seconds with one line naming it.

Examples
--------
>>> launch_id({"PMIX_NAMESPACE": "944701441"}), launch_id({"SLURM_JOB_ID": "77",
...     "SLURM_STEP_ID": "0"}), launch_id({})
('944701441', '77.0', 'launch')
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from tfpart.core.errors import TfpartError
from tfpart.core.output_folders import os_errors, write_file_atomically


def launch_id(environ):
    """An id of this launch that every task of it shares (``"launch"`` where the
    launcher gives none: then one launch at a time per folder)."""
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        if environ.get(name):
            return environ[name]
    if environ.get("SLURM_JOB_ID"):
        return f"{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', '0')}"
    return "launch"


def task_address(host, port=0):
    """``ip:port`` this task serves on: ``host`` resolved to an IP address (so that the
    server accepts connections on that address only, :mod:`tfpart.servers`) and
    ``port``, or a port free on it now when 0 (TensorFlow binds it moments later)."""
    try:
        ip = socket.gethostbyname(host)
    except OSError as exc:
        raise TfpartError(host, f"cannot resolve this task's host name ({exc})") from None
    if not port:
        with socket.socket() as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
    return f"{ip}:{port}"


def tasks_folder(cluster_file):
    """Where the tasks of a launch writing ``cluster_file`` meet."""
    path = Path(cluster_file)
    return path.with_name(f"{path.name}.tasks")


def report(folder, launch, rank, stage, data):
    """Write this task's ``data`` for ``stage`` ("address" or "serving")."""
    write_file_atomically(folder / f"{launch}.{stage}.{rank}.json", json.dumps(data))


def wait_for(folder, launch, size, stage, timeout, launcher, poll=0.1):
    """Every task's data for ``stage``, by rank, once all ``size`` have written it;
    TfpartError naming the ranks missing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        paths = [folder / f"{launch}.{stage}.{rank}.json" for rank in range(size)]
        missing = [rank for rank, path in enumerate(paths) if not path.exists()]
        if not missing:
            return [json.loads(path.read_text()) for path in paths]
        if time.monotonic() > deadline:
            ranks = ", ".join(map(str, missing[:5])) + (" …" if len(missing) > 5 else "")
            raise TfpartError(folder, f"rank {ranks} of the {launcher} launch did not "
                              f"{'report its address' if stage == 'address' else 'start'} "
                              f"within {timeout:g} s")
        time.sleep(poll)


def cluster_of(tasks, launcher):
    """The cluster file's contents for the tasks' reports (rank order): one ``worker``
    job, every task's devices, and the kinds made for devices no kind matched.

    >>> tasks = [{"address": f"10.0.0.{r}:7000", "devices": [
    ...     {"name": f"/job:worker/task:{r}/device:CPU:0", "kind": "cpu"}], "kinds": {}}
    ...     for r in (1, 2)]
    >>> cluster = cluster_of(tasks, "Open MPI")
    >>> cluster["cluster"], len(cluster["devices"])
    ({'worker': ['10.0.0.1:7000', '10.0.0.2:7000']}, 2)
    >>> cluster_of([tasks[0], tasks[0]], "Open MPI")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: ranks 0 and 1 of the Open MPI launch would both serve on 10.0.0.1:7000: give each task of a host its own --port, or none (a free one each)
    """
    ranks = {}
    for rank, task in enumerate(tasks):
        if task["address"] in ranks:
            raise TfpartError("", f"ranks {ranks[task['address']]} and {rank} of the "
                              f"{launcher} launch would both serve on {task['address']}: "
                              "give each task of a host its own --port, or none (a free "
                              "one each)")
        ranks[task["address"]] = rank
    kinds = {name: kind for task in tasks for name, kind in task["kinds"].items()}
    return {"name": f"{len(tasks)} tasks started by {launcher}",
            "cluster": {"worker": [task["address"] for task in tasks]},
            "devices": [device for task in tasks for device in task["devices"]],
            **({"kinds": kinds} if kinds else {})}


def agree_on_cluster(task, cluster_file, launch, host=None, port=0, timeout=120.0):
    """The cluster of every task of this launch (:func:`cluster_of`), once all have
    reported their address and devices; rank 0 first removes an old ``cluster_file``,
    so that no client reads it while the launch is under way."""
    from tfpart.device_detect import detect_devices

    folder = tasks_folder(cluster_file)
    if task.rank == 0:
        with os_errors(cluster_file, "remove"):
            Path(cluster_file).unlink(missing_ok=True)
    devices, kinds = detect_devices(prefix=f"/job:worker/task:{task.rank}")
    report(folder, launch, task.rank, "address",
           {"address": task_address(host or task.host, port), "devices": devices,
            "kinds": kinds})
    return cluster_of(wait_for(folder, launch, task.size, "address", timeout, task.launcher),
                      task.launcher)


def announce_serving(task, cluster_file, launch, cluster, timeout=120.0):
    """Say this task serves; rank 0 then waits for every task to say so and writes
    ``cluster`` to ``cluster_file``, atomically. Returns whether it wrote it."""
    folder = tasks_folder(cluster_file)
    report(folder, launch, task.rank, "serving",
           {"address": cluster["cluster"]["worker"][task.rank], "pid": os.getpid()})
    if task.rank != 0:
        return False
    wait_for(folder, launch, task.size, "serving", timeout, task.launcher)
    write_file_atomically(cluster_file, json.dumps(cluster))
    return True


def devices_across(task, cluster_file, launch, timeout=120.0):
    """Every task's devices, named for its rank (``/job:worker/task:<rank>/…``), and the
    kinds made for them, once all have reported: ``tfpart cluster detect`` under a
    launcher, whose rank 0 writes them to ``cluster_file``."""
    from tfpart.device_detect import detect_devices

    devices, kinds = detect_devices(prefix=f"/job:worker/task:{task.rank}")
    folder = tasks_folder(cluster_file)
    report(folder, launch, task.rank, "devices", {"devices": devices, "kinds": kinds})
    tasks = wait_for(folder, launch, task.size, "devices", timeout, task.launcher)
    return ([device for found in tasks for device in found["devices"]],
            {name: kind for found in tasks for name, kind in found["kinds"].items()})
