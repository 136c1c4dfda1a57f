"""Measured per-op profiles: their JSON form, the efficiency fit, and lookups.

A profile (``profiles/measured/<name>.json``, written by ``tfpart profile``) holds the
median time of every op of one model on one device kind, keyed by op type and input
shapes, with the TensorFlow version and hardware it was measured on. From those it fits,
per op class, the fraction of the datasheet roofline the kind reaches, and the fixed
per-op overhead; ops and shapes never measured are then predicted as roofline /
fitted efficiency + overhead.

Schema (``format`` ``tfpart-measured-profile/1``)::

    {"format": "tfpart-measured-profile/1", "device_kind": "cpu", "model": "...",
     "batch_size": 8, "tensorflow": "2.21.0", "hardware": {...},
     "step_time_s": 0.0091,
     "ops": [{"op_type": "Conv2D", "input_shapes": [[8, 32, 32, 3], [3, 3, 3, 32]],
              "time_s": 0.00077, "count": 1, "flops": 1.3e7, "bytes_accessed": 1.1e6}],
     "fitted": {"efficiency": {"matmul": 0.31, ...}, "op_overhead_s": 2.1e-6}}

Examples
--------
>>> from tfpart.cluster import load_device_kinds
>>> cpu = load_device_kinds()["cpu"]
>>> ops = [{"op_type": "MatMul", "input_shapes": [[64, 64], [64, 64]], "time_s": 2e-5,
...         "count": 1, "flops": 524288.0, "bytes_accessed": 49152.0}]
>>> profile = MeasuredProfile.from_measurements("cpu", ops, cpu)
>>> profile.op_time({"op_type": "MatMul", "input_shapes": ((64, 64), (64, 64)),
...                  "flops": 524288.0, "bytes_accessed": 49152.0}, cpu)
2e-05
>>> bigger = {"op_type": "MatMul", "input_shapes": ((128, 64), (64, 64)),
...           "flops": 1048576.0, "bytes_accessed": 81920.0}
>>> round(profile.op_time(bigger, cpu) * 1e6)  # not measured: twice the fitted work, one overhead
35
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.roofline import roofline_time
from tfpart.errors import ProfileError
from tfpart.ops import FREE_OPS, op_class

FORMAT = "tfpart-measured-profile/1"
CLASSES = ("matmul", "elementwise", "reduction", "data_movement")
SMALL_WORK = 1e4  # ops under this many FLOPs and bytes measure the fixed overhead


def shape_key(op_type, input_shapes):
    return f"{op_type}|{json.dumps([list(s) for s in input_shapes])}"


def fit_efficiency(ops, kind, step_time=None):
    """Per-class efficiency and per-op overheads that best explain measured ops.

    The op overhead is the median time of ops doing almost no work; each class's
    efficiency is the median of raw roofline time / (measured time - overhead) over its
    measured ops. Classes without measurements keep the kind's datasheet guess. The
    dispatch overhead is the executor's time between ops: the measured step time less
    the ops' own times, shared over the ops that ran.
    """
    timed = [op for op in ops if op["time_s"] > 0 and op["op_type"] not in FREE_OPS]
    small = [op["time_s"] for op in timed
             if op["flops"] < SMALL_WORK and op["bytes_accessed"] < SMALL_WORK]
    overhead = statistics.median(small) if small else kind.op_overhead_s
    efficiency = dict(kind.efficiency)
    for cls in CLASSES:
        ratios = []
        for op in timed:
            if op_class(op["op_type"]) != cls:
                continue
            raw = max(op["flops"] / kind.peak_flops, op["bytes_accessed"] / kind.memory_bandwidth)
            spent = op["time_s"] - overhead
            if raw > 0 and spent > 0:
                ratios.extend([raw / spent] * op["count"])
        if ratios:
            efficiency[cls] = min(statistics.median(ratios), 10.0)
    ran = sum(op["count"] for op in ops if op["time_s"] > 0)
    own = sum(op["count"] * op["time_s"] for op in ops)
    dispatch = max(0.0, (step_time - own) / ran) if step_time and ran else 0.0
    return {"efficiency": efficiency, "op_overhead_s": overhead, "dispatch_overhead_s": dispatch}


@dataclass
class MeasuredProfile:
    device_kind: str
    ops: list
    fitted: dict
    meta: dict = field(default_factory=dict)  # model, batch size, TF version, hardware

    def __post_init__(self):
        self._table = {shape_key(op["op_type"], op["input_shapes"]): op["time_s"]
                       for op in self.ops}

    @classmethod
    def from_measurements(cls, device_kind, ops, kind, **meta):
        fitted = fit_efficiency(ops, kind, meta.get("step_time_s"))
        return cls(device_kind=device_kind, ops=ops, fitted=fitted, meta=meta)

    def op_time(self, attrs, kind):
        """Measured time of an op with these attributes (plus the executor's dispatch
        overhead), else the fitted roofline; ops removed before running cost nothing."""
        dispatch = self.fitted.get("dispatch_overhead_s", 0.0)
        measured = self._table.get(shape_key(attrs["op_type"], attrs["input_shapes"]))
        if measured is not None and measured > 0:
            # A micro-batch (costmodel.pipeline) keeps its full-batch shapes: its time is
            # the measured one with all but the fixed per-op overhead scaled down.
            fraction = attrs.get("batch_fraction", 1.0)
            overhead = min(self.fitted["op_overhead_s"], measured)
            return dispatch + overhead + (measured - overhead) * fraction
        if measured is not None:
            return 0.0
        if attrs["op_type"] in FREE_OPS:
            return 0.0
        return dispatch + roofline_time(attrs["op_type"], attrs["flops"],
                                        attrs["bytes_accessed"], kind,
                                        efficiency=self.fitted["efficiency"],
                                        overhead=self.fitted["op_overhead_s"])

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self):
        return {"format": FORMAT, "device_kind": self.device_kind, **self.meta,
                "ops": self.ops, "fitted": self.fitted}

    def save(self, path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path, kinds=None):
        """Read and validate a profile; ProfileError names the file and the problem."""
        from tfpart.cluster import load_device_kinds

        kinds = load_device_kinds() if kinds is None else kinds
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ProfileError(path, "no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProfileError(path, f"not a readable JSON profile: {exc}") from None
        problem = _validate(data, kinds)
        if problem:
            raise ProfileError(path, problem)
        meta = {k: v for k, v in data.items()
                if k not in ("format", "device_kind", "ops", "fitted")}
        return cls(device_kind=data["device_kind"], ops=data["ops"], fitted=data["fitted"],
                   meta=meta)


def _validate(data, kinds):
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a measured profile (format must be {FORMAT!r})"
    if data.get("device_kind") not in kinds:
        return f"device_kind: unknown kind {data.get('device_kind')!r}"
    if not isinstance(data.get("ops"), list):
        return "ops: must be a list"
    for k, op in enumerate(data["ops"]):
        if not isinstance(op, dict):
            return f"ops[{k}]: must be an object"
        for name in ("op_type", "input_shapes", "time_s", "count", "flops", "bytes_accessed"):
            if name not in op:
                return f"ops[{k}]: lacks {name}"
        if not isinstance(op["time_s"], (int, float)) or op["time_s"] < 0:
            return f"ops[{k}].time_s: must be a non-negative number"
    fitted = data.get("fitted")
    if not isinstance(fitted, dict) or not isinstance(fitted.get("efficiency"), dict):
        return "fitted.efficiency: missing"
    if any(not isinstance(v, (int, float)) or v <= 0 for v in fitted["efficiency"].values()):
        return "fitted.efficiency: every value must be positive"
    overhead = fitted.get("op_overhead_s")
    if not isinstance(overhead, (int, float)) or overhead < 0:
        return "fitted.op_overhead_s: must be a non-negative number"
    return None
