"""Training throughput and memory on two local workers, beside the predictions.

    python -m benchmarks.training_throughput [--batch-size 64] [--rounds 2] [--repeats 5]
                                             [--models conv_tower transformer_stack]
                                             [--markdown]

Two ``tfpart worker`` processes on loopback, each pinned to its own core with one
intra-op and one inter-op thread. The link between them and the cost of launching a
step are measured first, and each model's training step (``train_step(x, y)``, mean
squared error, SGD with momentum; :func:`tfpart.export_train_step`) is profiled
(``tfpart profile --signature train_step``), so predictions use this machine's numbers.
For each model, in one run:

(a) the whole step on one worker (``--algorithm single``);
(b) op placement (``--algorithm greedy``, no micro-batches);
(c) pipelined, GPipe (``--schedule gpipe``, the micro-batch count tfpart chooses);
(d) pipelined, 1F1B (``--schedule 1f1b``, the micro-batch count tfpart chooses);
(e), (f) GPipe and 1F1B at 8 micro-batches, where their activation memory differs most;

and, for the conv tower, a hand-written plain-TensorFlow training step of the same
layers pipelined over the two workers with gradient accumulation (GPipe order), as a
user would write it without tfpart. Each variant runs on freshly started workers in a
fresh client process. Measured peak memory per worker is the growth of the worker
process's resident set from its start to its high-water mark (``VmHWM``), so it
includes TensorFlow's own buffers beside the plan's tensors; predicted memory is the
plan's (a pipelined training step's schedule-aware peak, else the simulator's or the
bound). Rounds alternate over variants so drift in this machine's speed hits them alike;
samples/s are medians over all timed steps.
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

from benchmarks.pipeline_throughput import measure_link, tfpart_json
from tfpart.local_workers import LocalWorkers
from tfpart.core.plan import Plan

VARIANTS = [("(a) one worker", ["--algorithm", "single"]),
            ("(b) op placement", ["--algorithm", "greedy"]),
            ("(c) pipelined, GPipe", ["--schedule", "gpipe"]),
            ("(d) pipelined, 1F1B", ["--schedule", "1f1b"]),
            ("(e) GPipe, M = 8", ["--schedule", "gpipe", "--microbatches", "8"]),
            ("(f) 1F1B, M = 8", ["--schedule", "1f1b", "--microbatches", "8"])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="steps timed per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["conv_tower", "transformer_stack"])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: the timing process
    parser.add_argument("--reference", type=int, help=argparse.SUPPRESS)  # its M
    parser.add_argument("out", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client and args.reference:
        return time_reference(args.client, args.repeats, args.batch_size, args.reference)
    if args.client:
        return time_steps(args.client, args.out, args.repeats)
    console = Console(width=160)
    work = Path(tempfile.mkdtemp(prefix="tfpart-training-"))
    try:
        cluster = measured_cluster(work, console)
        tables = [run_model(name, work, cluster, args) for name in args.models]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, rows, reference in tables:
        print_table(console, name, rows, reference, args)
    return 0


def measured_cluster(work, console):
    """The two-worker cluster file's contents with this machine's link and launch cost."""
    with LocalWorkers(2, work) as workers:
        link = measure_link(workers.path)
        cluster = dict(workers.cluster, step_overhead=link["step_overhead_s"],
                       links={"cross_host": {"bandwidth": link["bandwidth"],
                                             "latency": link["latency_s"], "cpu_copy": True}})
    console.print(f"Loopback link: {link['bandwidth'] / 1e9:.2f} GB/s, latency "
                  f"{link['latency_s'] * 1e6:.0f} µs; step launch "
                  f"{link['step_overhead_s'] * 1e6:.0f} µs")
    return cluster


def run_model(name, work, cluster, args):
    """Compile every variant of ``name``'s training step, time them; rows and the
    reference's (one worker, pipelined) seconds per step."""
    from examples.models import export_training_step

    model = export_training_step(work / name, name, "sgd_momentum")
    profile = work / f"{name}-profile.json"
    tfpart_json("profile", model, "--signature", "train_step", "--batch-size",
                args.batch_size, "-o", profile)
    cluster_file = work / "measured.json"
    cluster_file.write_text(json.dumps(cluster))
    outs = []
    for k, (_, options) in enumerate(VARIANTS):
        out = work / f"{name}-variant{k}"
        tfpart_json("compile", model, "--cluster", cluster_file, "-o", out, "--signature",
                    "train_step", "--batch-size", args.batch_size, "--profile", profile,
                    *options)
        outs.append(out)
    keys = [*outs] + (["reference"] if name == "conv_tower" else [])
    samples = {key: [] for key in keys}
    memory = {key: [] for key in keys}
    for _ in range(args.rounds):
        for key in keys:  # fresh workers: they keep earlier clients' state
            with LocalWorkers(2, work) as timing:
                cluster_file.write_text(json.dumps(dict(cluster, cluster=timing.cluster[
                    "cluster"])))
                baseline = [resident_bytes(p.pid, "VmRSS") for p in timing.processes]
                extra = ["--reference", "8", "--batch-size", str(args.batch_size)] \
                    if key == "reference" else [str(key)]
                samples[key] += time_in_fresh_client(cluster_file, args.repeats, extra)
                memory[key].append([resident_bytes(p.pid, "VmHWM") - base
                                    for p, base in zip(timing.processes, baseline)])
    rows = []
    for (label, _), out in zip(VARIANTS, outs):
        plan = Plan.load(out / "plan.json")
        predicted_memory = [figures.peak_memory_bytes
                            for figures in plan.predicted.devices.values()]
        rows.append({"variant": label, "microbatches": plan.microbatches,
                     "schedule": plan.schedule or "-",
                     "stages": len(set((plan.stages or {}).values())) or
                     len(plan.devices_used()),
                     "measured": args.batch_size / statistics.median(samples[out]),
                     "predicted": args.batch_size / plan.step_time,
                     "predicted_memory": predicted_memory,
                     "measured_memory": [max(m[k] for m in memory[out]) for k in range(2)]})
    reference = None
    if "reference" in samples:
        reference = {"measured": args.batch_size / statistics.median(samples["reference"]),
                     "measured_memory": [max(m[k] for m in memory["reference"])
                                         for k in range(2)]}
    return name, rows, reference


def resident_bytes(pid, field):
    """A process's ``VmRSS`` or ``VmHWM`` (peak resident set) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def time_in_fresh_client(cluster_file, repeats, extra):
    done = subprocess.run([sys.executable, "-m", "benchmarks.training_throughput",
                           "--client", str(cluster_file), "--repeats", str(repeats), *extra],
                          capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_steps(cluster_file, out, repeats):
    """Print the seconds of each of ``repeats`` training steps of a compiled model."""
    import tfpart

    timed = tfpart.time_model(out, cluster=tfpart.load_cluster(cluster_file),
                              repeats=repeats, warmup=3, watch=True)
    print(json.dumps(timed["times_s"]))
    return 0


def time_reference(cluster_file, repeats, batch_size, microbatches):
    """Seconds per step of a hand-written plain-TensorFlow pipelined training step of
    the conv tower's layers: the first half on task 0, the rest and the head on task 1,
    each micro-batch's gradients (TensorFlow puts each on its forward op's device)
    accumulated, then one SGD-with-momentum update, as a user would write it."""
    import keras
    import tensorflow as tf

    import tfpart
    from examples.models import conv_tower

    cluster = tfpart.load_cluster(cluster_file)
    tfpart.connect(cluster, watch=True)
    first, second = cluster.device_names[:2]
    model = conv_tower()
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    head = model.layers[-1]
    half = len(convs) // 2
    weights = []
    for k, layer in enumerate([*convs, head]):
        with tf.device(first if k < half else second):
            weights.append([tf.Variable(w) for w in layer.get_weights()])
    variables = [v for pair in weights for v in pair]
    with tf.device(second):
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(variables)

    def conv(x, kernel, bias):
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias))

    @tf.function
    def step(x, y):
        size = -(-batch_size // microbatches)
        total, loss = None, 0.0
        for m in range(microbatches):
            xm, ym = x[m * size:(m + 1) * size], y[m * size:(m + 1) * size]
            share = tf.cast(tf.shape(xm)[0], tf.float32) / batch_size
            with tf.GradientTape() as tape:
                with tf.device(first):
                    h = xm
                    for kernel, bias in weights[:half]:
                        h = conv(h, kernel, bias)
                with tf.device(second):
                    for kernel, bias in weights[half:-1]:
                        h = conv(h, kernel, bias)
                    out = tf.matmul(tf.reduce_mean(h, axis=[1, 2]), weights[-1][0]) + \
                        weights[-1][1]
                    part = tf.reduce_mean(tf.square(ym - out))
            grads = [g * share for g in tape.gradient(part, variables)]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
            loss += part * share
        optimizer.apply_gradients(zip(total, variables))
        return loss

    with tf.device(first):
        x = tf.random.normal([batch_size, 16, 16, 3])
        y = tf.random.normal([batch_size, 10])
    times = []
    for k in range(3 + repeats):
        start = time.perf_counter()
        step(x, y).numpy()
        if k >= 3:
            times.append(time.perf_counter() - start)
    print(json.dumps(times))
    return 0


def print_table(console, name, rows, reference, args):
    table = Table(title=f"{name} training step, batch {args.batch_size}, 2 pinned workers "
                        f"(median of {args.rounds} x {args.repeats} steps)")
    columns = ("variant", "stages", "M", "schedule", "measured samples/s",
               "predicted samples/s", "predicted peak MB per worker",
               "measured peak MB per worker")
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    lines = [_cells(r) for r in rows]
    if reference is not None:
        lines.append(["hand-written TF pipeline (reference)", "2", "8", "gpipe",
                      f"{reference['measured']:.1f}", "-", "-",
                      _megabytes(reference["measured_memory"])])
    for line in lines:
        table.add_row(*line)
    console.print(table)
    if args.markdown:
        print(f"\n**{name}**\n\n| {' | '.join(columns)} |")
        print("|" + "---|" * len(columns))
        for line in lines:
            print(f"| {' | '.join(line)} |")


def _cells(row):
    return [row["variant"], str(row["stages"]), str(row["microbatches"]), row["schedule"],
            f"{row['measured']:.1f}", f"{row['predicted']:.1f}",
            _megabytes(row["predicted_memory"]), _megabytes(row["measured_memory"])]


def _megabytes(values):
    return " / ".join(f"{v / 1e6:.1f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
