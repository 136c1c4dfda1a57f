"""How well does the GPU cost model predict a model's kernels? Cross-validated on a
kernel table, leaving each model@batch out.

The table (default ``../shared/gpu/h100_kernel_times.json``: 461 distinct ops of Keras
ResNet50 at batch 1, 8 and 32, a ResNet50 training step at 32 and a BERT-base encoder
layer at 8 and 32, each the GPU's own kernel time on an H100 from CUDA-graph replays,
at TF32 (``time_s``), fp32 and bf16) says how often each op occurs in each model@batch.
For every model@batch and precision it prints the measured kernel sum (Σ time × count)
and, each as a ratio to it, the predictions of

* ``old``: the H100 kind shipped before this refit (:data:`OLD_H100`, fitted to the
  superseded ``h100_kernels.json``, whose small-op times are the host's dispatch);
* ``refit``: the fit on every op (what ``profiles/device_kinds.json`` ships) -- it has
  seen the model it scores;
* ``cv``: the fit on the ops of the other model@batches only (an op the left-out
  model shares with another is left out too). Kernel classes only the left-out model
  has (the training step's backward convolutions) fall back to the coarse ``matmul``
  class fitted on the others.

Predictions are kernel times only: the host's dispatch per op (``op_overhead_s``) is
on another timeline and not in the measurements. Then the refit's figures per class.

Run from the repository root::

    .venv/bin/python -m benchmarks.gpu_costmodel_accuracy [--table PATH] [--markdown]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.markdown import print_table
from costmodel.calibration import fit_kernel_efficiency, kernel_rows, kernel_time
from costmodel.measured import recount_flops
from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TABLE = ROOT.parent / "shared" / "gpu" / "h100_kernel_times.json"
# The H100 entry of profiles/device_kinds.json before this refit (commit f2a08cc),
# fitted by tfpart calibrate to h100_kernels.json: no tile sizes, no multiprocessors.
OLD_H100 = {name: KernelEfficiency(compute, memory, launch_s) for name, (compute, memory,
                                                                         launch_s) in {
    "conv": ({"bf16": 0.4308, "fp32": 0.3149, "tf32": 0.4308}, 0.6138, 2.605e-05),
    "conv_backprop_filter": ({"bf16": 1, "fp32": 0.4377, "tf32": 1}, 0.4591, 6.141e-05),
    "conv_backprop_input": ({"bf16": 1, "fp32": 0.2915, "tf32": 1}, 0.08705, 8.435e-05),
    "data_movement": ({"any": 1}, 0.3992, 2.323e-05),
    "elementwise": ({"any": 1}, 0.661, 1.19e-05),
    "gemm": ({"bf16": 1, "fp32": 0.5748, "tf32": 1}, 0.2357, 2.476e-05),
    "matmul": ({"bf16": 0.5076, "fp32": 0.3234, "tf32": 0.3133}, 0.2805, 3.14e-05),
    "reduction": ({"any": 1}, 0.2822, 2.041e-05)}.items()}
WITHIN = 0.15  # a prediction within 15% of the measured sum counts as right
COLUMNS = ("model@batch", "precision", "measured ms", "old", "refit", "cv")


def model_sums(ops, kind, old_kind):
    """Per model@batch and precision: the measured kernel sum and the old, refit and
    cross-validated predictions of it (seconds), and the refit's table."""
    models = sorted({model for op in ops for model in op["models"]})
    refit = fit_kernel_efficiency(kernel_rows(ops, kind), kind)
    sums = []
    for model in models:
        cv = fit_kernel_efficiency(
            kernel_rows([op for op in ops if model not in op["models"]], kind), kind)
        mine = [dict(op, count=op["models"][model]) for op in ops if model in op["models"]]
        totals = {}
        for row in kernel_rows(mine, kind):
            totals.setdefault(row.setting, np.zeros(4))[:] += row.count * np.array([
                row.time_s, kernel_time(row, old_kind, OLD_H100),
                kernel_time(row, kind, refit), kernel_time(row, kind, cv)])
        for setting, (measured, old, fitted, crossed) in sorted(totals.items()):
            sums.append({"model": model, "precision": setting, "measured": measured,
                         "old": old, "refit": fitted, "cv": crossed})
    return sums, refit


def sum_cells(row):
    """A row of the table: the measured sum in ms, each prediction as its ratio."""
    return (row["model"], row["precision"], f"{row['measured'] * 1e3:.2f}",
            *(f"{row[key] / row['measured']:.2f}" for key in ("old", "refit", "cv")))


def class_cells(name, value):
    """A row of the per-class table of fitted figures."""
    return (name, f"{value.launch_s * 1e6:.2f}", f"{value.memory:.3f}",
            f"{value.tile_elements:.3g}" if value.tile_elements else "-",
            ", ".join(f"{p} {c:.3f}" for p, c in sorted(value.compute.items())))


def within_counts(sums):
    """For old, refit and cv: how many sums are within :data:`WITHIN`."""
    return {key: sum(abs(row[key] / row["measured"] - 1) <= WITHIN for row in sums)
            for key in ("old", "refit", "cv")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default=str(DEFAULT_TABLE))
    parser.add_argument("--kind", default="H100")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    args = parser.parse_args(argv)
    kind = load_device_kinds()[args.kind]
    old_kind = dataclasses.replace(kind, multiprocessors=None)  # as the old kind had none
    ops = [recount_flops(op) for op in json.loads(Path(args.table).read_text())["ops"]]
    sums, refit = model_sums(ops, kind, old_kind)
    console = Console(width=140)
    table = Table(title=f"Kernel sums on {args.kind} ({Path(args.table).name}): measured, "
                        "and predicted / measured")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "model@batch" else "right")
    for row in sums:
        table.add_row(*sum_cells(row))
    console.print(table)
    class_columns = ("class", "launch µs", "memory", "tile elements", "compute by precision")
    figures = Table(title=f"{args.kind} refit: figures per class "
                          f"({kind.multiprocessors} multiprocessors)")
    for column in class_columns:
        figures.add_column(column)
    for name, value in refit.items():
        figures.add_row(*class_cells(name, value))
    console.print(figures)
    counts = within_counts(sums)
    summary = (f"within {WITHIN:.0%} of the measured sum: old {counts['old']}, refit "
               f"{counts['refit']}, cross-validated {counts['cv']} of {len(sums)}")
    console.print(summary)
    if args.markdown:
        print()
        print_table(COLUMNS, [sum_cells(row) for row in sums])
        print()
        print_table(class_columns, [class_cells(n, v) for n, v in refit.items()])
        print()
        print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
