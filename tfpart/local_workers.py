"""Local ``tfpart worker`` processes on loopback: a multi-host cluster on one machine.

Each task is a separate process running its own ``tf.distribute.Server`` (TensorFlow's
distributed runtime), optionally pinned to its own core with ``taskset`` and given one
intra-op and one inter-op thread, so that each task is one real, parallel device. Used
by the multi-host tests, the benchmarks and the notebooks.

Example (not run here: it starts processes)::

    with LocalWorkers(2, directory) as workers:
        compile_model(model, workers.path, out, microbatches=4)
        verify(model, out, cluster=load_cluster(workers.path))
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tfpart.memory_stats import ALLOCATION_LOG, tensor_peak
from tfpart.op_libraries import check_op_libraries, recorded


PS_TASK_THREADS = 2  # intra-op and inter-op threads of each task of a cluster with ps tasks


def free_port():
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def worker_command(cluster_file, task, *, threads=1, job="worker", memory_stats=None,
                   op_libraries=()):
    """The command line that starts ``task`` of ``job`` in ``cluster_file`` (with
    ``threads`` intra-op and inter-op threads, TensorFlow's default when None; serving
    its allocator's figures to the file ``memory_stats`` when given; registering the
    custom ops of ``op_libraries``, :mod:`tfpart.op_libraries`).

    >>> worker_command("c.json", 1, op_libraries=["tensorflow_text"])[-2:]
    ['--op-library', 'tensorflow_text']
    """
    command = [sys.executable, "-m", "tfpart.cli", "worker", "--cluster", str(cluster_file),
               "--job", job, "--task", str(task)]
    if threads:
        command += ["--intra-threads", str(threads), "--inter-threads", str(threads)]
    if memory_stats:
        command += ["--memory-stats", str(memory_stats)]
    for library in recorded(op_libraries):
        command += ["--op-library", library]
    return command


class LocalWorkers:
    """``count`` worker tasks on free loopback ports, described by ``self.path``.

    Parameters
    ----------
    count : int
    directory : path
        Where the cluster file (``workers.json``) is written, and each task's log
        (``worker-0.log``, ``ps-0.log``: TensorFlow's own messages, for when a run fails).
    links : dict, optional
        The cluster file's ``links`` block (the cost model's view of loopback).
    pin : bool
        Pin task ``k`` to core ``k mod cores`` with ``taskset``, when it exists. With
        more tasks than cores, the cluster file gives tasks pinned to one core one
        ``core_group``: they take turns on it, which the simulator then knows.
    extra : dict, optional
        More top-level cluster-file fields (``step_overhead``, ``name``).
    ps : int
        Parameter-server tasks (job ``ps``, unpinned, not devices of the cost model),
        started after the workers.
    memory_stats : bool
        Start every task with ``--memory-stats`` (on TensorFlow's BFC allocator), so
        that :meth:`memory` and :meth:`reset_memory` can read its CPU allocator's bytes
        in use and peak (:mod:`tfpart.memory_stats`).
    allocation_log : bool
        Start every task with TensorFlow's allocation log on (every tensor allocated
        and freed, in its log), so that :meth:`tensor_peaks` can replay it.
    op_libraries : list of str
        What registers a model's custom ops in every task (``tfpart worker
        --op-library``): Python modules, shared objects (:mod:`tfpart.op_libraries`);
        a TfpartError before any task starts if one is not there.
    """

    def __init__(self, count, directory, *, links=None, pin=True, extra=None, timeout=120,
                 ps=0, memory_stats=False, allocation_log=False, op_libraries=()):
        check_op_libraries(op_libraries)  # one line here, not a task that never starts
        self.ps, self.memory_stats, self.allocation_log = ps, memory_stats, allocation_log
        self.op_libraries = op_libraries
        self.memory_files = {}  # task's CPU:0 device name -> its --memory-stats file
        self.ports = [free_port() for _ in range(count + ps)]
        jobs = {"worker": [f"localhost:{p}" for p in self.ports[:count]]}
        if ps:
            jobs["ps"] = [f"localhost:{p}" for p in self.ports[count:]]
        pin = pin and shutil.which("taskset") is not None
        cores = os.cpu_count() or 1
        shared = pin and count > cores  # tasks pinned to one core take turns on it
        self.cluster = {"name": f"{count} local workers",
                        "cluster": jobs,
                        "devices": [{"name": f"/job:worker/task:{k}/device:CPU:0",
                                     "kind": "cpu",
                                     **({"core_group": f"core{k % cores}"} if shared else {})}
                                    for k in range(count)],
                        **(extra or {})}
        if links:
            self.cluster["links"] = links
        self.path = Path(directory) / "workers.json"
        self.path.write_text(json.dumps(self.cluster))
        self.processes = [self._start(k, pin) for k in range(count)] + [
            self._start(k, False, "ps") for k in range(ps)]
        deadline = time.time() + timeout
        for port in self.ports:
            while not _accepts(port):
                if time.time() > deadline or any(p.poll() is not None for p in self.processes):
                    self.stop()
                    raise RuntimeError(f"local workers did not start within {timeout} s")
                time.sleep(0.2)
        for path in self.memory_files.values():  # written once the task answers signals
            while not path.exists():
                if time.time() > deadline or any(p.poll() is not None for p in self.processes):
                    self.stop()
                    raise RuntimeError(f"local workers did not start within {timeout} s")
                time.sleep(0.05)

    def _start(self, task, pin, job="worker"):
        # With parameter servers, a task with one inter-op thread hangs as soon as a ps
        # reads a tensor the worker computed (its only thread waits on the ps, and none
        # is left to serve the read: measured). TensorFlow's default is one thread per
        # core the task may run on, which is one when pinned: so they get two each.
        memory_file = None
        if self.memory_stats:
            memory_file = self.path.parent / f"{job}-{task}.memory.json"
            memory_file.unlink(missing_ok=True)
            self.memory_files[f"/job:{job}/task:{task}/device:CPU:0"] = memory_file
        command = worker_command(self.path, task, job=job,
                                 threads=PS_TASK_THREADS if self.ps else 1,
                                 memory_stats=memory_file, op_libraries=self.op_libraries)
        if pin:
            command = ["taskset", "-c", str(task % os.cpu_count()), *command]
        with open(self._log(job, task), "ab") as log:
            # TFPART_WORKER_PARENT: the task exits with this process, never left behind
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "TFPART_TF_LOG": log.name,
                                         "TFPART_WORKER_PARENT": str(os.getpid()),
                                         **(ALLOCATION_LOG if self.allocation_log else {})})

    def _log(self, job, task):
        return self.path.parent / f"{job}-{task}.log"

    def log_lines(self):
        """Each worker's CPU:0 device name -> the lines its log has now (a mark for
        :meth:`tensor_peaks`)."""
        marks = {}
        for name, path in self._logs().items():
            with open(path, errors="replace") as log:
                marks[name] = sum(1 for _ in log)
        return marks

    def tensor_peaks(self, since=None):
        """Each worker's CPU:0 device name -> the most bytes of tensors its allocation
        log shows alive at once after the mark ``since`` (:meth:`log_lines`; default
        the start), as requested and as allocated
        (:func:`tfpart.memory_stats.tensor_peak`). Needs ``allocation_log=True``."""
        if not self.allocation_log:
            raise RuntimeError("these workers were started without allocation_log=True")
        peaks = {}
        for name, path in self._logs().items():
            with open(path, errors="replace") as log:
                peaks[name] = tensor_peak(log, (since or {}).get(name, 0))
        return peaks

    def _logs(self):
        return {f"/job:worker/task:{k}/device:CPU:0": self._log("worker", k)
                for k in range(len(self.cluster["cluster"]["worker"]))}

    def process(self, task, job="worker"):
        """The ``subprocess.Popen`` of one task."""
        return self.processes[task + (len(self.cluster["cluster"]["worker"])
                                      if job == "ps" else 0)]

    def memory(self):
        """Each task's CPU allocator figures now: its CPU:0 device name ->
        ``{"current", "peak", "start"}`` in bytes, ``peak`` the most in use since the
        last :meth:`reset_memory` (or the start), ``start`` what it held right after its
        server started. Needs ``memory_stats=True``."""
        return self._ask_memory(reset=False)

    def reset_memory(self):
        """Reset every task's peak to the bytes it holds now; return the figures after
        the reset, as :meth:`memory` does."""
        return self._ask_memory(reset=True)

    def _ask_memory(self, reset):
        from tfpart.memory_stats import ask

        if not self.memory_stats:
            raise RuntimeError("these workers were started without memory_stats=True")
        processes = dict(zip(self.memory_files, self.processes))
        return ask({name: (processes[name], path) for name, path in self.memory_files.items()},
                   reset=reset)

    def kill(self, task, job="worker"):
        """Kill one task abruptly (as a crashed host would go)."""
        process = self.process(task, job)
        process.kill()
        process.wait(timeout=30)

    def freeze(self, task, job="worker", frozen=True):
        """Stop one task with SIGSTOP (as a hung or cut-off host would seem: its kernel
        still accepts connections), or with ``frozen=False`` let it go on (SIGCONT);
        returns once the kernel shows it stopped or running (signals arrive later)."""
        process = self.process(task, job)
        process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and process.poll() is None:
            try:
                state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # no /proc here: the signal alone
            if (state in "Tt") == frozen:
                return
            time.sleep(0.01)

    def stop(self):
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                process.send_signal(signal.SIGCONT)  # a frozen task acts on SIGTERM
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _accepts(port):
    try:
        socket.create_connection(("localhost", port), timeout=1).close()
        return True
    except OSError:
        return False
