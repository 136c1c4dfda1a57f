"""What a compile works out about a model once, before any strategy plans it.

:func:`analyse` reads the SavedModel and its signature (flattened once: the ops, their
shapes at the batch planned for, a training step's regions, the fusion groups
Grappler's remapper makes of it), checks that the model can fit the cluster, cuts the
tables no device can hold into row shards, and loads the measured profiles. The
:class:`Analysis` it returns is what every strategy of the compile is planned from
(:mod:`tfpart.compile`); a retry derives from it (:meth:`Analysis.with_tables_cut`)
instead of reading the model again, and what is costly and asked for by several
strategies (the ops that mix a batch's samples) is worked out at most once
(:meth:`Analysis.once`).

Examples
--------
>>> from profiles import DEFAULT_MODEL_DIR
>>> from tfpart.clusters import load
>>> from tfpart.strategy_request import resolve_strategy
>>> analysis = analyse(DEFAULT_MODEL_DIR, load("local_3cpu"), resolve_strategy(),
...                    batch_size=4)
>>> analysis.info.batch_size, len(analysis.graph) > 10, analysis.row_shards
(4, True, {})
>>> analysis.once("answer", lambda: 42), analysis.once("answer", lambda: 0)
(42, 42)

Begun in the background (:meth:`Analysis.start`), an answer is waited for, and what
its work raised is raised where it is asked for:

>>> analysis.start("ratio", lambda: 1 / 0)
>>> analysis.settle()
>>> analysis.once("ratio", lambda: 0)
Traceback (most recent call last):
...
ZeroDivisionError: division by zero
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from tfpart import table_cuts
from tfpart.core.errors import PlacementError, model_errors
from tfpart.core.limits import MAX_COMPILED_OPS, check_microbatches, check_tensors_fit
from tfpart.core.ops import writes_state
from tfpart.core.phases import timed

# Of each device's memory, kept free for what the cost model does not see; a model that
# fits only without it is planned without it (plan.json: context.memory_headroom).
MEMORY_HEADROOM = 0.1

TF1_REBUILT = ("the stages, replicas and splits of a TensorFlow 1 SavedModel are built "
               "for inference signatures (a training step gets an op placement)")


@dataclass(frozen=True)
class Analysis:
    """One compile's reading of its model, shared by every strategy it plans.

    Attributes
    ----------
    model_dir : pathlib.Path
        The SavedModel folder.
    proto : tensorflow SavedModel proto
        The SavedModel read.
    graph : tfpart.core.graph.OpGraph
        The signature's ops, priced at the batch planned for (its tables cut into row
        shards as ``row_shards`` says).
    info : rewriters.flat_signature.ModelInfo
        The signature, its inputs and shapes, the batch size, a training step's
        regions, the fusion groups (Grappler's view) and ``info.flat``, the flattened
        signature (with no table cut: the rewriter cuts it the same way).
    row_shards : dict
        Table -> rows of each of its shards (empty: no table cut).
    cluster : tfpart.core.cluster.Cluster
        The whole cluster (each plan is made for a :func:`planning_cluster` of it).
    measured : list
        The measured profiles the cost model uses.
    tf32 : bool or None
        Whether float32 matmuls run on TF32 units (None: the cluster's).
    given : rewriters.given_inputs.GivenInputs or None
        The user's inputs for the batch-mixing probe.
    timings : dict
        Seconds of each phase so far; the compile adds its own.
    answers : dict
        What :meth:`once` worked out, by name: shared with every analysis derived from
        this one.
    """

    model_dir: Path
    proto: object = field(repr=False)
    graph: object = field(repr=False)
    info: object = field(repr=False)
    row_shards: dict
    cluster: object = field(repr=False)
    measured: list = field(repr=False)
    tf32: bool | None
    given: object = field(repr=False)
    timings: dict = field(repr=False)
    answers: dict = field(default_factory=dict, repr=False)

    def once(self, name, work):
        """``work()`` the first time ``name`` is asked for by this compile, its answer
        after (that of :meth:`start`'s thread, once it is done, if one works it out)."""
        if name not in self.answers:
            self.answers[name] = work()
        answer = self.answers[name]
        return answer.result() if isinstance(answer, _Background) else answer

    def start(self, name, work):
        """Begin ``work()`` for ``name`` in a thread of its own, so that what this
        process does meanwhile overlaps it (TensorFlow's kernels, for one, let go of
        Python's lock); :meth:`once` of ``name`` waits for it, raising what it raised."""
        if name not in self.answers:
            self.answers[name] = _Background(work)

    def settle(self):
        """Wait for every thread :meth:`start` began (what they raised is kept for
        :meth:`once`): nothing of this compile runs behind the caller's back after."""
        for answer in self.answers.values():
            if isinstance(answer, _Background):
                answer.done()

    def with_tables_cut(self, graph, info, row_shards):
        """The same analysis of the model with its tables cut (``graph`` and ``info``
        read from the cut graph, :func:`rewriters.reader.read_with_row_shards`;
        ``row_shards`` the rows of each shard); what :meth:`once` found is kept."""
        return dataclasses.replace(self, graph=graph, info=info, row_shards=row_shards)


class _Background:
    """``work()`` run in a daemon thread (one an interrupted compile does not wait for);
    :meth:`result` waits for its answer and raises what it raised.

    >>> _Background(lambda: 6 * 7).result()
    42
    """

    def __init__(self, work):
        import threading

        self._answer, self._error = None, None

        def run():
            try:
                self._answer = work()
            except BaseException as exc:  # noqa: B036 -- handed to whoever waits
                self._error = exc

        self._thread = threading.Thread(target=run, name="tfpart-analysis", daemon=True)
        self._thread.start()

    def done(self):
        self._thread.join()

    def result(self):
        self.done()
        if self._error is not None:
            raise self._error
        return self._answer


def analyse(model_dir, cluster, request, *, batch_size=None, signature=None, profiles=(),
            tf32=None, op_libraries=(), inputs=None, progress=None, timings=None):
    """Read and analyse the SavedModel ``model_dir`` for a compile of ``request`` (a
    :class:`~tfpart.strategy_request.StrategyRequest`) on ``cluster``: the
    :class:`Analysis` every strategy is planned from.

    Raises
    ------
    tfpart.core.errors.TfpartError
        If the model cannot be read, its op libraries loaded, its micro-batches are out
        of bounds, it cannot fit the whole cluster, or a table that fits no device
        cannot be cut.
    """
    from rewriters.given_inputs import read_given_inputs
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import check_variables, read_saved_model
    from tfpart.op_libraries import load_op_libraries, naming_op_libraries

    load_op_libraries(op_libraries)
    timings = {"read": 0.0, "analyse": 0.0} if timings is None else timings
    (progress or (lambda name: None))("reading the SavedModel")
    with timed(timings, "read"), naming_op_libraries(), model_errors(model_dir, "read it"):
        proto = read_saved_model(model_dir)
        check_variables(model_dir)
        graph, info = read_model(proto, model_dir, batch_size=batch_size, signature=signature,
                                 timings=timings)
    timings["read"] -= timings["analyse"]
    given = read_given_inputs(inputs, proto.meta_graphs[0], info.signature) if inputs \
        else None
    if request.microbatches is not None:  # before any planning, the model's ops known
        check_microbatches(request.microbatches, info.batch_size, len(graph), model_dir,
                           MAX_COMPILED_OPS, "to compile")
    check_fits(graph, cluster, cluster.source or model_dir, info.batch_size)
    graph, info, row_shards = table_cuts.cut_tables(
        graph, info, proto, model_dir, planning_cluster(
            cluster, unread_variables(info, cluster, kept=False), MEMORY_HEADROOM)[0],
        timings)
    return Analysis(model_dir=Path(model_dir), proto=proto, graph=graph, info=info,
                    row_shards=row_shards, cluster=cluster,
                    measured=load_profiles(profiles, cluster), tf32=tf32, given=given,
                    timings=timings)


def refused_strategies(analysis, names):
    """The strategies of ``names`` the model can be planned with, and why each of the
    others cannot (name -> PlacementError): comparing several, each installed plug-in
    that cannot be loaded; with an input that has no batch dimension only the first is
    planned (micro-batches and replicas split every input); a TensorFlow 1 model that
    writes state gets no rebuilt plan (:data:`TF1_REBUILT`)."""
    from partitioner.registry import broken_plugins, get as get_algorithm

    graph, info, model_dir = analysis.graph, analysis.info, analysis.model_dir
    names, failures = list(names), broken_plugins() if len(names) > 1 else {}
    scalars = [key for key, (shape, _) in info.inputs.items() if not shape]
    if len(names) > 1 and scalars:
        failures.update({name: PlacementError(model_dir, f"input {scalars[0]!r} has no "
                                              "batch dimension to split")
                         for name in names[1:]})
        names = names[:1]
    writer = next((op for op, attrs in graph.ops.items() if writes_state(attrs["op_type"])),
                  None) if info.format == "tf1" else None
    if writer is not None:
        refused = [name for name in names if get_algorithm(name).rebuilt]
        failures.update({name: PlacementError(model_dir, f"op {writer} writes a variable or "
                                              f"a table: {TF1_REBUILT}") for name in refused})
        names = [name for name in names if name not in refused]
    return names, failures


def unread_variables(info, cluster, kept=True):
    """Where the variables the signature never reads go (the first device's host CPU,
    off every accelerator) and what they hold; ``kept=False``: the compiled model drops
    them (``count`` 0, and how many it drops)."""
    from tfpart.core.cluster import host_of

    host = f"{host_of(cluster.device_names[0])}/device:CPU:0"
    if not kept:
        return {"device": host, "count": 0, "bytes": 0, "dropped": len(info.unread_variables)}
    return {"device": host, "count": len(info.unread_variables),
            "bytes": int(sum(nbytes for _, nbytes in info.unread_variables.values()))}


def planning_cluster(cluster, unread, headroom):
    """The cluster a plan is made for. Where the variables the signature never reads go
    (:func:`unread_variables`) is a device of the cluster (a CPU cluster's first
    device), that device has their bytes less room; and each device keeps ``headroom``
    of its memory free (``MEMORY_HEADROOM``: for what the live-range model does not see,
    the allocator's rounding and unsplit chunks, kernels' scratch buffers, measured in
    benchmarks/memory_accuracy.py). Returns it and the index of the unread variables'
    device (None if they go off the cluster's devices).

    Raises
    ------
    PlacementError
        If they alone overflow that device."""
    from costmodel.memory import size_text
    from tfpart.core.cluster import normalize_device_name, with_memory

    names = [normalize_device_name(name) for name in cluster.device_names]
    host = normalize_device_name(unread["device"])
    room = [device.memory for device in cluster.devices]
    index = names.index(host) if unread["bytes"] and host in names else None
    if index is not None:
        room[index] -= unread["bytes"]
        if room[index] < 0:
            raise PlacementError(cluster.source, f"{cluster.device_names[index]} has "
                                 f"{size_text(cluster.devices[index].memory)}, less than the "
                                 f"{size_text(unread['bytes'])} of the {unread['count']} "
                                 f"variables the signature never reads, which are kept "
                                 f"there (a Keras export's second copy of its variables)")
    return with_memory(cluster, [nbytes - headroom * device.memory
                                 for nbytes, device in zip(room, cluster.devices)]), index


def check_fits(graph, cluster, source, batch_size=None):
    """PlacementError naming ``source`` if the model's tensors at ``batch_size`` or its
    variables need more memory than the whole ``cluster`` has."""
    if batch_size is not None:
        check_tensors_fit(graph, batch_size, cluster.total_memory(), source)
    params = graph.total_param_bytes()
    if params > cluster.total_memory():
        raise PlacementError(source, f"the model's variables need {params / 1e6:.1f} MB but "
                             f"the whole cluster has {cluster.total_memory() / 1e6:.1f} MB")


def load_profiles(paths, cluster=None):
    """Measured profiles from files (``tfpart profile`` output, or kernel tables), for
    the shipped device kinds or ``cluster``'s."""
    from costmodel.measured import load_profile

    kinds = cluster.kinds() if cluster is not None else None
    return [load_profile(path, kinds) for path in paths or ()]
