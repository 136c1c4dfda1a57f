"""How well does the cost model predict real GPU kernels? Cross-validated on a kernel table.

The table (default ``../shared/gpu/h100_kernels.json``: 461 ops of ResNet50 at
batch 1, 8 and 32, a ResNet50 training step and a BERT-base layer, each timed as its
cuDNN/cuBLAS kernel on an H100 at TF32, fp32 and bf16) says which model@batch each op
belongs to. For every model@batch the fit (:mod:`costmodel.calibration`) sees only the
ops that model does not contain, then predicts that model's ops: no model is scored by
a fit that has seen any of its ops. Kernel classes the other models lack (the
training step's backward convolutions) fall back to the coarse class fitted on the
others (``matmul``).

Compared side by side, per precision:

* ``before``: the datasheet kind as tfpart shipped it until now (every op at the fp32
  peak, one efficiency per coarse class, a fixed 5 us per op);
* ``after (cv)``: the cross-validated fit, at the op's own precision's peak;
* ``after (all)``: the fit on every op (what the shipped H100 kind holds), for
  reference only -- it has seen the model it scores.

Sums are of kernel times x occurrences (the executor's own per-op cost is not in the
measured times, so it is left out of the predictions too). Per-op figures are
prediction / measurement over distinct ops.

Run from the repository root::

    .venv/bin/python -m benchmarks.gpu_costmodel_accuracy [--table PATH] [--markdown]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.markdown import print_table
from costmodel.calibration import (default_precision, fit_kernel_efficiency, kernel_rows,
                                   kernel_time)
from costmodel.measured import recount_flops
from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds
from tfpart.core.ops import MATMUL_OPS, kernel_class

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TABLE = ROOT.parent / "shared" / "gpu" / "h100_kernels.json"
# The H100 entry of profiles/device_kinds.json before calibration (commit 28993f6).
BEFORE = {name: KernelEfficiency.parse(value) for name, value in
          {"matmul": 0.7, "elementwise": 0.8, "reduction": 0.6, "data_movement": 0.8}.items()}
BEFORE_OVERHEAD_S = 5e-6
TARGET_SUM, TARGET_OP = 0.15, (0.6, 1.6)


def before_time(row, kind):
    """The old prediction: fp32 peak for everything, coarse-class efficiency, 5 us."""
    return kernel_time(row._replace(precision="fp32"), kind, BEFORE) + BEFORE_OVERHEAD_S


def evaluate(ops, kind):
    """Per model@batch and precision: measured, before, after (cv), after (all) sums;
    and the per-op ratios (cv) by group."""
    models = sorted({model for op in ops for model in op["models"]})
    everything = fit_kernel_efficiency(kernel_rows(ops, kind), kind)
    sums, ratios = [], {}
    for model in models:
        train_rows = kernel_rows([op for op in ops if model not in op["models"]], kind)
        cv = fit_kernel_efficiency(train_rows, kind)
        seen = {kernel_class(row.op_type) for row in train_rows}
        totals = {}
        for op in (op for op in ops if model in op["models"]):
            count = op["models"][model]
            for row in kernel_rows([dict(op, count=count)], kind):
                entry = totals.setdefault(row.setting, np.zeros(4))
                predicted = kernel_time(row, kind, cv)
                entry += count * np.array([row.time_s, before_time(row, kind), predicted,
                                           kernel_time(row, kind, everything)])
                group = "conv/matmul" if row.op_type in MATMUL_OPS else "other"
                if kernel_class(row.op_type) not in seen:
                    group += " (class unseen)"
                ratios.setdefault(group, []).append((row.setting, predicted / row.time_s))
        for setting, (measured, before, after, full) in sorted(totals.items()):
            sums.append({"model": model, "setting": setting, "measured_ms": measured * 1e3,
                         "before": before / measured, "after_cv": after / measured,
                         "after_all": full / measured})
    return sums, ratios, everything


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default=str(DEFAULT_TABLE))
    parser.add_argument("--kind", default="H100")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    args = parser.parse_args(argv)
    kind = load_device_kinds()[args.kind]
    data = json.loads(Path(args.table).read_text())
    ops = [recount_flops(op) for op in data["ops"]]
    sums, ratios, fitted = evaluate(ops, kind)
    console = Console(width=140)
    table = Table(title=f"Predicted / measured kernel-time sums on {args.kind} "
                        f"({Path(args.table).name}; time_s at {default_precision(kind)})")
    for column in ("model@batch", "setting", "measured ms", "before", "after (cv)",
                   "after (all)"):
        table.add_column(column, justify="left" if column == "model@batch" else "right")
    for row in sums:
        table.add_row(row["model"], row["setting"], f"{row['measured_ms']:.2f}",
                      f"{row['before']:.2f}", f"{row['after_cv']:.2f}",
                      f"{row['after_all']:.2f}")
    console.print(table)
    per_op = Table(title="Per op, cross-validated prediction / measurement")
    per_op_columns = ("ops", "setting", "n", "p10", "median", "p90",
                      f"in [{TARGET_OP[0]}, {TARGET_OP[1]}]")
    for column in per_op_columns:
        per_op.add_column(column, justify="right")
    per_op_rows = []
    for group, values in sorted(ratios.items()):
        for setting in sorted({p for p, _ in values}):
            r = np.array([v for p, v in values if p == setting])
            inside = np.mean((r >= TARGET_OP[0]) & (r <= TARGET_OP[1]))
            per_op_rows.append((group, setting, str(len(r)), f"{np.percentile(r, 10):.2f}",
                                f"{np.median(r):.2f}", f"{np.percentile(r, 90):.2f}",
                                f"{inside:.0%}"))
    for row in per_op_rows:
        per_op.add_row(*row)
    console.print(per_op)
    params = Table(title=f"Fitted on every op: {args.kind}")
    param_columns = ("class", "launch", "memory", "compute by precision")
    for column in param_columns:
        params.add_column(column)
    param_rows = [(name, f"{value.launch_s * 1e6:.1f} us", f"{value.memory:.3f}",
                   ", ".join(f"{p} {c:.3f}" for p, c in sorted(value.compute.items())))
                  for name, value in fitted.items()]
    for row in param_rows:
        params.add_row(*row)
    console.print(params)
    within = sum(abs(row["after_cv"] - 1) <= TARGET_SUM for row in sums)
    console.print(f"{within} of {len(sums)} model@batch@precision sums within "
                  f"{TARGET_SUM:.0%} (cross-validated)")
    if args.markdown:
        columns = ("model@batch", "setting", "measured ms", "before", "after (cv)",
                   "after (all)")
        for table_columns, table_rows in [
                (columns, [(r["model"], r["setting"], f"{r['measured_ms']:.2f}",
                            f"{r['before']:.2f}", f"{r['after_cv']:.2f}",
                            f"{r['after_all']:.2f}") for r in sums]),
                (per_op_columns, per_op_rows), (param_columns, param_rows)]:
            print()
            print_table(table_columns, table_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
