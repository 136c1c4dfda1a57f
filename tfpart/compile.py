"""The whole pipeline as one function: read, cost, partition, rewrite, write
(:func:`compile_model`), or read and plan only (:func:`plan_model`); each gives a
result object (:class:`CompileResult`, :class:`PlanResult`)."""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from costmodel import CostModel
from costmodel.figures_basis import cluster_links, figures_basis
from partitioner.registry import get as get_algorithm
from partitioner.validate import check_kernels
from tfpart import table_cuts
from tfpart.analysis import (MEMORY_HEADROOM, analyse, load_profiles, planning_cluster,
                             refused_strategies, unread_variables)
from tfpart.core.cluster import Cluster, load_cluster
from tfpart.core.collector import long_lived_frozen
from tfpart.core.errors import ModelError, PlacementError, VerificationError
from tfpart.core.forked import ChildLost, fork_can_pay, start_forked
from tfpart.core.limits import (MAX_COMPILED_OPS, MAX_MICROBATCHES, check_microbatches,
                                check_planned_devices, largest_microbatches)
from tfpart.core.output_folders import check_free_space, check_inputs_outside, folder_bytes, \
    new_staging_folder, os_errors, removed_on_failure, temporary_folder
from tfpart.core.phases import timed
from tfpart.core.plan import RowShards
from tfpart.core.row_shards import shard_name
from tfpart.model_export import is_folder, saved_model_folder
from tfpart.report import placement_section, write_report
from tfpart.strategy_request import StrategyRequest, algorithm_options, resolve_strategy

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class PlanResult:
    """What :func:`plan_model` decided, and what it read to decide it.

    Attributes
    ----------
    plan : tfpart.core.plan.Plan
        The plan (what plan.json holds).
    step_time : float
        Its predicted step, in seconds (``plan.step_time``).
    strategy : str
        The strategy planned (a name of :mod:`partitioner.registry`): the one asked for,
        or the fastest of those ``strategy="auto"`` compared.
    compared : dict
        The predicted step, in seconds, of each strategy planned: every one ``auto``
        could plan, else the one asked for.
    refused : dict
        Why each strategy ``auto`` tried has no plan, by name (empty otherwise).
    graph : tfpart.core.graph.OpGraph
        The model's ops as planned (its tables cut into row shards if the plan cuts them).
    cluster : tfpart.core.cluster.Cluster
        The cluster planned for.
    info : rewriters.flat_signature.ModelInfo
        What the reader found: the signature, its inputs, the batch size.
    proto : tensorflow SavedModel proto
        The SavedModel read.
    timings : dict
        Seconds of each phase (read, analyse, cost, partition, ...).
    cost : costmodel.CostModel
        The cost model the plan was made with (on the cluster less its memory
        headroom), whose tables the report's simulation of the plan reuses.
    """

    plan: object = field(repr=False)
    step_time: float
    strategy: str
    compared: dict
    refused: dict
    graph: object = field(repr=False)
    cluster: object = field(repr=False)
    info: object = field(repr=False)
    proto: object = field(repr=False)
    timings: dict = field(repr=False)
    cost: object = field(default=None, repr=False)


@dataclass(frozen=True)
class CompileResult(PlanResult):
    """What :func:`compile_model` wrote: a :class:`PlanResult`, and

    Attributes
    ----------
    out : pathlib.Path
        The compiled SavedModel's folder (with plan.json and report.html).
    notes : list
        One-line remarks for the user (a profile measured on other hardware).
    verification : tfpart.verification.VerifyReport or None
        The comparison of the compiled model with the original, when asked for.
    """

    out: Path = None
    notes: list = field(default_factory=list)
    verification: object = field(default=None, repr=False)


def _whole_memory(plan, cluster, index, unread):
    """The plan's figures with every device's whole memory and the unread variables on
    device ``index`` (see :func:`planning_cluster`)."""
    if plan.predicted is None:
        return
    for device in cluster.devices:
        plan.predicted.devices[device.name].memory_bytes = float(device.memory)
    if index is not None:
        figures = plan.predicted.devices[cluster.device_names[index]]
        figures.peak_memory_bytes += unread["bytes"]
        figures.param_bytes += unread["bytes"]


def _samples_mixed_by(analysis, microbatches):
    """Ops that mix a batch's samples, which forbid micro-batches and replicas, each
    with why (loops and branches the batch steers, :mod:`rewriters.batch_flow`, then
    :mod:`rewriters.batch_check`'s probe, on the user's inputs if given; in a training
    step, only reductions over the batch that feed back into per-sample ops,
    :mod:`rewriters.training_regions`), worked out once per compile
    (:meth:`~tfpart.analysis.Analysis.once`): an error if micro-batches were asked
    for, else the pipeline keeps whole batches."""
    if microbatches == 1:
        return []
    mixing = analysis.once(MIXING, lambda: _mixing_ops(analysis))
    if mixing and microbatches is not None:
        raise ModelError(analysis.model_dir, f"op {mixing[0][0]} mixes the samples of a "
                         f"batch ({mixing[0][1]}), so {microbatches} micro-batches would "
                         "change the outputs; use --microbatches 1 (stages without "
                         "micro-batches)")
    return mixing


MIXING = "samples mixed"  # the name of the batch-mixing answer in Analysis.once


def _start_mixing_probe(analysis, request, names):
    """Begin the batch-mixing probe (:func:`_samples_mixed_by`) in the background if a
    strategy of ``names`` will ask for it: it runs the model in TensorFlow, which lets
    go of Python's lock, while the strategies before it plan (the greedy first)."""
    if request.microbatches != 1 and any(get_algorithm(name).stages for name in names):
        analysis.start(MIXING, lambda: _mixing_ops(analysis))


def _mixing_ops(analysis):
    from rewriters.batch_check import batch_mixing_ops
    from rewriters.batch_flow import signature_mixing

    info, model_dir = analysis.info, analysis.model_dir
    if info.training:
        return [(op, "it reduces over the batch and feeds per-sample ops")
                for op in info.nonlinear]
    # loops and branches steered by the batch, proven from the graph before any probe
    # runs; the probe then looks for what else mixes
    return (signature_mixing(info.flat, model_dir) if info.flat is not None else []) or \
        batch_mixing_ops(analysis.proto, model_dir, info.signature, info.flat, analysis.given)


def profile_notes(paths, cluster=None):
    """A line for each profile measured where oneDNN or the CPU's instruction sets
    differ from this machine's."""
    from tfpart.profiling import hardware_mismatch

    notes = []
    for path, profile in zip(paths or (), load_profiles(paths, cluster)):
        mismatch = hardware_mismatch(profile)
        if mismatch:
            notes.append(f"profile {path}: {mismatch}")
    return notes


def schedule_notes(request, plan):
    """A line when ``request`` names a schedule that ``plan`` does not follow: a
    schedule orders a training step's forward and backward passes, and a step without
    a backward pass runs its micro-batches forward in order, one stage per device.

    >>> from tfpart.core.plan import Plan, Stages
    >>> from tfpart.strategy_request import resolve_strategy
    >>> inference = Plan(assignment={"x": "A"}, stages=Stages({"x": 0}, 2))
    >>> schedule_notes(resolve_strategy("pipeline", schedule="1f1b"), inference)
    ['--schedule 1f1b: the signature has no backward pass (not a training step), so its micro-batches run forward in order, one stage per device (gpipe)']
    >>> schedule_notes(resolve_strategy("pipeline"), inference)
    []
    """
    if not request.schedule or not plan.stages or plan.stages.schedule:
        return []
    return [f"--schedule {request.schedule}: the signature has no backward pass (not a "
            "training step), so its micro-batches run forward in order, one stage per "
            "device (gpipe)"]


def _request(strategy, algorithm, pipeline, microbatches, schedule, options):
    """``strategy`` if it is already a :class:`StrategyRequest`, else the request of the
    Python API's keywords (an op placement by the greedy when none is given)."""
    if isinstance(strategy, StrategyRequest):
        return strategy
    return resolve_strategy(strategy, algorithm, pipeline=pipeline, microbatches=microbatches,
                            schedule=schedule, options=options, default="placement")


def plan_model(model, cluster, *, batch_size=None, signature=None, algorithm=None,
               options=None, profiles=(), progress=None, pipeline=False, microbatches=None,
               schedule=None, tf32=None, strategy=None, whole_tables=False, op_libraries=(),
               inputs=None):
    """Read a model and plan how to spread it over a cluster, writing nothing.

    Parameters
    ----------
    model : str, pathlib.Path, keras.Model or tf.Module
        A SavedModel folder, or a model object exported into a temporary folder that is
        removed before this returns (:func:`tfpart.model_export.saved_model_folder`): a
        Keras model once built, a ``tf.Module`` whose one ``tf.function`` with an
        ``input_signature`` is its signature. An object is exported at every call (a
        second or more for a small CNN, often more than planning it): to plan one model
        many times, export it once (``model.export(folder)``) and pass the folder.
    cluster : tfpart.core.cluster.Cluster, str or pathlib.Path
        The cluster or its cluster.json (the shipped ones: :func:`tfpart.clusters.load`).
    batch_size : int, optional
        The batch planned for: unknown leading dimensions take it (default: the
        signature's, else 1).
    signature : str, optional
        The signature planned (default ``serving_default``, else the first).
    strategy, algorithm, options, pipeline, microbatches, schedule : optional
        What is planned: :func:`tfpart.strategy_request.resolve_strategy` of them (with
        none, an op placement by the greedy), or ``strategy`` itself if it is a
        :class:`~tfpart.strategy_request.StrategyRequest`. ``strategy="auto"`` plans an
        op placement (greedy), a pipeline, data-parallel replicas, a placement with
        filter splits and replicas of a placement or of a pipeline (hybrid), each with
        default options, and keeps the one of least predicted step. ``algorithm`` names
        an entry of :mod:`partitioner.registry`, ``options`` its options. With
        ``pipeline`` (implied by ``microbatches`` and ``schedule``) stages run over
        micro-batches, for throughput, instead of a placement for the latency of one
        batch; ``schedule`` (one of :data:`costmodel.schedules.SCHEDULES`) fixes a
        training step's pipeline schedule, else the fastest one within memory.
    profiles : sequence of paths, optional
        Measured profiles (``tfpart profile``, kernel tables) the cost model uses.
    tf32 : bool, optional
        Whether float32 matmuls run on TF32 units (default: the cluster's;
        :mod:`costmodel.roofline`).
    whole_tables : bool
        A table that fits no device is cut into row shards
        (:func:`tfpart.table_cuts.cut_tables`); one that fits is cut too when that plans
        where nothing else does or predicts a faster step
        (:func:`tfpart.table_cuts.faster_with_tables_cut`), unless ``whole_tables``.
    op_libraries : sequence, optional
        Modules or shared objects registering the model's custom ops, loaded before it
        is read (:func:`tfpart.op_libraries.load_op_libraries`); the plan records them.
    inputs : path, optional
        An ``.npz`` file of the signature's inputs (:mod:`rewriters.given_inputs`) that
        the probe for ops mixing a batch's samples runs on, instead of random ones.
    progress : callable, optional
        Called with the name of each step as it starts.

    Returns
    -------
    PlanResult
        The plan, its predicted step, the strategy chosen and each one's prediction.

    Examples
    --------
    >>> import tfpart
    >>> result = tfpart.plan_model(tfpart.examples.saved_model("residual_cnn"),
    ...                            tfpart.clusters.load("a100_l4_one_host"), batch_size=8)
    >>> result.strategy, result.step_time == result.plan.step_time
    ('greedy', True)
    """
    with saved_model_folder(model) as model_dir, long_lived_frozen() as freeze:
        planned = _plan_saved_model(model_dir, _cluster_of(cluster), batch_size=batch_size,
                                    signature=signature, algorithm=algorithm,
                                    options=options, profiles=profiles, progress=progress,
                                    pipeline=pipeline, microbatches=microbatches,
                                    schedule=schedule, tf32=tf32, strategy=strategy,
                                    whole_tables=whole_tables, op_libraries=op_libraries,
                                    inputs=inputs, freeze=freeze)
        _forget_temporary_folder(planned.plan, model)
    return planned


def _forget_temporary_folder(plan, model):
    """A plan of a model object names no original model: the folder it was exported
    into is removed (``tfpart checkpoint`` then asks for ``--original``)."""
    if not is_folder(model):
        plan.context.pop("model", None)


def _cluster_of(cluster):
    """``cluster`` itself if it is a :class:`~tfpart.core.cluster.Cluster`, else the
    cluster its file holds."""
    return cluster if isinstance(cluster, Cluster) else load_cluster(cluster)


def _plan_saved_model(model_dir, cluster, *, batch_size=None, signature=None,
                      algorithm=None, options=None, profiles=(), progress=None,
                      pipeline=False, microbatches=None, schedule=None, tf32=None,
                      strategy=None, whole_tables=False, op_libraries=(), inputs=None,
                      freeze=lambda: None):
    """:func:`plan_model` of the SavedModel folder ``model_dir`` for ``cluster`` (a
    :class:`~tfpart.core.cluster.Cluster`): analyse once, plan each strategy from the
    analysis, retry as the plans ask (:func:`_plan_each_within_headroom`,
    :func:`_retry_with_tables_cut`), keep the fastest. ``freeze`` is called once the
    analysis is made (:func:`tfpart.core.collector.long_lived_frozen`)."""
    request = _request(strategy, algorithm, pipeline, microbatches, schedule, options)
    check_planned_devices(cluster)
    analysis = analyse(model_dir, cluster, request, batch_size=batch_size,
                       signature=signature, profiles=profiles, tf32=tf32,
                       op_libraries=op_libraries, inputs=inputs, progress=progress)
    freeze()  # the model read and analysed lives to the end of the compile
    timings = analysis.timings
    t0 = time.perf_counter()
    if request.compares or get_algorithm(request.algorithms[0]).stages:
        # the batch-mixing check runs the model, which starts TensorFlow: let this
        # process run the plan on logical CPUs afterwards
        from tfpart.runtime import add_local_cpus

        add_local_cpus(len(cluster))
    names, refused = refused_strategies(analysis, request.algorithms)
    planner = _Planner(request, progress or (lambda name: None), " (the first run compiles "
                       "tfpart's numba kernels, once: about 25 s)" if kernels_to_compile()
                       else "")
    try:
        chosen = _plan_each_within_headroom(planner, analysis, names, refused)
    finally:  # an interrupted compile leaves the probe's daemon thread behind
        if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            analysis.settle()
    if not analysis.row_shards and not whole_tables:
        chosen = _retry_with_tables_cut(planner, chosen, names)
    if not chosen.tried:
        raise next(iter(chosen.failures.values()))
    best = min(chosen.tried, key=lambda name: chosen.tried[name][0].step_time)
    plan, mixing = chosen.tried[best]
    _record_row_shards(plan, chosen.analysis.row_shards)
    _whole_memory(plan, cluster, chosen.unread_on, chosen.unread)
    timings["partition"] = time.perf_counter() - t0
    plan.context = _plan_context(plan, chosen, profiles, mixing, op_libraries)
    compared = {name: tried[0].step_time for name, tried in chosen.tried.items()}
    failures = {name: failure.problem for name, failure in chosen.failures.items()}
    if request.compares:
        plan.context["strategy"] = {"chosen": best, "step_times": compared,
                                    "refused": failures}
        if chosen.other:
            plan.context["strategy"]["tables " + (
                "whole" if chosen.analysis.row_shards else "cut")] = chosen.other
    return PlanResult(plan=plan, step_time=plan.step_time, strategy=best, compared=compared,
                      refused=failures, graph=chosen.analysis.graph, cluster=cluster,
                      info=chosen.analysis.info, proto=analysis.proto, timings=timings,
                      cost=chosen.cost)


@dataclass(frozen=True)
class _Planner:
    """What every strategy of one compile is planned with beside the analysis: the
    request, the progress callback and the note on a first run's kernel compilation."""

    request: StrategyRequest
    step: object
    first_run: str = ""


@dataclass
class _Attempt:
    """Every strategy planned for one version of the model (its tables whole or cut)."""

    analysis: object  # tfpart.analysis.Analysis of that version
    cost: object
    unread: dict  # unread_variables()
    unread_on: int | None
    headroom: float
    tried: dict  # strategy -> (plan, ops that mix samples)
    failures: dict  # strategy -> why it has no plan
    other: dict = field(default_factory=dict)  # strategy -> step, with the tables cut or not

    @property
    def step_time(self):
        """The least predicted step of its plans (inf if none)."""
        return min((plan.step_time for plan, _ in self.tried.values()), default=math.inf)


def _plan_each_within_headroom(planner, analysis, names, known):
    """Every strategy of ``names`` planned from ``analysis`` (``known``: why others
    have none), with each device keeping ``MEMORY_HEADROOM`` of its memory free; the
    headroom retry: planned without it if no strategy fits so."""
    # a model with tables cut is rebuilt without the variables its signature never reads
    unread = unread_variables(analysis.info, analysis.cluster, kept=not analysis.row_shards)
    attempt = _plan_each(planner, analysis, names, known, unread, MEMORY_HEADROOM)
    if attempt.tried:
        return attempt
    return _plan_each(planner, analysis, names, known, unread, 0.0)


def _plan_each(planner, analysis, names, known, unread, headroom):
    """Every strategy of ``names`` planned from ``analysis`` for the cluster with
    ``headroom`` of each device's memory kept free: an :class:`_Attempt`. tfpart's own
    placements (strategies that make no stages, so never run the model) plan in a forked
    process while this one plans the rest (:func:`_forked_names`); the outcomes are
    those of planning each in turn, in the order of ``names``."""
    cluster, unread_on = planning_cluster(analysis.cluster, unread, headroom)
    with timed(analysis.timings, "cost"):
        cost = CostModel(analysis.graph, cluster, measured=analysis.measured,
                         tf32=analysis.tf32)
    try:
        check_kernels(cost)
    except PlacementError as exc:
        raise PlacementError(cluster.source, exc.problem) from None
    analysis.settle()  # no thread of this process runs TensorFlow while it forks
    beside = _forked_names(names)
    child = None
    if beside:
        planner.step(f"partitioning {len(cost.graph)} ops into "
                     f"{', '.join(get_algorithm(name).making for name in beside)}"
                     f" (in a second process){planner.first_run}")
        child = start_forked(lambda: {name: _planned(name, planner.request, cost, analysis)
                                      for name in beside})
    try:
        if planner.request.compares:
            _start_mixing_probe(analysis, planner.request, names)
        outcomes = {}
        for name in names:
            if name not in beside:
                planner.step(f"partitioning {len(cost.graph)} ops into "
                             f"{get_algorithm(name).making}{planner.first_run}")
                outcomes[name] = _planned(name, planner.request, cost, analysis)
        if child is not None:
            outcomes.update(_forked_outcomes(child, beside, planner.request, cost, analysis))
    except BaseException:
        if child is not None:
            child.cancel()
        raise
    tried, failures = {}, dict(known)
    for name in names:
        outcome = outcomes[name]
        if isinstance(outcome, Exception):
            failures[name] = type(outcome)(outcome.path or cluster.source, outcome.problem)
        else:
            tried[name] = outcome
    return _Attempt(analysis, cost, unread, unread_on, headroom, tried, failures)


def _forked_names(names):
    """The strategies of ``names`` planned in a forked process (:mod:`tfpart.core.forked`):
    tfpart's own that make no stages (they never run TensorFlow, which a forked process
    must not), when others are left for this process and forking can pay."""
    own = [name for name in names if not get_algorithm(name).stages
           and get_algorithm(name).partition.__module__.startswith("partitioner.")]
    return own if own and len(own) < len(names) and fork_can_pay() else []


def _planned(name, request, cost, analysis):
    """Strategy ``name``'s ``(plan, ops that mix samples)`` (:func:`_partition`), or the
    PlacementError or ModelError it raised."""
    chosen = get_algorithm(name)
    try:
        table_cuts.check_combines(chosen, analysis.row_shards, analysis.info,
                                  analysis.model_dir)
        return _partition(chosen, request, cost, analysis)
    except (PlacementError, ModelError) as exc:
        return exc


def _forked_outcomes(child, names, request, cost, analysis):
    """The forked process's outcomes of ``names``; planned here if it died."""
    try:
        return child.result()
    except ChildLost:
        return {name: _planned(name, request, cost, analysis) for name in names}


def _retry_with_tables_cut(planner, whole, names):
    """The table-cut retry: ``whole`` (the attempt with no table cut), or the strategies
    of ``names`` that combine with row shards planned again from the same analysis
    with the model's largest tables cut, if that plans where ``whole`` did not or
    predicts a faster step (:func:`tfpart.table_cuts.faster_with_tables_cut`)."""
    def plan_cut(graph, info, row_shards, usable):
        cut = whole.analysis.with_tables_cut(graph, info, row_shards)
        return _plan_each_within_headroom(planner, cut, usable, {})

    return table_cuts.faster_with_tables_cut(whole, names, plan_cut)


def _record_row_shards(plan, row_shards):
    """Write into ``plan`` the tables it cuts: each one's rows per shard and the device
    the plan put each shard on."""
    if row_shards:
        plan.row_shards = {table: RowShards(sizes, [plan.assignment[shard_name(table, i)]
                                                    for i in range(len(sizes))])
                           for table, sizes in row_shards.items()}


def _plan_context(plan, chosen, profiles, mixing, op_libraries):
    """plan.json's ``context``: what ``plan`` was made from (``chosen``, the
    :class:`_Attempt` it came from)."""
    from tfpart.op_libraries import recorded

    analysis, cost = chosen.analysis, chosen.cost
    info, cluster = analysis.info, cost.cluster
    context = {"model": str(analysis.model_dir), "cluster": cluster.name,
               "fusion_groups": info.fusion_groups,
               "unread_variables": chosen.unread, "memory_headroom": chosen.headroom,
               "cluster_file": cluster.source, "devices": cluster.device_names,
               "signature": info.signature, "format": info.format,
               "batch_size": info.batch_size, "tf32": cost.tf32,
               "profiles": [str(p) for p in profiles or ()], "inputs": {
                   k: [list(s), d] for k, (s, d) in info.inputs.items()},
               "figures": figures_basis(cost, links=cluster_links(cluster))}
    if op_libraries:
        context["op_libraries"] = recorded(op_libraries)
    composites = getattr(info.flat, "composites", ())
    if composites:  # a model the pipeline pass rebuilds takes their parts as tensors
        context["composite_inputs"] = [dataclasses.asdict(c) for c in composites]
    if mixing:
        context["samples_mixed_by"] = mixing[:10]
    if plan.reimported:
        from rewriters.endpoints import kept_endpoints

        context["kept"] = dict(kept_endpoints(analysis.proto, info.signature), runs=(
            "the original graph's nodes, placed by the plan" if info.format == "tf1" else
            "the original graphs, not pipelined, reading the placed variables"))
    return context


KERNEL_MODULES = ("costmodel.arrays", "costmodel.simulate", "partitioner.earliest_finish",
                  "partitioner.list_schedules", "partitioner.stage_dp")


def kernels_to_compile():
    """The numba kernels of tfpart (in :data:`KERNEL_MODULES`) with no compiled copy in
    numba's cache yet: the first compile after install compiles them.

    >>> isinstance(kernels_to_compile(), list)
    True
    """
    import importlib

    from numba.core.dispatcher import Dispatcher

    missing = []
    for name in KERNEL_MODULES:
        for kernel in vars(importlib.import_module(name)).values():
            cache = getattr(kernel, "_cache", None) if isinstance(kernel, Dispatcher) else None
            index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
            if index and not Path(index).exists():
                missing.append(f"{name}.{kernel.py_func.__name__}")
    return missing


def _partition(chosen, request, cost, analysis):
    """``chosen``'s plan for ``request`` from ``analysis`` (and the ops that mix a
    batch's samples, if it uses micro-batches and some do: then it keeps whole
    batches). Replicas of a batch that some op mixes are refused, naming the op."""
    settings = algorithm_options(chosen.name, None if request.compares else request.options)
    info, model_dir = analysis.info, analysis.model_dir
    mixing = []
    if chosen.stages:
        fields = {f.name for f in dataclasses.fields(settings)}
        if "batch_size" in fields:
            _check_batch_option(settings, info.batch_size)
        microbatches = request.microbatches
        if chosen.microbatches and microbatches is None:
            microbatches = settings.microbatches
        mixing = _samples_mixed_by(analysis, microbatches)
        if mixing and chosen.replicates:
            raise PlacementError(model_dir, f"op {mixing[0][0]} mixes the samples of a batch "
                                 f"({mixing[0][1]}), so replicas of it would change the "
                                 "outputs")
        # what the algorithm declares it takes (partitioner.registry), in its options
        given = {"batch_size": info.batch_size} if "batch_size" in fields else {}
        if chosen.microbatches:
            given["microbatches"] = 1 if mixing else microbatches
        if chosen.schedules and request.schedule:
            given["schedule"] = request.schedule
        settings = dataclasses.replace(settings, **given)
        if getattr(settings, "microbatches", None) is not None:
            check_microbatches(settings.microbatches, info.batch_size, len(cost.graph),
                               model_dir, MAX_COMPILED_OPS, "to compile")
        if getattr(settings, "max_microbatches", 0) > MAX_MICROBATCHES:
            raise PlacementError(model_dir, f"max_microbatches {settings.max_microbatches}: "
                                 f"at most {MAX_MICROBATCHES} micro-batches per batch")
        if "max_microbatches" in fields:  # a count chosen here stays within the bound too
            settings = dataclasses.replace(settings, max_microbatches=min(
                settings.max_microbatches, largest_microbatches(len(cost.graph))))
    return chosen.partition(cost, options=settings), mixing


def _check_batch_option(settings, batch_size):
    """A stage-building algorithm's ``batch_size`` option is the model's batch size:
    one set otherwise (``--option batch_size=``) is refused, not overwritten.

    >>> from partitioner.pipeline_stages import PipelineOptions
    >>> _check_batch_option(PipelineOptions(), 8)
    >>> _check_batch_option(PipelineOptions(batch_size=4), 8)
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: --option batch_size=4: the batch size is the model's (8; set it with --batch-size)
    """
    default = next(f.default for f in dataclasses.fields(settings) if f.name == "batch_size")
    if settings.batch_size not in (default, batch_size):
        raise PlacementError("", f"--option batch_size={settings.batch_size}: the batch size "
                             f"is the model's ({batch_size}; set it with --batch-size)")


def compile_model(model, cluster, out, *, batch_size=None, signature=None,
                  algorithm=None, options=None, profiles=(), force=False, progress=None,
                  pipeline=False, microbatches=None, schedule=None, verify=False, tf32=None,
                  strategy=None, whole_tables=False, op_libraries=(), inputs=None):
    """Compile a model for a cluster: plan it, rewrite it, write it to ``out``.

    Parameters
    ----------
    model : str, pathlib.Path, keras.Model or tf.Module
        A SavedModel folder, or a model object exported into a temporary folder removed
        before this returns, as :func:`plan_model` takes it.
    cluster : tfpart.core.cluster.Cluster, str or pathlib.Path
        The cluster or its cluster.json (the shipped ones: :func:`tfpart.clusters.load`).
    out : str or pathlib.Path
        The folder the compiled SavedModel is written to, with plan.json and
        report.html; with ``force``, one tfpart wrote before is replaced.
    verify : bool
        Run the compiled model against the original (:func:`tfpart.verification.verify`,
        on one logical CPU per device: made here unless TensorFlow started with fewer,
        :func:`tfpart.runtime.ensure_local_cpus`) before it is moved into place: an
        error there, or a failed verification
        (:class:`~tfpart.core.errors.VerificationError`), leaves no output behind.
    inputs : path, optional
        An ``.npz`` file of the signature's inputs that verification and the
        batch-mixing probe run on (:mod:`rewriters.given_inputs`).
    batch_size, signature, strategy, algorithm, options, pipeline, microbatches, schedule, profiles, tf32, whole_tables, op_libraries, progress
        As :func:`plan_model` takes them (by default an op placement by the greedy;
        ``strategy="auto"``: the fastest strategy), resolved before any work; plan.json
        records the op libraries.

    Returns
    -------
    CompileResult
        What :func:`plan_model` gives, the output folder, notes for the user and the
        verification's report (``None`` without ``verify``).

    Examples
    --------
    >>> import tempfile, tfpart
    >>> out = tempfile.mkdtemp() + "/compiled"
    >>> result = tfpart.compile_model(tfpart.examples.saved_model("residual_cnn"),
    ...                               tfpart.clusters.load("local_3cpu"), out)
    >>> len(result.plan.devices_used()) > 1, (result.out / "plan.json").is_file()
    (True, True)
    """
    request = _request(strategy, algorithm, pipeline, microbatches, schedule, options)
    cluster = _cluster_of(cluster)
    with saved_model_folder(model) as model_dir, long_lived_frozen() as freeze:
        check_inputs_outside(out, [model_dir, *([cluster.source] if cluster.source else []),
                                   *(profiles or ()), *([inputs] if inputs else [])])
        # twice the model: the rewriters' working copy and the output
        check_free_space(out, 2 * folder_bytes(model_dir))
        staging = new_staging_folder(out, force)  # fails on an unwritable output first
        if verify:  # planning may start TensorFlow: make the devices to verify on first
            from tfpart.runtime import ensure_local_cpus

            ensure_local_cpus(len(cluster))
        with removed_on_failure(staging):
            planned = plan_model(model_dir, cluster, batch_size=batch_size,
                                 signature=signature, profiles=profiles, progress=progress,
                                 tf32=tf32, strategy=request, whole_tables=whole_tables,
                                 op_libraries=op_libraries, inputs=inputs)
            _forget_temporary_folder(planned.plan, model)
            freeze()  # the plan, its cost model and the model read: kept to the end
            result = _compile_into(staging, model_dir, cluster, out, planned,
                                   profiles=profiles, force=force, progress=progress,
                                   verify=verify, inputs=inputs)
    return dataclasses.replace(result, notes=result.notes + schedule_notes(request, result.plan))


def _compile_into(staging, model_dir, cluster, out, planned, *, profiles, force, progress,
                  verify, inputs=None):
    """Rewrite ``model_dir`` by the plan of :func:`plan_model`'s ``planned`` into
    ``staging``, verify it if asked and move it to ``out``."""
    from rewriters.passes import run_rewriters
    from rewriters.savedmodel_io import SavedModelParts, save

    plan, graph, info, proto, timings = (planned.plan, planned.graph, planned.info,
                                         planned.proto, planned.timings)
    step = progress or (lambda name: None)
    extra = {"plan.json": plan.to_json(Path(out) / "plan.json")}
    reports = []
    inner = {}  # the phases check_staged runs inside the write

    def check_staged(staging):
        """Verify (if asked) and write the report into the output before it moves in."""
        if verify:
            from tfpart.verification import verify as run_and_compare

            step("running the original and compiled models")
            with timed(inner, "verify"):
                reports.append(run_and_compare(model_dir, staging, inputs=inputs))
            if not reports[-1].ok:
                raise VerificationError(out, f"not written: {reports[-1].problem}")
        step("drawing the placement")
        with timed(inner, "picture"):
            picture = placement_section(plan, graph)
        step("writing the report")
        with timed(inner, "report"):
            write_report(plan, graph, cluster, Path(staging) / REPORT_FILE,
                         verification=reports[0] if reports else None,
                         timings={**timings, **inner}, picture=picture,
                         run=_simulated_step(planned, profiles))

    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    with os_errors(out, also=(tf.errors.OpError,)), temporary_folder(out, "rewrite") as workdir:
        with timed(timings, "rewrite"):
            rewritten = run_rewriters(SavedModelParts(proto, Path(model_dir), info.flat), plan,
                                      Path(workdir),
                                      progress=lambda name: step(f"rewriting: {name}"))
        step("writing the compiled SavedModel")
        with timed(timings, "write"):
            save(rewritten, out, force=force, extra_files=extra, check=check_staged,
                 staging=staging)
    timings["write"] -= sum(inner.values())
    timings.update(inner)
    return CompileResult(**{f.name: getattr(planned, f.name)
                            for f in dataclasses.fields(PlanResult)},
                         out=Path(out), notes=profile_notes(profiles, cluster),
                         verification=reports[0] if reports else None)


def _simulated_step(planned, profiles):
    """The simulated step of ``planned``'s plan (:func:`costmodel.execution.
    simulate_execution`) on the cost model it was planned with, whose graph arrays and
    derived tables are built already (a new one only for a :class:`PlanResult` made
    without it)."""
    from costmodel.execution import simulate_execution

    cost = planned.cost or CostModel(planned.graph, planned.cluster, tf32=planned.plan.context.get(
        "tf32"), measured=load_profiles(profiles, planned.cluster))
    return simulate_execution(planned.plan, cost)


def simulate_model(model_dir, plan_file, *, cluster_file=None, profiles=None,
                   op_libraries=()):
    """Read a model and a plan.json and simulate the plan; (run, plan): ``run`` is the
    :class:`~costmodel.execution.PlanRun` of its execution graph, whatever strategy
    made it. The op libraries the plan names and ``op_libraries`` are loaded before the
    model is read. The plan is checked against the
    cluster before the model is read (:func:`check_plan_devices`, its batch size and
    micro-batches within :mod:`tfpart.core.limits`) and against the model after
    (:func:`check_plan_ops`): PlacementError naming the plan file otherwise."""
    from costmodel.execution import simulate_execution
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import read_saved_model
    from tfpart.core.limits import check_batch_size
    from tfpart.core.plan import Plan
    from tfpart.op_libraries import check_op_libraries, load_op_libraries

    plan = Plan.load(plan_file)
    check_op_libraries(plan.op_libraries, plan_file)
    batch_size = plan.context.get("batch_size")
    if batch_size is not None:
        check_batch_size(batch_size, plan_file, "context.batch_size")
    check_microbatches(plan.microbatches, batch_size, source=plan_file)
    cluster_file = cluster_file or plan.context.get("cluster_file")
    if not cluster_file:
        raise PlacementError(plan_file, "names no cluster file; pass --cluster")
    cluster = load_cluster(cluster_file)
    check_planned_devices(cluster)
    check_plan_devices(plan, cluster, plan_file)
    profiles = plan.context.get("profiles", []) if profiles is None else profiles
    measured = load_profiles(profiles, cluster)
    load_op_libraries(plan.op_libraries, plan_file)
    load_op_libraries(op_libraries)
    proto = read_saved_model(model_dir)
    graph, info = read_model(proto, model_dir, batch_size=batch_size,
                             signature=plan.context.get("signature"))
    if plan.row_shards:
        from rewriters.reader import read_with_row_shards

        try:
            graph, _ = read_with_row_shards(proto, model_dir, info, {
                table: shards.sizes for table, shards in plan.row_shards.items()})
        except PlacementError as exc:
            raise PlacementError(plan_file, exc.problem) from None
    check_plan_ops(plan, graph, plan_file)
    check_microbatches(plan.microbatches, ops=len(graph), source=plan_file)
    cost = CostModel(graph, cluster, measured=measured, tf32=plan.context.get("tf32"))
    try:
        return simulate_execution(plan, cost), plan
    except PlacementError as exc:
        raise PlacementError(plan_file, exc.problem) from None


def check_plan_devices(plan, cluster, source):
    """PlacementError naming ``source`` if ``plan`` names a device ``cluster`` lacks
    or a stage past the cluster's devices (one device per stage).

    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from tfpart.core.plan import Plan
    >>> check_plan_devices(Plan(assignment={"a": "/device:GPU:0"}),
    ...                    cluster_of_devices(["cpu"]), "plan.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: plan.json: places ops on /device:GPU:0, which the cluster 'uniform' does not have
    """
    unknown = sorted(set(plan.devices_used()) - set(cluster.device_names))
    if unknown:
        raise PlacementError(source, f"places ops on {unknown[0]}, which the cluster "
                             f"{cluster.source or repr(cluster.name)} does not have"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    stages = set((plan.stages or {}).values())
    if stages and max(stages) >= len(cluster):
        raise PlacementError(source, f"has stage {max(stages)}, but a cluster of "
                             f"{len(cluster)} devices runs at most {len(cluster)} stages")


def check_plan_ops(plan, graph, source):
    """PlacementError naming ``source`` unless ``plan`` places exactly the ops of
    ``graph`` (no field of :meth:`~tfpart.core.plan.Plan.placed_ops` names one it
    lacks).

    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.plan import Plan
    >>> g = OpGraph(); g.add_op("a"); g.add_op("b")
    >>> check_plan_ops(Plan(assignment={"a": "A", "b": "A", "c": "A"}), g, "plan.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: plan.json: places 1 op the model does not have, e.g. c (was the plan made for another model or batch size?)
    >>> check_plan_ops(Plan(assignment={"a": "A"}), g, "plan.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: plan.json: does not place 1 op of the model, e.g. b (was the plan made for another model or batch size?)
    """
    missing = [op for op in graph.ops if op not in plan.assignment]
    if missing:
        raise PlacementError(source, f"does not place {len(missing)} op"
                             f"{'s' * (len(missing) > 1)} of the model, e.g. {missing[0]} "
                             "(was the plan made for another model or batch size?)")
    for where, ops in plan.placed_ops().items():
        extra = [op for op in ops if op not in graph.ops]
        if extra:
            field = "" if where == "assignment" else f" (in {where})"
            raise PlacementError(source, f"places {len(extra)} op{'s' * (len(extra) > 1)} "
                                 f"the model does not have{field}, e.g. {extra[0]} (was the "
                                 "plan made for another model or batch size?)")
