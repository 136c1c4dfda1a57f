"""1F1B (PipeDream-Flush): stage k of K runs K - k - 1 forwards to fill the pipeline,
then alternates one forward and one backward, then drains the backwards.

A stage holds the activations of at most K - k micro-batches (GPipe: all M); the
bubble is fill-drain's, (K - 1) / (M + K - 1) (Narayanan et al., 2021).

>>> stage_order(0, 2, 3)
[(0, 'forward'), (1, 'forward'), (0, 'backward'), (2, 'forward'), (1, 'backward'), (2, 'backward')]
"""
from __future__ import annotations

from costmodel.schedules import fill_drain

NAME = "1f1b"
SUMMARY = "one forward, one backward once the pipeline is full (less memory)"
CHUNKS = 1


def stage_order(stage, stages, microbatches):
    """The ``(micro-batch, phase)`` tasks of ``stage`` of ``stages``, in order."""
    forwards = [(m, "forward") for m in range(microbatches)]
    backwards = [(m, "backward") for m in range(microbatches)]
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for m in range(microbatches - warmup):
        order += [forwards[warmup + m], backwards[m]]
    return order + backwards[microbatches - warmup:]


def lanes(stage_devices, microbatches):
    """One lane per stage (``stage_devices``: stage -> device), each its
    ``(micro-batch, stage, phase)`` tasks in order.

    >>> lanes({0: "a", 1: "b"}, 2)[1]
    [(0, 1, 'forward'), (0, 1, 'backward'), (1, 1, 'forward'), (1, 1, 'backward')]
    """
    stages = sorted(stage_devices)
    return [[(m, stage, phase) for m, phase in stage_order(i, len(stages), microbatches)]
            for i, stage in enumerate(stages)]


bubble = fill_drain.bubble
