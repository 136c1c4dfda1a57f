"""Placement quality: every algorithm side by side, on graphs nobody here wrote too.

For each graph, each algorithm's simulated step time is divided by the best known value:
the ILP optimum where the ILP proves one, else the lower bound (critical path, work, LP
relaxation). Graphs:

* random DAGs of 10-30 ops on 2-4 random heterogeneous GPUs (seeded);
* the Moirai graphs (``../shared/benchmarks/moirai``: per-device op times and
  per-pair transfer times);
* Keras ResNet50, InceptionV3 and a transformer encoder (batch 32) on the shipped
  example clusters;

then the greedy's placement time on synthetic graphs of 1,000 to 100,000 ops.

    .venv/bin/python -m benchmarks.partition_quality [--quick] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.synthetic import random_cluster, random_dag
from costmodel import CostModel
from partitioner import HEURISTICS, ilp
from partitioner.ilp import ILPOptions
from profiles import CLUSTERS_DIR
from tfpart.core.cluster import load_cluster
from tfpart.importers import load_moirai

SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
ORDER = ["greedy", "ilp", "m_etf", "m_topo", "min_cut", "topo_split", "round_robin", "random",
         "single"]


def run_all(graph, cluster, ilp_options):
    """{algorithm: (step time, seconds)}, the ILP's record, and the lower bound."""
    cost = CostModel(graph, cluster)
    results, record, bound = {}, None, None
    for name, module in dict(HEURISTICS, ilp=ilp).items():
        options = {"options": ilp_options} if name == "ilp" else {}
        t0 = time.perf_counter()
        try:
            plan = module.partition(cost, **options)
        except Exception as exc:  # a baseline that cannot place this graph
            results[name] = (float("nan"), time.perf_counter() - t0, str(exc)[:60])
            continue
        results[name] = (plan.step_time, time.perf_counter() - t0, "")
        bound = plan.lower_bound
        if name == "ilp":
            record = plan.predicted.solver
    best = record["objective"] if record and record["status"] == "optimal" else bound
    return results, record, best


def ratio_table(title, rows, console, markdown):
    """rows: (graph label, results, best) -> a table of ratios to the best known."""
    table = Table(title=title)
    table.add_column("graph")
    for name in ORDER:
        table.add_column(name, justify="right")
    lines = ["| graph | " + " | ".join(ORDER) + " |", "|---" * (len(ORDER) + 1) + "|"]
    for label, results, best in rows:
        cells = []
        for name in ORDER:
            step, seconds, _ = results.get(name, (float("nan"), 0, ""))
            cells.append("fails" if np.isnan(step) else f"{step / best:.3f} ({seconds:.2f}s)")
        table.add_row(label, *cells)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    console.print(table)
    if markdown:
        print(f"\n{title}\n\n" + "\n".join(lines))


def random_dags(console, markdown, count, ilp_seconds, seed=2026):
    rng = np.random.default_rng(seed)
    rows, optimal = [], 0
    # greedy / ILP optimum, / the ILP plan's simulated step, and / the ILP's bound
    greedy_ratios = ([], [], [])
    for k in range(count):
        graph = random_dag(int(rng.integers(10, 31)), rng, max_fan_in=3)
        cluster = random_cluster(int(rng.integers(2, 5)), rng)
        results, record, best = run_all(graph, cluster, ILPOptions(time_limit=ilp_seconds))
        rows.append((f"dag{k} ({len(graph)} ops, {len(cluster)} GPUs, ILP {record['status']})",
                     results, best))
        greedy_ratios[2].append(results["greedy"][0] / record["bound"])
        if record["status"] == "optimal":
            optimal += 1
            greedy_ratios[0].append(results["greedy"][0] / best)
            greedy_ratios[1].append(results["greedy"][0] / record["own_step_time"])
    ratio_table("Random DAGs: step time / best known (placement time)", rows, console,
                markdown)
    return rows, greedy_ratios, optimal


def moirai(console, markdown, ilp_seconds):
    rows = []
    for path in sorted((SHARED / "moirai").glob("*.json")):
        graph, cluster = load_moirai(path)
        results, record, best = run_all(graph, cluster, ILPOptions(time_limit=ilp_seconds))
        rows.append((f"{path.stem} ({len(graph)} ops; ILP {record['status']})", results, best))
    ratio_table("Moirai graphs: step time / lower bound (placement time)", rows, console,
                markdown)
    return rows


def keras_models(console, markdown, ilp_seconds, quick):
    from examples import models
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import read_saved_model

    exporters = [("resnet50", models.export_resnet50),
                 ("transformer", models.export_transformer_encoder)]
    if not quick:
        exporters.insert(1, ("inception_v3", models.export_inception_v3))
    clusters = ["hetero_2v100_2t4.json", "a100_l4_one_host.json", "4xT4_one_host.json"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, export in exporters:
            path = export(Path(tmp) / name)
            graph, _ = read_model(read_saved_model(path), path, batch_size=32)
            for cluster_file in clusters:
                cluster = load_cluster(CLUSTERS_DIR / cluster_file)
                results, record, best = run_all(graph, cluster,
                                                ILPOptions(time_limit=ilp_seconds))
                rows.append((f"{name} ({len(graph)} ops) on {cluster.name}", results, best))
    ratio_table("Keras models (batch 32) on example clusters: step time / lower bound "
                "(placement time)", rows, console, markdown)
    return rows


SCALING_RUN = """
import json, sys, time
import numpy as np
from benchmarks.synthetic import random_cluster, random_dag
from costmodel import CostModel
from partitioner import greedy
n = int(sys.argv[1])
rng = np.random.default_rng(7)
cluster = random_cluster(4, rng)
greedy.partition(CostModel(random_dag(200, rng, window=64), cluster))  # loads the compiled loops
graph = random_dag(n, rng, window=64)
t0 = time.perf_counter()
cost = CostModel(graph, cluster)
t1 = time.perf_counter()
plan = greedy.partition(cost)
t2 = time.perf_counter()
# VmHWM, not getrusage's ru_maxrss: Linux keeps the parent's maximum across fork and exec
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status")
               if line.startswith("VmHWM:"))
print(json.dumps({"edges": graph.number_of_edges(), "cost_model": t1 - t0, "greedy": t2 - t1,
                  "rss_mb": peak_kb / 1024}))
"""


def scaling(console, markdown, sizes):
    """The greedy's time and the process's peak RSS per graph size, each size in a
    fresh process (so the RSS is that size's), after a small graph has loaded the
    compiled loops. The cost model's construction is timed apart."""
    table = Table(title="Greedy placement time (4 heterogeneous GPUs)")
    columns = ("ops", "edges", "greedy s", "µs per op", "cost model s", "peak RSS MB")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for n in sizes:
        run = json.loads(subprocess.run([sys.executable, "-c", SCALING_RUN, str(n)],
                                        check=True, capture_output=True, text=True,
                                        cwd=Path(__file__).resolve().parent.parent)
                         .stdout.splitlines()[-1])
        cells = (f"{n:,}", f"{run['edges']:,}", f"{run['greedy']:.2f}",
                 f"{1e6 * run['greedy'] / n:.0f}", f"{run['cost_model']:.2f}",
                 f"{run['rss_mb']:.0f}")
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    if markdown:
        print("\nGreedy placement time (4 heterogeneous GPUs)\n\n" + "\n".join(lines))


def summary(console, markdown, dag_ratios, optimal, count, all_rows):
    speedups, worse_than_etf, cases = [], 0, 0
    for _, results, _ in all_rows:
        greedy_step, random_step, etf_step = (results[n][0] for n in ("greedy", "random",
                                                                      "m_etf"))
        if not np.isnan(random_step):
            speedups.append(random_step / greedy_step)
        if not np.isnan(etf_step):
            cases += 1
            worse_than_etf += greedy_step > etf_step * (1 + 1e-9)
    to_optimum, to_ilp_plan, to_bound = dag_ratios
    text = [
        f"Greedy / ILP optimum on the random DAGs the ILP solved ({optimal} of {count}): "
        f"mean {statistics.mean(to_optimum):.3f}, "
        f"95th percentile {np.percentile(to_optimum, 95):.3f}, worst {max(to_optimum):.3f}",
        f"Greedy / the ILP's optimal placement as simulated (same DAGs): "
        f"mean {statistics.mean(to_ilp_plan):.3f}, "
        f"95th percentile {np.percentile(to_ilp_plan, 95):.3f}, worst {max(to_ilp_plan):.3f}",
        f"Greedy / the ILP's lower bound on all {count} random DAGs (proven or not): "
        f"mean {statistics.mean(to_bound):.3f}, "
        f"95th percentile {np.percentile(to_bound, 95):.3f}, worst {max(to_bound):.3f}",
        f"Greedy speed-up over random placement (simulated step time): geometric mean "
        f"{np.exp(np.mean(np.log(speedups))):.2f}x, smallest {min(speedups):.2f}x over "
        f"{len(speedups)} cases",
        f"Greedy worse than m-ETF in {worse_than_etf} of {cases} cases",
    ]
    for line in text:
        console.print(line)
    if markdown:
        print("\n" + "\n".join(f"- {line}" for line in text))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer graphs, shorter limits")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    console = Console(width=200)
    count = 6 if args.quick else 20
    ilp_seconds = 10 if args.quick else 30
    dag_rows, dag_ratios, optimal = random_dags(console, args.markdown, count, ilp_seconds)
    moirai_rows = moirai(console, args.markdown, ilp_seconds)
    keras_rows = keras_models(console, args.markdown, ilp_seconds, args.quick)
    summary(console, args.markdown, dag_ratios, optimal, count,
            dag_rows + moirai_rows + keras_rows)
    scaling(console, args.markdown, [1_000, 10_000] if args.quick else
            [1_000, 3_000, 10_000, 30_000, 100_000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
