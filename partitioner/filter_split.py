"""Filter split: an op placement (the greedy's, or one device) with its heaviest
convolutions and matmuls split along their output channels across devices, in
proportion to their speed.

Following Moreno-Álvarez et al., a layer's filters are shared among devices by their
measured speed with a largest-remainder rounding (:mod:`partitioner.shares`); here the
speed is each device's predicted time for that op, and a device whose share rounds to
nothing takes no part. The op's slices then run at once on their devices, which pays
when one layer dominates the step, or when the model fits on every device so that
placing whole ops leaves the others idle. Whether it pays is decided by simulation
(:func:`costmodel.splits.split_graph` prices the slices, the broadcast of the other
operands and the gather of the outputs): from a placement, the ``candidates``
splittable ops of longest time are tried, heaviest first, each over the 2, 3, …
fastest devices for it, and a split is kept when it shortens the simulated step by at
least ``min_gain`` and fits in memory. The search runs from the greedy's placement and
from the fastest single device (where the other devices are still free to take
slices); the faster result is kept. Backward ops of a training step split the same way
(a filter gradient along its output channels, an input gradient along its input
channels), each on its own.

References
----------
Moreno-Álvarez, Haut, Paoletti, Rico-Gallego, Díaz-Martín, Plaza. "Training deep neural
networks: a static load balancing approach", Neurocomputing, 2021.

Examples
--------
One big matmul on two CPUs: each computes half of the columns, which nearly halves
the step although the activations and half the weights cross between them.

>>> n = 4096
>>> g = OpGraph()
>>> g.add_op("x", op_type="Placeholder", outputs=[((n, n), "float32")])
>>> g.add_op("w", op_type="Const", outputs=[((n, n), "float32")])
>>> g.add_op("y", op_type="MatMul", flops=2.0 * n ** 3, bytes_accessed=12.0 * n * n,
...          input_shapes=((n, n), (n, n)), outputs=[((n, n), "float32")],
...          sliced={"input": 1, "axis": 1, "producer": "w"})
>>> g.add_edge("x", "y", bytes=4 * n * n); g.add_edge("w", "y", bytes=4 * n * n)
>>> cost = CostModel(g, cluster_of_devices(["cpu", "cpu"]))
>>> plan = partition(cost)
>>> plan.splits["y"].sizes, round(float(plan.step_time / cost.compute[2, 0]), 2)
((2048, 2048), 0.51)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costmodel.simulate import simulate
from costmodel.splits import split_cost
from partitioner.greedy_placement import GreedyOptions, greedy_placement
from partitioner.finish import make_plan
from partitioner.list_schedules import fastest_single_device
from partitioner.shares import proportional_shares
from tfpart.core.plan import Plan


@dataclass(frozen=True)
class FilterSplitOptions:
    """``candidates``: how many splittable ops (the longest first) are tried;
    ``max_devices``: the most devices one op is split over (None: every device that
    runs it); ``min_gain``: the fraction of the step a split must save to be kept;
    ``greedy``: the options of the greedy placement the splits may start from."""

    candidates: int = 16
    max_devices: int | None = None
    min_gain: float = 0.005
    greedy: GreedyOptions = field(default_factory=GreedyOptions)


def partition(cost, options=FilterSplitOptions()):
    """An op placement of ``cost.graph`` with the splits that shorten its step
    (``plan.splits``; empty if none does).

    Raises
    ------
    tfpart.core.errors.PlacementError
        As the greedy does: an op no device runs, or no placement fits in memory.
    """
    starts = [greedy_placement(cost, options.greedy)[0]]
    single = fastest_single_device(cost)
    if single is not None:
        starts.append(np.full(len(cost.ops), single[0]))
    device_of, splits, _ = min((_split_search(cost, start, options) for start in starts),
                               key=lambda found: found[2])
    split_costs, split_device_of = split_cost(cost, splits, device_of)
    figures = make_plan(split_costs, split_device_of, "filter_split", options)
    names = cost.cluster.device_names
    return Plan(assignment={op: names[d] for op, d in zip(cost.ops, device_of)},
                algorithm="filter_split", options=figures.options,
                splits={op: {"devices": [names[d] for d in devices], "sizes": list(sizes)}
                        for op, (devices, sizes) in splits.items()},
                predicted=figures.predicted, lower_bound=figures.lower_bound)


def _split_search(cost, device_of, options):
    """``(device_of, splits, simulated step)``: the splits kept, heaviest op first, from
    the placement ``device_of``."""
    splits, step = {}, simulate(cost, device_of, memory=False).makespan
    for op in _candidates(cost, device_of, options.candidates):
        best = None
        for trial in _device_choices(cost, op, options.max_devices):
            trial_step = _simulated_step(cost, {**splits, op: trial}, device_of)
            if trial_step is not None and (best is None or trial_step < best[1]):
                best = trial, trial_step
        if best is not None and best[1] < step * (1.0 - options.min_gain):
            splits[op], step = best
    return device_of, splits, step


def _candidates(cost, device_of, count):
    """The splittable ops (two channels or more, some time) of longest time where
    placed."""
    splittable = [op for op, attrs in cost.graph.ops.items() if _channels(attrs) > 1]
    time = {op: cost.compute[cost.index[op], device_of[cost.index[op]]] for op in splittable}
    return sorted((op for op in splittable if time[op] > 0), key=lambda op: -time[op])[:count]


def _device_choices(cost, op, max_devices):
    """``(devices, sizes)`` over the 2, 3, … devices fastest for ``op``, its channels
    shared by their speed (devices whose share rounds to nothing left out)."""
    times = cost.compute[cost.index[op]]
    fastest = [int(d) for d in np.argsort(times, kind="stable")
               if np.isfinite(times[d]) and times[d] > 0]
    channels = _channels(cost.graph.ops[op])
    seen = set()
    for k in range(2, min(len(fastest), max_devices or len(fastest)) + 1):
        devices = fastest[:k]
        sizes = proportional_shares(channels, 1.0 / times[devices])
        kept = tuple((d, s) for d, s in zip(devices, sizes) if s > 0)
        if len(kept) < 2 or kept in seen:
            continue
        seen.add(kept)
        yield tuple(d for d, _ in kept), tuple(s for _, s in kept)


def _channels(attrs):
    """The output channels an op's slices share: 0 if it does not split, which is also
    the case of an op whose output nothing reads (the reader leaves it no outputs).

    >>> _channels({"sliced": {"input": 1, "axis": 1, "producer": "w"},
    ...            "outputs": [((8, 64), "float32")]})
    64
    >>> _channels({"sliced": {"input": 1, "axis": 1, "producer": "w"}, "outputs": []})
    0
    """
    if not attrs.get("sliced") or not attrs["outputs"]:
        return 0
    shape = attrs["outputs"][0][0]
    return shape[-1] if shape else 0


def _simulated_step(cost, splits, device_of):
    """The simulated step with ``splits``, or None if it does not fit in memory: one
    simulation gives both (its peak is :func:`costmodel.simulate.live_peak`'s)."""
    split_costs, split_device_of = split_cost(cost, splits, device_of)
    schedule = simulate(split_costs, split_device_of)
    capacity = np.array([device.memory for device in cost.cluster.devices], dtype=float)
    return schedule.makespan if np.all(schedule.peak_memory <= capacity) else None
