"""Synchronous against asynchronous training on uneven workers: sync (the
data-parallel compile), ASGD, DC-ASGD and DDC-ASGD, several seeds each.

    python -m benchmarks.async_training [--seeds 5] [--steps 600] [--markdown]
                                        [--data digits|generated]
                                        [--updates-per-call 4] [--ps 1]
                                        [--workers 3] [--momentum 0.9] [--lambda0 2]
                                        [--plot async_training.png] [--save runs.json]

Data (``--data``): scikit-learn's handwritten digits (1,797 8×8 images, 10 classes;
shipped inside the package, no download; ``pip install -e '.[bench]'``), or a generated
problem (scikit-learn's ``make_classification``: 24,000 samples of 64 features, 10
classes of two clusters each), harder, so that accuracy still rises after 600 updates
instead of levelling off near 0.97 after 300, and with a held-out fifth of 4,800
samples instead of 360, whose accuracy is less noisy; a fifth held out either way.
Model: a 64-512-512-10 perceptron (:func:`examples.models.export_classifier_step`),
SGD with momentum; wide enough that computing a gradient takes longer than the
parameter servers' read and update, as in real training, so updates overlap and have
delays. Cluster: ``--workers`` (three) ``tfpart worker`` tasks and one ``ps`` task on
loopback, fresh for every run; the last worker is slowed by stopping and continuing
its process (it runs ``--slow-share`` of every 30 ms), so it computes about
``1 / share`` times slower. More workers on the same two cores make longer delays.

Each asynchronous run makes ``--steps`` updates of ``--batch-size`` samples; a sync
update takes that batch on each worker, so sync makes a third as many updates (with
three workers) over the same number of samples. The sync compile is told the slowed
worker's speed (a CPU kind ``1 / share`` times slower), so its batch shares follow
speed; the asynchronous modes need no such hint. Wall time counts from the first update
and counts training only: not the start of the processes, sync's compile, the tracing of
the asynchronous modes' function, nor each mode's warm-up (a first step or call on
every worker that changes nothing: it builds the function's parts on the workers and
servers, about 0.4 s for sync and 2 s for the asynchronous modes). Evaluations on the
held-out fifth run in the client: sync's between its steps, with its clock stopped
(they took about a fifth of its wall time before that); the asynchronous modes' in a
thread of their own, whenever the servers' count passes a multiple of the evaluation
interval, while the workers go on (they cost those runs no measurable time).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from benchmarks.markdown import show_rows
from examples.clusters import with_slower_cpu
from examples.models import export_classifier_step
from tfpart.local_workers import LocalWorkers

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sync", "async", "dc-asgd", "ddc-asgd")
PERIOD = 0.03
console = Console(highlight=False)


def data_set(name, path):
    """``name``'s data set ("digits" or "generated") saved as the training step's ``x``
    and ``y``; the generated one is the same for every seed (a seed varies the held-out
    split and the batches)."""
    try:
        from sklearn import datasets
    except ModuleNotFoundError:
        raise SystemExit("benchmarks.async_training needs scikit-learn: "
                         "pip install -e '.[bench]'") from None
    if name == "digits":
        data = datasets.load_digits()
        x, y = data.data / 16.0, data.target
    else:
        x, y = datasets.make_classification(
            n_samples=24_000, n_features=64, n_informative=32, n_redundant=0, n_classes=10,
            n_clusters_per_class=2, class_sep=1.5, random_state=0)
        x = (x - x.mean(0)) / x.std(0)
    np.savez(path, x=x.astype(np.float32), y=y.astype(np.int32))
    return path


class Throttle:
    """Stop and continue a process so it runs ``share`` of every ``period`` seconds."""

    def __init__(self, pid, share, period=PERIOD):
        self.pid, self.share, self.period = pid, share, period
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopped.is_set():
            time.sleep(self.period * self.share)
            os.kill(self.pid, signal.SIGSTOP)
            time.sleep(self.period * (1 - self.share))
            os.kill(self.pid, signal.SIGCONT)

    def stop(self):
        self.stopped.set()
        self.thread.join()
        os.kill(self.pid, signal.SIGCONT)


def one_run(work, model, data, mode, seed, args):
    """Train once on fresh workers; the run's evaluations, updates and summary."""
    out = work / f"{mode}-{seed}"
    slow = args.workers - 1
    with LocalWorkers(args.workers, work, ps=args.ps, pin=False) as workers:
        cluster = workers.path
        if mode == "sync":  # tell the compile the slowed worker's speed
            slowed = with_slower_cpu(json.loads(cluster.read_text()), slow,
                                     1 / args.slow_share, "cpu_slowed")
            cluster = work / "sync_cluster.json"
            cluster.write_text(json.dumps(slowed))
        steps = args.steps // args.workers if mode == "sync" else args.steps
        throttle = Throttle(workers.processes[slow].pid, args.slow_share)
        try:
            run = subprocess.run(
                [sys.executable, "-m", "tfpart.cli", "train", str(model), "--cluster",
                 str(cluster), "--data", str(data), "-o", str(out), "--mode", mode,
                 "--steps", str(steps), "--batch-size", str(args.batch_size), "--lr",
                 str(args.lr), "--momentum", str(args.momentum), "--lambda0",
                 str(args.lambda0), "--eval-every", str(max(1, steps // 30)), "--seed",
                 str(seed), "--updates-per-call", str(args.updates_per_call)],
                cwd=ROOT, capture_output=True, text=True, timeout=1800)
        finally:
            throttle.stop()
    if run.returncode:
        raise RuntimeError(f"{mode} seed {seed}: {run.stderr[-2000:]}")
    with open(out / "evaluations.csv") as handle:
        evaluations = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]
    return {"evaluations": evaluations, "summary": json.loads((out / "train.json").read_text())}


def accuracy_at(evaluations, key, value):
    """Held-out accuracy at ``value`` of ``key`` (update or wall_s), interpolated."""
    xs = [e[key] for e in evaluations]
    return float(np.interp(value, xs, [e["accuracy"] for e in evaluations]))


def time_to_reach(evaluations, target):
    """Wall seconds of the first evaluation at or above ``target`` (None: never)."""
    return next((e["wall_s"] for e in evaluations if e["accuracy"] >= target), None)


def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "never"
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.pstdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def sync_target(runs):
    """The sync runs' mean final accuracy, which the other modes are timed to reach."""
    return statistics.fmean(r["evaluations"][-1]["accuracy"] for r in runs["sync"])


def checkpoints(args):
    """The update counts at which the modes' accuracies are compared."""
    return [args.steps // 6, args.steps // 2, args.steps]


def tables(runs, args):
    """Rows of the accuracy/time table and of the delay table."""
    target = sync_target(runs)
    rows = []
    for mode in MODES:
        results = runs[mode]
        reach = [time_to_reach(r["evaluations"], target) for r in results]
        rows.append({
            "mode": mode,
            "updates": results[0]["summary"]["updates"],
            "wall s": spread([r["summary"]["wall_s"] for r in results]),
            "final accuracy": spread([r["evaluations"][-1]["accuracy"] for r in results]),
            f"s to sync's {target:.3f}": spread(reach) + (
                f" ({sum(t is None for t in reach)} of {len(reach)} never)"
                if any(t is None for t in reach) else ""),
            **{f"accuracy at {n} updates": "-" if mode == "sync" else spread(
                [accuracy_at(r["evaluations"], "update", n) for r in results])
               for n in checkpoints(args)}})
    delays = []
    for mode in MODES[1:]:
        for worker in map(str, range(args.workers)):
            # a worker that made no update in a run (a short one) is missing from it
            made = [r["summary"]["delays"].get(worker) for r in runs[mode]]
            figures = [f for f in made if f]

            def mean(key, digits):
                return f"{statistics.fmean(f[key] for f in figures):.{digits}f}" \
                    if figures else "-"

            slowed = " (slowed)" if worker == str(args.workers - 1) else ""
            delays.append({"mode": mode, "worker": worker + slowed,
                           "updates": "{:.0f}".format(statistics.fmean(
                               f["updates"] if f else 0 for f in made)),
                           "mean delay": mean("mean", 2), "median": mean("median", 1),
                           "p95": mean("p95", 1),
                           "max": str(max(f["max"] for f in figures)) if figures else "-"})
    return rows, delays


def paired(runs, args):
    """Per-seed differences (a seed's runs share the held-out split, whose difficulty
    varies more between seeds than the modes do): DC-ASGD's and DDC-ASGD's accuracy
    minus ASGD's at equal updates, and in how many seeds DDC-ASGD reaches sync's final
    accuracy before sync does (a run that never reaches it comes last)."""
    target = sync_target(runs)
    rows = []
    for mode in ("dc-asgd", "ddc-asgd"):
        row = {"difference": f"{mode} − async"}
        for n in checkpoints(args):
            gaps = [accuracy_at(r["evaluations"], "update", n) -
                    accuracy_at(a["evaluations"], "update", n)
                    for r, a in zip(runs[mode], runs["async"])]
            row[f"at {n} updates"] = (f"{statistics.fmean(gaps):+.4f} ± "
                                      f"{statistics.pstdev(gaps):.4f} "
                                      f"({sum(g >= 0 for g in gaps)} of {len(gaps)} ≥ 0)")
        rows.append(row)
    times = [[float("inf") if t is None else t
              for t in (time_to_reach(r["evaluations"], target) for r in runs[mode])]
             for mode in ("ddc-asgd", "sync")]
    first = sum(d < s for d, s in zip(*times))
    ties = sum(d == s for d, s in zip(*times))
    return rows, (f"DDC-ASGD reaches sync's {target:.3f} before sync in {first} of "
                  f"{len(times[0])} seeds" + (f" ({ties} ties)" if ties else ""))


def plot(runs, path, data, workers):
    """Held-out accuracy against wall time and against updates, mean over seeds with
    the range of the seeds shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode in MODES:
        for axis, key in zip(axes, ("wall_s", "update")):
            end = min(r["evaluations"][-1][key] for r in runs[mode])
            grid = np.linspace(0, end, 60)
            curves = np.array([[accuracy_at(r["evaluations"], key, g) for g in grid]
                               for r in runs[mode]])
            axis.plot(grid, curves.mean(0), label=mode)
            axis.fill_between(grid, curves.min(0), curves.max(0), alpha=0.2)
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel(f"updates (sync: one per {workers} worker batches)")
    for axis in axes:
        axis.set_ylabel("held-out accuracy")
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    figure.suptitle(f"{data.capitalize()} data, {workers} workers (one slowed), mean over "
                    "seeds, range shaded")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("digits", "generated"), default="digits")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600, help="asynchronous updates")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512, help="units of each of the "
                        "two hidden layers (a step must compute long enough to overlap)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--lambda0", type=float, default=2.0,
                        help="DC-ASGD's and DDC-ASGD's compensation strength")
    parser.add_argument("--workers", type=int, default=3,
                        help="worker tasks; the last is slowed (more workers, longer delays)")
    parser.add_argument("--slow-share", type=float, default=1 / 3,
                        help="share of the time the slowed worker runs")
    parser.add_argument("--ps", type=int, default=1, help="parameter-server tasks (with "
                        "two or more, the 1 MB hidden weight is cut into a piece on each)")
    parser.add_argument("--updates-per-call", type=int, default=4,
                        help="asynchronous updates a worker makes per scheduled call")
    parser.add_argument("--plot", default="async_training.png")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--save", help="write every run's evaluations and summary here "
                        "(JSON)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tfpart-async-") as tmp:
        work = Path(tmp)
        data = data_set(args.data, work / f"{args.data}.npz")
        model = export_classifier_step(work / "model", learning_rate=args.lr,
                                       momentum=args.momentum, hidden=args.hidden, depth=2)
        runs = {mode: [] for mode in MODES}
        for seed in range(args.seeds):  # modes alternate, so drift hits them alike
            for mode in MODES:
                runs[mode].append(one_run(work, model, data, mode, seed, args))
                last = runs[mode][-1]
                console.print(f"seed {seed} {mode}: accuracy "
                              f"{last['evaluations'][-1]['accuracy']:.3f} in "
                              f"{last['summary']['wall_s']:.1f} s")
    if args.save:
        Path(args.save).write_text(json.dumps(runs))
    rows, delays = tables(runs, args)
    differences, first = paired(runs, args)
    plot(runs, args.plot, args.data, args.workers)
    title = (f"{args.data.capitalize()} data on {args.workers} workers + {args.ps} ps, "
             f"worker {args.workers - 1} runs {args.slow_share:.2f} of the time; "
             f"{args.seeds} seeds, batch {args.batch_size}, lr {args.lr}, momentum "
             f"{args.momentum}, λ0 {args.lambda0}, "
             f"{args.updates_per_call} updates per call")
    for caption, table_rows in ((title, rows), ("Delays per worker (mean over seeds)", delays),
                                ("Paired over seeds: accuracy difference, mean ± "
                                 "standard deviation", differences)):
        show_rows(console, caption, table_rows, args.markdown)
    console.print(first)
    console.print(f"Plot: {args.plot}")


if __name__ == "__main__":
    main()
