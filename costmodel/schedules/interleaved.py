"""Interleaved 1F1B with virtual stages (Narayanan et al., SC 2021, Megatron-LM).

Each of D devices holds v > 1 non-contiguous chunks of the model: of D·v stages, stage
k runs on the device of stage k mod D. A device takes its micro-batches in groups of D,
each group through its first chunk, then its second, …; it runs forwards until the
pipeline is full, then alternates one forward and one backward (backwards through its
chunks in reverse), then drains the backwards. The fill and drain pass a chunk, 1/v of
a device's work, so the bubble shrinks to (D - 1) / (v·M + D - 1); a micro-batch
crosses D·v - 1 stage borders instead of D - 1.

Two devices, two chunks each (stages 0 and 2 on "a", 1 and 3 on "b"), two
micro-batches:

>>> [task[:2] for task in lanes({0: "a", 1: "b", 2: "a", 3: "b"}, 2)[0]][:6]
[(0, 0), (1, 0), (0, 2), (1, 2), (0, 2), (1, 2)]
"""
from __future__ import annotations

NAME = "interleaved"
SUMMARY = "1F1B over two virtual stages per device (a smaller bubble, more transfers)"
CHUNKS = 2


def chunks_of(stage_devices):
    """Each device's stages, in stage order, devices in the order of their first
    stage; ValueError unless stage k is on the device of stage k mod D.

    >>> chunks_of({0: "a", 1: "b", 2: "a", 3: "b"})
    [[0, 2], [1, 3]]
    """
    stages = sorted(stage_devices)
    devices = list(dict.fromkeys(stage_devices[k] for k in stages))
    count = len(devices)
    if len(stages) % count or any(stage_devices[k] != devices[i % count]
                                  for i, k in enumerate(stages)):
        raise ValueError(f"the {NAME} schedule needs stage k on the device of stage k mod "
                         f"{count}, the number of devices; stages -> devices were "
                         f"{[stage_devices[k] for k in stages]}")
    return [stages[d::count] for d in range(count)]


def _passes(chunks, count, microbatches, phase):
    """A device's tasks of one phase in order: micro-batches in groups of ``count``,
    each group through ``chunks`` (backwards: in reverse)."""
    order = chunks if phase == "forward" else chunks[::-1]
    return [(m, stage, phase)
            for first in range(0, microbatches, count)
            for stage in order
            for m in range(first, min(first + count, microbatches))]


def lanes(stage_devices, microbatches):
    """One lane per device: its ``(micro-batch, stage, phase)`` tasks in order."""
    per_device = chunks_of(stage_devices)
    count = len(per_device)
    table = []
    for rank, chunks in enumerate(per_device):
        forwards = _passes(chunks, count, microbatches, "forward")
        backwards = _passes(chunks, count, microbatches, "backward")
        warmup = min(len(forwards), 2 * (count - rank - 1) + (len(chunks) - 1) * count)
        order = forwards[:warmup]
        for i in range(len(forwards) - warmup):
            order += [forwards[warmup + i], backwards[i]]
        table.append(order + backwards[len(forwards) - warmup:])
    return table


def bubble(devices, chunks, microbatches):
    """The idle share of ``devices`` devices of ``chunks`` stages each over
    ``microbatches``.

    >>> bubble(2, 2, 4), bubble(2, 1, 4)
    (0.1111111111111111, 0.2)
    """
    devices = max(1, int(devices))
    return (devices - 1) / (max(1, chunks) * microbatches + devices - 1)
