"""Pipeline schedules: the order in which each device runs the tasks of a pipelined
step, one module per schedule, registered here.

A task is ``(micro-batch, stage, phase)``, phase ``"forward"`` or ``"backward"``. A
schedule module gives:

- ``NAME``, the plan's and the CLI's name for it, and ``SUMMARY``, a line of help;
- ``CHUNKS``, how many stages the pipeline partitioner puts on each device for it;
- ``lanes(stage_devices, microbatches)``, its task table: lanes of tasks, each run in
  its order on one device (a stage's or a device's), which :mod:`costmodel.lowering`
  turns into the tasks and ordering edges that the simulator
  (:func:`costmodel.pipeline._replicate`'s barriers) and the pipeline rewriter (its
  import order and gates) both read;
- ``bubble(devices, chunks, microbatches)``, its idle share.

Adding a schedule is one module and its line in ``_MODULES``: the CLI's
``--schedule`` choices, plan.json's schema (held equal by
``tests/costmodel/test_schedules.py``) and the pipeline partitioner's candidates
follow.

>>> SCHEDULES
('gpipe', '1f1b', 'interleaved')
>>> table({0: "a", 1: "b"}, 2, "1f1b")[0]
[(0, 0, 'forward'), (1, 0, 'forward'), (0, 0, 'backward'), (1, 0, 'backward')]
>>> in_flight({0: "a", 1: "b"}, 4, "1f1b")
[2, 1]
"""
from __future__ import annotations

from costmodel.schedules import fill_drain, interleaved, one_f_one_b

_MODULES = (fill_drain, one_f_one_b, interleaved)
REGISTRY = {module.NAME: module for module in _MODULES}
SCHEDULES = tuple(REGISTRY)


def schedule_named(name):
    """The module of schedule ``name``; ValueError naming the known ones."""
    if name not in REGISTRY:
        raise ValueError(f"unknown pipeline schedule {name!r}; one of {SCHEDULES}")
    return REGISTRY[name]


def table(stage_devices, microbatches, name="gpipe"):
    """Schedule ``name``'s lanes of ``(micro-batch, stage, phase)`` tasks for stages on
    ``stage_devices`` (stage -> device)."""
    return schedule_named(name).lanes(stage_devices, microbatches)


def in_flight(stage_devices, microbatches, name="gpipe"):
    """Per lane of :func:`table`, the most (micro-batch, stage) activations it holds at
    once: a forward task keeps its activations until its backward."""
    peaks = []
    for lane in table(stage_devices, microbatches, name):
        held = peak = 0
        for _, _, phase in lane:
            held += 1 if phase == "forward" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def bubble(name, devices, chunks, microbatches):
    """Schedule ``name``'s idle share over ``devices`` devices of ``chunks`` stages each
    and ``microbatches``.

    >>> bubble("gpipe", 3, 1, 8), bubble("interleaved", 3, 2, 8)
    (0.2, 0.1111111111111111)
    """
    return schedule_named(name).bubble(devices, chunks, microbatches)
