"""Tasks a launcher started (:mod:`tfpart.launcher`) agree on one cluster file, with no
address written by hand: ``mpirun -n 3 tfpart worker --cluster cluster.json``.

Each task picks its address (its host's IP address, resolved from the launcher's host
name or this machine's, and a free port), detects its devices
(:mod:`tfpart.device_detect`) and reports both in a folder every task can read: the
launch's own, under the cluster file's tasks folder (``cluster.json.tasks/``; on
several hosts, a shared file system), named after the launch's id
(:func:`launch_id`), so that no file of another launch, earlier or running at the same
time, is ever read. Every task waits until all have reported, starts its TensorFlow
server from the cluster they make, and says it serves; once every task serves on the
address agreed for it, rank 0 writes the cluster file (atomically, marked as tfpart's:
:mod:`tfpart.core.output_files`) and removes the launch's folder.

Nothing in the folder is trusted. Rank 0 creates the launch's folder, refusing one that
exists; each report is published as a new file, never over another (a second task
claiming a rank ends the launch); every file is read as a regular file of bounded
size and strict JSON (:func:`tfpart.core.input_files.read_json`: a FIFO is never
opened, a symbolic link is refused, a huge or deeply nested file is one line) and
checked (the rank's own device names, an ``ip:port`` address, the address agreed for
its rank). Under a launcher that gives no launch id, the folder has one name, and a
launch finding it in use is refused: one launch at a time.

A task that fails, or that the launcher stops with SIGTERM before its server starts,
removes what it wrote: rank 0 the whole folder, which tells the others the launch is
over; another rank first says why in ``failed.json``, which the others repeat as they
stop waiting (MPICH's Hydra stops the other ranks when one dies of a signal, not when
one exits with an error). A stop signal that comes meanwhile waits until the files are
removed (Open MPI stops every other rank with SIGTERM as soon as one exits with an
error, often while they remove theirs). A task that never reports ends the waiting
ones after ``timeout`` seconds with one line naming it.

The cluster file stays the old one until the new launch serves: a client that reads
it meanwhile reads a whole file, of an earlier launch (its ``name`` says which), and
finds its tasks gone (:func:`tfpart.servers.check_workers` names the first), rather
than no file, or a file naming tasks that do not serve yet. Removing the old file
first, as this module once did, deleted a hand-written one when the launch failed.

Examples
--------
>>> launch_id({"PMIX_NAMESPACE": "944701441"}), launch_id({"SLURM_JOB_ID": "77",
...     "SLURM_STEP_ID": "0"}), launch_id({"PMI_RANK": "0", "PMI_SIZE": "2"})
('944701441', '77.0', None)
>>> folder_name("944701441"), folder_name(None), folder_name("../../etc")[:14]
('launch-944701441', 'launch', 'launch-sha256-')
"""
from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import re
import signal
import socket
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tfpart.core.errors import OutputError, TfpartError
from tfpart.core.input_files import json_text, read_json
from tfpart.core.output_folders import TEMPORARY_TAG, os_errors
from tfpart.launcher import pmi_kvsname, shown

MAX_REPORT_BYTES = 2**20  # a task's report: a host of 16 GPUs takes about 4 KB
STAGES = ("address", "serving", "devices")
LAUNCH_FILE = "launch.json"  # rank 0's: whose launch the folder is
FAILED_FILE = "failed.json"  # the first task to fail says why: the others stop waiting
MAX_PROBLEM_CHARS = 300  # of a failed task's message, as the others repeat it
POLL_S = 0.1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # held while a task leaves


def launch_id(environ, timeout=30.0):
    """An id of this launch that every task of it shares and no other launch has:
    Open MPI's (PMIx namespace, or its job id), SLURM's job and step, Cray PALS's
    application id, the PMI job id, or the name of the key-value space MPICH's Hydra
    keeps for the launch (asked over ``PMI_FD``, :func:`tfpart.launcher.pmi_kvsname`);
    None where the launcher gives none (then one launch at a time may use a folder)."""
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        if environ.get(name):
            return environ[name]
    if environ.get("SLURM_JOB_ID"):
        return f"{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', '0')}"
    for name in ("PALS_APID", "PMI_JOBID"):
        if environ.get(name):
            return environ[name]
    return pmi_kvsname(environ, timeout)


def folder_name(launch):
    """The name of the folder of the launch whose id is ``launch`` (None: no id): the
    id where it is a plain name, else its SHA-256."""
    if launch is None:
        return "launch"
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", launch):
        return f"launch-{launch}"
    return f"launch-sha256-{hashlib.sha256(launch.encode()).hexdigest()[:32]}"


def tasks_folder(cluster_file):
    """Where the tasks of the launches writing ``cluster_file`` meet, each launch in a
    folder of its own."""
    path = Path(cluster_file)
    return path.with_name(f"{path.name}.tasks")


def checked_timeout(timeout):
    """``timeout`` if it is a finite number of seconds above 0, else TfpartError (a
    wait of NaN seconds would never end).

    >>> checked_timeout(float("nan"))
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: --launch-timeout: is nan: give a finite number of seconds above 0
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise TfpartError("--launch-timeout", f"is {timeout!r}: give a finite number of "
                          "seconds above 0")
    return timeout


def task_address(host, port=0):
    """``ip:port`` this task serves on: ``host`` resolved to an IP address (so that the
    server accepts connections on that address only, :mod:`tfpart.servers`) and
    ``port``, or a port free on it now when 0 (TensorFlow binds it moments later)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise TfpartError("--port", f"is {port!r}: give a port from 1 to 65535, or none")
    try:
        ip = socket.gethostbyname(host)
    except (OSError, UnicodeError, ValueError) as exc:
        raise TfpartError(host, f"cannot resolve this task's host name ({exc})") from None
    if not port:
        with socket.socket() as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
    return f"{ip}:{port}"


def checked_address(address, path=""):
    """``address`` if it is ``ip:port`` (IPv4, as :func:`task_address` makes it), else
    TfpartError naming ``path``.

    >>> checked_address("10.0.0.1:7000")
    '10.0.0.1:7000'
    >>> checked_address("evil.example:7000", "address.1.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: address.1.json: address is 'evil.example:7000', not ip:port
    """
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    try:
        ipaddress.IPv4Address(host)
        valid = re.fullmatch(r"[0-9]{1,5}", port) is not None and 0 < int(port) < 65536
    except ValueError:
        valid = False
    if not valid:
        raise TfpartError(path, f"address is {shown(address)}, not ip:port")
    return address


@dataclass
class Launch:
    """This task's part in one launch: its place (``task``), the launch's ``id`` (None:
    the launcher gives none), the launch's ``folder``, whether this task made it
    (``owner``, rank 0), and the files it ``wrote`` there."""

    task: object  # tfpart.launcher.LaunchedTask
    id: str | None
    folder: Path
    owner: bool = False
    wrote: list = field(default_factory=list)

    def path(self, stage, rank=None):
        return self.folder / f"{stage}.{self.task.rank if rank is None else rank}.json"

    def publish(self, path, data):
        """Write ``data`` (JSON) to ``path``, a file that must not exist: it appears
        whole (a hard link to a complete temporary file), never over another's."""
        temporary = path.with_name(f".{path.name}{TEMPORARY_TAG}{os.getpid()}")
        text = json_text(data, path)
        try:
            with os_errors(path):
                temporary.unlink(missing_ok=True)  # left by a process of the same id
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o644)
                with os.fdopen(fd, "w") as file:
                    file.write(text)
                try:
                    os.link(temporary, path, follow_symlinks=False)
                except FileExistsError:
                    raise TfpartError(path, "exists already: another task reported as "
                                      f"this one ({_launch_words(self)}); is another "
                                      "launch using this folder?") from None
        finally:
            try:
                temporary.unlink(missing_ok=True)
            except OSError:
                pass

    def report(self, stage, data):
        """Publish this task's report for ``stage`` (see :data:`STAGES`)."""
        path = self.path(stage)
        try:
            self.publish(path, {"rank": self.task.rank, "pid": os.getpid(),
                                "host": socket.gethostname(), **data})
        except TfpartError:
            check_launch_goes_on(self)  # the folder is gone: say why, not the write
            raise
        self.wrote.append(path)

    def leave(self, problem=None):
        """Remove what this task wrote (rank 0, which made the folder: every file of
        the launch, and the folder, which tells the others the launch is over). Another
        task that fails (``problem``, one line) says so first, in :data:`FAILED_FILE`,
        so that the others stop waiting. Errors are ignored, as this runs while
        failing; a stop signal is acted on once done (:func:`stop_signals_held`)."""
        with stop_signals_held():
            self._remove_files(problem)

    def _remove_files(self, problem):
        if problem and not self.owner:
            failed = self.folder / FAILED_FILE
            try:  # only the first to fail says it
                self.publish(failed, {
                    "rank": self.task.rank, "pid": os.getpid(), "host": socket.gethostname(),
                    "problem": problem[:MAX_PROBLEM_CHARS]})
                # rank 0 removes LAUNCH_FILE before FAILED_FILE: once LAUNCH_FILE is
                # gone, rank 0 may have passed FAILED_FILE, and this task removes it
                if not os.path.lexists(self.folder / LAUNCH_FILE):
                    self.wrote.append(failed)
            except TfpartError:
                pass
        names = [LAUNCH_FILE, FAILED_FILE] + [
            self.path(stage, rank).name for stage in STAGES
            for rank in range(self.task.size)] if self.owner else []
        for path in [*self.wrote, *(self.folder / name for name in names)]:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
        for folder in (self.folder, self.folder.parent):
            try:
                folder.rmdir()  # only if empty: a file tfpart did not write stays
            except OSError:
                pass

    def finish(self):
        """Remove the launch's folder once its work is done (rank 0)."""
        self.leave()


@contextmanager
def stop_signals_held():
    """Run a block with SIGINT, SIGTERM and SIGHUP held: one that comes meanwhile goes
    to its handler once the block is done, not in the middle of it. Held only in the
    main thread (where Python runs signal handlers) and where every handler is one
    Python can put back.

    >>> import os
    >>> seen = []
    >>> previous = signal.signal(signal.SIGHUP, lambda number, frame: seen.append("handled"))
    >>> with stop_signals_held():
    ...     os.kill(os.getpid(), signal.SIGHUP)
    ...     seen.append("block done")
    >>> _ = signal.signal(signal.SIGHUP, previous)
    >>> seen
    ['block done', 'handled']
    """
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    if threading.current_thread() is not threading.main_thread() or \
            None in handlers.values():
        yield
        return
    caught = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def join_launch(task, cluster_file, environ, timeout):
    """This task's :class:`Launch` for the cluster file ``cluster_file``: rank 0
    creates the launch's folder, refusing one that exists (another launch uses it, or
    one that ended abruptly left it), and says whose it is; the others wait for it
    and check it is their launch's."""
    timeout = checked_timeout(timeout)
    launch = Launch(task, launch_id(environ, timeout), Path())
    tasks = tasks_folder(cluster_file)
    launch.folder = tasks / folder_name(launch.id)
    whose = {"launch": launch.id, "launcher": task.launcher, "size": task.size}
    if task.rank == 0:
        _make_launch_folder(launch, tasks)
        launch.owner = True
        with leaving_on_failure(launch):
            launch.publish(launch.folder / LAUNCH_FILE, {
                **whose, "pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S")})
        return launch
    path = launch.folder / LAUNCH_FILE
    _wait_until(lambda: os.path.lexists(path), timeout, lambda: TfpartError(
        launch.folder, f"rank 0 of the {task.launcher} launch did not create this "
        f"launch's folder within {timeout:g} s"))
    _check_own_folder(tasks)
    _check_own_folder(launch.folder)
    found = _read(path, "a launch's description")
    if any(found.get(key) != value for key, value in whose.items()):
        raise TfpartError(path, f"describes another launch ({shown(found.get('launcher'))}"
                          f", {shown(found.get('size'))} tasks, id "
                          f"{shown(found.get('launch'))}) than this one "
                          f"({_launch_words(launch)}, {task.size} tasks): is another "
                          "launch using this folder?")
    return launch


def _make_launch_folder(launch, tasks, attempts=3):
    """Create ``launch.folder`` in ``tasks`` (made if missing), or TfpartError saying
    why it exists. A launch that just left may remove an empty ``tasks``: try again."""
    _check_own_folder(tasks)
    for attempt in range(attempts):
        with os_errors(tasks, "create"):
            tasks.mkdir(parents=True, exist_ok=True)
        try:
            launch.folder.mkdir()
            return
        except FileExistsError:
            raise TfpartError(launch.folder, _in_use(launch)) from None
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise OutputError(launch.folder, f"cannot create it: {exc.strerror}") from None
    raise OutputError(launch.folder, "cannot create it: its folder keeps vanishing")


@contextmanager
def leaving_on_failure(launch):
    """Run a part of ``launch`` (None: nothing to do); if it fails, this task leaves
    (:meth:`Launch.leave`)."""
    if launch is None:
        yield
        return
    try:
        yield
    except BaseException as exc:
        launch.leave(_problem(exc))
        raise


def _problem(exc):
    """What went wrong, in one line, as the other tasks will say it."""
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (tfpart.cli.Terminated)
        return "interrupted"
    text = str(exc) if isinstance(exc, TfpartError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split()) or type(exc).__name__


def wait_for(launch, stage, timeout, poll=POLL_S):
    """Every task's report for ``stage``, by rank, once all have published it, each
    read and checked (:func:`read_report`); TfpartError naming the ranks missing after
    ``timeout`` seconds, or the first report at fault."""
    missing = set(range(launch.task.size))

    def arrived():
        check_launch_goes_on(launch)
        missing.difference_update([rank for rank in missing
                                   if os.path.lexists(launch.path(stage, rank))])
        return not missing

    def late():
        ranks = sorted(missing)
        shown = ", ".join(map(str, ranks[:5])) + (" …" if len(ranks) > 5 else "")
        doing = {"address": "report its address", "serving": "start",
                 "devices": "report its devices"}[stage]
        return TfpartError(launch.folder, f"rank {shown} of the {launch.task.launcher} "
                           f"launch did not {doing} within {timeout:g} s")
    _wait_until(arrived, timeout, late, poll)
    try:
        return [read_report(launch.path(stage, rank), stage, rank)
                for rank in range(launch.task.size)]
    except TfpartError:
        check_launch_goes_on(launch)  # a report gone as the launch ends: say why
        raise


def check_launch_goes_on(launch):
    """TfpartError if another task of ``launch`` failed (its :data:`FAILED_FILE`, whose
    message this repeats) or rank 0 ended the launch (its folder is gone)."""
    failed = launch.folder / FAILED_FILE
    note = None
    if os.path.lexists(failed):
        try:
            note = _read(failed, "a failed task's note")
        except TfpartError:
            if os.path.lexists(failed):
                raise
            # removed as it was read: rank 0 is ending the launch (said below)
    if note is not None:
        rank, problem = note.get("rank"), note.get("problem")
        if type(rank) is not int or not isinstance(problem, str):
            raise TfpartError(failed, "is not a failed task's note (a rank and a problem)")
        raise TfpartError("", f"rank {rank} of {_launch_words(launch)} failed: "
                          f"{' '.join(problem[:MAX_PROBLEM_CHARS].split())}")
    if not launch.owner and not os.path.lexists(launch.folder / LAUNCH_FILE):
        raise TfpartError(launch.folder, f"rank 0 of {_launch_words(launch)} ended it "
                          "(this folder is gone): its own line says why")


def read_report(path, stage, rank):
    """The report of ``rank`` for ``stage`` in the file ``path``, checked: a regular
    file (not a symbolic link) of at most :data:`MAX_REPORT_BYTES`, strict JSON, an
    object naming ``rank`` and its process, with an ``ip:port`` address (stages
    "address" and "serving") and devices named for ``rank`` (stages "address" and
    "devices"); else TfpartError naming the file."""
    report = _read(path, f"rank {rank}'s report")
    if report.get("rank") != rank or type(report.get("rank")) is not int:
        raise TfpartError(path, f"is rank {shown(report.get('rank'))}'s report, in "
                          f"rank {rank}'s place")
    pid = report.get("pid")
    if type(pid) is not int or pid < 1 or not isinstance(report.get("host"), str):
        raise TfpartError(path, "does not name the process that wrote it (pid, host)")
    if stage in ("address", "serving"):
        checked_address(report.get("address"), path)
    if stage in ("address", "devices"):
        _check_devices(report.get("devices"), report.get("kinds"), rank, path)
    return report


def _check_devices(devices, kinds, rank, path):
    prefix = f"/job:worker/task:{rank}/"
    if not isinstance(devices, list) or not devices:
        raise TfpartError(path, "devices: not a list of this task's devices")
    for i, device in enumerate(devices):
        if not isinstance(device, dict) or not isinstance(device.get("name"), str) or \
                not isinstance(device.get("kind"), str):
            raise TfpartError(path, f"devices[{i}]: not a device (a name and a kind)")
        if not device["name"].startswith(prefix):
            raise TfpartError(path, f"devices[{i}]: {shown(device['name'])} is not a "
                              f"device of rank {rank} (named {prefix}…)")
    if not isinstance(kinds, dict) or not all(
            isinstance(name, str) and isinstance(kind, dict) for name, kind in kinds.items()):
        raise TfpartError(path, "kinds: not an object of device kinds")


def cluster_of(tasks, launcher, launch=None):
    """The cluster file's contents for the tasks' reports (rank order): one ``worker``
    job, every task's devices, and the kinds made for devices no kind matched; its
    name says the launch (``launch``, its id).

    >>> tasks = [{"address": f"10.0.0.{r}:7000", "devices": [
    ...     {"name": f"/job:worker/task:{r}/device:CPU:0", "kind": "cpu"}], "kinds": {}}
    ...     for r in (1, 2)]
    >>> cluster = cluster_of(tasks, "Open MPI", "944701441")
    >>> cluster["name"], cluster["cluster"], len(cluster["devices"])
    ('2 tasks started by Open MPI, launch 944701441', {'worker': ['10.0.0.1:7000', '10.0.0.2:7000']}, 2)
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
    return {"name": f"{len(tasks)} tasks started by {launcher}"
                    + (f", launch {launch}" if launch else ""),
            "cluster": {"worker": [task["address"] for task in tasks]},
            "devices": [device for task in tasks for device in task["devices"]],
            **({"kinds": kinds} if kinds else {})}


def agree_on_cluster(launch, devices, kinds, host=None, port=0, timeout=120.0):
    """The cluster of every task of ``launch`` (:func:`cluster_of`), once all have
    reported their address and their ``devices`` (named for their rank) and
    ``kinds``. The report at this task's rank must be the one it published."""
    task = launch.task
    address = task_address(host or task.host, port)
    launch.report("address", {"address": address, "devices": devices, "kinds": kinds})
    reports = wait_for(launch, "address", timeout)
    if reports[task.rank]["address"] != address:
        raise TfpartError(launch.path("address"), f"says {reports[task.rank]['address']}"
                          f", not {address} as this task wrote: replaced by another "
                          "process?")
    return cluster_of(reports, task.launcher, launch.id)


def announce_serving(launch, cluster, cluster_file, timeout=120.0, force=False):
    """Say this task serves; rank 0 then waits for every task to say so, on the
    address agreed for it in ``cluster``, writes ``cluster`` to ``cluster_file``
    (:func:`tfpart.core.output_files.write_json_output`: replacing only a cluster file
    tfpart wrote, or with ``force`` one of the user's) and removes the launch's
    folder. Returns whether it wrote the file."""
    from tfpart.core.output_files import CLUSTER_FILE, write_json_output

    agreed = cluster["cluster"]["worker"]
    with leaving_on_failure(launch):
        launch.report("serving", {"address": agreed[launch.task.rank]})
        if launch.task.rank != 0:
            return False
        for rank, report in enumerate(wait_for(launch, "serving", timeout)):
            if report["address"] != agreed[rank]:
                raise TfpartError(launch.path("serving", rank), "says rank "
                                  f"{rank} serves on {report['address']}, but the tasks "
                                  f"agreed on {agreed[rank]}: not a report of this launch")
        write_json_output(cluster_file, cluster, CLUSTER_FILE, command="worker", force=force)
    launch.finish()
    return True


def devices_across(task, cluster_file, environ, timeout=120.0, detect=None):
    """Every task's devices, named for its rank (``/job:worker/task:<rank>/…``), and the
    kinds made for them, once all have reported (rank 0; another rank gets its own,
    once rank 0 has read them): ``tfpart cluster detect`` under a launcher, whose
    rank 0 writes them to ``cluster_file``. ``detect(prefix)`` finds a task's devices
    (:func:`tfpart.device_detect.detect_devices`)."""
    if detect is None:
        from tfpart.device_detect import detect_devices as detect
    launch = join_launch(task, cluster_file, environ, timeout)
    with leaving_on_failure(launch):
        devices, kinds = detect(prefix=f"/job:worker/task:{task.rank}")
        launch.report("devices", {"devices": devices, "kinds": kinds})
        if task.rank:  # done once rank 0 has read it (and removed it)
            mine = launch.path("devices")
            _wait_until(lambda: not os.path.lexists(mine), timeout, lambda: TfpartError(
                launch.folder, f"rank 0 of the {task.launcher} launch did not gather "
                f"the tasks' devices within {timeout:g} s"))
            return devices, kinds
        found = wait_for(launch, "devices", timeout)
    launch.finish()
    return ([device for report in found for device in report["devices"]],
            {name: kind for report in found for name, kind in report["kinds"].items()})


def _wait_until(done, timeout, error, poll=POLL_S):
    """Poll ``done()`` until it is true; ``error()`` raised after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise error()
        time.sleep(poll)


def _read(path, what):
    """The JSON object in the file ``path`` (``what`` it should be), read within bounds;
    a symbolic link is refused (tfpart publishes plain files)."""
    try:
        is_link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError as exc:
        raise TfpartError(path, f"cannot read it: {exc.strerror}") from None
    if is_link:
        raise TfpartError(path, f"is a symbolic link, not {what} a task wrote")
    value = read_json(path, max_bytes=MAX_REPORT_BYTES)
    if not isinstance(value, dict):
        raise TfpartError(path, f"is not {what} (a JSON object)")
    return value


def _check_own_folder(folder):
    """TfpartError unless ``folder`` is absent or a folder (not a symbolic link to
    one: the tasks write only where tfpart made the folders)."""
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TfpartError(folder, f"cannot read it: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise TfpartError(folder, "is not a folder tfpart made (a symbolic link or a "
                          "file): remove it, or give another --cluster path")


def _in_use(launch):
    """Why the launch's folder, found existing, is not this launch's to use."""
    try:
        found = _read(launch.folder / LAUNCH_FILE, "a launch's description")
        since = (f" (its rank 0: process {shown(found.get('pid'))} on "
                 f"{shown(found.get('host'))}, since {shown(found.get('started'))})")
    except TfpartError:
        since = ""
    if launch.id is None:
        return (f"exists: another launch is using it, or one that ended abruptly left "
                f"it{since}. {launch.task.launcher} gives no launch id, so one launch at "
                "a time may use this folder: remove it once no launch runs, or give "
                "another --cluster path")
    return (f"exists: a launch with the same id ({launch.id}) left it{since}: remove it, "
            "or give another --cluster path")


def _launch_words(launch):
    return f"the {launch.task.launcher} launch" + (f" {launch.id}" if launch.id else "")
