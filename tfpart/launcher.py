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

Examples
--------
>>> task = launched_task({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
...     "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"})
>>> task.launcher, task.rank, task.size, task.local_rank, task.hosts
('slurm', 3, 4, 1, ('gpu07', 'gpu07', 'gpu08', 'gpu08'))
>>> launched_task({}) is None
True
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from tfpart.core.errors import TfpartError

MPI_VARIABLES = {  # launcher: (rank, size, local rank)
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "MPICH": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
}


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
    is malformed."""
    for launcher, (rank, size, local) in MPI_VARIABLES.items():
        if rank in environ:
            return _checked(LaunchedTask(launcher, _number(environ, rank),
                                         _number(environ, size),
                                         _number(environ, local, default=0)))
    if "SLURM_PROCID" in environ:
        nodes = expand_nodelist(_first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
        per_node = expand_tasks_per_node(_first(environ, "SLURM_STEP_TASKS_PER_NODE",
                                                "SLURM_TASKS_PER_NODE"))
        if len(per_node) != len(nodes):
            raise TfpartError("SLURM_STEP_TASKS_PER_NODE", f"gives tasks for {len(per_node)} "
                              f"nodes but the node list has {len(nodes)}")
        hosts = tuple(node for node, count in zip(nodes, per_node) for _ in range(count))
        size = _number(environ, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ
                       else "SLURM_NTASKS", default=len(hosts))
        if size != len(hosts):
            raise TfpartError("SLURM_NTASKS", f"is {size} but the nodes hold {len(hosts)} tasks")
        return _checked(LaunchedTask("slurm", _number(environ, "SLURM_PROCID"), size,
                                     _number(environ, "SLURM_LOCALID", default=0), hosts,
                                     environ.get("SLURMD_NODENAME") or None))
    return None


def expand_nodelist(nodelist):
    """The host names of a SLURM node list: comma-separated names, each with
    optional bracketed ranges and lists (zero padding kept), as ``scontrol show
    hostnames`` expands them.

    >>> expand_nodelist("node[01-03,07],gpu-a[1-2]x,login")
    ['node01', 'node02', 'node03', 'node07', 'gpu-a1x', 'gpu-a2x', 'login']
    >>> expand_nodelist("rack[1-2]-n[3-4]")
    ['rack1-n3', 'rack1-n4', 'rack2-n3', 'rack2-n4']
    """
    names = []
    for part in _top_level_split(nodelist):
        if not re.fullmatch(r"(?:[^\[\],]+|\[[^\[\]]+\])+", part):
            raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list {nodelist!r}")
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            values = [literal + value for value in _ranges(ranges, nodelist)] \
                if ranges else [literal]
            expanded = [head + value for head in expanded for value in values]
        names.extend(expanded)
    if not names or not all(names):
        raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list {nodelist!r}")
    return names


def expand_tasks_per_node(text):
    """Tasks on each node from SLURM's compressed form: ``2(x3),1`` is 2, 2, 2, 1.

    >>> expand_tasks_per_node("2(x3),1"), expand_tasks_per_node("4")
    ([2, 2, 2, 1], [4])
    """
    counts = []
    for item in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if found is None:
            raise TfpartError("SLURM_STEP_TASKS_PER_NODE", f"cannot read {text!r}")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def _ranges(ranges, nodelist):
    values = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise TfpartError("SLURM_STEP_NODELIST", f"cannot read the node list {nodelist!r}")
        width = len(low)
        values += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
    return values


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


def _number(environ, name, default=None):
    raw = environ.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not raw.strip().isdigit():
        raise TfpartError(name, f"is {raw!r}, not a number")
    return int(raw)


def _checked(task):
    if not 0 <= task.rank < task.size:
        raise TfpartError("", f"{task.launcher} says this is rank {task.rank} of {task.size}")
    return task
