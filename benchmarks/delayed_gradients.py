"""Delay compensation with the delays under control: asynchronous SGD replayed in one
process on a prescribed schedule of delays, so that ASGD, DC-ASGD and DDC-ASGD see the
same batches and the same delays and differ only in their update rule.

    python -m benchmarks.delayed_gradients [--workers 1,3,8,16] [--seeds 10]
                                           [--steps 600] [--lambda0 2] [--markdown]

Why: on the real parameter-server runtime (:mod:`benchmarks.async_training`) two runs
of one seed differ in their delays as well as in their rule, because the operating
system schedules the workers differently each time; that noise is as large as the
differences between the modes. Here the workers are simulated: worker ``k`` takes a
gradient ``duration`` after reading the weights (the last worker three times slower,
every duration jittered by a seeded log-normal factor), and the update's delay ``tau``
is the number of updates applied between its read and its own. With one worker every
delay is zero: sequential SGD, the reference compensation tries to approach.

The model, data and hyper-parameters are the real benchmark's: a 64-512-512-10
perceptron (ReLU, softmax cross-entropy, Glorot-uniform weights), the generated data
set with a seeded fifth held out, batches of 128, SGD at 0.05 with momentum 0.9. The
update is :func:`tfpart.trainer.delay_compensation.update`, the rule the parameter servers run.
The gradients are computed in numpy (checked against TensorFlow's in
``tests/trainer/test_delayed_gradients.py``), which also gives the empirical Fisher diagonal
(the mean of the per-sample squared gradients) that the compensation's ``g ⊙ g``
stands in for.

Two tables:

- accuracy on the held-out fifth at equal updates per number of workers and mode, and
  the paired difference from ASGD (same seed: same batches, same delays);
- how much of the change of a stale gradient ``g(w) − g(w_bak)`` (measured, on the same
  batch, along the ASGD run) each diagonal correction ``c ⊙ (w − w_bak)`` predicts:
  the remaining error relative to leaving the gradient stale, for DC-ASGD's
  ``λ ⊙ g ⊙ g``, for the best single multiple of ``g ⊙ g``, and for the empirical
  Fisher diagonal as it is and at its best multiple. Below 1 a correction brings the
  stale gradient closer to the current one; above 1 it moves it further away.
"""
from __future__ import annotations

import argparse
import heapq
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from rich.console import Console

from benchmarks.async_training import data_set, spread
from benchmarks.markdown import show_rows
from tfpart.trainer.delay_compensation import (ASYNC_MODES, Hyper, compensation_strength,
                                               running_freshness, update)
from tfpart.trainer.loop import TrainOptions, held_out_split

console = Console(highlight=False)
SLOWER = 3.0  # the last worker's gradient takes this many times longer
JITTER = 0.2  # standard deviation of the log of each gradient's duration


def glorot_weights(rng, sizes):
    """A perceptron's weights and biases, ``[W1, b1, W2, b2, ...]``, as Keras
    initialises them (Glorot-uniform weights, zero biases).

    >>> [w.shape for w in glorot_weights(np.random.default_rng(0), [4, 3, 2])]
    [(4, 3), (3,), (3, 2), (2,)]
    """
    weights = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        weights += [rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32),
                    np.zeros(fan_out, np.float32)]
    return weights


def forward(weights, x):
    """The perceptron's layer inputs (``x`` and each ReLU hidden layer's output) and
    its logits (the linear last layer's output)."""
    inputs = [x]
    for kernel, bias in zip(weights[:-2:2], weights[1:-2:2]):
        inputs.append(np.maximum(inputs[-1] @ kernel + bias, 0.0))
    return inputs, inputs[-1] @ weights[-2] + weights[-1]


def gradient(weights, x, y, fisher=False):
    """The gradient of the mean softmax cross-entropy over the batch ``(x, y)`` and, if
    ``fisher``, the empirical Fisher diagonal: the mean over the samples of each
    sample's squared gradient.

    >>> rng = np.random.default_rng(0)
    >>> weights = glorot_weights(rng, [4, 3, 2])
    >>> g, f = gradient(weights, rng.normal(size=(5, 4)), np.array([0, 1, 1, 0, 1]), True)
    >>> [a.shape for a in g] == [a.shape for a in f] == [w.shape for w in weights]
    True
    """
    inputs, z = forward(weights, x)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    delta = p  # each sample's gradient with respect to its logits
    grads, squares = [], []
    for index in range(len(inputs) - 1, -1, -1):
        a = inputs[index]
        grads[:0] = [a.T @ delta / len(y), delta.mean(0)]
        if fisher:
            squares[:0] = [(a * a).T @ (delta * delta) / len(y), (delta * delta).mean(0)]
        if index:
            delta = (delta @ weights[2 * index].T) * (a > 0)
    return grads, (squares if fisher else None)


def accuracy(weights, x, y):
    return float((forward(weights, x)[1].argmax(1) == y).mean())


def delay_schedule(workers, updates, rng):
    """Who makes each update and which earlier update's weights it read: a list of
    ``(worker, read)`` in the order the updates are applied, ``read`` counting the
    updates applied before the worker read the weights (its delay is then
    ``position - read``).

    >>> delay_schedule(1, 3, np.random.default_rng(0))
    [(0, 0), (0, 1), (0, 2)]
    """
    def duration(worker):
        slower = SLOWER if workers > 1 and worker == workers - 1 else 1.0
        return slower * float(np.exp(rng.normal(0.0, JITTER)))

    pending = [(duration(k), k, 0) for k in range(workers)]  # (finish time, worker, read)
    heapq.heapify(pending)
    schedule = []
    while len(schedule) < updates:
        finish, worker, read = heapq.heappop(pending)
        schedule.append((worker, read))
        heapq.heappush(pending, (finish + duration(worker), worker, len(schedule)))
    return schedule


def batches(rng, samples, size, count):
    """``count`` index arrays of ``size``, each epoch a fresh permutation."""
    order = np.concatenate([rng.permutation(samples)
                            for _ in range(count * size // samples + 1)])
    return [order[i * size:(i + 1) * size] for i in range(count)]


class Explained:
    """Sums for the share of the stale gradients' change each correction predicts."""

    NAMES = ("dc-asgd λ·g⊙g", "best multiple of g⊙g", "Fisher diagonal",
             "best multiple of Fisher")

    def __init__(self):
        self.change = 0.0  # Σ |g(w) − g(w_bak)|²
        self.residual = {"dc-asgd λ·g⊙g": 0.0, "Fisher diagonal": 0.0}
        self.cross = {"g⊙g": 0.0, "Fisher": 0.0}  # Σ <change, term>
        self.square = {"g⊙g": 0.0, "Fisher": 0.0}  # Σ |term|²

    def add(self, change, terms):
        """``terms``: each correction's ``c ⊙ (w − w_bak)`` at unit strength, and
        DC-ASGD's own at its adaptive λ."""
        self.change += float(change @ change)
        for name, term in (("dc-asgd λ·g⊙g", terms["dc"]),
                           ("Fisher diagonal", terms["Fisher"])):
            miss = change - term
            self.residual[name] += float(miss @ miss)
        for name in ("g⊙g", "Fisher"):
            self.cross[name] += float(change @ terms[name])
            self.square[name] += float(terms[name] @ terms[name])

    def ratios(self):
        """Each correction's remaining error over the stale gradient's, as a norm ratio
        (a best multiple ``s`` leaves ``|change|² − s·<change, term>``)."""
        best = {name: self.change - self.cross[name] ** 2 / self.square[name]
                for name in self.cross if self.square[name]}
        errors = [self.residual["dc-asgd λ·g⊙g"], best.get("g⊙g", self.change),
                  self.residual["Fisher diagonal"], best.get("Fisher", self.change)]
        return dict(zip(self.NAMES, (np.sqrt(e / self.change) if self.change else 1.0
                                     for e in errors)))


def replay(mode, workers, seed, args, data, explain=False):
    """One simulated asynchronous run: held-out accuracy every ``args.every`` updates,
    the mean delay and, if ``explain``, the corrections' :meth:`Explained.ratios`."""
    (x, y), (held_x, held_y) = data
    rng = np.random.default_rng(seed)
    weights = glorot_weights(rng, [x.shape[1], args.hidden, args.hidden, int(y.max()) + 1])
    schedule = delay_schedule(workers, args.steps, rng)
    picks = batches(rng, len(x), args.batch_size, args.steps)
    hyper = Hyper(learning_rate=args.lr, momentum=args.momentum, lambda0=args.lambda0)
    velocity = [np.zeros_like(w) for w in weights]
    ms = [np.zeros_like(w) for w in weights]
    explained_ms = [np.zeros_like(w) for w in weights]
    mean_freshness = 0.0
    read_at = {0: weights}  # weights by the number of updates applied before them
    last_read = {read: position for position, (_, read) in enumerate(schedule)}
    explained = Explained()
    curve = [(0, accuracy(weights, held_x, held_y))]
    for position, ((_, read), batch) in enumerate(zip(schedule, picks)):
        stale = read_at[read]
        tau = position - read
        g, fisher = gradient(stale, x[batch], y[batch], fisher=explain)
        if explain:
            now = gradient(weights, x[batch], y[batch])[0] if tau else g
            explained.add(*correction_terms(g, now, fisher, weights, stale, explained_ms,
                                            hyper, position + 1))
        new = [update(mode, w, gi, wb, m, v, tau, mean_freshness, hyper, np.sqrt,
                      step=position + 1)
               for w, gi, wb, m, v in zip(weights, g, stale, ms, velocity)]
        weights = [n.w for n in new]
        ms = [n.ms for n in new]
        velocity = [n.velocity for n in new]
        mean_freshness = running_freshness(tau, mean_freshness, hyper)
        read_at[position + 1] = weights
        read_at = {r: w for r, w in read_at.items() if last_read.get(r, r) > position}
        if (position + 1) % args.every == 0:
            curve.append((position + 1, accuracy(weights, held_x, held_y)))
    delays = [position - read for position, (_, read) in enumerate(schedule)]
    return {"mode": mode, "workers": workers, "seed": seed, "curve": curve,
            "mean delay": statistics.fmean(delays),
            "explained": explained.ratios() if explain else None}


def correction_terms(g, now, fisher, weights, stale, ms, hyper, step):
    """The change of one stale gradient and each correction's prediction of it, all
    flattened; ``ms`` (DC-ASGD's running mean square) is updated in place."""
    flat = np.concatenate
    unbias = 1.0 - hyper.ms_decay ** step
    dc, square, fisher_term = [], [], []
    for index, (gi, fi, w, wb) in enumerate(zip(g, fisher, weights, stale)):
        ms[index], lam = compensation_strength(ms[index], gi, hyper, np.sqrt, unbias)
        moved = (w - wb).ravel()
        dc.append((lam * gi * gi).ravel() * moved)
        square.append((gi * gi).ravel() * moved)
        fisher_term.append(fi.ravel() * moved)
    change = flat([n.ravel() for n in now]) - flat([gi.ravel() for gi in g])
    return change, {"dc": flat(dc), "g⊙g": flat(square), "Fisher": flat(fisher_term)}


def at(curve, update_count):
    """Accuracy at ``update_count`` updates, interpolated along ``curve``."""
    return float(np.interp(update_count, *zip(*curve)))


def one_blas_thread():
    """Keep each run to one BLAS thread: runs side by side whose BLAS threads outnumber
    the cores spin against each other, many times slower."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def run_all(args):
    """Every mode for every number of workers and seed, ``args.jobs`` at a time; the
    first three seeds' ASGD runs also measure the corrections."""
    with tempfile.TemporaryDirectory(prefix="tfpart-delayed-") as tmp:
        loaded = np.load(data_set("generated", Path(tmp) / "generated.npz"))
        x, y = loaded["x"], loaded["y"].astype(np.int64)
    jobs = [(mode, workers, seed) for workers in args.workers for seed in range(args.seeds)
            for mode in (("async",) if workers == 1 else ASYNC_MODES)]
    with ProcessPoolExecutor(args.jobs, initializer=one_blas_thread) as pool:
        futures = [pool.submit(replay, mode, workers, seed, args,
                               held_out_split((x, y), TrainOptions.eval_fraction, seed),
                               explain=(mode == "async" and workers > 1 and seed < 3))
                   for mode, workers, seed in jobs]
        runs = []
        for job, future in zip(jobs, futures):
            runs.append(future.result())
            console.print(f"{job[1]} workers, {job[0]}, seed {job[2]}: accuracy "
                          f"{runs[-1]['curve'][-1][1]:.3f}", style="dim")
    return runs


def accuracy_rows(runs, args):
    """Accuracy at equal updates per number of workers and mode, and the seed-by-seed
    difference from ASGD (from sequential SGD for ASGD itself)."""
    checkpoints = [args.steps // 6, args.steps // 2, args.steps]
    by = {}
    for run in runs:
        by.setdefault((run["workers"], run["mode"]), {})[run["seed"]] = run
    sequential = by.get((1, "async"))
    rows = []
    for (workers, mode), seeds in by.items():
        delay = statistics.fmean(r["mean delay"] for r in seeds.values())
        row = {"workers": str(workers), "mode": "sequential SGD" if workers == 1 else mode,
               "mean delay": f"{delay:.2f}"}
        for n in checkpoints:
            row[f"accuracy at {n}"] = spread([at(r["curve"], n) for r in seeds.values()])
        base = by[(workers, "async")] if mode != "async" else sequential
        row["paired with"] = "-" if workers == 1 or base is None else (
            "ASGD" if mode != "async" else "sequential")
        for n in checkpoints:
            if row["paired with"] == "-":
                row[f"difference at {n}"] = "-"
                continue
            gaps = [at(r["curve"], n) - at(base[s]["curve"], n) for s, r in seeds.items()]
            row[f"difference at {n}"] = (
                f"{statistics.fmean(gaps):+.4f} ± {statistics.pstdev(gaps):.4f} "
                f"({sum(g >= 0 for g in gaps)}/{len(gaps)} ≥ 0)")
        rows.append(row)
    return rows


def explained_rows(runs):
    """The corrections' :meth:`Explained.ratios`, mean over the runs that measured them."""
    rows = []
    for workers in sorted({r["workers"] for r in runs if r["explained"]}):
        ratios = [r["explained"] for r in runs if r["workers"] == workers and r["explained"]]
        rows.append({"workers": str(workers), "runs": str(len(ratios)),
                     **{name: f"{statistics.fmean(r[name] for r in ratios):.3f}"
                        for name in Explained.NAMES}})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=lambda s: [int(n) for n in s.split(",")],
                        default=[1, 3, 8, 16], help="comma-separated worker counts")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=20, help="updates between evaluations")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--lambda0", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    runs = run_all(args)
    title = (f"Generated data, simulated delays; {args.seeds} seeds, batch "
             f"{args.batch_size}, lr {args.lr}, momentum {args.momentum}, λ0 {args.lambda0}")
    for caption, rows in ((title, accuracy_rows(runs, args)),
                          ("Error of each correction of the stale gradients along ASGD "
                           "(relative to leaving them stale; below 1 helps)",
                           explained_rows(runs))):
        if rows:
            show_rows(console, caption, rows, args.markdown)


if __name__ == "__main__":
    main()
