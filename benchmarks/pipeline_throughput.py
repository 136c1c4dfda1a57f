"""Real pipeline throughput on two local workers, beside the predictions.

    python -m benchmarks.pipeline_throughput [--batch-size 64] [--rounds 3] [--repeats 5]
                                            [--markdown]

Two ``tfpart worker`` processes on loopback, each pinned to its own core with one
intra-op and one inter-op thread (two real, parallel devices). The link between them
and the cost of launching a step on them are measured first, and the model is profiled
(``tfpart profile``), so the predictions use this machine's numbers. Then, in one run:

(a) the whole model on one worker (``--algorithm single``);
(b) the pipeline partitioner's 2-stage split without pipelining (``--microbatches 1``);
(c) the same kind of split pipelined over the micro-batch count tfpart chooses.

plus the same split at other fixed micro-batch counts, to show how good the chosen
count is, and the model's training step (``train_step``, Adam) pipelined over
``--schedule-microbatches`` micro-batches in every schedule of
:mod:`costmodel.schedules` (GPipe, 1F1B, interleaved 1F1B over two stages per
worker): the schedules' bubbles, predicted and measured (``--schedules-only`` times
only these). Each variant is timed on freshly started workers by a fresh client process
(``tfpart.connect``, ``tfpart.load``): workers keep state from earlier clients, and a
client holding several remote models slowed the later ones down. This is repeated for
``--rounds`` rounds over all variants so that drift in this machine's speed hits them
alike; the table shows each one's median over all its timed batches beside its
predicted samples/s. Targets: (c) >= 1.8 x (b) and
(c) >= 1.6 x (a).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from examples.models import export_conv_tower
from tfpart.local_workers import LocalWorkers
from tfpart.core.plan import Plan


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
    parser.add_argument("--repeats", type=int, default=5, help="batches timed per round")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--also", type=int, nargs="*", default=[2, 4, 8, 16],
                        help="fixed micro-batch counts to time beside the chosen one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--schedule-microbatches", type=int, default=8,
                        help="micro-batches of the training step in each schedule")
    parser.add_argument("--schedules-only", action="store_true",
                        help="time only the training step's schedules")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: the timing process
    parser.add_argument("--reference", type=int, help=argparse.SUPPRESS)  # its M
    parser.add_argument("out", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client and args.reference:
        return time_reference(args.client, args.repeats, args.batch_size, args.reference)
    if args.client:
        return time_batches(args.client, args.out, args.repeats)
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
            variants = [] if args.schedules_only else [
                ("(a) whole model on one worker", ["--algorithm", "single"]),
                ("(b) 2 stages, no pipelining", ["--microbatches", "1"]),
                ("(c) 2 stages, pipelined", ["--pipeline"])]
            variants += [(f"    2 stages, M = {m} (fixed)", ["--microbatches", str(m)])
                         for m in ([] if args.schedules_only else args.also)]
            variants = [(label, model, profile, options) for label, options in variants]
            variants += schedule_variants(work, args)
            outs = []
            for k, (label, source, source_profile, options) in enumerate(variants):
                out = work / f"variant{k}"
                tfpart_json("compile", source, "--cluster", cluster_file, "-o", out,
                            "--batch-size", args.batch_size, "--profile", source_profile,
                            *options)
                outs.append(out)
        samples = {out: [] for out in [*outs, "ref-one", "ref-two"]}
        for _ in range(args.rounds):
            for out in [*outs, *([] if args.schedules_only else ["ref"])]:
                # fresh workers too: they keep earlier clients' state
                with LocalWorkers(2, work) as timing:
                    cluster_file.write_text(json.dumps(dict(cluster, cluster=timing.cluster[
                        "cluster"])))
                    if out == "ref":
                        one, two = time_in_fresh_client(
                            cluster_file, "--reference", args.repeats,
                            ["--reference", "8", "--batch-size", str(args.batch_size)])
                        samples["ref-one"] += one
                        samples["ref-two"] += two
                    else:
                        samples[out] += time_in_fresh_client(cluster_file, out, args.repeats)
        for (label, *_), out in zip(variants, outs):
            median = statistics.median(samples[out])
            plan = Plan.load(out / "plan.json")
            stages = len(set((plan.stages or {}).values())) or len(plan.devices_used())
            pipeline = plan.predicted.pipeline if plan.predicted else None
            rows.append({"variant": label, "stages": stages,
                         "microbatches": plan.microbatches,
                         "bubble": pipeline.bubble_fraction if pipeline else None,
                         "measured": args.batch_size / median,
                         "predicted": args.batch_size / plan.step_time})
        reference = None if args.schedules_only else [
            statistics.median(samples["ref-one"]), statistics.median(samples["ref-two"])]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(console, rows, args)
    if reference is None:
        return 0
    console.print(f"Reference, hand-written plain TensorFlow (same layers, no tfpart): one "
                  f"worker {args.batch_size / reference[0]:.1f} samples/s, two workers "
                  f"pipelined over 8 micro-batches {args.batch_size / reference[1]:.1f} "
                  f"samples/s ({reference[0] / reference[1]:.2f}x)")
    return 0


def schedule_variants(work, args):
    """The training step of the model, exported and profiled, compiled in every
    schedule: ``(label, model, profile, compile options)`` each."""
    from costmodel.schedules import SCHEDULES
    from examples.models import export_training_step

    model = export_training_step(work / "conv_tower_step", "conv_tower", "adam")
    profile = work / "step_profile.json"
    tfpart_json("profile", model, "--batch-size", args.batch_size, "--signature",
                "train_step", "-o", profile)
    m = args.schedule_microbatches
    return [(f"(d) training step, {schedule}, M = {m}", model, profile,
             ["--signature", "train_step", "--microbatches", str(m), "--schedule", schedule])
            for schedule in SCHEDULES]


def time_in_fresh_client(cluster_file, out, repeats, extra=()):
    arguments = list(extra) if out == "--reference" else [str(out)]
    done = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_throughput", "--client",
                           str(cluster_file), "--repeats", str(repeats), *arguments],
                          capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_batches(cluster_file, out, repeats):
    """Print the seconds of each of ``repeats`` batches of a compiled model."""
    import tfpart

    timed = tfpart.time_model(out, cluster=tfpart.load_cluster(cluster_file), repeats=repeats,
                              warmup=3, watch=True)
    print(json.dumps(timed["times_s"]))
    return 0


def time_reference(cluster_file, repeats, batch_size, microbatches):
    """Seconds per batch of a hand-written plain-TensorFlow pipeline of the same layers
    (the first half on task 0, the rest on task 1; no tfpart, no control edges), and of
    the same layers all on task 0: what TensorFlow itself reaches on these workers."""
    import tensorflow as tf

    import tfpart

    cluster = tfpart.load_cluster(cluster_file)
    tfpart.connect(cluster, watch=True)
    first, second = cluster.device_names[:2]
    rng = tf.random.Generator.from_seed(0)
    shapes = [(3, 3, 3, 64)] + [(3, 3, 64, 64)] * 7
    kernels = []
    for k, shape in enumerate(shapes):
        with tf.device(first if k < len(shapes) // 2 else second):
            kernels.append((tf.Variable(rng.normal(shape) * 0.05), tf.Variable(tf.zeros(64))))

    def layers(x, chosen):
        for kernel, bias in chosen:
            x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias))
        return x

    def build(split, m_count):
        @tf.function
        def run(x):
            size = batch_size // m_count
            outs = []
            for m in range(m_count):
                with tf.device(first):
                    h = layers(x[m * size:(m + 1) * size], kernels[:4])
                with tf.device(second if split else first):
                    outs.append(tf.reduce_mean(layers(h, kernels[4:]), axis=[1, 2]))
            return tf.concat(outs, 0)
        return run

    with tf.device(first):
        x = tf.random.normal([batch_size, 16, 16, 3])
    results = []
    for fn in (build(False, 1), build(True, microbatches)):
        times = []
        for k in range(3 + repeats):
            start = time.perf_counter()
            fn(x).numpy()
            if k >= 3:
                times.append(time.perf_counter() - start)
        results.append(times)
    print(json.dumps(results))
    return 0


def print_table(console, rows, args):
    table = Table(title=f"conv_tower, batch {args.batch_size}, 2 pinned workers (median of "
                        f"{args.rounds} x {args.repeats} batches)")
    for column in ("variant", "stages", "M", "bubble", "measured samples/s",
                   "predicted samples/s", "measured / predicted"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in rows:
        bubble = "-" if r["bubble"] is None else f"{100 * r['bubble']:.0f}%"
        table.add_row(r["variant"], str(r["stages"]), str(r["microbatches"]), bubble,
                      f"{r['measured']:.1f}", f"{r['predicted']:.1f}",
                      f"{r['measured'] / r['predicted']:.2f}")
    console.print(table)
    summary = ""
    if not args.schedules_only:
        a, b, c = (r["measured"] for r in rows[:3])
        summary = (f"(c)/(b) = {c / b:.2f}x (target >= 1.8), (c)/(a) = {c / a:.2f}x "
                   f"(target >= 1.6)")
        console.print(summary)
    if args.markdown:
        print("\n| variant | stages | M | bubble | measured samples/s | predicted samples/s |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            bubble = "-" if r["bubble"] is None else f"{100 * r['bubble']:.0f}%"
            print(f"| {r['variant']} | {r['stages']} | {r['microbatches']} | {bubble} | "
                  f"{r['measured']:.1f} | {r['predicted']:.1f} |")
        print(f"\n{summary}")


if __name__ == "__main__":
    sys.exit(main())
