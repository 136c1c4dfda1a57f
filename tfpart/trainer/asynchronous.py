"""Asynchronous training on TensorFlow's parameter-server runtime.

The client is a ``tf.distribute.experimental.ParameterServerStrategy`` coordinator
(``ClusterCoordinator``) of a cluster's ``worker`` and ``ps`` tasks, each a
``tfpart worker`` process. A large weight is cut along its first axis into pieces on
several servers, a small one stays whole on one
(:func:`partitioner.ps_shards.shard_variables`). Everything a mode keeps lives on the
parameter servers, beside the weight or piece it belongs to:

- the weights ``w``, their velocity and (DC-ASGD, DDC-ASGD) the mean square of their
  gradients;
- ``w_bak`` (DC-ASGD, DDC-ASGD): one copy of the weights per worker, written when the
  worker reads them (a variable with a leading worker axis);
- on the first server: the update counter, the counter's value at each worker's last
  read (so an update's delay is counted there), and DDC-ASGD's running mean freshness;
- the model's non-trainable state (batch normalisation's moving statistics), spread
  over the servers like the weights: each step reads it with the weights and writes
  back the state its ``gradients`` call left, last writer wins, as a model's own
  training step updates it (uncompensated: it is not a gradient);
- on each server, a lock (``tf.CriticalSection``) that each read and each update of
  its variables holds, so that updates there apply one at a time.

One update, run by whichever worker is free (a scheduled call makes several, one after
the other, on that worker): read the weights (and keep them as ``w_bak``) on the
servers, compute the gradients on the worker with the model's stateless ``gradients``
signature (a weight's pieces joined there, its gradient cut there), then apply
:func:`tfpart.trainer.delay_compensation.update` on each server for its variables (the ops are
placed there, so only the gradients travel). A call returns its updates' losses and
delays and the worker's index; the coordinator reschedules a call whose worker was
lost on the workers still up (updates beyond the run's total, from a call rerun after
some of its updates were applied, change nothing).

Example (not run here: it needs running ``ps`` and ``worker`` tasks)::

    trainer = AsyncTrainer(cluster, "model/", initial, {}, data, "dc-asgd", Hyper(0.05), 32)
    pending = [trainer.schedule(updates=4) for _ in range(25)]
    losses, worker, delays = pending[0].fetch()
"""
from __future__ import annotations

import functools

import numpy as np

from partitioner.ps_shards import MIN_SHARD_BYTES, shard_variables
from rewriters.tf_import import tensorflow
from tfpart.trainer.delay_compensation import Updated, running_freshness, update
from tfpart import servers
from tfpart.core.errors import TfpartError


def ps_devices(cluster):
    """Device names of the cluster's ``ps`` tasks."""
    count = len(cluster.tf_cluster.get("ps", ()))
    if not count:
        raise TfpartError(cluster.source, "asynchronous training needs a 'ps' job in the "
                          "'cluster' block (parameter-server tasks)")
    return [f"/job:ps/replica:0/task:{k}/device:CPU:0" for k in range(count)]


def coordinator_of(cluster):
    """A parameter-server strategy and its coordinator for ``cluster``'s tasks."""
    tf = tensorflow()
    servers.check_workers(cluster)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        servers.cluster_spec(cluster), rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    servers.connected = True  # errors from here on end the process (tfpart.cli.main)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    without_cluster_recovery(coordinator)
    return strategy, coordinator


def without_cluster_recovery(coordinator):
    """Stop the thread of ``coordinator`` that recovers the cluster once a lost worker
    is back, so a lost worker is given up for good: the coordinator still puts its
    unfinished call back for the others (before it would wait for the recovery), and
    its thread for that worker then waits, but nothing updates the client's cluster.

    Why: as soon as a worker fails, TensorFlow's ``WorkerPreemptionHandler`` calls
    ``context.update_server_def`` from that thread while the other threads run: the
    surviving workers' threads copying results, the client evaluating and saving
    checkpoints. The update rewrites process-wide state of the eager context under
    them (it swaps the gRPC server's worker cache, clears the context's kernel and
    device caches, its default executor and step container, drops the lost worker's
    devices), then blocks until that worker answers again; TensorFlow notes in
    ``WorkerPreemptionHandler.stop`` that the thread "touches eager context which is a
    process-wide singleton". The client of ``test_async_training_goes_on_without_a_lost_
    worker`` died with SIGSEGV after the worker was killed, once in a CI run. A
    ``tfpart worker`` that comes back is a new process the run does not use.

    Does nothing if TensorFlow's coordinator has no such thread (another version).

    >>> without_cluster_recovery(object())  # no such thread: nothing to stop
    """
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    thread = getattr(handler, "_preemption_handler_thread", None)
    if thread is None or not hasattr(handler, "_should_preemption_thread_run"):
        return
    handler._should_preemption_thread_run = False
    with handler._cluster_update_lock:
        handler._cluster_due_for_update_or_finish.set()  # the thread wakes and ends
    thread.join(timeout=30)
    handler._cluster_due_for_update_or_finish.clear()
    # wait_on_failure asserts the thread runs; a failed worker's thread then waits on
    # _worker_up_cond, which nothing notifies (TensorFlow wakes it after an hour)
    handler._should_preemption_thread_run = True


class Piece:
    """One server's piece of a weight (its first-axis rows, or all of it) and the
    state a mode keeps beside it: velocity, mean square, the workers' copies; ``server``
    is the index of the server that holds them."""

    def __init__(self, value, name, workers, mode, server):
        tf = tensorflow()
        self.server = server
        self.w = tf.Variable(value, name=name)
        self.velocity = tf.Variable(np.zeros_like(value), name=f"{name}_v")
        self.ms = tf.Variable(np.zeros_like(value), name=f"{name}_ms") \
            if mode != "async" else None
        self.bak = tf.Variable(np.repeat(value[None], workers, axis=0), name=f"{name}_bak") \
            if mode != "async" else None


class ServerState:
    """The variables of one asynchronous run, created on the parameter servers."""

    def __init__(self, strategy, initial, placement, servers, workers, mode, states=None):
        tf = tensorflow()
        with strategy.scope():
            # Round robin puts the k-th new variable on server k; the others colocate.
            anchors = [tf.Variable(0, name=f"server{k}") for k in range(len(servers))]
            for anchor, server in zip(anchors, servers):
                if tf.DeviceSpec.from_string(anchor.device).task != \
                        tf.DeviceSpec.from_string(server).task:
                    raise TfpartError("", f"variable meant for {server} landed on "
                                      f"{anchor.device}")

            def on(server):
                return strategy.extended.colocate_vars_with(anchors[servers.index(server)])

            self.pieces = []  # per weight, its pieces in the order of their rows
            for name, value in initial.items():
                shards = placement[name]
                cuts = np.cumsum([shard.rows or 0 for shard in shards])[:-1]
                pieces = []
                for k, (shard, part) in enumerate(zip(shards, np.split(value, cuts))):
                    with on(shard.server):
                        pieces.append(Piece(part, name if len(shards) == 1
                                            else f"{name}/part_{k}", workers, mode,
                                            servers.index(shard.server)))
                self.pieces.append(pieces)
            self.states, self.state_server = {}, {}
            for name, value in (states or {}).items():
                self.state_server[name] = servers.index(placement[name][0].server)
                with on(placement[name][0].server):
                    self.states[name] = tf.Variable(value, name=name)
            # One lock per server, for the variables it holds; server 0's also for the
            # counts, which an update takes first. A lock is created on the current
            # device (the strategy's scope places variables only): without tf.device
            # it lived on the client, a round trip from the workers.
            self.devices = servers
            self.locks = []
            for k, server in enumerate(servers):
                with tf.device(server):
                    self.locks.append(tf.CriticalSection(name=f"updates_lock_{k}"))
            with on(servers[0]):
                self.updates = tf.Variable(0, dtype=tf.int64, name="updates")
                self.read_at = tf.Variable(np.zeros(workers, np.int64), name="read_at")
                self.mean_freshness = tf.Variable(0.0, name="mean_freshness")
                # updates numbered beyond it change nothing (a warm-up's, a rerun's)
                self.limit = tf.Variable(np.iinfo(np.int64).max, dtype=tf.int64,
                                         name="limit")

    def weights(self):
        """Each weight's value now (its pieces joined), a numpy array."""
        return [np.concatenate([piece.w.numpy() for piece in pieces])
                for pieces in self.pieces]

    def saved(self, names):
        """What a checkpoint holds, as ``(named, optimizer)``: each a dict of a name and
        the variables whose values, joined along their first axis, are saved under it.
        ``named``: the weights (a weight cut into pieces saved whole, so a run may
        resume on another number of servers) and states, by their signature names;
        ``optimizer``: what a resumed run needs besides, each weight's velocity
        (``w000_velocity``) and mean square (``w000_ms``) and DDC-ASGD's running mean
        freshness. The update count is the checkpoint's number; the workers' copies
        ``w_bak`` and read counts are written afresh by every read, so are not saved."""
        named = {name: [piece.w for piece in pieces] for name, pieces in zip(names, self.pieces)}
        named.update({name: [state] for name, state in self.states.items()})
        optimizer = {f"{name}_{kind}": [getattr(piece, attribute) for piece in pieces]
                     for kind, attribute in (("velocity", "velocity"), ("ms", "ms"))
                     for name, pieces in zip(names, self.pieces)
                     if getattr(pieces[0], attribute) is not None}
        optimizer["mean_freshness"] = [self.mean_freshness]
        return named, optimizer


class AsyncTrainer:
    """Schedules asynchronous updates of ``model``'s weights on ``cluster``.

    Parameters
    ----------
    cluster : tfpart.core.cluster.Cluster
        With ``worker`` and ``ps`` jobs.
    model_dir : path
        A SavedModel with the stateless signature ``gradients``
        (:func:`tfpart.training.export_train_step`). It is loaded once the coordinator
        is connected (``self.model``): functions loaded before do not reach the workers.
    initial : dict
        The weights to start from, by the ``weights`` signature's names (numpy arrays).
    states : dict
        The non-trainable state to start from, by the ``states`` signature's names
        (empty for a model without one).
    data : (x, y) numpy arrays
        The training split; each worker draws its own shuffled mini-batches.
    mode : {"async", "dc-asgd", "ddc-asgd"}
    hyper : tfpart.trainer.delay_compensation.Hyper
    batch_size : int
    seed : int
    min_shard_bytes : int
        Weights of at least twice this many bytes are cut along their first axis over
        the servers (:func:`partitioner.ps_shards.shard_variables`); ``self.placement``
        says which server holds each piece.
    max_updates : int, optional
        The servers apply no more updates than this. The coordinator reruns a lost
        worker's call whole, though some of its updates may already have been applied;
        the updates beyond the total are then counted but change nothing.
    start : int
        Updates already made (a resumed run, its state restored from a checkpoint):
        the servers count on from there, and each worker skips the batches it would
        have drawn by then had the workers shared the updates evenly.
    """

    def __init__(self, cluster, model_dir, initial, states, data, mode, hyper, batch_size,
                 seed=0, min_shard_bytes=MIN_SHARD_BYTES, max_updates=None, start=0):
        tf = tensorflow()
        self.strategy, self.coordinator = coordinator_of(cluster)
        self.model = tf.saved_model.load(str(model_dir))
        self.workers = len(cluster.tf_cluster["worker"])
        self.names = list(initial)
        servers = ps_devices(cluster)
        self.placement = shard_variables(
            {k: v.nbytes for k, v in {**initial, **states}.items()}, servers,
            rows={k: v.shape[0] for k, v in initial.items() if v.ndim},
            min_shard_bytes=min_shard_bytes)
        self.state = ServerState(self.strategy, initial, self.placement, servers,
                                 self.workers, mode, states)
        self.start = start
        self._batches = _batches_fn(data, batch_size, self.workers, seed,
                                    skip=start // self.workers)
        self.iterator = self._new_iterator()
        self.max_updates = max_updates or np.iinfo(np.int64).max  # the servers' limit
        self.state.limit.assign(self.max_updates)
        self._steps = {}  # updates per call -> its function
        self._step_of = functools.partial(_step_function, self.state, self.names,
                                          self.model.signatures["gradients"], mode, hyper)

    def trace(self, updates=1):
        """Trace the function of a call of ``updates`` updates now (about a second for
        the digits benchmark's), as :meth:`schedule` would on its first call."""
        if updates not in self._steps:
            step = self._step_of(updates)
            # what ClusterCoordinator.schedule traces with: the per-worker iterator's spec
            step.get_concrete_function(self.iterator._type_spec)
            self._steps[updates] = step
        return self._steps[updates]

    def warm_up(self, updates=1):
        """Run a call of ``updates`` updates on each worker that changes nothing, then
        start the counts (at ``start``) and the workers' batches afresh: the first call
        of a function on a worker builds its parts there and on the servers (about two
        seconds for the digits benchmark's, XLA's compile of the update included), a
        cost paid once, like sync's compile."""
        tf = tensorflow()
        self.state.limit.assign(0)
        for _ in range(self.workers):  # one each: every worker is idle at the start
            self.schedule(updates)
        self.coordinator.join()
        self.state.updates.assign(self.start)
        self.state.read_at.assign(tf.zeros_like(self.state.read_at))
        self.state.limit.assign(self.max_updates)
        self.iterator = self._new_iterator()

    def _new_iterator(self):
        return iter(self.coordinator.create_per_worker_dataset(self._batches))

    def schedule(self, updates=1):
        """Queue a call of ``updates`` updates, one after the other on one worker; a
        ``RemoteValue`` of (their losses, the worker's index, their delays)."""
        return self.coordinator.schedule(self.trace(updates), args=(self.iterator,))

    def weights(self):
        """The weights and states now, as numpy arrays by their signature names."""
        return {**dict(zip(self.names, self.state.weights())),
                **{name: s.numpy() for name, s in self.state.states.items()}}

    def updates(self):
        """Updates the servers have applied."""
        return int(min(self.state.updates.numpy(), self.max_updates))

    def saved(self):
        """The variables a checkpoint holds (:meth:`ServerState.saved`)."""
        return self.state.saved(self.names)

    def join(self):
        self.coordinator.join()


def fused_update(mode, hyper):
    """:func:`tfpart.trainer.delay_compensation.update` compiled by XLA: one kernel per piece
    shape instead of a dozen element-wise ops, each a pass over the whole piece, on a
    server that applies every worker's updates (about 10–15% off a DC-ASGD run of the
    digits benchmark). Arguments as ``update``'s, without ``mode``, ``hyper`` and
    ``sqrt``, and ``applies``: when false, the state comes back unchanged.

    >>> import numpy as np
    >>> from tfpart.trainer.delay_compensation import Hyper
    >>> fused = fused_update("async", Hyper(learning_rate=0.5))
    >>> float(fused(np.ones(1, np.float32), np.ones(1, np.float32), np.ones(1, np.float32),
    ...             0.0, np.zeros(1, np.float32), 0.0, 0.0, 1.0, True).w[0])
    0.5
    """
    tf = tensorflow()

    @tf.function(jit_compile=True)
    def fused(w, g, w_bak, ms, velocity, tau, mean_freshness, step, applies):
        new = update(mode, w, g, w_bak, ms, velocity, tau, mean_freshness, hyper, tf.sqrt,
                     step)
        return Updated(*(tf.where(applies, changed, kept) for changed, kept
                         in zip(new, (w, ms, velocity, mean_freshness))))

    return fused


def _step_function(state, names, gradients, mode, hyper, updates):
    """The scheduled function: ``updates`` times, one after the other, read the weights
    (kept as the worker's ``w_bak``) on the servers, compute the gradients on the
    worker, apply ``mode``'s update on the servers; returns the updates' losses, the
    worker's index and the updates' delays. Each update reads the weights afresh, so
    its delay counts the other workers' updates since as for a call of one update;
    only the client's cost of a call is shared. Updates numbered beyond
    ``state.limit`` change nothing.

    Each server's part of a read or an update holds that server's lock (a
    ``tf.CriticalSection`` there), so every update counts: without the locks,
    overlapping updates dropped more than half of a test's
    (``test_no_update_is_lost_when_workers_update_at_once``). Server 0 counts an update
    first; the other servers' parts wait for its number and delay, not for each other.
    """
    tf = tensorflow()

    fused = fused_update(mode, hyper)
    pieces_on = {server: [piece for pieces in state.pieces for piece in pieces
                          if piece.server == server]
                 for server in range(len(state.devices))}
    states_on = {server: [name for name, on in state.state_server.items() if on == server]
                 for server in range(len(state.devices))}

    def read(server, worker, values):
        """On ``server``: read its pieces and states into ``values`` (by piece and by
        name) and keep the pieces as the worker's ``w_bak``; server 0 first keeps the
        count as the worker's ``read_at``. A token once done."""
        done = []
        if server == 0:
            done.append(state.read_at.scatter_update(tf.IndexedSlices(
                tf.reshape(state.updates.read_value(), [1]), tf.reshape(worker, [1]))))
        for piece in pieces_on[server]:
            values[piece] = piece.w.read_value()
            if piece.bak is not None:
                done.append(piece.bak.scatter_update(
                    tf.IndexedSlices(values[piece][None], tf.reshape(worker, [1]))))
            done.append(values[piece])
        for name in states_on[server]:
            values[name] = state.states[name].read_value()
            done.append(values[name])
        return token(done)

    def count(worker):
        """On server 0: this update's number, delay, whether it applies, and DDC-ASGD's
        running mean freshness before it (the mean after it is kept)."""
        number = state.updates.assign_add(1)  # this update's, from 1
        with tf.control_dependencies([number]):
            mean_freshness = state.mean_freshness.read_value()
        delay = number - 1 - tf.gather(state.read_at, worker)
        applies = number <= state.limit.read_value()
        done = []
        if mode == "ddc-asgd":
            done.append(state.mean_freshness.assign(tf.where(
                applies, running_freshness(tf.cast(delay, tf.float32), mean_freshness, hyper),
                mean_freshness)))
        return (number, delay, applies, mean_freshness), done

    def apply(server, worker, grads, out, counted=None):
        """On ``server``: apply the update to its pieces and states, counting it first
        on server 0 (``counted`` then None). A token once done; server 0 also returns
        the count."""
        done = []
        if counted is None:
            counted, done = count(worker)
        number, delay, applies, mean_freshness = counted
        for piece in pieces_on[server]:
            current = piece.w.read_value()
            new = fused(current, grads[piece],
                        current if piece.bak is None else tf.gather(piece.bak, worker),
                        0.0 if piece.ms is None else piece.ms.read_value(),
                        piece.velocity.read_value(), tf.cast(delay, tf.float32),
                        mean_freshness, tf.cast(number, tf.float32), applies)
            done += [piece.w.assign(new.w), piece.velocity.assign(new.velocity)]
            if piece.ms is not None:
                done.append(piece.ms.assign(new.ms))
        for name in states_on[server]:
            variable = state.states[name]
            done.append(variable.assign(tf.where(applies, out[name], variable.read_value())))
        return (token(done), *counted) if server == 0 else token(done)

    def token(done):
        """A scalar on this server once ``done`` has run: what its lock waits for before
        it is released there (a tensor the lock returned to the worker would hold it for
        a round trip)."""
        with tf.control_dependencies(done):
            return tf.constant(0)

    def locked(last, server, function, *args):
        """``function(server, *args)`` on ``server`` under its lock, taken once the
        section before it in the call has released its own (``last``: its token, or
        None), so a call never holds one server's lock while waiting for another's.
        Without that, two workers' calls of several updates deadlocked on two servers:
        TensorFlow runs a function's lock releases in program order, so a release waited
        on the lock of an earlier section, which the other call held."""
        def section():
            with tf.control_dependencies([] if last is None else [last]):
                return function(server, *args)

        with tf.device(state.devices[server]):
            return state.locks[server].execute(section)

    def one_update(worker, x, y, last):
        """One update; its loss, delay and the token of its last section."""
        # read's values come out beside the locks: returned through one, a value would
        # reach the worker only once that lock is released
        values = {}
        for server in pieces_on:
            last = locked(last, server, read, worker, values)
        # Identities on the worker: without them the placer puts the gradients' call
        # beside its inputs, on the servers, and the steps run one by one.
        values = {key: tf.identity(value) for key, value in values.items()}
        read_weights = [values[pieces[0]] if len(pieces) == 1
                        else tf.concat([values[piece] for piece in pieces], 0)
                        for pieces in state.pieces]
        out = gradients(x=x, y=y, **dict(zip(names, read_weights)),
                        **{name: values[name] for name in state.states})
        grads = {}  # by piece, cut on the worker
        for name, pieces in zip(names, state.pieces):
            g = tf.identity(out[f"g{name[1:]}"])
            grads.update(zip(pieces, [g] if len(pieces) == 1 else
                             tf.split(g, [piece.w.shape[0] for piece in pieces])))
        # A lock is taken once its arguments are ready (the gradients among them), so
        # an update's delay counts the updates applied while its gradient was computed.
        last, *counted = locked(last, 0, apply, worker, grads, out)
        for server in list(pieces_on)[1:]:
            last = locked(last, server, apply, worker, grads, out, counted)
        with tf.control_dependencies([last]):
            return tf.identity(out["loss"]), counted[1], last

    @tf.function
    def step(iterator):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        losses, delays, last = [], [], None
        for _ in range(updates):
            loss, delay, last = one_update(worker, *next(iterator), last)
            losses.append(loss)
            delays.append(delay)
        return tf.stack(losses), worker, tf.stack(delays)

    return step


def sample_orders(samples, workers, seed, epochs=8):
    """Each worker's order of the training samples: a new seeded permutation every
    epoch, for ``epochs`` epochs (then repeated). Row k is worker k's.

    >>> sample_orders(4, 2, seed=0, epochs=2).shape
    (2, 8)
    """
    rng = np.random.default_rng(seed)
    return np.stack([np.concatenate([rng.permutation(samples) for _ in range(epochs)])
                     for _ in range(workers)])


def _batches_fn(data, batch_size, workers, seed, skip=0):
    """A dataset function for the coordinator: worker k's mini-batches are consecutive
    runs of ``batch_size`` samples in its order (:func:`sample_orders`), repeated, the
    first ``skip`` left out."""
    tf = tensorflow()
    x, y = data
    orders = sample_orders(len(x), workers, seed)

    def dataset_fn():
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        order = tf.gather(tf.constant(orders), worker)
        return (tf.data.Dataset.from_tensor_slices(order).repeat()
                .batch(batch_size, drop_remainder=True).skip(skip)
                .map(lambda i: (tf.gather(x, i), tf.gather(y, i))))

    return dataset_fn
