"""``tfpart train``: run a training step for N updates on a cluster, from a data file.

Modes:

- ``sync``: the model's ``train_step`` compiled data-parallel over the cluster's
  ``worker`` tasks (one replica per worker, batch shares by speed), run step after step
  as one synchronous update of the global batch (``batch_size`` per worker);
- ``async``, ``dc-asgd``, ``ddc-asgd``: asynchronous updates on TensorFlow's
  parameter-server runtime (:mod:`tfpart.async_training`,
  :mod:`tfpart.delay_compensation`), ``batch_size`` per update. The client schedules
  ``updates_per_call`` updates per function call (each on freshly read weights), since
  a call costs the client and the servers a few milliseconds; the results of one call
  arrive together, so their rows share a wall time.

The data file is an ``.npz`` holding the training step's inputs by name (``x`` and
``y``); a seeded fraction is held out for evaluation. Every ``eval_every`` updates the
weights are evaluated on it (loss, and accuracy when the labels are classes) and saved
as a checkpoint, so a run that ends early leaves one that loads. Wall seconds count
training only: from the first update, after a warm-up that builds the function on the
workers and changes nothing; ``sync`` evaluates between its steps with its clock
stopped, the asynchronous modes from a thread while the workers go on. The output folder
gets:

- ``updates.csv``: one row per update (update, worker, loss, delay, wall seconds);
- ``evaluations.csv``: one row per evaluation (update, wall seconds, loss, accuracy);
- ``train.json``: options, final figures, and the delays per worker;
- ``plan.json``: where the variables live (the compiled plan for ``sync``, whose
  compiled model is ``compiled/``; for the asynchronous modes, the parameter server
  of each weight or piece of one, and ``context.pieces`` the pieces' rows);
- ``checkpoint/``: the weights, by the ``weights`` signature's names
  (:func:`trained_weights`).

Example (not run here: it needs running ``tfpart worker`` tasks)::

    result = train("model/", "cluster.json", "digits.npz", "run/",
                   TrainOptions(mode="ddc-asgd", steps=300))
    result.evaluations[-1]["accuracy"]
"""
from __future__ import annotations

import csv
import dataclasses
import json
import re
import shutil
import statistics
import threading
import time
from collections import deque
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from partitioner.ps_shards import MIN_SHARD_BYTES
from rewriters.tf_import import tensorflow
from tfpart.cluster import load_cluster
from tfpart.delay_compensation import ASYNC_MODES, Hyper
from tfpart.errors import ModelError, OutputError, TfpartError

MODES = ("sync", *ASYNC_MODES)
SIGNATURES = ("gradients", "predict", "weights")
WEIGHT_OR_STATE = re.compile(r"^[ws]\d{3}/")  # checkpoint keys of w000…, s000…


@dataclass(frozen=True)
class TrainOptions:
    mode: str = "dc-asgd"
    steps: int = 200  # updates
    batch_size: int = 32  # samples per update and worker (sync: per worker)
    learning_rate: float = 0.05
    momentum: float = 0.0
    lambda0: float = 2.0
    ms_decay: float = 0.95
    epsilon: float = 1e-7
    eval_every: int = 25
    eval_fraction: float = 0.2
    seed: int = 0
    min_shard_bytes: int = MIN_SHARD_BYTES
    updates_per_call: int = 4  # async modes: updates one scheduled function makes

    def hyper(self):
        return Hyper(self.learning_rate, self.momentum, self.lambda0, self.ms_decay,
                     self.epsilon)


@dataclass
class TrainResult:
    out: Path
    options: TrainOptions
    updates: list = field(default_factory=list)  # dicts: update, worker, loss, delay, wall_s
    evaluations: list = field(default_factory=list)  # dicts: update, wall_s, loss, accuracy
    summary: dict = field(default_factory=dict)


def load_data(path, signature, fraction, seed):
    """``((x, y) training, (x, y) held out)`` from an ``.npz`` with the signature's
    inputs; one-line errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise TfpartError(path, "no such data file")
    try:
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError) as exc:
        raise TfpartError(path, f"not a readable .npz file ({exc})") from None
    specs = {name: spec for name, spec in signature.structured_input_signature[1].items()
             if name in ("x", "y")}
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise TfpartError(path, f"has no array {missing[0]!r} (the training step's inputs "
                          f"are {', '.join(sorted(specs))})")
    columns = []
    for name in ("x", "y"):
        spec, value = specs[name], arrays[name]
        if value.shape[1:] != tuple(spec.shape[1:]) or not len(value):
            raise TfpartError(path, f"array {name!r} has shape {value.shape}; the step "
                              f"takes {spec.shape.as_list()} (None: any batch)")
        columns.append(value.astype(spec.dtype.as_numpy_dtype))
    if len(columns[0]) != len(columns[1]):
        raise TfpartError(path, f"x has {len(columns[0])} samples but y {len(columns[1])}")
    training, held = held_out_split(columns, fraction, seed)
    if not len(training[0]):
        raise TfpartError(path, f"{len(columns[0])} samples leave none to train on")
    return training, held


def held_out_split(columns, fraction, seed):
    """``(training, held out)``: each a tuple of ``columns`` (arrays of one length)
    cut at the same samples, a seeded ``fraction`` of them (at least one) held out.

    >>> training, held = held_out_split((np.arange(10), np.arange(10) * 2), 0.2, seed=0)
    >>> [len(c) for c in training], [len(c) for c in held], bool((held[1] == 2 * held[0]).all())
    ([8, 8], [2, 2], True)
    """
    order = np.random.default_rng(seed).permutation(len(columns[0]))
    held = max(1, int(round(fraction * len(order))))
    shuffled = [c[order] for c in columns]
    return tuple(c[held:] for c in shuffled), tuple(c[:held] for c in shuffled)


def evaluate(model, named, held):
    """Loss and accuracy (class labels or one-hot) on ``held`` of the weights and
    states ``named`` (by their signature names)."""
    x, y = held
    loss = float(model.signatures["gradients"](x=x, y=y, **named)["loss"])
    output = model.signatures["predict"](x=x, **named)["output"].numpy()
    labels = y if y.ndim == 1 else y.argmax(-1) if y.shape[-1] > 1 else None
    accuracy = None if labels is None or output.ndim != 2 else \
        float(np.mean(output.argmax(-1) == labels.astype(np.int64)))
    return loss, accuracy


def trained_weights(out):
    """The weights in ``out``'s latest checkpoint, by name (``w000``, …), and the
    non-trainable states (``s000``, …) of a model that has them."""
    tf = tensorflow()
    prefix = tf.train.latest_checkpoint(str(Path(out) / "checkpoint"))
    if prefix is None:
        raise TfpartError(out, "has no checkpoint")
    reader = tf.train.load_checkpoint(prefix)
    return {key.split("/")[0]: reader.get_tensor(key)
            for key in reader.get_variable_to_shape_map()
            if key.endswith("/.ATTRIBUTES/VARIABLE_VALUE") and WEIGHT_OR_STATE.match(key)}


def _load_model(model_dir, mode):
    tf = tensorflow()
    if not (Path(model_dir) / "saved_model.pb").is_file():
        raise ModelError(model_dir, "is not a SavedModel (saved_model.pb is missing)")
    try:
        model = tf.saved_model.load(str(model_dir))
    except (ValueError, OSError, tf.errors.OpError) as exc:
        raise ModelError(model_dir, f"cannot be loaded: {str(exc).splitlines()[0]}") \
            from None
    needed = SIGNATURES + (("train_step",) if mode == "sync" else ())
    missing = [name for name in needed if name not in model.signatures]
    if missing:
        raise ModelError(model_dir, f"has no {missing[0]!r} signature; export it with "
                         "tfpart.export_train_step")
    return model


class _SyncRun:
    """The data-parallel compile of ``train_step``, one step per global batch."""

    def __init__(self, model_dir, cluster, out, train_data, options, stack):
        from tfpart.compile import compile_model
        from tfpart.runtime import load, runnable
        from tfpart.training import weight_variable_ops

        workers = len(cluster.tf_cluster.get("worker", ()))
        if not workers:
            raise TfpartError(cluster.source, "has no 'worker' job in its 'cluster' block")
        self.batch = options.batch_size * workers
        result = compile_model(model_dir, cluster.source, out / "compiled",
                               batch_size=self.batch, signature="train_step",
                               algorithm="data_parallel", options={"replicas": workers})
        shutil.copy(out / "compiled" / "plan.json", out / "plan.json")
        self.plan = result.plan
        _, _, directory, _ = stack.enter_context(runnable(out / "compiled", cluster, True))
        compiled = load(directory)
        self.model = tensorflow().saved_model.load(str(model_dir))  # after connecting
        self.step = compiled.signatures["train_step"]
        self.variables = {
            f"{prefix}{i:03d}": compiled.variables_by_op[name]
            for prefix, signature in (("w", "weights"), ("s", "states"))
            if signature in self.model.signatures
            for i, name in enumerate(weight_variable_ops(model_dir, signature))}
        self.data, self.options = train_data, options
        self._warm_up(compiled)

    def _warm_up(self, compiled):
        """One step on the first batch, its changes undone (every variable of the
        compiled model, optimizer state and replicas' copies included): the first
        call builds the step's parts on the workers (about 0.4 s for the digits
        benchmark's), a cost paid once, like the compile."""
        tf = tensorflow()
        everything = [v for v in tf.nest.flatten(
            [getattr(compiled, name, {}) for name in ("variables_by_op", "replica_variables",
                                                       "collective_tokens")])
            if isinstance(v, tf.Variable)]
        before = [v.numpy() for v in everything]
        x, y = self.data
        self.step(x=x[:self.batch], y=y[:self.batch])
        for variable, value in zip(everything, before):
            variable.assign(value)

    def results(self):
        from tfpart.async_training import sample_orders

        x, y = self.data
        steps, batch = self.options.steps, self.batch
        order = sample_orders(len(x), 1, self.options.seed, -(-steps * batch // len(x)))[0]
        for start in range(0, steps * batch, batch):
            take = order[start:start + batch]
            yield float(self.step(x=x[take], y=y[take])["loss"]), -1, 0

    def weights(self):
        return {name: v.numpy() for name, v in self.variables.items()}

    def checkpoint(self):
        return tensorflow().train.Checkpoint(**self.variables)


class _AsyncRun:
    def __init__(self, model_dir, initial, cluster, out, train_data, options):
        from tfpart.async_training import AsyncTrainer
        from tfpart.plan import Plan

        self.trainer = AsyncTrainer(cluster, model_dir, *initial, train_data, options.mode,
                                    options.hyper(), options.batch_size, options.seed,
                                    options.min_shard_bytes, options.steps)
        self.model = self.trainer.model
        self.per_call = options.updates_per_call
        whole, rest = divmod(options.steps, self.per_call)
        self.calls = [self.per_call] * whole + [rest] * (rest > 0)
        for count in set(self.calls):  # before the clock starts, as sync's compile
            self.trainer.trace(count)
            self.trainer.warm_up(count)
        placement = self.trainer.placement
        self.plan = Plan(assignment=piece_devices(placement), algorithm="ps_shards",
                         options=dataclasses.asdict(options),
                         context={"mode": options.mode, "workers": self.trainer.workers,
                                  "pieces": {name: [shard.rows for shard in shards]
                                             for name, shards in placement.items()
                                             if len(shards) > 1}})
        self.plan.save(out / "plan.json")

    def results(self):
        """Results in the order scheduled, keeping calls queued (so a long run neither
        waits to queue every call first nor holds every result). The queue is long
        enough that while the oldest result waits on a slow worker, the others do not
        run out of calls."""
        tf = tensorflow()
        calls = self.calls
        queued = min(len(calls), -(-32 // self.per_call) * self.trainer.workers)
        pending = deque((count, self.trainer.schedule(count)) for count in calls[:queued])
        while pending:
            count, value = pending.popleft()
            if queued < len(calls):
                pending.append((calls[queued], self.trainer.schedule(calls[queued])))
                queued += 1
            try:
                losses, worker, delays = value.fetch()
            except tf.errors.UnavailableError:
                # The updates were applied, but their results stayed on a worker lost
                # since (the coordinator reruns a call that had not finished elsewhere).
                yield from [(float("nan"), None, None)] * count
                continue
            for loss, delay in zip(losses, delays):
                yield float(loss), int(worker), int(delay)
        self.trainer.join()

    def weights(self):
        return self.trainer.weights()

    def applied(self):
        """Updates the servers have applied (some beyond the results fetched)."""
        return self.trainer.updates()

    def checkpoint(self):
        return self.trainer.checkpoint()


def train(model_dir, cluster_file, data_file, out, options=TrainOptions(), *, force=False,
          progress=None):
    """Train ``model_dir``'s weights on ``cluster_file``'s tasks; see the module doc.

    ``progress(done, total, text)`` is called after every update, when given.
    """

    from tfpart.servers import cluster_errors

    tf = tensorflow()
    if options.mode not in MODES:
        raise TfpartError("", f"unknown mode {options.mode!r}; one of {', '.join(MODES)}")
    if min(options.steps, options.batch_size, options.eval_every,
           options.updates_per_call) < 1:
        raise TfpartError("", "steps, batch size, eval interval and updates per call must "
                          "be at least 1")
    if options.min_shard_bytes < 0:
        raise TfpartError("", f"--min-shard-bytes must be at least 0, not "
                          f"{options.min_shard_bytes}")
    if not 0 < options.eval_fraction < 1:
        raise TfpartError("", f"--eval-fraction must be between 0 and 1, not "
                          f"{options.eval_fraction}")
    cluster = load_cluster(cluster_file)
    model = _load_model(model_dir, options.mode)  # checked here; loaded again once connected
    train_data, held = load_data(data_file, model.signatures["gradients"],
                                 options.eval_fraction, options.seed)
    if options.mode != "sync":
        from tfpart.async_training import ps_devices

        ps_devices(cluster)
        initial = [{k: v.numpy() for k, v in sorted(model.signatures[name]().items())}
                   if name in model.signatures else {} for name in ("weights", "states")]
    out = Path(out)
    if out.exists():
        if not force:
            raise OutputError(out, "already exists (use --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    result = TrainResult(out=out, options=options)
    with ExitStack() as stack, cluster_errors(cluster):
        run = _SyncRun(model_dir, cluster, out, train_data, options, stack) \
            if options.mode == "sync" else \
            _AsyncRun(model_dir, initial, cluster, out, train_data, options)
        manager = tf.train.CheckpointManager(run.checkpoint(), str(out / "checkpoint"),
                                             max_to_keep=1)
        clock = Stopwatch()

        def evaluation(applied):
            if result.evaluations and result.evaluations[-1]["update"] == applied:
                return  # already evaluated at this count
            wall_s = clock()
            loss, accuracy = evaluate(run.model, run.weights(), held)
            result.evaluations.append({"update": applied, "wall_s": wall_s,
                                       "loss": loss, "accuracy": accuracy})
            manager.save(checkpoint_number=applied)
            _write_csv(out / "evaluations.csv", result.evaluations)

        with clock.paused():
            evaluation(0)
        synchronous = options.mode == "sync"
        with nullcontext() if synchronous else evaluated_alongside(
                run.applied, evaluation, options.eval_every):
            for done, (loss, worker, delay) in enumerate(run.results(), 1):
                result.updates.append({"update": done, "worker": worker, "loss": loss,
                                       "delay": delay, "wall_s": clock()})
                if synchronous and (done % options.eval_every == 0 or done == options.steps):
                    with clock.paused():  # sync's evaluations hold up its training
                        evaluation(done)
                if progress:
                    accuracy = result.evaluations[-1]["accuracy"]
                    progress(done, options.steps, f"loss {loss:.4f}, held-out accuracy " + (
                        "-" if accuracy is None else f"{accuracy:.3f}"))
        if not synchronous:
            evaluation(run.applied())
    _write_csv(out / "updates.csv", result.updates)
    result.summary = _summary(result, run.plan)
    (out / "train.json").write_text(json.dumps(result.summary, indent=1))
    return result


class Stopwatch:
    """Seconds since it was made, less the time spent in its :meth:`paused` blocks.

    >>> clock = Stopwatch()
    >>> with clock.paused():
    ...     time.sleep(0.05)
    >>> clock() < 0.05
    True
    """

    def __init__(self):
        self.start, self.excluded = time.perf_counter(), 0.0

    def __call__(self):
        return time.perf_counter() - self.start - self.excluded

    @contextmanager
    def paused(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - began


@contextmanager
def evaluated_alongside(applied, evaluation, every, poll_s=0.02):
    """While the block runs, call ``evaluation(count)`` from a thread each time
    ``applied()`` (the servers' update count) reaches the next multiple of ``every``.

    Asynchronous results come back in the order their calls were scheduled, so a slow
    worker's call holds back the results behind it while the servers go on updating:
    evaluating as results arrive would skip whole stretches of updates. An error in
    the thread is raised when the block ends.

    >>> import itertools
    >>> counter, seen = itertools.count(0, 7), []
    >>> with evaluated_alongside(lambda: next(counter), seen.append, 10, poll_s=0.001):
    ...     while len(seen) < 3:
    ...         time.sleep(0.01)
    >>> [count >= bound and count - bound < 7 for count, bound in zip(seen, (10, 20, 30))]
    [True, True, True]
    """
    stop, failures = threading.Event(), []

    def watch():
        due = every
        try:
            while not stop.wait(poll_s):
                count = applied()
                if count >= due:
                    evaluation(count)
                    due = (count // every + 1) * every
        except Exception as error:  # raised again in the caller's thread
            failures.append(error)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if failures:
        raise failures[0]


def piece_devices(placement):
    """plan.json's assignment for the servers' variables: a whole weight by its name, a
    piece of one as TensorFlow names a ``ShardedVariable``'s (``w001/part_0``).

    >>> from partitioner.ps_shards import Shard
    >>> piece_devices({"w000": [Shard("ps0", 3), Shard("ps1", 2)], "w001": [Shard("ps1", None)]})
    {'w000/part_0': 'ps0', 'w000/part_1': 'ps1', 'w001': 'ps1'}
    """
    return {name if len(shards) == 1 else f"{name}/part_{k}": shard.server
            for name, shards in placement.items() for k, shard in enumerate(shards)}


def delays_by_worker(updates):
    """Per worker: updates, and the mean, median, 95th percentile and largest delay.

    >>> delays_by_worker([{"worker": 0, "delay": 0}, {"worker": 0, "delay": 2},
    ...                   {"worker": 1, "delay": None}])
    {'0': {'updates': 2, 'mean': 1.0, 'median': 1.0, 'p95': 1.9, 'max': 2}}
    """
    by_worker = {}
    for row in updates:
        if row["delay"] is not None:  # None: the results were lost with their worker
            by_worker.setdefault(row["worker"], []).append(row["delay"])
    return {str(worker): {"updates": len(values), "mean": statistics.fmean(values),
                          "median": float(np.median(values)),
                          "p95": float(np.percentile(values, 95)), "max": max(values)}
            for worker, values in sorted(by_worker.items())}


def _summary(result, plan):
    last = result.evaluations[-1]
    return {"options": dataclasses.asdict(result.options), "updates": len(result.updates),
            "wall_s": result.updates[-1]["wall_s"], "final_loss": last["loss"],
            "final_accuracy": last["accuracy"],
            "delays": delays_by_worker(result.updates),
            "variables": {name: device for name, device in plan.assignment.items()
                          if result.options.mode != "sync"}}


def _write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
