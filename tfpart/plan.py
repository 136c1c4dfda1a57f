"""Plan: the result of partitioning, and its JSON form (plan.json).

A plan maps every op to a device name (``assignment``), optionally to a pipeline stage,
and records the algorithm and options that made it and the cost-model figures it was
based on, so a reader sees what was predicted and how far from optimal it can be.

Examples
--------
>>> from tfpart.graph import OpGraph
>>> from tfpart.cluster import cluster_of_devices
>>> g = OpGraph(); g.add_op("a"); g.add_op("b", colocation="a")
>>> plan = Plan(assignment={"a": "/job:localhost/replica:0/task:0/device:CPU:0",
...                         "b": "/job:localhost/replica:0/task:0/device:CPU:1"})
>>> plan.check(g, cluster_of_devices(["cpu", "cpu"]))
Traceback (most recent call last):
...
tfpart.errors.PlacementError: colocation group 'a' is split over 2 devices: a, b
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from costmodel.memory import device_memory
from tfpart.errors import PlacementError

PLAN_FORMAT_VERSION = 1


@dataclass
class Plan:
    assignment: dict
    algorithm: str = ""
    options: dict = field(default_factory=dict)
    stages: dict | None = None
    microbatches: int = 1
    predicted: dict = field(default_factory=dict)
    lower_bound: float | None = None
    context: dict = field(default_factory=dict)  # model, cluster, batch size, signature

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self):
        return {"format_version": PLAN_FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data):
        data = {k: v for k, v in data.items() if k != "format_version"}
        return cls(**data)

    def save(self, path):
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path):
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise PlacementError(path, f"not a readable plan.json: {exc}") from None

    # -- figures -------------------------------------------------------------------------
    @property
    def step_time(self):
        return self.predicted.get("step_time")

    @property
    def gap(self):
        """Relative distance of the predicted step time above the lower bound."""
        if not self.lower_bound or self.step_time is None:
            return None
        return self.step_time / self.lower_bound - 1.0

    def devices_used(self):
        return sorted(set(self.assignment.values()))

    # -- validity ------------------------------------------------------------------------
    def check(self, graph, cluster):
        """Raise PlacementError unless the plan is valid for ``graph`` on ``cluster``.

        Checks: every op placed on a device of the cluster; no colocation group split;
        no op on a device kind without its kernel; no device over its memory.
        """
        names = set(cluster.device_names)
        unplaced = [op for op in graph.ops if op not in self.assignment]
        if unplaced:
            raise PlacementError("", f"{len(unplaced)} ops unplaced, e.g. {unplaced[0]}")
        unknown = sorted({d for d in self.assignment.values() if d not in names})
        if unknown:
            raise PlacementError("", f"plan names devices not in the cluster: {unknown}")
        for group, members in graph.colocation_groups().items():
            devices = {self.assignment[m] for m in members}
            if len(devices) > 1:
                raise PlacementError("", f"colocation group {group!r} is split over "
                                     f"{len(devices)} devices: {', '.join(members[:4])}")
        kind_of = {d.name: d.kind.name for d in cluster.devices}
        for op, attrs in graph.ops.items():
            allowed = attrs["allowed_kinds"]
            if allowed is not None and kind_of[self.assignment[op]] not in allowed:
                raise PlacementError("", f"op {op} ({attrs['op_type']}) is on "
                                     f"{self.assignment[op]}, a {kind_of[self.assignment[op]]}"
                                     f" without its kernel")
        used = device_memory(graph, self.assignment, cluster.device_names)
        for device in cluster.devices:
            if used[device.name] > device.memory:
                raise PlacementError("", f"{device.name} needs {used[device.name] / 1e6:.1f} MB"
                                     f" but has {device.memory / 1e6:.1f} MB")
