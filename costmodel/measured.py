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
     "fitted": {"efficiency": {"matmul": 0.31, ...}, "op_overhead_s": 2.1e-6,
                "dispatch_overhead_s": 1.2e-6, "host_dispatch_s": 3.3e-6}}

``host_dispatch_s`` is what running one op costs the host that measured it: the
executor's time between ops plus the median time of trivially small ops
(:func:`host_dispatch_figure`). It prices the host issuing each op to an accelerator
(:mod:`costmodel.lanes`). Profiles written before it was recorded derive it on load
from the same figures.

A *kernel table* is the same without ``fitted`` (and optionally without
``batch_size``, ``tensorflow``, ``step_time_s``): kernel times measured outside
TensorFlow, each op possibly also timed at other precisions (``time_s_fp32``,
``time_s_bf16``; ``time_s`` is at TensorFlow's default for the kind, TF32 where it
has it) and with ``output_shapes``. Loading one fits a
:class:`~tfpart.core.device_kinds.KernelEfficiency` per kernel class
(:mod:`costmodel.calibration`); as the kernels exclude TensorFlow's own per-op cost,
the kind's ``op_overhead_s`` is added to every op. FLOPs of backward-filter
convolutions are recounted from the shapes (tables written before tfpart counted
them hold the old figure).

Examples
--------
>>> from tfpart.core.device_kinds import load_device_kinds
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
from functools import lru_cache
from pathlib import Path

from costmodel.roofline import roofline_time
from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds
from tfpart.core.errors import ProfileError
from tfpart.core.input_files import read_json
from tfpart.core.flops import op_flops
from tfpart.core.ops import CONV_BACKPROP_FILTER_OPS, FREE_OPS, MATMUL_OPS, class_lineage, op_class
from tfpart.core.output_files import MARK_KEY, PROFILE, write_json_output

FORMAT = "tfpart-measured-profile/1"
MAX_PROFILE_BYTES = 256 * 2**20  # a million measured ops' rows
CLASSES = ("matmul", "elementwise", "reduction", "data_movement")
SMALL_WORK = 1e4  # ops under this many FLOPs and bytes measure the fixed overhead


def shape_key(op_type, input_shapes):
    return f"{op_type}|{json.dumps([list(s) for s in input_shapes])}"


def small_op_time(ops):
    """The median time of the measured ops doing almost no work (under
    :data:`SMALL_WORK` FLOPs and bytes), or None if there are none.

    >>> small_op_time([{"op_type": "AddV2", "time_s": 3e-6, "flops": 8, "bytes_accessed": 48,
    ...                 "count": 1}])
    3e-06
    """
    small = [op["time_s"] for op in ops if op["time_s"] > 0 and op["op_type"] not in FREE_OPS
             and op["flops"] < SMALL_WORK and op["bytes_accessed"] < SMALL_WORK]
    return statistics.median(small) if small else None


def host_dispatch_figure(ops, dispatch):
    """What running one op costs the host these ``ops`` were measured on: ``dispatch``
    (the executor's time between ops) plus :func:`small_op_time`; None where no small
    op was measured.

    TensorFlow's executor spends this much of the host per op whatever the device; on
    a CPU it also covers a kernel that does nothing, which on a GPU is the launch.

    >>> host_dispatch_figure([{"op_type": "Relu", "time_s": 2e-6, "flops": 4,
    ...                        "bytes_accessed": 32, "count": 1}], 1e-6)
    3e-06
    """
    small = small_op_time(ops)
    return None if small is None else small + dispatch


def fit_efficiency(ops, kind, step_time=None, dispatch=None):
    """Per-class efficiency and per-op overheads that best explain measured ops.

    The op overhead is the median time of ops doing almost no work; each class's
    efficiency is the median of raw roofline time / (measured time - overhead) over its
    measured ops whose raw roofline time is at least that overhead, if it has any (a
    smaller op's time is mostly overhead and noise, which says little of its class's
    throughput), else over all its measured ops. Classes without measurements keep the
    kind's datasheet guess. The
    dispatch overhead is the executor's time between ops: ``dispatch`` where the trace
    measured it (:func:`tfpart.profiling.idle_per_op`), else the measured step time less
    the ops' own times, shared over the ops that ran.
    """
    timed = [op for op in ops if op["time_s"] > 0 and op["op_type"] not in FREE_OPS]
    small = small_op_time(ops)
    overhead = kind.op_overhead_s if small is None else small
    efficiency = {cls: value.to_json() for cls, value in kind.efficiency.items()}
    for cls in CLASSES:
        ratios, large = [], []
        for op in timed:
            if op_class(op["op_type"]) != cls:
                continue
            raw = max(op["flops"] / kind.peak_flops, op["bytes_accessed"] / kind.memory_bandwidth)
            spent = op["time_s"] - overhead
            if raw > 0 and spent > 0:
                ratios.extend([raw / spent] * op["count"])
                if raw >= overhead:
                    large.extend([raw / spent] * op["count"])
        if ratios:  # measured: replaces the kind's figures for the class and its parts
            efficiency = {name: value for name, value in efficiency.items()
                          if class_lineage(name)[-1] != cls}
            efficiency[cls] = min(statistics.median(large or ratios), 10.0)
    ran = sum(op["count"] for op in ops if op["time_s"] > 0)
    own = sum(op["count"] * op["time_s"] for op in ops)
    if dispatch is None:
        dispatch = max(0.0, (step_time - own) / ran) if step_time and ran else 0.0
    fitted = {"efficiency": efficiency, "op_overhead_s": overhead,
              "dispatch_overhead_s": dispatch}
    host = host_dispatch_figure(ops, dispatch)
    if host is not None:
        fitted["host_dispatch_s"] = host
    return fitted


@dataclass
class MeasuredProfile:
    device_kind: str
    ops: list
    fitted: dict
    meta: dict = field(default_factory=dict)  # model, batch size, TF version, hardware

    def __post_init__(self):
        self._table = {shape_key(op["op_type"], op["input_shapes"]): op for op in self.ops}
        self.precision = self.meta.get("precision", "fp32")  # of time_s
        self._efficiency = {name: KernelEfficiency.parse(value)
                            for name, value in self.fitted["efficiency"].items()}

    @classmethod
    def from_measurements(cls, device_kind, ops, kind, **meta):
        fitted = fit_efficiency(ops, kind, meta.get("step_time_s"),
                                meta.get("dispatch_overhead_s"))
        return cls(device_kind=device_kind, ops=ops, fitted=fitted, meta=meta)

    def measured_time(self, attrs, precision):
        """The measured seconds of an op with these attributes at ``precision``, or
        None. A table's ``time_s`` is at its own precision, ``time_s_<p>`` at p; TF32
        changes nothing outside matmuls, so there fp32 and tf32 times stand in for
        each other."""
        row = self._table.get(shape_key(attrs["op_type"], attrs["input_shapes"]))
        if row is None:
            return None
        same = {precision}
        if attrs["op_type"] not in MATMUL_OPS and precision in ("fp32", "tf32"):
            same = {"fp32", "tf32"}
        if self.precision in same:
            return row["time_s"]
        return next((row[f"time_s_{p}"] for p in sorted(same) if f"time_s_{p}" in row), None)

    @property
    def host_dispatch(self):
        """Seconds the measuring host spent running each op apart from its work
        (``fitted.host_dispatch_s``), or None: a kernel table measures no host.

        >>> from tfpart.core.device_kinds import load_device_kinds
        >>> ops = [{"op_type": "AddV2", "input_shapes": [[2], [2]], "time_s": 3e-6,
        ...         "count": 1, "flops": 2.0, "bytes_accessed": 24.0}]
        >>> measured = MeasuredProfile.from_measurements(
        ...     "cpu", ops, load_device_kinds()["cpu"], dispatch_overhead_s=1e-6)
        >>> round(measured.host_dispatch * 1e6, 3)
        4.0
        >>> kernel_table_profile("H100", ops, load_device_kinds()["H100"]).host_dispatch is None
        True
        """
        return self.fitted.get("host_dispatch_s")

    def op_time(self, attrs, kind, precision="fp32", dispatch=None):
        """Measured time of an op with these attributes (plus the executor's dispatch
        overhead, or ``dispatch`` where given: the host's cost of issuing it to an
        accelerator), else the fitted roofline; ops removed before running cost
        nothing."""
        if dispatch is None:
            dispatch = self.fitted.get("dispatch_overhead_s", 0.0)
        measured = self.measured_time(attrs, precision)
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
                                        efficiency=self._efficiency,
                                        overhead=self.fitted["op_overhead_s"],
                                        precision=precision)

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self):
        return {"format": FORMAT, "device_kind": self.device_kind, **self.meta,
                "ops": self.ops, "fitted": self.fitted}

    def save(self, path, force=False):
        """Write the profile to ``path`` with tfpart's mark, atomically and under the
        output rule (:mod:`tfpart.core.output_files`: ``force`` replaces a profile
        tfpart did not write); ProfileError naming the first figure that is not finite."""
        write_json_output(path, self.to_dict(), PROFILE, "profile", force=force,
                          error=ProfileError, indent=1)

    @classmethod
    def load(cls, path, kinds=None):
        """Read and validate a profile; ProfileError names the file and the problem."""
        kinds = load_device_kinds() if kinds is None else kinds
        data = read_profile_json(path)
        problem = _validate(data, kinds)
        if problem:
            raise ProfileError(path, problem)
        meta = {k: v for k, v in data.items()
                if k not in ("format", "device_kind", "ops", "fitted", MARK_KEY)}
        kind = kinds[data["device_kind"]]
        if "fitted" in data:
            return cls(device_kind=data["device_kind"], ops=data["ops"],
                       fitted=_with_host_dispatch(data["fitted"], data["ops"], meta),
                       meta=meta)
        return kernel_table_profile(data["device_kind"], data["ops"], kind, **meta)


def _with_host_dispatch(fitted, ops, meta):
    """``fitted`` with ``host_dispatch_s`` derived from its figures where a profile
    measured on a host (``tfpart profile`` records the ``hardware``) was written before
    it was recorded."""
    if "host_dispatch_s" in fitted or "hardware" not in meta:
        return fitted
    host = host_dispatch_figure(ops, fitted.get("dispatch_overhead_s", 0.0))
    return fitted if host is None else dict(fitted, host_dispatch_s=host)


def load_profile(path, kinds=None):
    """:meth:`MeasuredProfile.load` with the shipped kinds (or ``kinds``: a cluster's,
    which may declare its own), once per version of the file (a kernel table is fitted
    when loaded, and a compile reads its profiles from the early input check, the
    partitioning and the notes)."""
    if kinds is not None and _device_kind(path) not in load_device_kinds():
        return MeasuredProfile.load(path, kinds)  # a kind the cluster declares
    try:
        stat = Path(path).stat()
    except OSError:
        return MeasuredProfile.load(path)  # its error names the file
    return _load_version(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


def _device_kind(path):
    """The ``device_kind`` a profile file names (None if it cannot be read)."""
    try:
        return read_profile_json(path).get("device_kind")
    except (ProfileError, AttributeError):
        return None


def read_profile_json(path):
    """The parsed JSON of a profile or kernel table: a regular file of at most
    :data:`MAX_PROFILE_BYTES`, strict JSON (:mod:`tfpart.core.input_files`); ProfileError
    naming it otherwise."""
    return read_json(path, ProfileError, max_bytes=MAX_PROFILE_BYTES,
                     what="a readable JSON profile")


@lru_cache(maxsize=32)
def _load_version(path, mtime_ns, size):
    return MeasuredProfile.load(path)


def kernel_table_profile(device_kind, ops, kind, **meta):
    """A profile from a kernel table (see the module docstring): ``time_s`` at the
    kind's default precision, efficiencies fitted per kernel class, the kind's
    ``op_overhead_s`` added to every op."""
    from costmodel.calibration import default_precision, fit_kernel_efficiency, kernel_rows

    ops = [recount_flops(op) for op in ops]
    fitted = fit_kernel_efficiency(kernel_rows(ops, kind), kind)
    meta.setdefault("precision", default_precision(kind))
    return MeasuredProfile(device_kind=device_kind, ops=ops, meta=meta, fitted={
        "efficiency": {name: value.to_json() for name, value in fitted.items()},
        "op_overhead_s": 0.0, "dispatch_overhead_s": kind.op_overhead_s})


def recount_flops(op):
    """``op`` with its FLOPs counted from its shapes where tfpart's count changed
    (backward-filter convolutions, once counted as elementwise)."""
    if op["op_type"] in CONV_BACKPROP_FILTER_OPS and op.get("output_shapes"):
        return dict(op, flops=float(op_flops(op["op_type"], op["input_shapes"],
                                             op["output_shapes"], {})))
    return op


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
        for name, value in op.items():
            if (name.startswith("time_s") or name in ("flops", "bytes_accessed", "count")) \
                    and (not isinstance(value, (int, float)) or isinstance(value, bool)
                         or value < 0):
                return f"ops[{k}].{name}: must be a non-negative number"
        for name in ("input_shapes", "output_shapes"):
            shapes = op.get(name, [])
            if not isinstance(shapes, list) or not all(
                    isinstance(shape, list) and all(isinstance(n, int) for n in shape)
                    for shape in shapes):
                return f"ops[{k}].{name}: must be a list of shapes (lists of ints)"
    if "fitted" not in data:
        return None  # a kernel table: fitted on load
    fitted = data.get("fitted")
    if not isinstance(fitted, dict) or not isinstance(fitted.get("efficiency"), dict):
        return "fitted.efficiency: missing"
    for name, value in fitted["efficiency"].items():
        if not _positive_efficiency(value):
            return (f"fitted.efficiency.{name}: must be a positive number or "
                    "{compute: {precision: positive}, memory: positive, launch_s}")
    optional = {name: fitted[name] for name in ("dispatch_overhead_s", "host_dispatch_s")
                if name in fitted}
    for name, value in {"op_overhead_s": fitted.get("op_overhead_s"), **optional}.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            return f"fitted.{name}: must be a non-negative number"
    return None


def _positive_efficiency(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value > 0
    try:
        parsed = KernelEfficiency.parse(value)
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return parsed.memory > 0 and parsed.launch_s >= 0 and parsed.compute and all(
        v > 0 for v in parsed.compute.values())
