"""Fit a device kind's kernel efficiencies to measured kernel times.

A kernel table (``tfpart-measured-profile/1`` rows: op type, shapes, FLOPs, bytes,
``time_s`` and ``count``; ``../shared/gpu/h100_kernel_times.json`` is one) may time each
op at several precisions: ``time_s`` at TensorFlow's default for the kind (TF32 where
the kind has it, else fp32) and ``time_s_<precision>`` at others (``time_s_fp32``,
``time_s_bf16``). Rows are measured on float32 tensors, so a half-precision column
moves half the bytes. Other columns (``host_loop_s``: the host's dispatch, not the
kernel) are not read.

For each kernel class with enough rows (and for each coarse class, pooling its kernel
classes, so a class never measured falls back to a calibrated parent) the fit finds
the :class:`~tfpart.core.device_kinds.KernelEfficiency` -- a launch floor, a memory
fraction, a compute fraction per precision and, on a kind with ``multiprocessors``, a
tile size -- that minimises the squared log error of
:func:`costmodel.roofline.kernel_seconds` against the measured times, each row
weighted by the square root of how often the op occurs. Log errors make a 2x miss on
a small kernel count as much as on a large one.

Two choices keep the fit from reading more into the rows than they hold:

* The memory fraction of matrix multiplies (``gemm``) is the elementwise class's,
  fitted first: the device's streaming bandwidth. Their memory-bound rows are dense
  layers at small batches, which stream their weights; a table's are small (a
  classifier's few MB), too small to tell a low plateau from a ramp still short of it,
  and a fit of their own would read a low plateau off them that a large dense layer
  (a 400 MB weight matrix) does not have. Convolutions keep their own: their
  memory-bound rows are large.
* The tile size is searched from several starts (the fit is not convex in it), and a
  class keeps one only where the waves explain its rows better than the plain
  roofline (:data:`WAVES_MUST_GAIN`) and not at the smallest size searched.
* No launch floor above the class's fastest measured kernel.

Examples
--------
>>> from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds
>>> h100 = load_device_kinds()["H100"]
>>> truth = {"elementwise": KernelEfficiency({"fp32": 0.5}, memory=0.7, launch_s=6e-6,
...                                          tile_elements=2e4)}
>>> rows = [KernelRow("Relu", 0.0, b, "fp32", 0.0, 1, "fp32") for b in (1e4, 1e6, 1e7, 1e8, 1e9)]
>>> rows = [r._replace(time_s=kernel_time(r, h100, truth)) for r in rows]
>>> fitted = fit_kernel_efficiency(rows, h100)["elementwise"]
>>> round(fitted.memory, 3), round(fitted.launch_s * 1e6, 2), round(fitted.tile_elements)
(0.7, 6.0, 20000)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from costmodel.roofline import ELEMENT_BYTES, roofline_time, waved_roofline
from tfpart.core.device_kinds import KernelEfficiency, wave_occupancy
from tfpart.core.ops import FREE_OPS, MATMUL_OPS, class_lineage, kernel_class

BYTES_SCALE = {"bf16": 0.5, "fp16": 0.5}  # float32-shaped rows timed in half precision
MIN_ROWS = 3  # rows a class needs for its own fit
FP32_UNITS = ("fp32", "fp64", "any")  # precisions off the tensor cores
STREAMING_CLASS = "elementwise"  # whose memory fraction is the device's streaming one
STREAMING_SHARERS = ("gemm",)  # classes that take it rather than fit their own
TILE_STARTS = (1e3, 1e4, 1e5, 1e6)  # elements per tile, where searches begin
WAVES_MUST_GAIN = 0.01  # a tile size is kept if it cuts the squared error by 1% or more
_BOUNDS = {"launch_s": (1e-7, 1e-3), "memory": (1e-3, 2.0), "compute": (1e-3, 1.0),
           "tile_elements": (1e2, 1e10)}


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
    """Every (op, precision) time of a kernel table's ``ops`` as a :class:`KernelRow`
    (``time_s`` and the ``time_s_<precision>`` columns); ops that cost nothing
    (metadata, aliases) and zero times are left out."""
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
    """Predicted kernel seconds of ``row`` (the host's per-op cost excluded)."""
    return roofline_time(row.op_type, row.flops, row.bytes_accessed, kind,
                         efficiency=efficiency, overhead=0.0, precision=row.precision)


def fit_kernel_efficiency(rows, kind, min_rows=MIN_ROWS):
    """Per class, the :class:`KernelEfficiency` that best explains ``rows``.

    Parameters
    ----------
    rows : list of KernelRow
    kind : tfpart.core.device_kinds.DeviceKind
        Supplies the peaks and the memory bandwidth the fractions are of, and the
        multiprocessors the tiles run over (none: no tile sizes are fitted).
    min_rows : int
        Classes with fewer rows get no entry of their own.

    Returns
    -------
    dict
        Kernel class or coarse class -> KernelEfficiency, by class name.
    """
    by_class = {}
    for row in rows:
        for name in class_lineage(kernel_class(row.op_type)):
            by_class.setdefault(name, []).append(row)
    enough = {name: members for name, members in by_class.items() if len(members) >= min_rows}
    fitted = {}
    if STREAMING_CLASS in enough:
        fitted[STREAMING_CLASS] = _fit_class(enough[STREAMING_CLASS], kind)
    streaming = fitted[STREAMING_CLASS].memory if fitted else None
    for name, members in enough.items():
        if name not in fitted:
            fitted[name] = _fit_class(members, kind,
                                      streaming if name in STREAMING_SHARERS else None)
    return dict(sorted(fitted.items()))


class _Rows(NamedTuple):
    """A class's rows as arrays for the fit."""

    flops: np.ndarray
    nbytes: np.ndarray
    elements: np.ndarray
    measured: np.ndarray
    weight: np.ndarray
    peak: np.ndarray
    which: np.ndarray  # each row's index into the class's precisions


def _as_arrays(rows, kind, precisions):
    """``rows`` as :class:`_Rows`; ``precisions``: the class's compute fractions, by
    precision (``["any"]`` off the matrix units)."""
    one_fraction = precisions == ["any"]
    return _Rows(
        flops=np.array([row.flops for row in rows]),
        nbytes=np.array([row.bytes_accessed for row in rows]),
        elements=np.array([row.bytes_accessed / ELEMENT_BYTES.get(row.precision, 4)
                           for row in rows]),
        measured=np.array([row.time_s for row in rows]),
        weight=np.sqrt([row.count for row in rows]),
        peak=np.array([kind.peak(row.precision) if row.op_type in MATMUL_OPS
                       else kind.peak_flops for row in rows]),
        which=np.array([0 if one_fraction else precisions.index(row.precision)
                        for row in rows]))


def _predicted(data, kind, launch, memory, compute, tile):
    """:func:`costmodel.roofline.kernel_seconds` of every row at once."""
    return waved_roofline(data.flops, data.nbytes, data.elements,
                          flop_rate=data.peak * compute[data.which],
                          byte_rate=kind.memory_bandwidth * memory, launch_s=launch,
                          tile_elements=tile, multiprocessors=kind.multiprocessors)


def _fit_class(rows, kind, memory=None):
    """The KernelEfficiency of one class's ``rows``; ``memory``: its memory fraction,
    given (the streaming class's), else fitted."""
    # Off the matrix units the precision does not change the peak tfpart uses, and
    # such kernels are rarely compute-bound: one fraction for all precisions.
    on_matrix_units = any(row.op_type in MATMUL_OPS for row in rows)
    precisions = sorted({row.precision for row in rows}) if on_matrix_units else ["any"]
    data = _as_arrays(rows, kind, precisions)
    plain = _least_squares(data, kind, len(precisions), memory, tile=0.0)
    best = plain
    for tile in (TILE_STARTS if kind.multiprocessors else ()):
        waves = _least_squares(data, kind, len(precisions), memory, tile)
        if waves[0] < best[0]:
            best = waves
    # tiles as small as the search allows mean no wave was ever part-empty: the plain
    # roofline's own figures, not the tiled search's with its tile dropped
    if best[0] > plain[0] * (1 - WAVES_MUST_GAIN) or \
            best[4] <= _BOUNDS["tile_elements"][0] * 1.01:
        best = plain
    _, launch, fitted_memory, compute, tile = best
    compute = _settle_undetermined(data, kind, launch, fitted_memory, compute, tile,
                                   precisions)
    return KernelEfficiency(compute={p: _round(c) for p, c in zip(precisions, compute)},
                            memory=_round(fitted_memory), launch_s=_round(launch),
                            tile_elements=_round(tile))


def _least_squares(data, kind, n_precisions, memory, tile):
    """One search from a start: ``(cost, launch_s, memory, compute, tile_elements)``,
    the tile size fitted from ``tile`` (0: the plain roofline, no tile size) and the
    memory fraction fitted unless given."""
    from scipy.optimize import least_squares

    names = ["launch_s"] + (["memory"] if memory is None else []) + \
        ["compute"] * n_precisions + (["tile_elements"] if tile else [])
    start = [float(np.min(data.measured))] + ([0.7] if memory is None else []) + \
        [0.5] * n_precisions + ([tile] if tile else [])

    def unpack(x):
        values = list(np.exp(x))
        launch = values.pop(0)
        fraction = values.pop(0) if memory is None else memory
        compute = np.array(values[:n_precisions])
        return launch, fraction, compute, (values[n_precisions] if tile else 0.0)

    def residuals(x):
        predicted = _predicted(data, kind, *unpack(x))
        return data.weight * np.log(predicted / data.measured)

    # no floor above the class's fastest kernel: that kernel contradicts it
    bounds = dict(_BOUNDS, launch_s=(_BOUNDS["launch_s"][0],
                                     min(_BOUNDS["launch_s"][1], float(np.min(data.measured)))))
    lower = np.log([bounds[n][0] for n in names])
    upper = np.log([bounds[n][1] for n in names])
    fit = least_squares(residuals, np.clip(np.log(start), lower + 1e-9, upper - 1e-9),
                        bounds=(lower, upper), x_scale=1.0)
    return (float(fit.cost), *unpack(fit.x))


def _settle_undetermined(data, kind, launch, memory, compute, tile, precisions):
    """Compute fractions no row was bound by (every kernel of that precision hit the
    launch floor or the memory roof) are not determined by the fit. Each takes the
    best fraction determined in the class on the same units (tensor cores, or the
    fp32 units), else 1: the measurements put no ceiling below the peak. Never one so
    low that it would bind a measured row."""
    occupancy = wave_occupancy(data.elements, tile, kind.multiprocessors)
    # what the compute roof must stay under not to bind, in the plateau's units
    other = np.maximum(launch * occupancy, data.nbytes / (kind.memory_bandwidth * memory))
    bound = data.flops / (data.peak * compute[data.which]) >= other * (1 - 1e-6)
    fp32_units = [p in FP32_UNITS for p in precisions]
    settled = compute.copy()
    for j in range(len(compute)):
        mine = data.which == j
        if bound[mine].any():
            continue
        alike = [c for i, c in enumerate(compute)
                 if bound[data.which == i].any() and fp32_units[i] == fp32_units[j]]
        lowest = float(np.max(data.flops[mine] / (data.peak[mine] * other[mine]))) \
            if mine.any() else 0.0
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
