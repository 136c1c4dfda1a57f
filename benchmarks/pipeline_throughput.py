"""Real pipeline throughput on two local workers, beside the predictions.

    python -m benchmarks.pipeline_throughput [--batch-size 64] [--repeats 10] [--markdown]

Two ``tfpart worker`` processes on loopback, each pinned to its own core with one
intra-op and one inter-op thread (two real, parallel devices). The link between them
and the cost of launching a step on them are measured first, and the model is profiled
(``tfpart profile``), so the predictions use this machine's numbers. Then, in one run:

(a) the whole model on one worker (``--algorithm single``);
(b) the pipeline partitioner's 2-stage split without pipelining (``--microbatches 1``);
(c) the same kind of split pipelined over the micro-batch count tfpart chooses.

Each is timed by ``tfpart run`` in a fresh client process (median of ``--repeats``
batches) and printed with its predicted samples/s. Targets: (c) >= 1.8 x (b) and
(c) >= 1.6 x (a).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from examples.models import export_conv_tower
from tfpart.local_workers import LocalWorkers


def tfpart_json(*args, timeout=1800):
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode:
        raise RuntimeError((done.stdout + done.stderr)[-3000:])
    return done.stdout


def measure_link(cluster_file):
    done = subprocess.run([sys.executable, "-m", "benchmarks.run_compiled", "--measure-link",
                           "--cluster", str(cluster_file)], capture_output=True, text=True,
                          timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    console = Console(width=150)
    work = Path(tempfile.mkdtemp(prefix="tfpart-pipeline-"))
    rows = []
    try:
        model = export_conv_tower(work / "conv_tower")
        profile = work / "profile.json"
        tfpart_json("profile", model, "--batch-size", args.batch_size, "-o", profile)
        with LocalWorkers(2, work) as workers:
            link = measure_link(workers.path)
            cluster = dict(workers.cluster, step_overhead=link["step_overhead_s"],
                           links={"cross_host": {"bandwidth": link["bandwidth"],
                                                 "latency": link["latency_s"],
                                                 "cpu_copy": True}})
            cluster_file = work / "measured.json"
            cluster_file.write_text(json.dumps(cluster))
            console.print(f"Loopback link: {link['bandwidth'] / 1e9:.2f} GB/s, latency "
                          f"{link['latency_s'] * 1e6:.0f} µs; step launch "
                          f"{link['step_overhead_s'] * 1e6:.0f} µs")
            variants = [("(a) whole model on one worker", ["--algorithm", "single"]),
                        ("(b) 2 stages, no pipelining", ["--microbatches", "1"]),
                        ("(c) 2 stages, pipelined", ["--pipeline"])]
            for label, options in variants:
                out = work / label[1]
                t0 = time.perf_counter()
                tfpart_json("compile", model, "--cluster", cluster_file, "-o", out,
                            "--batch-size", args.batch_size, "--profile", profile, *options)
                compile_s = time.perf_counter() - t0
                plan = json.loads((out / "plan.json").read_text())
                measured = json.loads(tfpart_json(
                    "run", out, "--cluster", workers.path, "--repeats", args.repeats,
                    "--warmup", 3, "--json").strip().splitlines()[-1])
                stages = len(set((plan.get("stages") or {}).values())) or len(
                    set(plan["assignment"].values()))
                rows.append({"variant": label, "stages": stages,
                             "microbatches": plan.get("microbatches", 1),
                             "measured": measured["samples_per_s"],
                             "predicted": args.batch_size / plan["predicted"]["step_time"],
                             "compile_s": compile_s})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(console, rows, args)
    return 0


def print_table(console, rows, args):
    table = Table(title=f"conv_tower, batch {args.batch_size}, 2 pinned workers "
                        f"(median of {args.repeats} batches)")
    for column in ("variant", "stages", "M", "measured samples/s", "predicted samples/s",
                   "measured / predicted"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in rows:
        table.add_row(r["variant"], str(r["stages"]), str(r["microbatches"]),
                      f"{r['measured']:.1f}", f"{r['predicted']:.1f}",
                      f"{r['measured'] / r['predicted']:.2f}")
    console.print(table)
    a, b, c = (r["measured"] for r in rows)
    summary = (f"(c)/(b) = {c / b:.2f}x (target >= 1.8), (c)/(a) = {c / a:.2f}x "
               f"(target >= 1.6)")
    console.print(summary)
    if args.markdown:
        print("\n| variant | stages | M | measured samples/s | predicted samples/s |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['variant']} | {r['stages']} | {r['microbatches']} | "
                  f"{r['measured']:.1f} | {r['predicted']:.1f} |")
        print(f"\n{summary}")


if __name__ == "__main__":
    sys.exit(main())
