"""Plan: the result of partitioning, and its JSON form (plan.json).

A plan maps every op to a device name (``assignment``), optionally to a pipeline stage,
and records the algorithm and options that made it and the cost-model figures it was
based on, so a reader sees what was predicted and how far from optimal it can be.

Plans are validated against a graph and cluster by :func:`partitioner.validate.check_plan`.

Examples
--------
>>> plan = Plan(assignment={"a": "/device:CPU:0"}, predicted={"step_time": 2.0},
...             lower_bound=1.6)
>>> Plan.from_dict(plan.to_dict()) == plan, round(plan.gap, 2)
(True, 0.25)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
