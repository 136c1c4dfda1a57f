"""Fill–drain (GPipe): every micro-batch's forward, then every backward.

A stage holds the activations of all M micro-batches at once; its idle share is
(K - 1) / (M + K - 1) over K stages (Huang et al., GPipe, 2019).

>>> stage_order(1, 2, 2)
[(0, 'forward'), (1, 'forward'), (0, 'backward'), (1, 'backward')]
"""
from __future__ import annotations

NAME = "gpipe"
SUMMARY = "every forward, then every backward (fill-drain)"
CHUNKS = 1  # stages per device when the pipeline partitioner plans it


def stage_order(stage, stages, microbatches):
    """The ``(micro-batch, phase)`` tasks of ``stage`` of ``stages``, in order: the
    same on every stage."""
    return [(m, "forward") for m in range(microbatches)] + \
        [(m, "backward") for m in range(microbatches)]


def lanes(stage_devices, microbatches):
    """One lane per stage (``stage_devices``: stage -> device), each its
    ``(micro-batch, stage, phase)`` tasks in order.

    >>> lanes({0: "a", 1: "b"}, 1)
    [[(0, 0, 'forward'), (0, 0, 'backward')], [(0, 1, 'forward'), (0, 1, 'backward')]]
    """
    stages = sorted(stage_devices)
    return [[(m, stage, phase) for m, phase in stage_order(i, len(stages), microbatches)]
            for i, stage in enumerate(stages)]


def bubble(devices, chunks, microbatches):
    """The idle share of ``devices`` busy stages over ``microbatches``.

    >>> bubble(3, 1, 8)
    0.2
    """
    devices = max(1, int(devices))
    return (devices - 1) / (microbatches + devices - 1)
