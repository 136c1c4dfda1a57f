"""Which placements change when the GPU kinds are calibrated, and by how much?

For each example GPU cluster (``profiles/clusters/``) and model, the greedy places
the model twice:

* ``before``: with the device kinds as tfpart shipped them before calibration
  (``benchmarks/data/device_kinds_before_calibration.json``) and the old precision
  rule (every op at the fp32 peak);
* ``after``: with the shipped kinds (H100 fitted to measured kernels, A100s derived
  from it, TF32 and half-precision peaks).

The table gives each plan's predicted step under its own cost model, the share of
ops whose device changed, and the old plan re-priced by the calibrated model: how
much slower than the new plan the calibrated model thinks it is ("old plan / new").

Run from the repository root::

    .venv/bin/python -m benchmarks.gpu_placement_changes [--markdown]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.markdown import print_table
from costmodel import CostModel
from costmodel.simulate import simulate
from examples import models as example_models
from partitioner import greedy
from tfpart.core.cluster import cluster_from_dict
from tfpart.core.device_kinds import kinds_from_dict, load_device_kinds

ROOT = Path(__file__).resolve().parents[1]
BEFORE_KINDS = Path(__file__).resolve().parent / "data" / "device_kinds_before_calibration.json"
CLUSTERS = ["h100_a100_l4_one_host", "a100_l4_one_host", "hetero_2v100_2t4",
            "4xT4_one_host"]
MODELS = {  # name -> (exporter, batch size)
    "resnet50": (example_models.export_resnet50, 32),
    "transformer": (example_models.export_transformer_encoder, 64),
    "residual_cnn": (example_models.export_residual_cnn, 128),
}


def read_graph(exporter, batch, workdir):
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import read_saved_model

    path = exporter(Path(workdir) / exporter.__name__)
    graph, _ = read_model(read_saved_model(path), path, batch_size=batch)
    return graph


def clusters(name):
    data = json.loads((ROOT / "profiles" / "clusters" / f"{name}.json").read_text())
    before = kinds_from_dict(json.loads(BEFORE_KINDS.read_text())["kinds"], BEFORE_KINDS)
    return (cluster_from_dict(data, source=name, kinds=before),
            cluster_from_dict(data, source=name, kinds=load_device_kinds()))


def compare(graph, cluster_name):
    old_cluster, new_cluster = clusters(cluster_name)
    old_cost = CostModel(graph, old_cluster, tf32=False)  # the old rule: fp32 peaks
    new_cost = CostModel(graph, new_cluster)
    old, new = greedy.partition(old_cost), greedy.partition(new_cost)
    names = new_cluster.device_names
    old_on_new = simulate(new_cost, np.array([names.index(old.assignment[op])
                                              for op in new_cost.ops])).makespan
    moved = np.mean([old.assignment[op] != new.assignment[op] for op in graph.ops])
    return {"cluster": cluster_name, "before_ms": old.step_time * 1e3,
            "after_ms": new.step_time * 1e3, "moved": float(moved),
            "old_plan_on_new": old_on_new / new.step_time,
            "devices_before": len(old.devices_used()), "devices_after": len(new.devices_used())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.models.split(","):
            exporter, batch = MODELS[model]
            graph = read_graph(exporter, batch, workdir)
            for cluster_name in CLUSTERS:
                rows.append(dict(compare(graph, cluster_name), model=f"{model}@{batch}"))
    table = Table(title="Greedy placements before and after GPU calibration")
    columns = ("model", "cluster", "step before (ms)", "step after (ms)", "devices",
               "ops moved", "old plan / new")
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "cluster") else "right")
    cells = [(r["model"], r["cluster"], f"{r['before_ms']:.2f}", f"{r['after_ms']:.2f}",
              f"{r['devices_before']} -> {r['devices_after']}", f"{r['moved']:.0%}",
              f"{r['old_plan_on_new']:.2f}") for r in rows]
    for row in cells:
        table.add_row(*row)
    Console(width=140).print(table)
    if args.markdown:
        print_table(columns, cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
