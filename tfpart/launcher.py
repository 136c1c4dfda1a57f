"""Which task this process is, when a launcher started it: ``mpirun`` (Open MPI,
MPICH and its derivatives) or SLURM's ``srun``, read from the environment they set,
as TensorFlow's ``SlurmClusterResolver`` and Horovod read it.

Open MPI sets ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE`` and
``OMPI_COMM_WORLD_LOCAL_RANK``; MPICH's Hydra (and Intel MPI) ``PMI_RANK``,
``PMI_SIZE`` and ``MPI_LOCALRANKID``; ``srun`` ``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID``, the step's node list (``SLURM_STEP_NODELIST``, in SLURM's range
syntax) and tasks per node (``SLURM_STEP_TASKS_PER_NODE``, e.g. ``2(x3),1``). Under
SLURM every task's host follows from those (tasks fill the nodes in order, SLURM's
default block distribution); under MPI only a task's own host is known, and the tasks
tell each other theirs (:mod:`tfpart.rendezvous`).

Every variable is read within bounds: ranks and sizes are ASCII digits (``"²"`` is a
digit to :meth:`str.isdigit`, not to :func:`int`) of at most
:data:`~tfpart.core.limits.MAX_LAUNCHED_TASKS` tasks, and node lists and tasks per
node are counted before they are expanded, so ``node[1-1000000000]`` is one line, not
a list of a billion names.

Hydra sets nothing that every rank of a launch shares and the next launch does not
(checked on MPICH 4.0.2: ``PMI_RANK``, ``PMI_SIZE``, ``PMI_FD``, ``MPI_LOCALRANKID``,
``MPI_LOCALNRANKS``, ``HYDI_CONTROL_FD``, ``MPIR_CVAR_CH3_INTERFACE_HOSTNAME``), but
its process manager names each launch's key-value space after mpiexec's process id,
the process group and a random number (``kvs_10014_0_34446074_host``):
:func:`pmi_kvsname` asks for it over the PMI-1 socket Hydra hands each rank.

Examples
--------
>>> task = launched_task({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
...     "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"})
>>> task.launcher, task.rank, task.size, task.local_rank, task.hosts
('slurm', 3, 4, 1, ('gpu07', 'gpu07', 'gpu08', 'gpu08'))
>>> launched_task({}) is None
True
>>> launched_task({"PMI_RANK": "²", "PMI_SIZE": "4"})
Traceback (most recent call last):
...
tfpart.core.errors.TfpartError: PMI_RANK: is '²', not a number (ASCII digits)
"""
from __future__ import annotations

import math
import os
import re
import socket
import stat
from dataclasses import dataclass

from tfpart.core.errors import TfpartError
from tfpart.core.limits import MAX_LAUNCHED_TASKS

MPI_VARIABLES = {  # launcher: (rank, size, local rank)
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "MPICH": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
}
MAX_NUMBER_DIGITS = 18  # beyond any count the bounds allow; int() of 4,300 digits fails
PMI_TIMEOUT_S = 30.0  # Hydra answers in milliseconds; longer is a process manager gone
MAX_PMI_LINE = 4096  # bytes of one PMI-1 answer (Hydra's own limit is 1024)


@dataclass(frozen=True)
class LaunchedTask:
    """This process's place among the tasks a launcher started: its ``rank`` of
    ``size``, its ``local_rank`` among the tasks on its host, and, where the launcher
    says (SLURM), every rank's host in SLURM's default block distribution and this
    task's own node (``SLURMD_NODENAME``, right under any distribution)."""

    launcher: str
    rank: int
    size: int
    local_rank: int
    hosts: tuple | None = None
    node: str | None = None

    @property
    def host(self):
        """This task's host name: the launcher's, else this machine's."""
        return self.node or (self.hosts[self.rank] if self.hosts else socket.gethostname())


def launched_task(environ):
    """The :class:`LaunchedTask` described by ``environ`` (``os.environ``), or None
    when no launcher started this process; TfpartError naming the variable when one
    is malformed or out of bounds."""
    for launcher, (rank, size, local) in MPI_VARIABLES.items():
        if rank in environ:
            return _checked(LaunchedTask(launcher, _number(environ, rank),
                                         _number(environ, size, low=1),
                                         _number(environ, local, default=0)))
    if environ.get("PMI_PORT") and environ.get("PMI_ID"):
        raise TfpartError("PMI_PORT", "is set without PMI_RANK and PMI_SIZE (mpiexec "
                          "-pmi-port): launch without -pmi-port, so that each task knows "
                          "its rank and the number of tasks")
    if "SLURM_PROCID" in environ:
        return _slurm_task(environ)
    return None


def _slurm_task(environ):
    nodes = expand_nodelist(_first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    per_node = expand_tasks_per_node(_first(environ, "SLURM_STEP_TASKS_PER_NODE",
                                            "SLURM_TASKS_PER_NODE"))
    if len(per_node) != len(nodes):
        raise TfpartError("SLURM_STEP_TASKS_PER_NODE", f"gives tasks for {len(per_node)} "
                          f"nodes but the node list has {len(nodes)}")
    hosts = tuple(node for node, count in zip(nodes, per_node) for _ in range(count))
    size = _number(environ, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ
                   else "SLURM_NTASKS", default=len(hosts), low=1)
    if size != len(hosts):
        raise TfpartError("SLURM_NTASKS", f"is {size} but the nodes hold {len(hosts)} tasks")
    return _checked(LaunchedTask("slurm", _number(environ, "SLURM_PROCID"), size,
                                 _number(environ, "SLURM_LOCALID", default=0), hosts,
                                 environ.get("SLURMD_NODENAME") or None))


def expand_nodelist(nodelist, limit=MAX_LAUNCHED_TASKS):
    """The host names of a SLURM node list: comma-separated names, each with
    optional bracketed ranges and lists (zero padding kept), as ``scontrol show
    hostnames`` expands them; TfpartError if it names more than ``limit`` nodes
    (counted before any is made).

    >>> expand_nodelist("node[01-03,07],gpu-a[1-2]x,login")
    ['node01', 'node02', 'node03', 'node07', 'gpu-a1x', 'gpu-a2x', 'login']
    >>> expand_nodelist("rack[1-2]-n[3-4]")
    ['rack1-n3', 'rack1-n4', 'rack2-n3', 'rack2-n4']
    >>> expand_nodelist("n[1-1000000000]")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: SLURM_STEP_NODELIST: names 1000000000 nodes, more than the 4096 tasks a launch may have
    """
    parts = []
    for part in _top_level_split(nodelist):
        # one character or one bracket per repetition: no nested quantifier to backtrack
        if not re.fullmatch(r"(?:[^\[\],]|\[[^\[\]]+\])+", part):
            raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list "
                              f"{shown(nodelist)}")
        parts.append([(literal, _ranges(ranges, nodelist) if ranges else None)
                      for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part)])
    count = sum(math.prod(1 if values is None else len(values) for _, values in pieces)
                for pieces in parts)
    if count > limit:
        raise TfpartError("SLURM_STEP_NODELIST", f"names {count} nodes, more than the "
                          f"{limit} tasks a launch may have")
    names = []
    for pieces in parts:
        expanded = [""]
        for literal, values in pieces:
            expanded = [head + literal + str(value) for head in expanded
                        for value in ([""] if values is None else values)]
        names.extend(expanded)
    if not names or not all(names):
        raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list "
                          f"{shown(nodelist)}")
    return names


def expand_tasks_per_node(text, limit=MAX_LAUNCHED_TASKS):
    """Tasks on each node from SLURM's compressed form: ``2(x3),1`` is 2, 2, 2, 1;
    TfpartError if they add up to more than ``limit`` (counted before the list is
    made).

    >>> expand_tasks_per_node("2(x3),1"), expand_tasks_per_node("4")
    ([2, 2, 2, 1], [4])
    >>> expand_tasks_per_node("1(x1000000000)")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: SLURM_STEP_TASKS_PER_NODE: 1000000000 tasks, more than the 4096 a launch may have
    """
    items = []
    for item in text.split(","):
        found = re.fullmatch(r"\s*([0-9]{1,%d})(?:\(x([0-9]{1,%d})\))?\s*"
                             % (MAX_NUMBER_DIGITS, MAX_NUMBER_DIGITS), item)
        if found is None:
            raise TfpartError("SLURM_STEP_TASKS_PER_NODE", f"cannot read {shown(text)}")
        items.append((int(found.group(1)), int(found.group(2) or 1)))
    total = sum(count * repeats for count, repeats in items)
    if total > limit:
        raise TfpartError("SLURM_STEP_TASKS_PER_NODE", f"{total} tasks, more than the "
                          f"{limit} a launch may have")
    return [count for count, repeats in items for _ in range(repeats)]


def pmi_kvsname(environ, timeout=PMI_TIMEOUT_S):
    """The name of this launch's key-value space, asked of the process manager over
    the PMI-1 socket it passed in ``PMI_FD`` (MPICH's Hydra, Intel MPI), or None where
    there is none. The exchange is the one ``PMI_Init``, ``PMI_KVS_Get_my_name`` and
    ``PMI_Finalize`` make (so Hydra neither waits on this process nor counts it as
    failed when the socket closes); the socket is closed after it.

    >>> pmi_kvsname({}) is None
    True
    >>> pmi_kvsname({"PMI_FD": "٣"})
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: PMI_FD: is '٣', not a number (ASCII digits)
    """
    if not environ.get("PMI_FD"):
        return None
    fd = _number(environ, "PMI_FD", high=2**31 - 1)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        raise TfpartError("PMI_FD", f"is {fd}, which is not open in this process: "
                          "was it started by the launcher itself?") from None
    if not stat.S_ISSOCK(mode):
        raise TfpartError("PMI_FD", f"is {fd}, which is not a socket to a process manager")
    channel = socket.socket(fileno=fd)
    try:
        channel.settimeout(min(timeout, PMI_TIMEOUT_S))
        _ask(channel, "init pmi_version=1 pmi_subversion=1", "response_to_init")
        name = _ask(channel, "get_my_kvsname", "my_kvsname").get("kvsname")
        _ask(channel, "finalize", "finalize_ack")
    except OSError as exc:  # a timeout included
        raise TfpartError("PMI_FD", "the process manager did not answer on this socket "
                          f"({exc.strerror or exc or 'timed out'})") from None
    finally:
        channel.close()
    if not name:
        raise TfpartError("PMI_FD", "the process manager gave no name for this launch")
    return name


def _ask(channel, command, answer):
    """Send the PMI-1 ``command`` and read its one-line answer, which must be ``answer``
    with ``rc`` 0 if any; its ``key=value`` fields."""
    channel.sendall(f"cmd={command}\n".encode())
    line = b""
    while not line.endswith(b"\n"):
        chunk = channel.recv(MAX_PMI_LINE)
        if not chunk or len(line) + len(chunk) > MAX_PMI_LINE:
            raise TfpartError("PMI_FD", f"the process manager's answer to {command!r} "
                              "ended early or is too long")
        line += chunk
    fields = dict(field.partition("=")[::2] for field in
                  line.decode("ascii", "replace").split())
    if fields.get("cmd") != answer or fields.get("rc", "0") != "0":
        raise TfpartError("PMI_FD", f"the process manager answered {command!r} with "
                          f"{shown(line.decode('ascii', 'replace').strip())}")
    return fields


def _ranges(ranges, nodelist):
    values = []
    for item in ranges.split(","):
        found = re.fullmatch(r"([0-9]{1,%d})(?:-([0-9]{1,%d}))?"
                             % (MAX_NUMBER_DIGITS, MAX_NUMBER_DIGITS), item)
        if found is None:
            raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list "
                              f"{shown(nodelist)}")
        low, high = found.group(1), found.group(2) or found.group(1)
        if int(high) < int(low):
            raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list "
                              f"{shown(nodelist)}: the range {item} is empty")
        values.append(_ZeroPadded(int(low), int(high), len(low)))
    return _Concatenated(values)


class _ZeroPadded:
    """The numbers ``low`` to ``high`` as text ``width`` wide, made only when iterated."""

    def __init__(self, low, high, width):
        self.low, self.high, self.width = low, high, width

    def __len__(self):
        return max(0, self.high - self.low + 1)

    def __iter__(self):
        return (str(n).zfill(self.width) for n in range(self.low, self.high + 1))


class _Concatenated:
    """Sequences one after the other, counted without being made."""

    def __init__(self, parts):
        self.parts = parts

    def __len__(self):
        return sum(len(part) for part in self.parts)

    def __iter__(self):
        return (value for part in self.parts for value in part)


def _top_level_split(text):
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _first(environ, *names):
    for name in names:
        if environ.get(name):
            return environ[name]
    raise TfpartError(names[0], "is not set, though SLURM_PROCID is: not an srun task?")


def _number(environ, name, default=None, low=0, high=MAX_LAUNCHED_TASKS):
    """The variable ``name`` as a whole number of ASCII digits from ``low`` to
    ``high`` (``default`` where it is unset and a default is given)."""
    raw = environ.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not re.fullmatch(r"\s*[0-9]+\s*", raw):
        raise TfpartError(name, f"is {shown(raw)}, not a number (ASCII digits)")
    digits = raw.strip().lstrip("0") or "0"
    value = int(digits) if len(digits) <= MAX_NUMBER_DIGITS else math.inf
    said = value if value < math.inf else f"a number of {len(digits)} digits"
    if value > high and high == MAX_LAUNCHED_TASKS:
        raise TfpartError(name, f"is {said}: more than the {high} tasks a launch may have")
    if not low <= value <= high:
        raise TfpartError(name, f"is {said}: not from {low} to {high}")
    return value


def shown(raw, width=60):
    """``raw`` as a message shows it: quoted, cut to ``width`` characters."""
    text = repr(raw)
    return text if len(text) <= width else text[:width - 4] + "…" + text[-3:]


def _checked(task):
    if not 0 <= task.rank < task.size:
        raise TfpartError("", f"{task.launcher} says this is rank {task.rank} of {task.size}")
    return task
