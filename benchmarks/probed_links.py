"""Plans from probed links against plans from datasheet links, on three local workers
(issue 40): which predicts the measured step better.

    .venv/bin/python -m benchmarks.probed_links [--batch-size 64] [--markdown]

Three ``tfpart worker`` processes on loopback, each pinned to a core (this machine
has two, so two share one) with one intra-op and one inter-op thread. ``tfpart cluster
probe`` measures their links and the cost of launching a step first. Then the example
model is compiled for them twice per strategy (op placement, pipeline, data parallel):
from the cluster file as written (the default links: a 10 Gbit/s, 50 µs link between
tasks, no launch cost) and from the probed one. Each compiled model is timed (``tfpart
run --cluster``, median of 20 batches) on freshly started workers by a fresh client,
since workers keep state from earlier clients. The table gives each plan's predicted
and measured step and the prediction's error.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from benchmarks.markdown import show_rows
from benchmarks.pipeline_throughput import tfpart_json
from profiles import DEFAULT_MODEL_DIR
from tfpart.local_workers import LocalWorkers

STRATEGIES = ("placement", "pipeline", "data_parallel")


def timed(compiled, links, workdir, batch):
    """Median step of ``compiled`` on fresh workers whose file has ``links`` (the probe's
    figures, or none)."""
    (workdir / "run").mkdir(exist_ok=True)
    with LocalWorkers(3, workdir / "run") as workers:
        cluster = dict(workers.cluster, **links)
        path = workdir / "run" / "timed.json"
        path.write_text(json.dumps(cluster))
        out = tfpart_json("run", compiled, "--cluster", path, "--batch-size", batch,
                          "--repeats", 20, "--json")
    return json.loads(out.strip().splitlines()[-1])["median_s"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    args = parser.parse_args(argv)
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "probe").mkdir()
        with LocalWorkers(3, work / "probe") as workers:
            datasheet = workers.path
            probed = work / "probed.json"
            console.print(tfpart_json("cluster", "probe", datasheet, "-o", probed))
        measured = json.loads(probed.read_text())
        links = {"links": measured["links"], "step_overhead": measured["step_overhead"]}
        for strategy in STRATEGIES:
            for label, cluster, applied in (("datasheet", datasheet, {}),
                                            ("probed", probed, links)):
                out = work / f"{strategy}-{label}"
                tfpart_json("compile", DEFAULT_MODEL_DIR, "--cluster", cluster, "--strategy",
                            strategy, "--batch-size", args.batch_size, "-o", out)
                predicted = json.loads((out / "plan.json").read_text())["predicted"][
                    "step_time"]
                step = timed(out, applied, work, args.batch_size)
                rows.append({"strategy": strategy, "links": label,
                             "predicted": f"{predicted * 1e3:.2f} ms",
                             "measured": f"{step * 1e3:.2f} ms",
                             "error": f"{(predicted / step - 1) * 100:+.0f}%"})
    show_rows(console, f"The example at batch {args.batch_size} on three local workers",
              rows, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
