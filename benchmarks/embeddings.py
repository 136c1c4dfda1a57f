"""Embedding tables: what a row lookup costs, predicted against measured (issue 39).

For the two-tower recommender of :func:`examples.models.recommender` (an item table of
``--items`` x 64, 512 MB at the default 2M rows) at each batch size:

* **the item lookup** (a ``GatherV2`` of ``batch`` rows of the read table): its time
  measured by ``tfpart profile`` here (one core, one op at a time), beside the CPU
  roofline's prediction from the rows it reads and writes (:mod:`tfpart.core.touched`)
  and from every input in full (the figure before issue 39);
* **the step**: the model compiled for one device of the default cluster, its measured
  median step (``tfpart run``, a fresh process with one intra-op thread) beside the
  plan's predicted step and the step predicted before (the same plan, with the lookup
  at the old figure: one device runs its ops one after another).

Run from the repository root::

    .venv/bin/python -m benchmarks.embeddings [--items 2000000] [--batches 80,1024] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from benchmarks.costmodel_accuracy import tfpart_command
from benchmarks.markdown import show_rows
from examples.models import export_recommender
from tfpart.core.dtypes import tensor_bytes


def tfpart(*args, timeout=1800):
    """Run ``tfpart`` in a fresh process; its stdout."""
    done = subprocess.run([tfpart_command(), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return done.stdout


def item_lookup(graph, table_bytes):
    """The lookup that receives the whole item table."""
    return next(op for op, attrs in graph.ops.items() if attrs["op_type"] == "GatherV2"
                and any(edge["bytes"] == table_bytes for edge in graph.in_edges(op).values()))


def whole_inputs(graph, op):
    """Bytes of ``op``'s inputs and outputs in full: what it was priced at before."""
    attrs = graph.ops[op]
    return sum(edge["bytes"] for edge in graph.in_edges(op).values() if not edge["control"]) + \
        sum(tensor_bytes(shape, dtype) for shape, dtype in attrs["outputs"])


def measure(model, batch, items, dim, workdir):
    """One row: the lookup's and the step's times, measured and predicted."""
    from costmodel.roofline import roofline_time
    from profiles import DEFAULT_CLUSTER_FILE
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.core.cluster import load_cluster

    graph, _ = read_model(read_saved_model(model), model, batch_size=batch)
    lookup = item_lookup(graph, tensor_bytes((items, dim), "float32"))
    attrs = graph.ops[lookup]
    kind = load_cluster(DEFAULT_CLUSTER_FILE).devices[0].kind
    now = roofline_time("GatherV2", attrs["flops"], attrs["bytes_accessed"], kind)
    before = roofline_time("GatherV2", attrs["flops"], whole_inputs(graph, lookup), kind)
    profile = workdir / f"profile{batch}.json"
    tfpart("profile", model, "--batch-size", batch, "-o", profile, "--intra-threads", 1)
    measured_lookup = next(op["time_s"] for op in json.loads(profile.read_text())["ops"]
                           if op["op_type"] == "GatherV2" and op["input_shapes"][0] == [items, dim])
    out = workdir / f"out{batch}"
    tfpart("compile", model, "--algorithm", "single", "--batch-size", batch, "-o", out)
    predicted = json.loads((out / "plan.json").read_text())["predicted"]["step_time"]
    run = json.loads(tfpart("run", out, "--batch-size", batch, "--repeats", 50, "--json")
                     .strip().splitlines()[-1])
    return {"batch": str(batch),
            "lookup measured": f"{measured_lookup * 1e6:.1f} µs",
            "lookup predicted": f"{now * 1e6:.1f} µs",
            "lookup predicted before": f"{before * 1e6:.1f} µs",
            "step measured": f"{run['median_s'] * 1e6:.0f} µs",
            "step predicted": f"{predicted * 1e6:.0f} µs",
            "step predicted before": f"{(predicted + before - now) * 1e6:.0f} µs"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", default="80,1024")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        model = export_recommender(workdir / "model", items=args.items, dim=args.dim)
        rows = [measure(model, int(batch), args.items, args.dim, workdir)
                for batch in args.batches.split(",")]
    table = args.items * args.dim * 4 / 2**20
    show_rows(Console(), f"Recommender, a {args.items:,} x {args.dim} item table "
              f"({table:.0f} MiB), one CPU device", rows, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
