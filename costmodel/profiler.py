"""Measure every op of a model on the local device (TensorFlow's own step stats).

The signature is inlined exactly as the reader inlines it (so op names match the
OpGraph), imported into a TensorFlow session with one inter-op thread (ops run one at a
time, as the simulator assumes) and ``intra_threads`` intra-op threads, its variables
set to random values, and run on random inputs: ``warmup`` untimed runs, then
``repeats`` runs traced with ``RunOptions.FULL_TRACE``. Each op's time is the median of
its traced durations. Grappler's remapper (op fusion) is turned off so that every op
is measured as itself; ops Grappler still removes (constant folding, pruning) are
recorded as taking no time, as they do at run time.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections import defaultdict

import numpy as np

from costmodel.measured import MeasuredProfile, shape_key


def hardware_description(intra_threads):
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "logical_cores": os.cpu_count(), "intra_op_threads": intra_threads,
            "inter_op_threads": 1, "platform": platform.platform()}


def session_config(intra_threads, fuse=False):
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

    config = config_pb2.ConfigProto(intra_op_parallelism_threads=intra_threads,
                                    inter_op_parallelism_threads=1)
    if not fuse:
        config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF
    return config


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


def random_feeds(graph, inputs, rng):
    """Random values for the flattened signature's placeholders."""
    feeds = {}
    for placeholder, shape, _ in inputs.values():
        tensor = graph.get_tensor_by_name(f"{placeholder}:0")
        if tensor.dtype.is_floating:
            value = rng.standard_normal(shape)
        elif tensor.dtype.is_integer or tensor.dtype.is_bool:
            value = rng.integers(0, 2, size=shape)
        else:
            value = np.full(shape, b"tfpart", dtype=object)
        feeds[tensor] = np.asarray(value).astype(tensor.dtype.as_numpy_dtype)
    return feeds


def claim_threads(intra_threads):
    """Give TensorFlow ``intra_threads`` intra-op threads, which is only possible before
    it starts: its CPU device keeps the thread pool it was created with."""
    from rewriters.tf_import import tensorflow
    from tfpart.errors import ProfileError

    tf = tensorflow()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        if tf.config.threading.get_intra_op_parallelism_threads() != intra_threads:
            raise ProfileError("", "TensorFlow already started in this process with other "
                               "thread settings; profile in a fresh process "
                               "(tfpart profile)") from None


def measure_ops(flat, graph, *, repeats, warmup, intra_threads, seed=0):
    """Median seconds per op name, and the median untraced step time."""
    from tensorflow.core.protobuf import config_pb2

    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    rng = np.random.default_rng(seed)
    with graph.as_default():
        init = _initialise_variables(tf, graph, rng)
    fetches = [graph.get_tensor_by_name(t) for t in flat.outputs]
    feeds = random_feeds(graph, flat.inputs, rng)
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
        durations = defaultdict(list)
        for _ in range(repeats):
            metadata = config_pb2.RunMetadata()
            session.run(fetches, feeds, options=options, run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    nanos = node.op_end_rel_nanos - node.op_start_rel_nanos
                    durations[node.node_name].append(max(nanos, 0) / 1e9)
    return ({name: statistics.median(times) for name, times in durations.items()},
            statistics.median(walls))


def profile_model(model_dir, batch_size=None, *, signature=None, repeats=20, warmup=5,
                  intra_threads=1, device_kind="cpu", progress=None):
    """Measure a SavedModel's ops here; return a fitted :class:`MeasuredProfile`."""
    from rewriters.reader import flatten_signature, import_flat, read_model
    from rewriters.savedmodel_io import read_saved_model
    from rewriters.tf_import import tensorflow
    from tfpart.cluster import load_device_kinds

    step = progress or (lambda message: None)
    claim_threads(intra_threads)
    step("reading the SavedModel")
    proto = read_saved_model(model_dir)
    opgraph, info = read_model(proto, model_dir, batch_size, signature)
    flat = flatten_signature(proto, model_dir, info.batch_size, info.signature)
    step(f"running {len(opgraph)} ops {warmup + 2 * repeats} times")
    t0 = time.perf_counter()
    per_op, step_time = measure_ops(flat, import_flat(flat, model_dir), repeats=repeats,
                                    warmup=warmup, intra_threads=intra_threads)
    by_key = defaultdict(list)
    for name, attrs in opgraph.ops.items():
        if attrs["op_type"] == "VarHandleOp" and name not in per_op:
            continue  # variables the signature does not read
        key = shape_key(attrs["op_type"], attrs["input_shapes"])
        by_key[key].append((per_op.get(name, 0.0), attrs))
    ops = [{"op_type": entries[0][1]["op_type"],
            "input_shapes": [list(s) for s in entries[0][1]["input_shapes"]],
            "time_s": statistics.median(t for t, _ in entries), "count": len(entries),
            "flops": entries[0][1]["flops"], "bytes_accessed": entries[0][1]["bytes_accessed"]}
           for _, entries in sorted(by_key.items())]
    kind = load_device_kinds()[device_kind]
    return MeasuredProfile.from_measurements(
        device_kind, ops, kind, model=str(model_dir), signature=info.signature,
        batch_size=info.batch_size, tensorflow=tensorflow().__version__,
        hardware=hardware_description(intra_threads), repeats=repeats, warmup=warmup,
        step_time_s=step_time, profiling_seconds=time.perf_counter() - t0)
