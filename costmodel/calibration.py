"""Fit a device kind's kernel efficiencies to measured kernel times.

A kernel table (``tfpart-measured-profile/1`` rows: op type, shapes, FLOPs, bytes,
``time_s`` and ``count``; ``../shared/gpu/h100_kernels.json`` is one) may time each op
at several precisions: ``time_s`` at TensorFlow's default for the kind (TF32 where the
kind has it, else fp32) and ``time_s_<precision>`` at others (``time_s_fp32``,
``time_s_bf16``). Rows are measured on float32 tensors, so a half-precision column
moves half the bytes.

For each kernel class with enough rows (and for each coarse class, pooling its kernel
classes, so a class never measured falls back to a calibrated parent) the fit finds
the :class:`~tfpart.core.device_kinds.KernelEfficiency` -- one launch floor, one memory
fraction, one compute fraction per precision -- that minimises the squared log error
of ``max(launch_s, flops / (peak * compute), bytes / (bandwidth * memory))`` against
the measured times, each row weighted by how often the op occurs. Log errors make a
2x miss on a small kernel count as much as on a large one.

Examples
--------
>>> from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds
>>> h100 = load_device_kinds()["H100"]
>>> truth = {"elementwise": KernelEfficiency({"fp32": 0.5}, memory=0.7, launch_s=1e-5)}
>>> rows = [KernelRow("Relu", 0.0, b, "fp32", 0.0, 1, "fp32") for b in (1e4, 1e6, 1e8, 1e9)]
>>> rows = [r._replace(time_s=kernel_time(r, h100, truth)) for r in rows]
>>> fitted = fit_kernel_efficiency(rows, h100)["elementwise"]
>>> round(fitted.memory, 3), round(fitted.launch_s * 1e6, 2)
(0.7, 10.0)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from costmodel.roofline import roofline_time
from tfpart.core.device_kinds import KernelEfficiency
from tfpart.core.ops import FREE_OPS, MATMUL_OPS, class_lineage, kernel_class

BYTES_SCALE = {"bf16": 0.5, "fp16": 0.5}  # float32-shaped rows timed in half precision
MIN_ROWS = 3  # rows a class needs for its own fit
FP32_UNITS = ("fp32", "fp64", "any")  # precisions off the tensor cores
_BOUNDS = {"launch_s": (1e-7, 1e-3), "memory": (1e-3, 2.0), "compute": (1e-3, 1.0)}


class KernelRow(NamedTuple):
    """One measured kernel: ``setting`` is the column it was timed in (``tf32`` for
    TF32 on, ``fp32``, ``bf16``), ``precision`` the peak it runs at (a Relu timed
    with TF32 on still runs at fp32)."""

    op_type: str
    flops: float
    bytes_accessed: float
    precision: str
    time_s: float
    count: int
    setting: str


def default_precision(kind):
    """The precision of a table's ``time_s``: TensorFlow's default on ``kind``."""
    return "tf32" if "tf32" in kind.peaks else "fp32"


def kernel_rows(ops, kind):
    """Every (op, precision) time of a kernel table's ``ops`` as a :class:`KernelRow`;
    ops that cost nothing (metadata, aliases) and zero times are left out."""
    rows = []
    for op in ops:
        if op["op_type"] in FREE_OPS:
            continue
        columns = {default_precision(kind): op["time_s"]}
        columns.update({key[len("time_s_"):]: value for key, value in op.items()
                        if key.startswith("time_s_") and value is not None})
        for setting, seconds in columns.items():
            # TF32 changes nothing outside matmuls
            precision = "fp32" if op["op_type"] not in MATMUL_OPS and setting == "tf32" \
                else setting
            if seconds and seconds > 0:
                rows.append(KernelRow(op["op_type"], float(op["flops"]),
                                      float(op["bytes_accessed"]) *
                                      BYTES_SCALE.get(precision, 1.0),
                                      precision, float(seconds), int(op.get("count", 1)),
                                      setting))
    return rows


def kernel_time(row, kind, efficiency):
    """Predicted kernel seconds of ``row`` (the executor's per-op cost excluded)."""
    return roofline_time(row.op_type, row.flops, row.bytes_accessed, kind,
                         efficiency=efficiency, overhead=0.0, precision=row.precision)


def fit_kernel_efficiency(rows, kind, min_rows=MIN_ROWS):
    """Per class, the :class:`KernelEfficiency` that best explains ``rows``.

    Parameters
    ----------
    rows : list of KernelRow
    kind : tfpart.core.device_kinds.DeviceKind
        Supplies the peaks and the memory bandwidth the fractions are of.
    min_rows : int
        Classes with fewer rows get no entry of their own.

    Returns
    -------
    dict
        Kernel class or coarse class -> KernelEfficiency.
    """
    by_class = {}
    for row in rows:
        for name in class_lineage(kernel_class(row.op_type)):
            by_class.setdefault(name, []).append(row)
    return {name: _fit_class(members, kind) for name, members in sorted(by_class.items())
            if len(members) >= min_rows}


def _fit_class(rows, kind):
    from scipy.optimize import least_squares

    # Off the matrix units the precision does not change the peak tfpart uses, and
    # such kernels are rarely compute-bound: one fraction for all precisions.
    on_matrix_units = any(row.op_type in MATMUL_OPS for row in rows)
    precisions = sorted({row.precision for row in rows}) if on_matrix_units else ["any"]
    flops = np.array([row.flops for row in rows])
    nbytes = np.array([row.bytes_accessed for row in rows])
    measured = np.array([row.time_s for row in rows])
    weight = np.sqrt([row.count for row in rows])
    peak = np.array([kind.peak(row.precision) if row.op_type in MATMUL_OPS
                     else kind.peak_flops for row in rows])
    which = np.array([precisions.index(row.precision) if on_matrix_units else 0
                      for row in rows])

    def unpack(x):
        launch, memory, *compute = np.exp(x)
        return launch, memory, np.array(compute)

    def residuals(x):
        launch, memory, compute = unpack(x)
        predicted = np.maximum(launch, np.maximum(flops / (peak * compute[which]),
                                                  nbytes / (kind.memory_bandwidth * memory)))
        return weight * np.log(predicted / measured)

    names = ["launch_s", "memory"] + ["compute"] * len(precisions)
    start = np.log([float(np.min(measured)), 0.5] + [0.5] * len(precisions))
    lower = np.log([_BOUNDS[n][0] for n in names])
    upper = np.log([_BOUNDS[n][1] for n in names])
    fit = least_squares(residuals, np.clip(start, lower + 1e-9, upper - 1e-9),
                        bounds=(lower, upper), x_scale=1.0)
    launch, memory, compute = unpack(fit.x)
    compute = _settle_undetermined(compute, launch, memory, flops, nbytes, peak, which,
                                   kind.memory_bandwidth, precisions)
    return KernelEfficiency(compute={p: _round(c) for p, c in zip(precisions, compute)},
                            memory=_round(memory), launch_s=_round(launch))


def _settle_undetermined(compute, launch, memory, flops, nbytes, peak, which, bandwidth,
                         precisions):
    """Compute fractions no row was bound by (every kernel of that precision hit the
    launch floor or the memory roof) are not determined by the fit. Each takes the
    best fraction determined in the class on the same units (tensor cores, or the
    fp32 units), else 1: the measurements put no ceiling below the peak. Never one so
    low that it would bind a measured row."""
    other = np.maximum(launch, nbytes / (bandwidth * memory))
    bound = flops / (peak * compute[which]) >= other * (1 - 1e-6)
    fp32_units = [p in FP32_UNITS for p in precisions]
    settled = compute.copy()
    for j in range(len(compute)):
        mine = which == j
        if bound[mine].any():
            continue
        alike = [c for i, c in enumerate(compute)
                 if bound[which == i].any() and fp32_units[i] == fp32_units[j]]
        lowest = float(np.max(flops[mine] / (peak[mine] * other[mine]))) if mine.any() else 0.0
        settled[j] = min(1.0, max(lowest, max(alike, default=1.0)))
    return settled


def _round(value, digits=4):
    """``value`` to ``digits`` significant digits (fits are not more exact)."""
    return float(f"{value:.{digits}g}") if value else 0.0


def fit_link(rows):
    """Alpha-beta ``(latency_s, bandwidth)`` of copies ``[(bytes, seconds), ...]``,
    least squares on relative error (small and large copies count alike).

    >>> latency, bandwidth = fit_link([(n, 2e-5 + n / 5e10) for n in (1e3, 1e6, 1e8)])
    >>> round(latency * 1e6, 3), round(bandwidth / 1e9, 3)
    (20.0, 50.0)
    """
    sizes = np.array([float(n) for n, _ in rows])
    seconds = np.array([float(t) for _, t in rows])
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / seconds[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return float(latency), (float(1.0 / per_byte) if per_byte > 0 else math.inf)
