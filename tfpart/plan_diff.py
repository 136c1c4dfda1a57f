"""What changed between two plans: the ops that moved, each device's load and memory,
and the predicted step time, before and after (``tfpart diff``).

Examples
--------
>>> from tfpart.core.plan import Plan
>>> before = Plan(assignment={"a": "gpu:0", "b": "gpu:0"})
>>> after = Plan(assignment={"a": "gpu:0", "b": "gpu:1"})
>>> difference = diff_plans(before, after)
>>> difference.moved
{'b': ('gpu:0', 'gpu:1')}
>>> diff_plans(after, after).unchanged
True
"""
from __future__ import annotations

from dataclasses import dataclass

SHOWN_MOVES = 20  # moved ops listed by name; the rest are counted


@dataclass
class PlanDiff:
    """``moved``: op -> (device before, device after); ``only_before``/``only_after``:
    ops one plan places and the other does not; ``devices``: device -> (figures
    before, figures after), each a dict of ops, busy seconds and peak memory bytes (or
    None where the device is not in that plan); ``step_time``: (before, after)."""

    moved: dict
    only_before: list
    only_after: list
    devices: dict
    step_time: tuple
    algorithms: tuple

    @property
    def unchanged(self):
        return not (self.moved or self.only_before or self.only_after) and \
            self.step_time[0] == self.step_time[1] and \
            all(a == b for a, b in self.devices.values())

    def lines(self):
        """The difference as lines of text for the terminal."""
        if self.unchanged:
            return ["no change: every op on the same device, same figures"]
        before, after = self.step_time
        out = [f"algorithm: {self.algorithms[0]} -> {self.algorithms[1]}"]
        if before is not None and after is not None:
            out.append(f"predicted step: {before * 1e3:.3f} ms -> {after * 1e3:.3f} ms "
                       f"({after / before:.3f}x)")
        out.append(f"{len(self.moved)} ops moved" + (
            f", {len(self.only_before)} only before, {len(self.only_after)} only after"
            if self.only_before or self.only_after else ""))
        for op, (a, b) in list(sorted(self.moved.items()))[:SHOWN_MOVES]:
            out.append(f"  {op}: {a} -> {b}")
        if len(self.moved) > SHOWN_MOVES:
            out.append(f"  ... and {len(self.moved) - SHOWN_MOVES} more")
        out.append("device: ops, busy ms, peak MB (before -> after)")
        for device, (a, b) in sorted(self.devices.items()):
            out.append(f"  {device}: {_figures(a)} -> {_figures(b)}")
        return out


def diff_plans(before, after):
    """The :class:`PlanDiff` from plan ``before`` to plan ``after``."""
    moved = {op: (device, after.assignment[op]) for op, device in before.assignment.items()
             if op in after.assignment and after.assignment[op] != device}
    devices = {}
    for index, plan in enumerate((before, after)):
        for device, figures in _device_figures(plan).items():
            devices.setdefault(device, [None, None])[index] = figures
    step = tuple(plan.predicted.step_time if plan.predicted else None
                 for plan in (before, after))
    return PlanDiff(moved=moved,
                    only_before=sorted(set(before.assignment) - set(after.assignment)),
                    only_after=sorted(set(after.assignment) - set(before.assignment)),
                    devices={d: tuple(pair) for d, pair in devices.items()},
                    step_time=step, algorithms=(before.algorithm, after.algorithm))


def _device_figures(plan):
    """Per device: its ops, and where the plan has predictions, busy time and peak."""
    counts = {}
    for device in plan.assignment.values():
        counts[device] = counts.get(device, 0) + 1
    predicted = plan.predicted.devices if plan.predicted else {}
    return {device: {"ops": counts.get(device, 0),
                     "busy_s": predicted[device].busy_s if device in predicted else None,
                     "peak_bytes": predicted[device].peak_memory_bytes
                     if device in predicted else None}
            for device in sorted(set(counts) | set(predicted))}


def _figures(figures):
    if figures is None:
        return "absent"
    busy = "?" if figures["busy_s"] is None else f"{figures['busy_s'] * 1e3:.3f}"
    peak = "?" if figures["peak_bytes"] is None else f"{figures['peak_bytes'] / 1e6:.1f}"
    return f"{figures['ops']}, {busy}, {peak}"
