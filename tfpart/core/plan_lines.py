"""One line on each kind of plan an algorithm of tfpart makes: pipeline stages,
data-parallel replicas, filter splits; and the units they are written in. Each
algorithm's ``describe`` in :mod:`partitioner.registry` is one of these (a placement of
whole ops has none), and ``tfpart compile``'s summary, the report and the placement
picture print it (:func:`partitioner.registry.describe_plan`); they sit this low so
that the registry's algorithms and the app that prints them share one text.

Examples
--------
>>> from tfpart.core.plan import Plan
>>> splits_line(Plan(assignment={}, splits={}))
'Filter split: no split shortens the predicted step; a placement of whole ops'
"""
from __future__ import annotations

from tfpart.core.plan import all_reduces


def seconds(s):
    """A duration for people: milliseconds, or microseconds below one.

    >>> seconds(0.0125), seconds(2.5e-5)
    ('12.500 ms', '25.0 µs')
    """
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def counted(n, noun):
    """``n`` and ``noun``, plural unless ``n`` is 1.

    >>> counted(1, "replica"), counted(3, "tensor copy")
    ('1 replica', '3 tensor copies')
    """
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def byte_text(n):
    """A size in bytes for people.

    >>> byte_text(2450), byte_text(12)
    ('2.45 KB', '12 B')
    """
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def pipeline_line(plan):
    """One line on a pipelined plan: stages, micro-batches, schedule and the predicted
    bubble, throughput and latency."""
    p = plan.predicted.pipeline
    schedule = f" ({plan.schedule} schedule)" if plan.schedule else ""
    return (f"Pipeline: {len(set(plan.stages.values()))} stages, {plan.microbatches} "
            f"micro-batches{schedule} (bubble {100 * p.bubble_fraction:.0f}%); predicted "
            f"throughput {p.throughput:.1f} samples/s, first result after "
            f"{seconds(p.first_result)}, one micro-batch every {seconds(p.interval)}")


def splits_line(plan):
    """One line on a plan's filter splits: how many ops, over which devices.

    >>> from tfpart.core.plan import Plan
    >>> splits_line(Plan(assignment={}, splits={"conv": {
    ...     "devices": ["/device:CPU:0", "/device:CPU:1"], "sizes": [40, 24]}}))
    'Filter split: 1 op in slices of its output channels (conv: /device:CPU:0 40, /device:CPU:1 24)'
    """
    splits = plan.splits
    if not splits:
        return "Filter split: no split shortens the predicted step; a placement of whole ops"
    shown = [f"{op}: " + ", ".join(f"{d} {size}" for d, size in zip(s.devices, s.sizes))
             for op, s in list(splits.items())[:3]]
    more = f"; and {len(splits) - 3} more" if len(splits) > 3 else ""
    return (f"Filter split: {len(splits)} op{'s' if len(splits) > 1 else ''} in slices of "
            f"{'their' if len(splits) > 1 else 'its'} output channels ({'; '.join(shown)}{more})")


def replicas_line(plan):
    """One line on a data-parallel plan: each replica's device and share of the batch.

    >>> from tfpart.core.plan import Plan, Stages
    >>> replicas_line(Plan(assignment={}, context={"batch_size": 6}, replicas={
    ...     "devices": ["/device:CPU:0", "/device:CPU:1"], "fractions": [2 / 3, 1 / 3],
    ...     "pinned": []}))
    'Data parallel: 2 replicas (/device:CPU:0 4 samples, /device:CPU:1 2 samples of 6); variables on /device:CPU:0'
    >>> replicas_line(Plan(assignment={}, context={"batch_size": 4}, replicas={
    ...     "devices": ["A", "B"], "fractions": [0.5, 0.5], "pinned": [],
    ...     "placements": [{"x": "A", "y": "C"}, {"x": "B", "y": "D"}]}))
    'Data parallel: 2 replicas (A+C 2 samples, B+D 2 samples of 4); variables on A'
    >>> replicas_line(Plan(assignment={"x": "A"}, context={"batch_size": 4},
    ...     stages=Stages({"x": 0}, 2, "gpipe"), replicas={"devices": ["A", "B"],
    ...     "fractions": [0.5, 0.5], "pinned": [], "reduce": "all_reduce"}))
    'Data parallel: 2 replicas (A 2 samples, B 2 samples of 4); a copy of the variables on each, gradients all-reduced'
    >>> replicas_line(Plan(assignment={"x": "A", "y": "C"}, context={"batch_size": 8},
    ...     stages=Stages({"x": 0, "y": 1}, 4), replicas={"devices": ["A", "B"],
    ...     "fractions": [0.5, 0.5], "pinned": [], "placements": [{"x": "A", "y": "C"}, {"x": "B", "y": "D"}],
    ...     "microbatches": 2}))
    'Data parallel: 2 replicas (A+C 4 samples, B+D 4 samples of 8), each a pipeline of 2 stages over 2 micro-batches; variables on A+C'
    >>> replicas_line(Plan(assignment={}, context={"batch_size": 1}, replicas={
    ...     "devices": ["A"], "fractions": [1.0], "pinned": [],
    ...     "why_one_replica": "the batch has one sample"}))
    'Data parallel: 1 replica (A 1 sample of 1); variables on A; only one: the batch has one sample'
    """
    batch = plan.context.get("batch_size") or 1
    replicas = plan.replicas
    placements = replicas.placements or [{}] * len(replicas.devices)
    shares = ", ".join(
        "+".join([device, *sorted(set(placement.values()) - {device})])
        + f" {counted(round(f * batch), 'sample')}"
        for device, f, placement in zip(replicas.devices, replicas.fractions, placements))
    if all_reduces(replicas):
        where = ("a copy of the variables on each, gradients all-reduced"
                 if plan.schedule else "a copy of the variables on each")
    else:
        home = "+".join(sorted(set(plan.assignment.values()))) \
            if replicas.microbatches else replicas.devices[0]
        where = (f"gradients summed and the update run once on {home}"
                 if plan.schedule else f"variables on {home}")
    pipelines = (f", each a pipeline of {len(set(plan.stages.values()))} stages over "
                 f"{replicas.microbatches} micro-batches") \
        if replicas.microbatches else ""
    alone = f"; only one: {replicas.why_one_replica}" if replicas.why_one_replica else ""
    return (f"Data parallel: {counted(len(replicas.devices), 'replica')} ({shares} of {batch})"
            f"{pipelines}; {where}{alone}")
