"""``tfpart train``: run a training step for N updates on a cluster, from a data file.

Modes:

- ``sync``: the model's ``train_step`` compiled data-parallel over the cluster's
  ``worker`` tasks (one replica per worker, batch shares by speed), run step after step
  as one synchronous update of the global batch (``batch_size`` per worker);
- ``async``, ``dc-asgd``, ``ddc-asgd``: asynchronous updates on TensorFlow's
  parameter-server runtime (:mod:`tfpart.trainer.asynchronous`,
  :mod:`tfpart.trainer.delay_compensation`), ``batch_size`` per update. The client schedules
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
  (:func:`trained_weights`), and under ``optimizer`` the rest of the training state
  (``sync``: every other variable of the compiled step, the optimizer's slots and
  iteration count among them; the asynchronous modes: the servers' velocities, mean
  squares and running mean freshness); the checkpoint's number is its update count;
- ``run.json``: what the run depends on (options, the data's and the model's SHA-256,
  the number of workers and servers) and the updates it was resumed at.

Output folder and resuming. ``out`` is tfpart's: it carries the marker of
:mod:`tfpart.core.output_folders`, and an existing folder without it (but an empty one) is
refused, as is an ``out`` that is, lies in or holds an input. Rerun on an existing
output, training resumes from its latest checkpoint (``restart=True`` empties it and
starts over) with the same options, refused in one line naming the first that differs;
``updates.csv`` and ``evaluations.csv`` go on from the checkpoint's update, and the
wall clock from its time. ``sync`` draws the batch of update ``k`` as a pure function
of the seed and ``k`` (:func:`sync_batches`) and restores every variable of the step,
so a resumed run ends with the weights of one never stopped. The asynchronous modes
restore the servers' state and count, each worker skipping the batches it would have
drawn by then (:class:`tfpart.trainer.asynchronous.AsyncTrainer`); the updates whose results
died with the client are rows with no loss, as a lost worker's are. A run that fails
before its first checkpoint after update 0 leaves no output (a folder it created is
removed).

Example (not run here: it needs running ``tfpart worker`` tasks)::

    result = train("model/", "cluster.json", "digits.npz", "run/",
                   TrainOptions(mode="ddc-asgd", steps=300))
    result.evaluations[-1]["accuracy"]
"""
from __future__ import annotations

import csv
import dataclasses
import fcntl
import hashlib
import io
import json
import math
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
from tfpart.core.cluster import load_cluster
from tfpart.trainer.delay_compensation import ASYNC_MODES, Hyper
from tfpart.core.errors import ModelError, OutputError, TfpartError, first_line
from tfpart.core.output_folders import MARKER, check_inputs_outside, create_output_folder, \
    empty_output_folder, is_tfpart_output, os_errors, write_file_atomically, write_marker

MODES = ("sync", *ASYNC_MODES)
SIGNATURES = ("gradients", "predict", "weights")
WEIGHT_OR_STATE = re.compile(r"^[ws]\d{3}/")  # checkpoint keys of w000…, s000…
RUN_FILE = "run.json"
UPDATE_FIELDS = ("update", "worker", "loss", "delay", "wall_s")
EVALUATION_FIELDS = ("update", "wall_s", "loss", "accuracy")
# options that change neither the batches nor the updates: free to differ on resuming
RESCHEDULING = ("eval_every", "updates_per_call")
FLAGS = {"mode": "--mode", "steps": "--steps", "batch_size": "--batch-size",
         "learning_rate": "--lr", "momentum": "--momentum", "lambda0": "--lambda0",
         "eval_fraction": "--eval-fraction", "seed": "--seed",
         "min_shard_bytes": "--min-shard-bytes"}


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
    resumed_at: list = field(default_factory=list)  # updates it was resumed at, in order
    resumed: int | None = None  # the update this call went on from (None: from the start)


def load_data(path, signature, fraction, seed):
    """``((x, y) training, (x, y) held out)`` from an ``.npz`` with the signature's
    inputs; one-line errors name the file."""
    from rewriters.given_inputs import read_npz

    path = Path(path)
    arrays = read_npz(path)
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
        raise ModelError(model_dir, f"cannot be loaded: {first_line(exc)}") \
            from None
    needed = SIGNATURES + (("train_step",) if mode == "sync" else ())
    missing = [name for name in needed if name not in model.signatures]
    if missing:
        raise ModelError(model_dir, f"has no {missing[0]!r} signature; export it with "
                         "tfpart.export_train_step")
    return model


class _SyncRun:
    """The data-parallel compile of ``train_step``, one step per global batch."""

    def __init__(self, model_dir, cluster, out, train_data, options, stack, op_libraries=()):
        from tfpart.compile import compile_model
        from tfpart.runtime import load, runnable
        from tfpart.training import weight_variable_ops

        workers = len(cluster.tf_cluster.get("worker", ()))
        if not workers:
            raise TfpartError(cluster.source, "has no 'worker' job in its 'cluster' block")
        self.batch = options.batch_size * workers
        # force: a resumed run compiles again over the compile it wrote before
        result = compile_model(model_dir, cluster.source, out / "compiled",
                               batch_size=self.batch, signature="train_step",
                               algorithm="data_parallel", options={"replicas": workers},
                               force=True, op_libraries=op_libraries)
        shutil.copy(out / "compiled" / "plan.json", out / "plan.json")
        self.plan = result.plan
        here = stack.enter_context(runnable(out / "compiled", cluster, watch=True))
        self.compiled = load(here.directory)
        self.model = tensorflow().saved_model.load(str(model_dir))  # after connecting
        self.step = self.compiled.signatures["train_step"]
        self.variables = {
            f"{prefix}{i:03d}": self.compiled.variables_by_op[name]
            for prefix, signature in (("w", "weights"), ("s", "states"))
            if signature in self.model.signatures
            for i, name in enumerate(weight_variable_ops(model_dir, signature))}
        self.data, self.options, self.start = train_data, options, 0

    def _everything(self):
        """Every variable of the compiled step, once, by a name: the model's own by op
        name (the optimizer's slots and iteration count among them), each replica's
        copies (``replica1/…``) and the collective-ordering tokens."""
        tf = tensorflow()
        found = dict(self.compiled.variables_by_op)
        for r, copies in enumerate(getattr(self.compiled, "replica_variables", ()), 1):
            found.update({f"replica{r}/{name}": v for name, v in copies.items()})
        found.update({f"token/{device}": v for device, v in
                      getattr(self.compiled, "collective_tokens", {}).items()})
        seen, once = set(), {}
        for name, variable in found.items():
            if isinstance(variable, tf.Variable) and id(variable) not in seen:
                seen.add(id(variable))
                once[name] = variable
        return once

    def prepare(self, start):
        """Go on from update ``start`` (the variables restored), after a warm-up: one
        step on the first batch, its changes undone (every variable of the compiled
        model, optimizer state and replicas' copies included). The first call builds
        the step's parts on the workers (about 0.4 s for the digits benchmark's), a
        cost paid once, like the compile."""
        self.start = start
        everything = list(self._everything().values())
        before = [v.numpy() for v in everything]
        x, y = self.data
        self.step(x=x[:self.batch], y=y[:self.batch])
        for variable, value in zip(everything, before):
            variable.assign(value)

    def results(self):
        x, y = self.data
        for take in sync_batches(len(x), self.batch, self.options.seed, self.start,
                                 self.options.steps):
            yield float(self.step(x=x[take], y=y[take])["loss"]), -1, 0

    def weights(self):
        return {name: v.numpy() for name, v in self.variables.items()}

    def saved(self):
        """What a checkpoint holds (as :class:`Snapshot` takes it): the weights and
        states by name, and every other variable of the step under ``optimizer``."""
        named = {id(v) for v in self.variables.values()}
        return ({name: [v] for name, v in self.variables.items()},
                {name: [v] for name, v in self._everything().items() if id(v) not in named})


class _AsyncRun:
    def __init__(self, model_dir, initial, cluster, out, train_data, options, start,
                 op_libraries=()):
        from tfpart.trainer.asynchronous import AsyncTrainer
        from tfpart.core.plan import Plan
        from tfpart.op_libraries import recorded

        self.trainer = AsyncTrainer(cluster, model_dir, *initial, train_data, options.mode,
                                    options.hyper(), options.batch_size, options.seed,
                                    options.min_shard_bytes, options.steps, start=start)
        self.model = self.trainer.model
        self.options = options
        placement = self.trainer.placement
        self.plan = Plan(assignment=piece_devices(placement), algorithm="ps_shards",
                         options=dataclasses.asdict(options),
                         context={"mode": options.mode, "workers": self.trainer.workers,
                                  "pieces": {name: [shard.rows for shard in shards]
                                             for name, shards in placement.items()
                                             if len(shards) > 1}})
        if op_libraries:
            self.plan.context["op_libraries"] = recorded(op_libraries)
        self.plan.save(out / "plan.json")

    def prepare(self, start):
        """Trace and warm up each call size before the clock starts, as sync's
        compile; the servers then count on from ``start`` (the state restored)."""
        self.per_call = self.options.updates_per_call
        whole, rest = divmod(self.options.steps - start, self.per_call)
        self.calls = [self.per_call] * whole + [rest] * (rest > 0)
        for count in set(self.calls):
            self.trainer.trace(count)
            self.trainer.warm_up(count)

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

    def saved(self):
        return self.trainer.saved()


class Snapshot:
    """The training state copied into variables of this process, and a checkpoint of
    those copies: ``named`` and ``optimizer`` (``{name: variables}``, the variables'
    values joined along their first axis saved under the name) as a run's
    :meth:`saved` gives them.

    Why copies: variables on several tasks are saved by a ``tf.function`` that
    TensorFlow traces, registers on every task of the cluster and removes again at
    each save, from the evaluating thread while the workers run; after a worker is
    lost every registration and removal also fails towards it. A checkpoint of this
    process's own variables is written here, with no function, and does not depend
    on how the variables are cut over the servers.
    """

    def __init__(self, named, optimizer):
        tf = tensorflow()
        self.sources = {**{("", k): v for k, v in named.items()},
                        **{("optimizer", k): v for k, v in optimizer.items()}}
        self.copies = {key: tf.Variable(_joined(variables), name=key[1].replace("/", "_"))
                       for key, variables in self.sources.items()}
        self.checkpoint = tf.train.Checkpoint(
            **{k: v for (group, k), v in self.copies.items() if not group},
            optimizer={k: v for (group, k), v in self.copies.items() if group})

    def take(self):
        """Copy the state now."""
        for key, variables in self.sources.items():
            self.copies[key].assign(_joined(variables))

    def restore(self, prefix):
        """Read the checkpoint ``prefix`` and write it into the run's variables."""
        self.checkpoint.restore(prefix).assert_existing_objects_matched()
        for key, variables in self.sources.items():
            value = self.copies[key].numpy()
            parts = [value] if len(variables) == 1 else \
                np.split(value, np.cumsum([v.shape[0] for v in variables])[:-1])
            for variable, part in zip(variables, parts):
                variable.assign(part)


def _joined(variables):
    return variables[0].numpy() if len(variables) == 1 else \
        np.concatenate([v.numpy() for v in variables])


def sync_batches(samples, batch, seed, first, last):
    """The sample indices of sync's updates ``first`` … ``last - 1`` (counting from 0):
    update ``k`` takes samples ``k * batch`` … ``(k + 1) * batch - 1`` of a stream of
    seeded permutations of the samples, one per epoch. A pure function of the seed and
    the update's number, so a resumed run draws the batches an uninterrupted one would.

    >>> [b.tolist() for b in sync_batches(5, 2, seed=0, first=0, last=4)]
    [[2, 4], [3, 0], [1, 4], [1, 2]]
    >>> [b.tolist() for b in sync_batches(5, 2, seed=0, first=2, last=4)]  # resumed at 2
    [[1, 4], [1, 2]]
    """
    from tfpart.trainer.asynchronous import sample_orders

    order = sample_orders(samples, 1, seed, -(-last * batch // samples))[0]
    for start in range(first * batch, last * batch, batch):
        yield order[start:start + batch]


def check_output(out, inputs):
    """Before anything is loaded: OutputError unless ``out`` may be ``tfpart train``'s
    output: absent, empty, or an output of ``tfpart train`` (its marker), and no input
    is it, lies in it or holds it.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "thesis").mkdir(); _ = (root / "thesis" / "notes.txt").write_text("x")
    >>> check_output(root / "thesis", [root / "model"])
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: ...: exists and was not written by tfpart train (it has no .tfpart-output): remove it yourself or choose another -o
    """
    check_inputs_outside(out, inputs)
    out = Path(out)
    if out.is_symlink():
        raise OutputError(out, "is a symbolic link; give the folder it points to, or "
                          "another -o")
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputError(out, "exists and is not a folder")
    if is_tfpart_output(out, "train") or not any(out.iterdir()):
        return
    if is_tfpart_output(out):
        raise OutputError(out, "is the output of another tfpart command, not of tfpart "
                          "train: choose another -o")
    raise OutputError(out, f"exists and was not written by tfpart train (it has no "
                      f"{MARKER}): remove it yourself or choose another -o")


def run_identity(options, data_file, model_dir, cluster):
    """What a run's updates depend on, for ``run.json``: the options (but
    :data:`RESCHEDULING`'s), the data's and the model's SHA-256, and the numbers of
    workers and servers."""
    jobs = cluster.tf_cluster or {}
    return {"options": {key: value for key, value in dataclasses.asdict(options).items()
                        if key not in RESCHEDULING},
            "data_sha256": _sha256([data_file]),
            "model_sha256": _sha256([Path(model_dir) / "saved_model.pb",
                                     Path(model_dir) / "variables" / "variables.index"]),
            "workers": len(jobs.get("worker", ())), "ps": len(jobs.get("ps", ()))}


def _sha256(paths):
    """SHA-256 of the files' bytes one after the other (a missing one counts empty).
    A SavedModel's ``variables.index`` holds a checksum of every variable's bytes."""
    digest = hashlib.sha256()
    for path in paths:
        if Path(path).is_file():
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()


def identity_difference(saved, now, data_file, model_dir):
    """How the run ``now`` differs from the checkpointed run ``saved`` (both
    :func:`run_identity`), in words; None if it does not.

    >>> saved = {"options": {"seed": 3, "mode": "sync"}, "data_sha256": "a"}
    >>> identity_difference(saved, {"options": {"seed": 4, "mode": "sync"},
    ...                             "data_sha256": "a"}, "d.npz", "m/")
    'its checkpointed run had --seed 3, not 4'
    >>> identity_difference(saved, {**saved, "data_sha256": "b"}, "d.npz", "m/")
    'd.npz has changed since its checkpointed run (another SHA-256)'
    """
    before, after = saved.get("options", {}), now["options"]
    for key in after:
        if key in before and before[key] != after[key]:
            return (f"its checkpointed run had {FLAGS.get(key, key)} {before[key]}, "
                    f"not {after[key]}")
    if saved.get("data_sha256") != now["data_sha256"]:
        return f"{data_file} has changed since its checkpointed run (another SHA-256)"
    if "model_sha256" in now and saved.get("model_sha256") != now["model_sha256"]:
        return f"the model {model_dir} has changed since its checkpointed run"
    for key, job in (("workers", "worker"), ("ps", "ps")):
        if key in now and saved.get(key) != now[key]:
            return f"its checkpointed run had {saved.get(key)} {job} tasks, not {now[key]}"
    return None


def checkpointed_update(out):
    """The update count of ``out``'s latest checkpoint (its number), or None; read
    from the state file ``tf.train.CheckpointManager`` writes (without TensorFlow).

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> (out / "checkpoint").mkdir()
    >>> _ = (out / "checkpoint" / "checkpoint").write_text('model_checkpoint_path: "ckpt-40"')
    >>> checkpointed_update(out) is None  # no ckpt-40.index: not written whole
    True
    >>> _ = (out / "checkpoint" / "ckpt-40.index").write_bytes(b"")
    >>> checkpointed_update(out)
    40
    """
    folder = Path(out) / "checkpoint"
    try:
        text = (folder / "checkpoint").read_text()
    except OSError:
        return None
    match = re.search(r'^model_checkpoint_path:\s*"(?:[^"]*/)?(ckpt-(\d+))"', text, re.M)
    if match is None or not (folder / f"{match.group(1)}.index").is_file():
        return None
    return int(match.group(2))


@contextmanager
def training_output(out, identity, restart, describe):
    """Context manager: take ``out`` (checked by :func:`check_output`) for this run;
    yields the update to resume at (None: from the start, the folder empty but for
    the marker and ``run.json``). A run that resumes from a checkpoint whose options
    differ is refused (``describe(saved)``: the difference in words, or None). If the
    block fails before a checkpoint beyond update 0 exists, what the run wrote is
    removed: the folder if the run created it. Another ``tfpart train`` on the same
    folder is refused while this one runs."""
    out = Path(out)
    created = marked = False
    if not out.exists():
        create_output_folder(out, "train")
        created = True
    elif not is_tfpart_output(out, "train"):  # an empty folder
        with os_errors(out):
            write_marker(out, "train")
        marked = True
    with _locked(out):
        start = None
        try:
            saved = _read_json(out / RUN_FILE)
            at = checkpointed_update(out) if saved else None
            if at is not None and not restart:
                difference = describe(saved)
                if difference:
                    raise OutputError(out, f"cannot resume: {difference}; give the same "
                                      "options, or --restart to start over")
                start = at
                if at < saved.get("options", {}).get("steps", math.inf):  # else: done
                    saved["resumed_at"] = [*saved.get("resumed_at", []), at]
                    write_file_atomically(out / RUN_FILE, json.dumps(saved, indent=1))
            else:
                empty_output_folder(out, "train")
                write_file_atomically(out / RUN_FILE, json.dumps(identity, indent=1))
            yield start
        except BaseException:
            if start is None and not checkpointed_update(out):
                if created:
                    shutil.rmtree(out, ignore_errors=True)
                else:
                    empty_output_folder(out, "train")
                    if marked:
                        (out / MARKER).unlink(missing_ok=True)
            raise


@contextmanager
def _locked(out):
    """Hold an exclusive lock on ``out``'s marker while the block runs (released by
    the kernel if the process dies)."""
    with os_errors(out, "lock"):
        handle = open(Path(out) / MARKER)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(out, "is being written by another tfpart train; wait for it "
                              "or choose another -o") from None
        yield
    finally:
        handle.close()


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_rows(path, fields):
    """The rows of a CSV that ``train`` wrote, with their types back (``""``: None);
    a row cut short (the process killed while writing it) is left out.

    >>> import tempfile
    >>> path = tempfile.mktemp(suffix=".csv")
    >>> _ = open(path, "w").write("update,worker,loss,delay,wall_s\\n1,0,0.5,,0.1\\n2,1,0.")
    >>> read_rows(path, UPDATE_FIELDS)
    [{'update': 1, 'worker': 0, 'loss': 0.5, 'delay': None, 'wall_s': 0.1}]
    """
    kinds = {"update": int, "worker": int, "delay": int}
    found = []
    try:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                try:
                    found.append({key: None if row[key] in ("", None)
                                  else kinds.get(key, float)(row[key]) for key in fields})
                except (KeyError, ValueError):
                    break
    except OSError:
        return []
    if found and any(found[-1][key] is None for key in ("update", "wall_s")):
        found.pop()
    return found


def continued_rows(updates, evaluations, start):
    """The rows of the run so far that a run resumed at update ``start`` keeps:
    ``start`` update rows (the updates whose results died with the client, if any,
    with no loss, worker or delay) and the evaluations up to ``start``; and the wall
    seconds to go on from.

    >>> rows = [{"update": k, "worker": 0, "loss": 1.0, "delay": 0, "wall_s": k / 10}
    ...         for k in (1, 2, 3)]
    >>> kept, evals, wall = continued_rows(rows, [{"update": 0, "wall_s": 0.0}], 4)
    >>> [r["update"] for r in kept], kept[-1]["worker"], wall
    ([1, 2, 3, 4], None, 0.3)

    An asynchronous run's checkpoint can be taken (its evaluation timed) before the
    client logged the row of its last update: the clock goes on from the later.

    >>> continued_rows(rows, [{"update": 3, "wall_s": 0.25}], 3)[2]
    0.3
    """
    kept = [row for row in updates if row["update"] <= start][:start]
    evaluations = [row for row in evaluations if row["update"] <= start]
    at = [row["wall_s"] for row in evaluations if row["update"] == start]
    wall = max([row["wall_s"] for row in kept[-1:]] +
               (at or [row["wall_s"] for row in evaluations[-1:]]), default=0.0)
    kept += [{"update": k, "worker": None, "loss": math.nan, "delay": None, "wall_s": wall}
             for k in range(len(kept) + 1, start + 1)]
    return kept, evaluations, wall


def _check_options(options):
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


def train(model_dir, cluster_file, data_file, out, options=TrainOptions(), *, restart=False,
          force=False, progress=None, op_libraries=()):
    """Train ``model_dir``'s weights on ``cluster_file``'s tasks; see the module doc.

    An existing output of ``tfpart train`` is resumed from its latest checkpoint, or
    emptied first with ``restart`` (``force`` is the same). ``progress(done, total,
    text)`` is called after every update, when given, and once at the start.
    ``op_libraries`` register the model's custom ops first (the workers' own are
    ``tfpart worker --op-library``); plan.json records them.
    """
    from tfpart.op_libraries import load_op_libraries
    from tfpart.servers import cluster_errors

    tf = tensorflow()
    _check_options(options)
    out = Path(out)
    check_output(out, [model_dir, data_file, cluster_file])
    cluster = load_cluster(cluster_file)
    load_op_libraries(op_libraries)
    model = _load_model(model_dir, options.mode)  # checked here; loaded again once connected
    train_data, held = load_data(data_file, model.signatures["gradients"],
                                 options.eval_fraction, options.seed)
    if options.mode != "sync":
        from tfpart.trainer.asynchronous import ps_devices

        ps_devices(cluster)
        initial = [{k: v.numpy() for k, v in sorted(model.signatures[name]().items())}
                   if name in model.signatures else {} for name in ("weights", "states")]
    identity = run_identity(options, data_file, model_dir, cluster)
    result = TrainResult(out=out, options=options)
    with training_output(out, identity, restart or force, lambda saved: identity_difference(
            saved, identity, data_file, model_dir)) as resumed:
        start = resumed or 0
        if resumed is not None:
            from tfpart.checkpoints import check_checkpoint_input

            # here, not at the restore: a broken file there is taken for the cluster's fault
            check_checkpoint_input(out / "checkpoint" / f"ckpt-{start}")
            result.updates, result.evaluations, wall = continued_rows(
                read_rows(out / "updates.csv", UPDATE_FIELDS),
                read_rows(out / "evaluations.csv", EVALUATION_FIELDS), start)
            result.resumed = start
            result.resumed_at = json.loads((out / RUN_FILE).read_text()).get("resumed_at", [])
        if start >= options.steps:  # done before: its summary again
            if not result.evaluations or result.evaluations[-1]["update"] != start:
                raise OutputError(out, "has its last checkpoint but not its evaluation; "
                                  "--restart to train again")
            return _finish(result, _plan_of(out))
        with ExitStack() as stack, cluster_errors(cluster):
            run = _SyncRun(model_dir, cluster, out, train_data, options, stack,
                           op_libraries) if options.mode == "sync" else \
                _AsyncRun(model_dir, initial, cluster, out, train_data, options, start,
                          op_libraries)
            snapshot = Snapshot(*run.saved())
            manager = tf.train.CheckpointManager(snapshot.checkpoint, str(out / "checkpoint"),
                                                 max_to_keep=1)
            if resumed is not None:
                snapshot.restore(str(out / "checkpoint" / f"ckpt-{start}"))
                _write_csv(out / "evaluations.csv", result.evaluations, EVALUATION_FIELDS)
            run.prepare(start)
            updates_log = stack.enter_context(_UpdatesLog(out / "updates.csv",
                                                          result.updates))
            clock = Stopwatch(offset=wall if resumed is not None else 0.0)
            lock = threading.Lock()  # the asynchronous modes evaluate from a thread

            def evaluation(applied):
                with lock:
                    if result.evaluations and result.evaluations[-1]["update"] == applied:
                        return  # already evaluated at this count
                    wall_s = clock()
                    loss, accuracy = evaluate(run.model, run.weights(), held)
                    result.evaluations.append({"update": applied, "wall_s": wall_s,
                                               "loss": loss, "accuracy": accuracy})
                    snapshot.take()
                    # the evaluations first: a checkpoint always has its row
                    _write_csv(out / "evaluations.csv", result.evaluations,
                               EVALUATION_FIELDS)
                    manager.save(checkpoint_number=applied)

            with clock.paused():
                evaluation(start)
            if progress:
                progress(start, options.steps, "starting" if resumed is None else
                         f"resumed at update {start}")
            synchronous = options.mode == "sync"
            with nullcontext() if synchronous else evaluated_alongside(
                    run.applied, evaluation, options.eval_every, first=start):
                for done, (loss, worker, delay) in enumerate(run.results(), start + 1):
                    updates_log.add({"update": done, "worker": worker, "loss": loss,
                                     "delay": delay, "wall_s": clock()})
                    if synchronous and (done % options.eval_every == 0
                                        or done == options.steps):
                        updates_log.flush()  # the rows up to a checkpoint are on disk
                        with clock.paused():  # sync's evaluations hold up its training
                            evaluation(done)
                    if progress:
                        accuracy = result.evaluations[-1]["accuracy"]
                        progress(done, options.steps, f"loss {loss:.4f}, held-out accuracy "
                                 + ("-" if accuracy is None else f"{accuracy:.3f}"))
            if not synchronous:
                evaluation(run.applied())
    return _finish(result, run.plan)


def _finish(result, plan):
    _write_csv(result.out / "updates.csv", result.updates, UPDATE_FIELDS)
    result.summary = _summary(result, plan)
    write_file_atomically(result.out / "train.json", json.dumps(result.summary, indent=1))
    return result


def _plan_of(out):
    from tfpart.core.plan import Plan

    return Plan.load(Path(out) / "plan.json")


class _UpdatesLog:
    """``updates.csv`` written as the rows come (``rows``: those of the run so far,
    written first), so that a run killed mid-way leaves the rows up to its last
    checkpoint: flushed at each of sync's evaluations, every ``every_s`` seconds (the
    asynchronous modes evaluate from a thread) and at the end."""

    def __init__(self, path, rows, every_s=0.5):
        self.path, self.rows = Path(path), rows
        self.every_s, self.flushed = every_s, time.monotonic()
        _write_csv(self.path, rows, UPDATE_FIELDS)

    def __enter__(self):
        with os_errors(self.path):
            self.handle = open(self.path, "a", newline="")
        self.writer = csv.DictWriter(self.handle, fieldnames=UPDATE_FIELDS)
        return self

    def add(self, row):
        self.rows.append(row)
        self.writer.writerow(row)
        if time.monotonic() - self.flushed > self.every_s:
            self.flush()

    def flush(self):
        self.handle.flush()
        self.flushed = time.monotonic()

    def __exit__(self, *exc):
        self.handle.close()

class Stopwatch:
    """Seconds since it was made (plus ``offset``: a resumed run's time so far), less
    the time spent in its :meth:`paused` blocks.

    >>> clock = Stopwatch(offset=10.0)
    >>> with clock.paused():
    ...     time.sleep(0.05)
    >>> 10.0 <= clock() < 10.05
    True
    """

    def __init__(self, offset=0.0):
        self.start, self.excluded = time.perf_counter() - offset, 0.0

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
def evaluated_alongside(applied, evaluation, every, poll_s=0.02, first=0):
    """While the block runs, call ``evaluation(count)`` from a thread each time
    ``applied()`` (the servers' update count) reaches the next multiple of ``every``
    after ``first``.

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
        due = (first // every + 1) * every
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
            "final_accuracy": last["accuracy"], "resumed_at": result.resumed_at,
            "delays": delays_by_worker(result.updates),
            "variables": {name: device for name, device in plan.assignment.items()
                          if result.options.mode != "sync"}}


def _write_csv(path, rows, fields):
    """Write ``rows`` whole, through a temporary file (a reader never sees half)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_file_atomically(path, text.getvalue())
