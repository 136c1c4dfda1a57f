"""Measure every op of a model on the local device (TensorFlow's own step stats).

The signature is inlined exactly as the reader inlines it (so op names match the
OpGraph), imported into a TensorFlow session with one inter-op thread (ops run one at a
time, as the simulator assumes) and ``intra_threads`` intra-op threads, its variables
set to random values, and run on random inputs: ``warmup`` untimed runs, then
``repeats`` runs traced with ``RunOptions.FULL_TRACE``. Each op's time is the median of
its traced durations.

Grappler runs as it does in production, so what is timed is what TensorFlow runs: a
fused kernel (``_FusedConv2D`` standing for Conv2D + BiasAdd + Relu) reports its time
under one member's name, and that time is shared among the members of its fusion
group (:mod:`rewriters.fusion`) in proportion to their roofline times, so no compute op
of a group is recorded at zero. Ops Grappler removes for other reasons (constant
folding, pruning) are recorded as taking no time, as they do at run time. The profile
records whether oneDNN was on and the CPU's instruction-set flags, which decide what
Grappler fuses and how fast the kernels are. The executor's time between ops (the
dispatch overhead added to every op) is read from the traces (:func:`idle_per_op`);
with the median time of the ops that do almost no work it gives the host's cost of
running one op (``host_dispatch_s``: :func:`costmodel.measured.host_dispatch_figure`),
which prices this host issuing ops to a GPU (:mod:`costmodel.lanes`).
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections import defaultdict

import numpy as np

from costmodel.measured import MeasuredProfile, shape_key


# Instruction sets that change which kernels TensorFlow picks (and oneDNN's default).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_bf16", "amx_int8", "asimd", "sve")


def cpu_model_and_flags():
    """The CPU's model name and the :data:`ISA_FLAGS` it has (from /proc/cpuinfo)."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return model, sorted(f for f in ISA_FLAGS if f in flags)


def onednn_enabled():
    """Whether TensorFlow runs with its oneDNN optimisations in this process."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def hardware_description(intra_threads, cores=None):
    model, flags = cpu_model_and_flags()
    return {"cpu": model, "cpu_flags": flags, "onednn": onednn_enabled(), "pinned_cores": cores,
            "logical_cores": os.cpu_count(), "intra_op_threads": intra_threads,
            "inter_op_threads": 1, "platform": platform.platform()}


def hardware_mismatch(profile):
    """One sentence saying how the machine a profile was measured on differs from this
    one in what decides TensorFlow's kernels (oneDNN, instruction sets), or None."""
    measured = profile.meta.get("hardware", {})
    here = {"onednn": onednn_enabled(), "cpu_flags": cpu_model_and_flags()[1]}
    differences = []
    if "onednn" in measured and measured["onednn"] != here["onednn"]:
        differences.append(f"oneDNN {'on' if measured['onednn'] else 'off'} there, "
                           f"{'on' if here['onednn'] else 'off'} here")
    if "cpu_flags" in measured and set(measured["cpu_flags"]) != set(here["cpu_flags"]):
        only_there = sorted(set(measured["cpu_flags"]) - set(here["cpu_flags"]))
        only_here = sorted(set(here["cpu_flags"]) - set(measured["cpu_flags"]))
        differences.append("CPU flags " + "; ".join(
            part for part in (f"{' '.join(only_there)} only there" if only_there else "",
                              f"{' '.join(only_here)} only here" if only_here else "")
            if part))
    if not differences:
        return None
    return (f"measured on another kind of CPU setup ({', '.join(differences)}); its times "
            "may not hold here")


def session_config(intra_threads):
    from tensorflow.core.protobuf import config_pb2

    return config_pb2.ConfigProto(intra_op_parallelism_threads=intra_threads,
                                  inter_op_parallelism_threads=1)


def attribute_fused_times(per_op, fusion_groups, opgraph, kind):
    """Share each fusion group's measured time (its fused kernel reports under one
    member's name) among its members in proportion to their roofline times on
    ``kind``; returns a new op -> seconds dict.

    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> g = OpGraph()
    >>> g.add_op("conv", op_type="Conv2D", flops=9e6, bytes_accessed=1e5)
    >>> g.add_op("bias", op_type="BiasAdd", flops=1e4, bytes_accessed=8e4)
    >>> times = attribute_fused_times({"bias": 1e-3}, [["bias", "conv"]], g,
    ...                               load_device_kinds()["cpu"])
    >>> times["conv"] > times["bias"] > 0, round(sum(times.values()), 9)
    (True, 0.001)
    """
    from costmodel.roofline import roofline_time

    times = dict(per_op)
    for members in fusion_groups:
        measured = sum(per_op.get(m, 0.0) for m in members)
        weights = {m: roofline_time(opgraph.ops[m]["op_type"], opgraph.ops[m]["flops"],
                                    opgraph.ops[m]["bytes_accessed"], kind, overhead=0.0)
                   for m in members if m in opgraph}
        total = sum(weights.values())
        if measured <= 0 or total <= 0:
            continue
        for member, weight in weights.items():
            times[member] = measured * weight / total
    return times


def _initialise_variables(tf, graph, rng):
    assigns = []
    for op in graph.get_operations():
        if op.type == "VarHandleOp":
            shape = tf.TensorShape(op.get_attr("shape")).as_list()
            dtype = tf.dtypes.as_dtype(op.get_attr("dtype"))
            value = (rng.standard_normal(shape) * 0.05 if dtype.is_floating
                     else np.zeros(shape)).astype(dtype.as_numpy_dtype)
            assigns.append(tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value))
    return tf.group(*assigns)


def random_feeds(graph, inputs, rng, composites=(), rows=1):
    """Random values for the flattened signature's placeholders (``inputs``: key ->
    (placeholder, shape, dtype)); the components of a ragged or sparse input
    (``composites``) a valid value of its spec with ``rows`` rows, one value per row
    where the spec leaves a row's length open, as the flattened signature has them
    (:func:`rewriters.composite_inputs.composite_value`)."""
    from rewriters.composite_inputs import composite_value

    def tensor(key):
        return graph.get_tensor_by_name(f"{inputs[key][0]}:0")

    def draw(key, shape):
        dtype = tensor(key).dtype
        if dtype.is_floating:
            value = rng.standard_normal(shape)
        elif dtype.is_integer or dtype.is_bool:
            value = rng.integers(0, 2, size=shape)
        else:
            value = np.full(shape, b"tfpart", dtype=object)
        return np.asarray(value).astype(dtype.as_numpy_dtype)

    values = {}
    for composite in composites:
        values.update(composite_value(composite, rows, rng, draw, length=1))
    for key, (_, shape, _) in inputs.items():
        if key not in values:
            values[key] = draw(key, shape)
    return {tensor(key): value for key, value in values.items()}


def with_open_composites(flat):
    """``flat`` (a :class:`rewriters.flat_signature.FlatSignature`) with the batch
    dimensions of its ragged and sparse inputs' placeholders left open: flattened, they
    hold one value per row, which a ragged dimension of fixed length contradicts."""
    import dataclasses

    if not flat.composites:
        return flat
    placeholders = {flat.inputs[key][0] for composite in flat.composites
                    for key in composite.keys}
    graph_def = type(flat.graph_def)()
    graph_def.CopyFrom(flat.graph_def)
    for node in graph_def.node:
        for axis in flat.batch_axes.get(node.name, ()) if node.name in placeholders else ():
            node.attr["shape"].shape.dim[axis].size = -1
    return dataclasses.replace(flat, graph_def=graph_def)


def claim_threads(intra_threads):
    """Give TensorFlow ``intra_threads`` intra-op threads, which is only possible before
    it starts: its CPU device keeps the thread pool it was created with. The process is
    also pinned to that many cores, since a session's kernels otherwise spread over
    every core whatever its thread settings (measured: one intra-op thread timed the
    example CNN at 21 ms unpinned, 34 ms pinned to one core, as a pinned worker runs it).
    Returns the cores pinned to (None where the OS cannot pin)."""
    from rewriters.tf_import import tensorflow
    from tfpart.core.errors import ProfileError

    cores = None
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))[:intra_threads]
        os.sched_setaffinity(0, cores)
    tf = tensorflow()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        if tf.config.threading.get_intra_op_parallelism_threads() != intra_threads:
            raise ProfileError("", "TensorFlow already started in this process with other "
                               "thread settings; profile in a fresh process "
                               "(tfpart profile)") from None
    return cores


def measure_ops(flat, graph, *, repeats, warmup, intra_threads, seed=0):
    """Median seconds per op name, the median untraced step time, and the median
    executor time between ops (:func:`idle_per_op` of each traced step)."""
    from tensorflow.core.protobuf import config_pb2

    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    rng = np.random.default_rng(seed)
    with graph.as_default():
        init = _initialise_variables(tf, graph, rng)
    fetches = [graph.get_tensor_by_name(t) for t in flat.outputs]
    feeds = random_feeds(graph, flat.inputs, rng, flat.composites, flat.info.batch_size)
    with tf.compat.v1.Session(graph=graph, config=session_config(intra_threads)) as session:
        session.run(init)
        for _ in range(warmup):
            session.run(fetches, feeds)
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            session.run(fetches, feeds)
            walls.append(time.perf_counter() - t0)
        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
        durations, idle = defaultdict(list), []
        for _ in range(repeats):
            metadata = config_pb2.RunMetadata()
            session.run(fetches, feeds, options=options, run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    nanos = node.op_end_rel_nanos - node.op_start_rel_nanos
                    durations[node.node_name].append(max(nanos, 0) / 1e9)
            idle.append(idle_per_op([[(node.all_start_nanos / 1e9, (node.all_start_nanos +
                                                                     node.all_end_rel_nanos) / 1e9)
                                      for node in device.node_stats]
                                     for device in metadata.step_stats.dev_stats]))
    return ({name: statistics.median(times) for name, times in durations.items()},
            statistics.median(walls), statistics.median(idle))


def idle_per_op(devices):
    """Seconds each device's executor spent between ops, per op: the span of its ops'
    ``(start, end)`` intervals less the time some op ran, summed over ``devices`` (a
    list of interval lists), over all their ops.

    This is the dispatch overhead a profile adds to every op. It is read from the trace,
    not from the step time less the ops' median times: one slow op among ops of the same
    type and shapes (a read of a large variable TensorFlow copies, among reads of small
    ones) would otherwise be spread over every op.

    >>> idle_per_op([[(0.0, 1.0), (1.5, 2.0), (1.8, 3.0)], [(0.0, 0.5)]])
    0.125
    """
    idle, count = 0.0, 0
    for intervals in filter(None, devices):
        ordered = sorted(intervals)
        busy, reach = 0.0, -math.inf
        for start, end in ordered:
            busy += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        idle += reach - ordered[0][0] - busy
        count += len(ordered)
    return idle / count if count else 0.0


def profile_model(model_dir, batch_size=None, *, signature=None, repeats=20, warmup=5,
                  intra_threads=1, device_kind="cpu", progress=None):
    """Measure a SavedModel's ops here; return a fitted :class:`MeasuredProfile`."""
    from rewriters.flat_signature import import_flat
    from rewriters.flatten import flat_at
    from rewriters.reader import read_model
    from rewriters.savedmodel_io import read_saved_model
    from rewriters.tf_import import tensorflow
    from tfpart.core.device_kinds import load_device_kinds

    step = progress or (lambda message: None)
    cores = claim_threads(intra_threads)
    step("reading the SavedModel")
    proto = read_saved_model(model_dir)
    opgraph, info = read_model(proto, model_dir, batch_size, signature)
    flat = flat_at(proto, model_dir, info.batch_size, info.signature, info.flat)
    step(f"running {len(opgraph)} ops {warmup + 2 * repeats} times")
    t0 = time.perf_counter()
    graph = import_flat(with_open_composites(flat), model_dir)
    per_op, step_time, dispatch = measure_ops(flat, graph, repeats=repeats, warmup=warmup,
                                              intra_threads=intra_threads)
    kind = load_device_kinds()[device_kind]
    per_op = attribute_fused_times(per_op, info.fusion_groups, opgraph, kind)
    by_key = defaultdict(list)
    for name, attrs in opgraph.ops.items():
        key = shape_key(attrs["op_type"], attrs["input_shapes"])
        by_key[key].append((per_op.get(name, 0.0), attrs))
    ops = [{"op_type": entries[0][1]["op_type"],
            "input_shapes": [list(s) for s in entries[0][1]["input_shapes"]],
            "time_s": statistics.median(t for t, _ in entries), "count": len(entries),
            "flops": entries[0][1]["flops"], "bytes_accessed": entries[0][1]["bytes_accessed"]}
           for _, entries in sorted(by_key.items())]
    return MeasuredProfile.from_measurements(
        device_kind, ops, kind, model=str(model_dir), signature=info.signature,
        batch_size=info.batch_size, tensorflow=tensorflow().__version__,
        hardware=hardware_description(intra_threads, cores), repeats=repeats, warmup=warmup,
        step_time_s=step_time, dispatch_overhead_s=dispatch,
        profiling_seconds=time.perf_counter() - t0)
