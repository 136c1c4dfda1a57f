"""Training on two uneven workers: one worker, data parallel with equal shares and with
shares by speed, filter split, and ``--strategy auto``'s choice, measured beside the
predictions.

    python -m benchmarks.uneven_workers [--batch-size 64] [--rounds 2] [--repeats 5]
                                        [--model conv_tower] [--markdown]

Two ``tfpart worker`` processes on loopback, each pinned to its own core with one
intra-op and one inter-op thread; a busy loop pinned to task 1's core while it runs
leaves that worker a share of its core, which makes the two uneven (the slowdown is
measured first, as the ratio of a one-core matmul loop's time beside the busy loop to
its time alone). The link and the step launch are measured as in
:mod:`benchmarks.training_throughput`. Variants, each compiled from the model's
training step (SGD with momentum) and timed on freshly started workers:

(a) the whole step on one worker (``--algorithm single``: the fast one);
(b) data parallel, equal shares: compiled for a cluster that says both workers are
    alike (what a tool that ignores speed does);
(c) data parallel, shares by speed: compiled for the cluster as it is (task 1 a CPU
    kind slower by the measured ratio), the gradients reduced to one copy of the
    variables (c1) or all-reduced by collective ops over a copy on each worker (c2);
(d) filter split (``--strategy filter_split``): the convolutions and matmuls whose
    split the cost model predicts to pay, their output channels shared by speed;
(e) ``--strategy auto`` on the cluster as it is;
(f) for the conv towers, the same layers trained with a hand-written
    ``tf.distribute.MultiWorkerMirroredStrategy`` loop (two processes, equal halves of
    the batch, gradients all-reduced by TensorFlow's collective ops): what a user would
    write without tfpart.

Predictions use the model's training step profiled here (``tfpart profile``, one core),
and for the slowed worker the same profile with every time multiplied by the measured
ratio (a kind the cluster file declares).
Rounds alternate over variants; samples/s are medians over all timed steps.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.pipeline_throughput import tfpart_json
from benchmarks.training_throughput import measured_cluster, time_in_fresh_client
from examples.clusters import with_slower_cpu
from tfpart.local_workers import LocalWorkers
from tfpart.core.plan import Plan

REPLICAS = ["--algorithm", "data_parallel", "--option", "replicas=2"]
VARIANTS = [("(a) one worker", "uneven", ["--algorithm", "single"]),
            ("(b) data parallel, equal shares", "even", REPLICAS),
            ("(c1) data parallel, shares by speed, one copy", "uneven",
             [*REPLICAS, "--option", "reduce=one_device"]),
            ("(c2) data parallel, shares by speed, all-reduced", "uneven",
             [*REPLICAS, "--option", "reduce=all_reduce"]),
            ("(d) filter split", "uneven", ["--strategy", "filter_split"]),
            ("(e) --strategy auto", "uneven", ["--strategy", "auto"])]
LOOP = "import time, numpy as np; a = np.random.rand(300, 300); t = time.perf_counter()\n" \
       "for _ in range(300): a @ a\nprint(time.perf_counter() - t)"
TOWERS = ("conv_tower", "wide_conv_tower")  # the models with a hand-written baseline
SLOW_CORE = 1  # LocalWorkers pins task k to core k
SLOW_KIND = "cpu_shared_core"


MIRRORED = r"""
import json, os, sys, time
os.environ["TF_CONFIG"] = sys.argv[1]
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from examples.models import TRAINABLE
batch, repeats = int(sys.argv[2]), int(sys.argv[3])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
keras_model = TRAINABLE[sys.argv[4]]()
convs = [layer.get_weights() for layer in keras_model.layers if layer.get_weights()]
with strategy.scope():
    weights = [tf.Variable(w) for pair in convs for w in pair]
    velocity = [tf.Variable(tf.zeros_like(w)) for w in weights]


def forward(x):
    h = x
    for kernel, bias in zip(weights[0:-2:2], weights[1:-2:2]):
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, kernel, 1, "SAME"), bias))
    return tf.matmul(tf.reduce_mean(h, axis=[1, 2]), weights[-2]) + weights[-1]


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(tf.reduce_mean(tf.square(y - forward(x)), axis=1),
                                          global_batch_size=batch)
    grads = tape.gradient(loss, weights)
    return loss, tf.distribute.get_replica_context().all_reduce("sum", grads)


def apply(w, v, g):  # SGD with momentum 0.9, lr 0.01, on each worker's copy
    v.assign(0.9 * v - 0.01 * g)
    return w.assign_add(v)


@tf.function
def step(x, y):
    loss, grads = strategy.run(replica_step, args=(x, y))
    for w, v, g in zip(weights, velocity, grads):
        strategy.extended.update(w, apply, args=(v, g))
    return loss


x = tf.random.normal([batch // 2, *keras_model.input_shape[1:]])
y = tf.random.normal([batch // 2, 10])
times = []
for k in range(3 + repeats):
    start = time.perf_counter()
    strategy.reduce("sum", step(x, y), axis=None).numpy()
    if k >= 3:
        times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def time_mirrored(work, batch_size, repeats, model):
    """Seconds per step of a hand-written ``MultiWorkerMirroredStrategy`` training step
    of a conv tower (``model``): two worker processes pinned like tfpart's, each computing half
    the batch (the strategy's equal shares), gradients all-reduced by TensorFlow's
    collective ops; task 1 beside a busy loop."""
    from tfpart.local_workers import free_port

    ports = [free_port(), free_port()]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]),
               TF_CPP_MIN_LOG_LEVEL="2")
    workers = [subprocess.Popen(
        ["taskset", "-c", str(task), sys.executable, "-c", MIRRORED,
         json.dumps({"cluster": cluster, "task": {"type": "worker", "index": task}}),
         str(batch_size), str(repeats), model], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=work) for task in range(2)]
    hog = busy_loop(SLOW_CORE)
    try:
        out, err = workers[0].communicate(timeout=1800)
        workers[1].communicate(timeout=600)
    finally:
        hog.kill()
        for worker in workers:
            worker.kill()
    if workers[0].returncode:
        raise RuntimeError(err[-3000:])
    return json.loads(out.strip().splitlines()[-1])


def busy_loop(core):
    """A process spinning on ``core`` until killed."""
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c",
                             "while True: pass"])


def slowdown(core=SLOW_CORE):
    """How many times longer a one-core matmul loop takes beside the busy loop."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")

    def loop_seconds():
        return float(subprocess.run(["taskset", "-c", str(core), sys.executable, "-c", LOOP],
                                    capture_output=True, text=True, check=True,
                                    env=env).stdout)
    alone = min(loop_seconds() for _ in range(3))
    hog = busy_loop(core)
    try:
        shared = min(loop_seconds() for _ in range(3))
    finally:
        hog.kill()
    return shared / alone


def uneven(cluster, ratio):
    """``cluster`` (a dict) with task 1 a CPU kind ``ratio`` times slower."""
    return with_slower_cpu(cluster, 1, ratio, SLOW_KIND)


def slowed_profile(path, ratio):
    """A copy of the measured ``cpu`` profile at ``path`` for the slowed worker's kind:
    every time ``ratio`` times longer."""
    data = json.loads(Path(path).read_text())
    data["device_kind"] = SLOW_KIND
    for op in data["ops"]:
        for key in [k for k in op if k.startswith("time_s")]:
            op[key] *= ratio
    for key in ("op_overhead_s", "dispatch_overhead_s"):
        if key in data.get("fitted", {}):
            data["fitted"][key] *= ratio
    slowed = Path(path).with_name(f"{SLOW_KIND}.json")
    slowed.write_text(json.dumps(data))
    return slowed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="steps timed per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="conv_tower")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    from examples.models import export_training_step

    console = Console(width=160)
    work = Path(tempfile.mkdtemp(prefix="tfpart-uneven-"))
    try:
        ratio = slowdown()
        console.print(f"Task 1 beside a busy loop: {ratio:.2f}x slower")
        base = measured_cluster(work, console)
        clusters = {"even": base, "uneven": uneven(base, ratio)}
        model = export_training_step(work / args.model, args.model, "sgd_momentum")
        profiles = {"even": [work / "cpu.json"]}
        tfpart_json("profile", model, "--signature", "train_step", "--batch-size",
                    args.batch_size, "-o", profiles["even"][0])
        profiles["uneven"] = [*profiles["even"], slowed_profile(profiles["even"][0], ratio)]
        outs = []
        for k, (_, which, options) in enumerate(VARIANTS):
            cluster_file = work / f"{which}.json"
            cluster_file.write_text(json.dumps(clusters[which]))
            outs.append(work / f"variant{k}")
            measured = [arg for path in profiles[which] for arg in ("--profile", path)]
            tfpart_json("compile", model, "--cluster", cluster_file, "-o", outs[-1],
                        "--signature", "train_step", "--batch-size", args.batch_size,
                        *measured, *options)
        samples = {out: [] for out in outs}
        mirrored = []
        for _ in range(args.rounds):
            for out in outs:
                samples[out] += time_on_uneven_workers(work, base, out, args.repeats)
            if args.model in TOWERS:
                mirrored += time_mirrored(work, args.batch_size, args.repeats, args.model)
        rows = [row(label, Plan.load(out / "plan.json"), samples[out], args.batch_size)
                for (label, _, _), out in zip(VARIANTS, outs)]
        if mirrored:
            rows.append(["(f) hand-written MultiWorkerMirroredStrategy", "-",
                         f"{args.batch_size // 2}/{args.batch_size // 2}",
                         f"{args.batch_size / statistics.median(mirrored):.1f}", "-"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(console, rows, ratio, args)
    return 0


def time_on_uneven_workers(work, cluster, out, repeats):
    """Seconds per step of ``out`` on fresh workers, task 1 beside a busy loop."""
    with LocalWorkers(2, work) as timing:
        running = work / "running.json"
        running.write_text(json.dumps(dict(cluster, cluster=timing.cluster["cluster"])))
        hog = busy_loop(SLOW_CORE)
        try:
            return time_in_fresh_client(running, repeats, [str(out)])
        finally:
            hog.kill()


def row(label, plan, seconds, batch_size):
    replicas, splits = plan.replicas, plan.splits or {}
    if replicas:
        shares = "/".join(str(round(f * batch_size)) for f in replicas.fractions)
        if len(replicas.fractions) > 1:
            shares += f", {(replicas.reduce or 'one_device').replace('_', ' ')}"
    elif splits:
        channels = [sum(split.sizes) for split in splits.values()]
        fast = sum(split.sizes[0] for split in splits.values())
        shares = f"{len(splits)} ops split, {fast}/{sum(channels) - fast} channels"
    else:
        shares = "-"
    chosen = (plan.context.get("strategy") or {}).get("chosen", plan.algorithm)
    return [label, chosen, shares, f"{batch_size / statistics.median(seconds):.1f}",
            f"{batch_size / plan.step_time:.1f}"]


def print_table(console, rows, ratio, args):
    columns = ("variant", "plan", "shares", "measured samples/s", "predicted samples/s")
    table = Table(title=f"{args.model} training step, batch {args.batch_size}, 2 pinned "
                        f"workers, task 1 {ratio:.2f}x slower (median of {args.rounds} x "
                        f"{args.repeats} steps)")
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for line in rows:
        table.add_row(*line)
    console.print(table)
    if args.markdown:
        print(f"\n| {' | '.join(columns)} |\n|" + "---|" * len(columns))
        for line in rows:
            print(f"| {' | '.join(line)} |")


if __name__ == "__main__":
    sys.exit(main())
