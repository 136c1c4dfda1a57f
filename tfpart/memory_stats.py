"""A task's allocator figures on request: ``tfpart worker --memory-stats FILE``.

What TensorFlow's CPU allocator holds in a ``tfpart worker`` process, as that process
itself reads it with ``tf.config.experimental.get_memory_info("CPU:0")``: the
server's devices and the process's own eager context share the one CPU allocator
(``ProcessState``), so these figures include every tensor the server allocates for
its remote clients (variables, activations, received copies). Measured: a client's
``tf.random.normal([4096, 4096])`` and a matmul of it placed on a worker raised the
worker's ``current`` by 134,218,240 bytes (the two 64 MiB tensors, which the client
still held), and a function making a further 32 MiB and 16 MiB tensor there raised
its ``peak`` by exactly 48 MiB above that.

TensorFlow keeps these statistics only for its BFC allocator, which
``TF_CPU_ALLOCATOR_USE_BFC=true`` selects for CPUs; :func:`serve` sets that before the
server makes its allocator, so a task measured runs on the BFC allocator rather than
the default one.

The task answers two signals (sent by :meth:`tfpart.local_workers.LocalWorkers.memory`
and ``reset_memory``, or by hand with ``kill -USR1 PID``):

- ``SIGUSR1``: write ``{"current": ..., "peak": ..., "start": ..., "pid": ...}`` to
  FILE (bytes in use now, the most in use since the last reset or the start, and the
  bytes in use right after the server started, before any client);
- ``SIGUSR2``: reset the peak to the bytes in use now, then write FILE the same way.

FILE is replaced atomically (written beside it, then renamed), so a reader that
removes it before signalling and waits for it to reappear reads one whole answer. It
follows the output rule of :mod:`tfpart.core.output_files`, checked before the server
starts (:func:`check_output`): an existing FILE is replaced only if tfpart wrote it
(each answer carries tfpart's mark), never a file of the user's.

The task's allocator starts with one region of :data:`RESERVED_BYTES`, as
TensorFlow's GPU allocator does (without ``allow_growth`` it takes the GPU's memory as
one region when it starts): :func:`reserve_one_region` allocates and frees that much
before any client connects, addresses only (no page is touched). Without it the CPU's
BFC allocator grows by regions of 2 MiB, doubling, and a tensor landing at a region's
end gets the whole remainder when that is less than twice its size: measured, six
tensors of 22.8 MB in all held 31.5 MB of chunks from a fresh allocator, 23.2 MB after
the reservation. Those remainders are an artefact of growing a CPU's allocator, not what
a GPU plan pays, so a measured peak leaves them out.

The allocator's peak still counts its chunks, not the tensors in them: a freed chunk of
less than twice a later request is handed out whole. A task started with
:data:`ALLOCATION_LOG` in its environment logs every tensor allocated and freed;
:func:`tensor_peak` replays that log for the peak of the tensors' own bytes.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from tfpart.core.errors import first_line
from tfpart.core.output_files import MARK_KEY, check_output_file, json_kind, write_json_output

REPORT = signal.SIGUSR1
RESET = signal.SIGUSR2
BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
# addresses, not pages: more than any test or benchmark holds, and within what Linux's
# default (heuristic) overcommit grants a process on a small machine
RESERVED_BYTES = min(8 << 30, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
MEMORY_FIGURES = json_kind("memory figures file", "current", "peak", "start")


def check_output(path):
    """OutputError unless a task may write its figures to ``path``: absent, or a file of
    figures tfpart wrote (the worker has no ``--force``)."""
    check_output_file(path, MEMORY_FIGURES, force_flag=None)


def _write_figures(path, figures):
    write_json_output(path, figures, MEMORY_FIGURES, "worker --memory-stats",
                      force_flag=None)


def use_bfc_allocator():
    """Make TensorFlow give CPUs its BFC allocator, whose statistics it keeps; effective
    only before this process makes its CPU allocator (before a server or op runs).
    Until :func:`serve` answers them, :data:`REPORT` and :data:`RESET` are ignored (their
    default action would end the task while it starts)."""
    os.environ[BFC_VARIABLE] = "true"
    for number in (REPORT, RESET):
        signal.signal(number, signal.SIG_IGN)


def reserve_one_region(tf, nbytes):
    """Grow this process's BFC allocator by one region of ``nbytes`` and free it again,
    so that the tensors after it are cut from one free chunk as on a GPU (see the
    module docstring); the peak is reset to the bytes in use after. ``Empty`` without
    ``init`` writes nothing, so no page of the region is touched.

    In a fresh process (the allocator is chosen when TensorFlow first needs one):

    >>> import subprocess, sys
    >>> code = ("from tfpart.memory_stats import use_bfc_allocator, reserve_one_region\\n"
    ...         "use_bfc_allocator()\\n"
    ...         "import tensorflow as tf\\n"
    ...         "reserve_one_region(tf, 1 << 30)\\n"
    ...         "info = tf.config.experimental.get_memory_info('CPU:0')\\n"
    ...         "print(info['peak'] == info['current'] < 1 << 20)")
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    'True\\n'
    """
    rows = -(-nbytes // 4096)  # a 2-D shape: one dimension of 2**31 or more overflows
    region = tf.raw_ops.Empty(shape=[rows, 4096], dtype=tf.uint8, init=False)
    del region
    tf.config.experimental.reset_memory_stats("CPU:0")


def serve(path):
    """Answer :data:`REPORT` and :data:`RESET` in this process by writing its CPU
    allocator's figures to ``path`` (see the module docstring). Call it in the main
    thread, once the server has started: its bytes in use then are ``start``. Writes
    ``path`` once at once, so that whoever started the task knows when it answers
    (until then a signal would end it: their default action)."""
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    path = Path(path)
    try:
        reserve_one_region(tf, RESERVED_BYTES)
    except tf.errors.ResourceExhaustedError as exc:  # measured as the allocator grows
        print(f"tfpart worker: no {RESERVED_BYTES >> 20} MiB region reserved: "
              f"{first_line(exc)}", file=sys.stderr, flush=True)
    start = tf.config.experimental.get_memory_info("CPU:0")["current"]

    def answer(number, frame):
        try:
            if number == RESET:
                tf.config.experimental.reset_memory_stats("CPU:0")
            info = tf.config.experimental.get_memory_info("CPU:0")
            _write_figures(path, {"current": info["current"], "peak": info["peak"],
                                  "start": start, "pid": os.getpid()})
        except Exception as exc:  # noqa: BLE001 - a failed answer must not stop the task
            print(f"tfpart worker: no memory figures written to {path}: {exc}",
                  file=sys.stderr, flush=True)

    signal.signal(REPORT, answer)
    signal.signal(RESET, answer)
    _write_figures(path, {"current": start, "peak": start, "start": start, "pid": os.getpid()})


def ask(tasks, reset=False, timeout=30.0):
    """Signal every task and return its answer.

    Parameters
    ----------
    tasks : dict
        key -> ``(subprocess.Popen, path)``: a process serving its figures to ``path``.
    reset : bool
        Reset each task's peak first (:data:`RESET`) rather than only reading it.
    timeout : float
        Seconds to wait for all the answers.

    Returns
    -------
    dict
        key -> ``{"current", "peak", "start", "pid"}`` (bytes).
    """
    for process, path in tasks.values():
        Path(path).unlink(missing_ok=True)
    for process, _ in tasks.values():
        process.send_signal(RESET if reset else REPORT)
    deadline = time.monotonic() + timeout
    answers = {}
    for key, (process, path) in tasks.items():
        while True:
            try:
                answer = json.loads(Path(path).read_text())
                answers[key] = {name: value for name, value in answer.items()
                                if name != MARK_KEY}
                break
            except FileNotFoundError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"task {key} (pid {process.pid}) wrote no memory "
                                       f"figures to {path}") from None
                time.sleep(0.01)
    return answers


# TensorFlow's allocation log (``LogMemory``), on with ``TF_CPP_VMODULE=log_memory=2``
ALLOCATION_LOG = {"TF_CPP_VMODULE": "log_memory=2", "TF_CPP_MIN_LOG_LEVEL": "0"}
_ALLOCATED = re.compile(r"MemoryLogTensorAllocation \{.*? requested_bytes: (\d+) "
                        r"allocated_bytes: (\d+) allocator_name: (\"[^\"]*\") "
                        r"allocation_id: (\d+)")
_DEALLOCATED = re.compile(r"MemoryLogTensorDeallocation \{.*?allocation_id: (\d+) "
                          r"allocator_name: (\"[^\"]*\")")


def tensor_peak(lines, since=0):
    """The most bytes of tensors alive at once in TensorFlow's allocation log, from the
    ``since``-th line on: the tensors' own sizes (``requested``) and the allocator's
    chunks that hold them (``allocated``: rounded up, and a chunk of up to twice the
    size when the BFC allocator hands out a free chunk whole). Each is the running sum
    of allocations less deallocations over the whole log (what was allocated before
    ``since`` counts while it is alive), its peak taken from ``since`` on.

    >>> log = ['__LOG_MEMORY__ MemoryLogTensorAllocation { step_id: 1 kernel_name: "a" '
    ...        'tensor { allocation_description { requested_bytes: 400 allocated_bytes: 512 '
    ...        'allocator_name: "cpu" allocation_id: 7 } } }',
    ...        '__LOG_MEMORY__ MemoryLogTensorDeallocation { allocation_id: 7 '
    ...        'allocator_name: "cpu" }']
    >>> tensor_peak(log)
    {'requested': 400, 'allocated': 512}
    >>> tensor_peak(log, since=1)  # the tensor is alive as the window opens
    {'requested': 400, 'allocated': 512}
    >>> tensor_peak(log + log, since=2)
    {'requested': 400, 'allocated': 512}
    >>> tensor_peak(log, since=2)
    {'requested': 0, 'allocated': 0}
    """
    alive, now, peak = {}, [0, 0], None  # bytes (requested, allocated) alive
    for number, line in enumerate(lines):
        if number == since:  # what is alive as the window opens
            peak = list(now)
        if "__LOG_MEMORY__" not in line:
            continue
        found = _ALLOCATED.search(line)
        if found:  # ids are each allocator's own
            sizes = alive[found[3], found[4]] = (int(found[1]), int(found[2]))
            now = [now[0] + sizes[0], now[1] + sizes[1]]
        else:
            found = _DEALLOCATED.search(line)
            sizes = alive.pop((found[2], found[1]), (0, 0)) if found else (0, 0)
            now = [now[0] - sizes[0], now[1] - sizes[1]]
        if peak is not None:
            peak = [max(peak[0], now[0]), max(peak[1], now[1])]
    requested, allocated = peak or now
    return {"requested": requested, "allocated": allocated}
