"""Which strategy ``--strategy auto`` picks: op placement (greedy), pipeline,
data-parallel replicas, filter split or hybrid replicas (of a placement or of a
pipeline), by predicted step time, for example models
(inference at batch 32, and training steps) on every example cluster, side by side.

Predictions only; the measured comparison on two pinned workers (one slowed) against
a hand-written ``MultiWorkerMirroredStrategy`` is :mod:`benchmarks.uneven_workers`.

    .venv/bin/python -m benchmarks.strategies [--markdown]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from profiles import CLUSTERS_DIR, DEFAULT_MODEL_DIR
from tfpart.core.cluster import load_cluster
from tfpart.compile import plan_model
from partitioner.registry import auto_candidates

STRATEGIES = auto_candidates()  # what auto plans, in its order

CLUSTERS = ["local_3cpu.json", "4xT4_one_host.json", "hetero_2v100_2t4.json",
            "a100_l4_one_host.json", "h100_a100_l4_one_host.json"]


def models(directory):
    """(name, SavedModel directory, signature) of the example models, exported here."""
    from examples import models as examples

    yield "residual_cnn (the example)", DEFAULT_MODEL_DIR, None
    yield "resnet50", examples.export_resnet50(directory / "resnet50"), None
    yield "transformer", examples.export_transformer_encoder(directory / "transformer"), None
    for model in ("cnn", "transformer"):
        path = examples.export_training_step(directory / f"{model}_train", model, "adam")
        yield f"{model} training step (Adam)", path, "train_step"


def choices(batch_size=32):
    """One row per model and cluster: each strategy's predicted step and the choice."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, signature in models(Path(tmp)):
            for cluster_file in CLUSTERS:
                cluster = load_cluster(CLUSTERS_DIR / cluster_file)
                plan = plan_model(path, cluster, batch_size=batch_size, signature=signature,
                                  strategy="auto").plan
                strategy = plan.context["strategy"]
                shares = ""
                if plan.replicas:
                    shares = "/".join(str(round(f * batch_size))
                                      for f in plan.replicas.fractions)
                    if plan.replicas.microbatches:
                        shares += (f", pipelines of {len(set(plan.stages.values()))} "
                                   f"stages × {plan.replicas.microbatches}")
                    if len(plan.replicas.fractions) > 1:
                        shares += f", {plan.replicas.reduce or 'one_device'}"
                elif plan.splits:
                    shares = f"{len(plan.splits)} op{'s' if len(plan.splits) > 1 else ''} split"
                rows.append((name, cluster.name, *(
                    f"{strategy['step_times'][s] * 1e3:.3f}" if s in strategy["step_times"]
                    else "—" for s in STRATEGIES), strategy["chosen"], shares))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    columns = ("model", "cluster", *(f"{s} ms" for s in STRATEGIES), "chosen",
               "replica shares or splits")
    rows = choices()
    table = Table(title="Predicted step per strategy (batch 32) and auto's choice")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(width=200).print(table)
    if args.markdown:
        print("| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
