"""The lowering of a plan's pipelined or replicated step: the tasks it runs, in an order
that can be built, and the schedule's ordering edges between them.

A task is one piece of the model, ``(stage, phase)``, run for one micro-batch of one
replica on one device. :func:`lower` lists a step's tasks from the schedule's task
table (:mod:`costmodel.schedules`): per replica, the lanes of the table (a stage's or
a device's tasks) merged so that every task comes after the tasks whose results it
reads. Its ordering edges are the schedule itself: on each lane, a task waits for the
one before it. It prices nothing and builds nothing; both sides of the compiler read
it: the simulator's execution graph (:func:`costmodel.pipeline.pipeline_graph` and
its barriers) and the pipeline rewriter (its imports and gates, :mod:`rewriters.lowered`).

Micro-batches are numbered over the whole step, ``0 … M - 1``, the rows of the batch
in order: each replica runs a run of consecutive ones (its ``lanes`` entry). A task
also carries the numbering the execution graph stamps on its copies: its ``replica``
(None without replicas) and its ``microbatch`` within that replica (None where the
replica, or the step, runs its rows at once).

Examples
--------
Two stages on two devices, two micro-batches, 1F1B; the second stage has no backward:

>>> step = lower({0: "a", 1: "b"}, {(0, "forward"), (0, "backward"), (1, "forward")},
...              2, "1f1b", reads={(1, "forward"): {(0, "forward")},
...                                (0, "backward"): {(1, "forward")}})
>>> [(t.step_microbatch, t.stage, t.phase) for t in step.tasks]
[(0, 0, 'forward'), (1, 0, 'forward'), (0, 1, 'forward'), (0, 0, 'backward'), (1, 1, 'forward'), (1, 0, 'backward')]
>>> [(a.step_microbatch, a.phase, b.step_microbatch, b.phase) for a, b in step.ordering
...  if a.stage == 0]
[(0, 'forward', 1, 'forward'), (1, 'forward', 0, 'backward'), (0, 'backward', 1, 'backward')]
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.schedules import table


@dataclass(frozen=True)
class Task:
    """Piece ``(stage, phase)`` run for micro-batch ``step_microbatch`` of the step (its
    rows of the batch) on ``device``; ``replica`` and ``microbatch`` (within the
    replica) as the execution graph numbers its copies (None: not one of several)."""

    step_microbatch: int
    stage: int
    phase: str
    replica: int | None
    microbatch: int | None
    device: object  # a device name or index, as the caller gave it

    @property
    def piece(self):
        """The ``(stage, phase)`` this task runs."""
        return self.stage, self.phase


@dataclass(frozen=True)
class Lowering:
    """A step's tasks in an order that imports each after those it reads, the
    schedule's ordering edges ``(earlier, later)`` (a lane's consecutive tasks), and
    per replica its micro-batches of the step (one entry without replicas)."""

    tasks: tuple
    ordering: tuple
    lanes: tuple
    replicated: bool

    def replica_of(self, step_microbatch):
        """The replica that runs micro-batch ``step_microbatch`` (None without
        replicas).

        >>> lower({0: "a"}, {(0, "forward")}, 2, replicas=2).replica_of(3)
        1
        """
        if not self.replicated:
            return None
        return next(r for r, lane in enumerate(self.lanes) if step_microbatch in lane)

    def of_replica(self, replica):
        """Replica ``replica``'s tasks (every task without replicas), in order."""
        return [task for task in self.tasks if task.replica in (replica, None)]

    def copies(self, replica):
        """The micro-batch numbers of replica ``replica``'s copies of an op, as the
        execution graph stamps them: ``[None]`` where it runs its rows at once.

        >>> lower({0: "a"}, {(0, "forward")}, 2, replicas=2).copies(1)
        [0, 1]
        >>> lower({0: "a"}, {(0, "forward")}, None, replicas=2).copies(1)
        [None]
        """
        if any(task.microbatch is None for task in self.tasks if task.replica == replica):
            return [None]
        return list(range(len(self.lanes[replica])))

    def waits_for(self):
        """Each task that waits for another on its lane -> that task."""
        return {later: earlier for earlier, later in self.ordering}


def lower(stage_devices, pieces, microbatches, schedule="gpipe", replicas=0, reads=None,
          devices=None):
    """The :class:`Lowering` of a step.

    Parameters
    ----------
    stage_devices : dict
        Stage -> the device it runs on: how the stages share devices lays out the
        schedule's task table.
    pieces : set of tuple
        The ``(stage, phase)`` pieces that hold ops: a task of any other is left out,
        and a task waits only for the pieces of ``reads`` among them.
    microbatches : int or None
        Micro-batches of the step; with ``replicas``, of each replica (None: each
        replica runs its share at once, and nothing is ordered).
    schedule : str
        A schedule of :mod:`costmodel.schedules`.
    replicas : int
        How many replicas (0: none).
    reads : dict, optional
        Piece -> the pieces whose results it reads (of the same micro-batch); without
        it, the lanes are merged one task of each at a time.
    devices : list of dict, optional
        Per replica, stage -> the device its tasks run on (by default every replica's
        on ``stage_devices``).

    Raises
    ------
    ValueError
        If the schedule does not take these stages, or no order lets every task follow
        the tasks it reads (stages that read each other's results both ways).

    Examples
    --------
    Two replicas of one stage, each with two micro-batches of its own:

    >>> step = lower({0: "x"}, {(0, "forward")}, 2, replicas=2, devices=[{0: "a"}, {0: "b"}])
    >>> [(t.step_microbatch, t.replica, t.microbatch, t.device) for t in step.tasks]
    [(0, 0, 0, 'a'), (1, 0, 1, 'a'), (2, 1, 0, 'b'), (3, 1, 1, 'b')]
    >>> step.lanes, len(step.ordering)
    (([0, 1], [2, 3]), 2)
    """
    per = microbatches or 1
    count = max(1, replicas)
    lanes = tuple(list(range(r * per, (r + 1) * per)) for r in range(count))
    layout = table(stage_devices, per, schedule)
    devices = devices or [stage_devices] * count
    tasks, ordering = [], []
    for r, lane in enumerate(lanes):
        queues = [[Task(lane[m], stage, phase, r if replicas else None,
                         _numbered(m, per, microbatches, replicas), devices[r][stage])
                   for m, stage, phase in row if (stage, phase) in pieces]
                  for row in layout]
        if microbatches or not replicas:
            ordering += [pair for queue in queues for pair in zip(queue, queue[1:])]
        tasks += _merged(queues, pieces, reads, schedule)
    return Lowering(tuple(tasks), tuple(ordering), lanes, bool(replicas))


def _numbered(m, per, microbatches, replicas):
    """Micro-batch ``m`` of its replica (of ``per``) as the execution graph numbers it:
    None where its replica, or the step, runs its rows at once.

    >>> _numbered(1, 2, 2, 2), _numbered(0, 1, None, 2), _numbered(0, 1, 1, 0)
    (1, None, None)
    """
    if replicas:
        return m if microbatches else None
    return m if per > 1 else None


def _merged(queues, pieces, reads, schedule):
    """The tasks of ``queues`` (one per lane, each in its order) in one order: in
    rounds, every lane whose next task reads only tasks already taken (of its
    micro-batch, of the ``pieces``) gives it."""
    taken, order = set(), []
    while any(queues):
        ready = [queue for queue in queues if queue and all(
            (queue[0].step_microbatch, *piece) in taken or piece not in pieces
            for piece in (reads or {}).get(queue[0].piece, ()))]
        if not ready:
            task = next(queue[0] for queue in queues if queue)
            raise ValueError(f"the {schedule} schedule cannot run stage {task.stage}'s "
                             f"{task.phase} of micro-batch {task.step_microbatch}: the "
                             "stages read each other's results in both directions")
        for queue in ready:
            taken.add((queue[0].step_microbatch, *queue[0].piece))
            order.append(queue.pop(0))
    return order
