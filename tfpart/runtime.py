"""Loading and running compiled models with stock TensorFlow, and verifying them.

``load`` is the Python API's front door; in plain TensorFlow it is::

    tf.saved_model.load(path, options=tf.saved_model.LoadOptions(
        experimental_variable_policy=
            tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES))

``verify`` runs an original and a compiled SavedModel on the same random inputs and
reads, from TensorFlow's own run metadata, on which device every op ran.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rewriters.tf_import import tensorflow
from tfpart.errors import ModelError, TfpartError, first_line, model_errors

connected = False  # set once this process is a client of a cluster (see connect)
RUNTIME_OPS = {"_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval",
               "_DeviceArg", "_DeviceRetval", "NoOp"}


def load(path):
    """Load a compiled SavedModel with its variables on the devices it names."""
    tf = tensorflow()
    options = tf.saved_model.LoadOptions(
        experimental_variable_policy=tf.saved_model.experimental.VariablePolicy
        .SAVE_VARIABLE_DEVICES)
    return tf.saved_model.load(str(path), options=options)


def ensure_local_cpus(count):
    """Make at least ``count`` logical CPU devices, if TensorFlow has not started yet."""
    tf = tensorflow()
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        current = tf.config.get_logical_device_configuration(cpu) or [None]
        if len(current) < count:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # already initialised: use what exists
    have = len(tf.config.list_logical_devices("CPU"))
    if have < count:
        raise TfpartError("", f"the plan needs {count} devices but only {have} logical CPU "
                          "devices exist in this process (TensorFlow started before tfpart "
                          "could add more)")


def set_threads(intra=None, inter=None):
    """Threads TensorFlow may use in this process (before it starts)."""
    tf = tensorflow()
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)


def cluster_spec(cluster):
    tf = tensorflow()
    if not cluster.tf_cluster:
        raise TfpartError(cluster.source, "has no 'cluster' block (job -> task addresses)")
    return tf.train.ClusterSpec(cluster.tf_cluster)


def start_server(cluster, task, job=None, intra_threads=None, inter_threads=None):
    """Start this task's ``tf.distribute.Server`` for ``cluster``; return it."""
    tf = tensorflow()
    spec = cluster_spec(cluster)
    job = job or sorted(cluster.tf_cluster)[0]
    if job not in cluster.tf_cluster or not 0 <= task < len(cluster.tf_cluster[job]):
        raise TfpartError(cluster.source, f"has no task {task} in job {job!r}")
    address = cluster.tf_cluster[job][task]
    _check_port_free(cluster, job, task, address)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra_threads or 0,
                                      inter_op_parallelism_threads=inter_threads or 0)
    try:
        return tf.distribute.Server(spec, job_name=job, task_index=task, config=config,
                                    start=True)
    except (tf.errors.OpError, ValueError) as exc:
        raise TfpartError(cluster.source, f"cannot start {job} task {task} at "
                          f"{address}: {str(exc).splitlines()[0]}") from None


def _split_address(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "localhost", int(port)


def _check_port_free(cluster, job, task, address):
    """gRPC may share a port with another server (SO_REUSEPORT); refuse instead."""
    host, port = _split_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("" if host in ("localhost", "0.0.0.0") else host, port))
        except OSError as exc:
            raise TfpartError(cluster.source, f"cannot start {job} task {task}: port {port} "
                              f"of {address} is already in use ({exc.strerror})") from None


def task_addresses(cluster):
    """(job, task, address) of every task in the cluster block."""
    return [(job, task, address) for job, addresses in sorted(cluster.tf_cluster.items())
            for task, address in enumerate(addresses)]


def check_workers(cluster, timeout=3.0):
    """Fail with a one-line error naming the first task whose server is not reachable."""
    for job, task, address in task_addresses(cluster):
        host, port = _split_address(address)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise TfpartError(cluster.source, f"{job} task {task} at {address} is not "
                              f"reachable ({reason}); start it with `tfpart worker "
                              f"--cluster {cluster.source} --task {task}`") from None


def watch_workers(cluster, interval=0.5, on_lost=None):
    """Check the tasks every ``interval`` seconds in a daemon thread; when one stops
    accepting connections, call ``on_lost(message)`` (default: print the one-line
    error and exit with code 2, since a TensorFlow call waiting on a dead worker may
    not return for minutes)."""
    def default(message):
        from tfpart.quiet import user_stderr

        print(f"tfpart: error: {message}", file=user_stderr(), flush=True)
        os._exit(2)

    def loop():
        while True:
            time.sleep(interval)
            try:
                check_workers(cluster, timeout=max(interval, 1.0))
            except TfpartError as exc:
                (on_lost or default)(f"{exc} (lost while running)")
                return

    thread = threading.Thread(target=loop, name="tfpart-worker-watch", daemon=True)
    thread.start()
    return thread


@contextmanager
def cluster_errors(cluster):
    """Turn TensorFlow's errors from a run across ``cluster`` into one-line errors that
    name the task that went away, when one did."""
    tf = tensorflow()
    try:
        yield
    except tf.errors.OpError as exc:
        if cluster is None:
            raise
        check_workers(cluster, timeout=1.0)  # names the lost task, if one is gone
        raise TfpartError(cluster.source, "the run across the cluster failed: "
                          f"{first_line(exc)}") from None


def connect(cluster, watch=False):
    """Make this process a client of ``cluster``'s TensorFlow servers, after checking
    that every task is up; with ``watch``, exit cleanly if one goes away later."""
    global connected  # process-wide, as TensorFlow's own context is
    check_workers(cluster)
    tensorflow().config.experimental_connect_to_cluster(cluster_spec(cluster))
    connected = True
    if watch:
        watch_workers(cluster)


def random_inputs(signature_fn, batch_size, seed=0):
    """Random tensors matching a signature's inputs, unknown dims set to batch_size."""
    tf = tensorflow()
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, spec in signature_fn.structured_input_signature[1].items():
        shape = [batch_size if d is None else d for d in spec.shape.as_list()]
        if spec.dtype.is_floating:
            value = rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)
        elif spec.dtype.is_integer:
            value = rng.integers(0, 2, size=shape).astype(spec.dtype.as_numpy_dtype)
        elif spec.dtype == tf.bool:
            value = rng.integers(0, 2, size=shape).astype(bool)
        else:
            value = np.full(shape, b"tfpart", dtype=object)
        inputs[name] = tf.constant(value, dtype=spec.dtype)
    return inputs


@dataclass
class VerifyReport:
    max_abs_diff: float
    outputs_equal: bool
    ops_per_device: dict  # device -> ops TensorFlow placed there (from run metadata)
    ops_checked: int  # ops found in both the plan and TensorFlow's placement
    op_mismatches: list = field(default_factory=list)  # (op, planned, actual)
    # Constants elsewhere than planned: Grappler's constant folding re-creates them
    # beside what it folded; they hold no work, so they are listed, not failed.
    moved_constants: list = field(default_factory=list)  # (op, planned, actual)
    variable_mismatches: list = field(default_factory=list)
    device_map: dict = field(default_factory=dict)
    placement: dict = field(default_factory=dict)  # op -> device TensorFlow ran it on

    @property
    def ok(self):
        return self.outputs_equal and not self.op_mismatches and not self.variable_mismatches


def run_with_placement(fn, inputs):
    """Call ``fn(**inputs)``; return (outputs, {op name: device}, {op name: op type})
    from TensorFlow's run metadata (the partition graphs it really ran)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        outputs = fn(**inputs)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    placed, op_types = {}, {}
    for function_graph in metadata.function_graphs:
        for partition in function_graph.partition_graphs:
            for node in partition.node:
                if node.op not in RUNTIME_OPS:
                    placed[node.name] = node.device
                    op_types[node.name] = node.op
    return outputs, placed, op_types


def _as_arrays(outputs):
    tf = tensorflow()
    return [np.asarray(t) for t in tf.nest.flatten(outputs)]


def _variable_devices(obj):
    """(name, device) of every variable reachable from a loaded object."""
    from tensorflow.python.checkpoint import graph_view

    tf = tensorflow()
    objects, _ = graph_view.ObjectGraphView(obj).breadth_first_traversal()
    return sorted((v.name.split(":")[0], v.device) for v in objects
                  if isinstance(v, tf.Variable))


def verify(original_dir, compiled_dir, *, rtol=1e-5, atol=1e-6, seed=0, batch_size=None,
           cluster=None, watch=False):
    """Run both models on the same random inputs; compare outputs and placement.

    Without ``cluster`` the compiled model's devices are mapped onto local logical CPUs
    (one per cluster device). With a :class:`~tfpart.cluster.Cluster` whose ``cluster``
    block names running ``tfpart worker`` tasks, this process connects to them and runs
    the compiled model as it is, across the tasks (the original runs here).
    """
    from rewriters.pipeline import original_op_name

    tf = tensorflow()
    with _runnable(compiled_dir, cluster, watch) as (plan, proto, local_dir, device_map):
        signature = plan["context"]["signature"]
        batch = batch_size or plan["context"]["batch_size"]
        with model_errors(original_dir, "load and run it"):
            original = tf.saved_model.load(str(original_dir))
            inputs = random_inputs(original.signatures[signature], batch, seed)
            expected = _as_arrays(original.signatures[signature](**inputs))
        with cluster_errors(cluster), model_errors(
                compiled_dir, "load and run it",
                passing=(tf.errors.OpError,) if cluster is not None else ()):
            compiled = load(local_dir)
            outputs, placed, op_types = run_with_placement(
                compiled.signatures[signature], inputs)
            actual = _as_arrays(outputs)
            variables = _variable_devices(compiled)
    diffs = [float(np.max(np.abs(a.astype(float) - e.astype(float)))) if a.size else 0.0
             for a, e in zip(actual, expected)]
    equal = len(actual) == len(expected) and all(
        np.allclose(a, e, rtol=rtol, atol=atol) for a, e in zip(actual, expected))
    planned = {op: device_map[d] for op, d in plan["assignment"].items()}
    runs = [(name, device, op_types[name]) for name, device in placed.items()]
    if plan.get("stages"):  # each micro-batch's imported copy of the source's ops
        runs = [(original_op_name(n), d, t) for n, d, t in runs if original_op_name(n) != n]
    checked = [(name, device, op) for name, device, op in runs if name in planned]
    elsewhere = [(name, planned[name], device, op) for name, device, op in checked
                 if not _same_device(planned[name], device)]
    mismatches = [(name, want, got) for name, want, got, op in elsewhere if op != "Const"]
    moved_constants = [(name, want, got) for name, want, got, op in elsewhere if op == "Const"]
    expected_vars = sorted(_saved_variable_devices(proto))  # proto is already remapped
    variable_mismatches = [pair for pair in Counter(expected_vars) - Counter(
        (n, _canonical(d)) for n, d in variables)]
    return VerifyReport(max_abs_diff=max(diffs, default=0.0), outputs_equal=equal,
                        ops_per_device=dict(Counter(placed.values())),
                        ops_checked=len(checked), op_mismatches=mismatches,
                        moved_constants=moved_constants,
                        variable_mismatches=variable_mismatches, device_map=device_map,
                        placement=placed)


@contextmanager
def _runnable(compiled_dir, cluster, watch):
    """``(plan, proto, directory to load, device map)`` of a compiled model, made
    runnable here. With ``cluster``, this process connects to its tasks and the model
    runs as it is; without, its devices are mapped onto local logical CPUs in a
    temporary copy (removed on exit)."""
    from rewriters.remap import local_device_map, remap_devices
    from rewriters.savedmodel_io import read_saved_model, write_saved_model

    compiled_dir = Path(compiled_dir)
    plan_file = compiled_dir / "plan.json"
    if not plan_file.is_file():
        raise ModelError(compiled_dir, "not a tfpart output (plan.json is missing)")
    plan = json.loads(plan_file.read_text())
    devices = plan["context"].get("devices") or sorted(set(plan["assignment"].values()))
    if cluster is not None:
        _check_plan_devices(plan, cluster, plan_file)
        connect(cluster, watch=watch)
        yield plan, read_saved_model(compiled_dir), compiled_dir, {d: d for d in devices}
        return
    device_map = local_device_map(devices)
    host = plan["context"].get("unread_variables", {}).get("device")
    if host and host not in device_map:  # the host CPU of the first device
        device_map[host] = device_map[devices[0]]
    ensure_local_cpus(len(devices))
    proto = remap_devices(read_saved_model(compiled_dir), device_map)
    with tempfile.TemporaryDirectory(prefix="tfpart-local-") as tmp:
        yield plan, proto, write_saved_model(proto, compiled_dir, Path(tmp) / "local"), device_map


def _check_plan_devices(plan, cluster, plan_file):
    names = {_canonical(d) for d in cluster.device_names}
    unknown = sorted(d for d in set(plan["assignment"].values()) if _canonical(d) not in names)
    if unknown:
        raise TfpartError(cluster.source, f"has no device {unknown[0]}, which "
                          f"{plan_file} places ops on")


def _saved_variable_devices(proto):
    return [(obj.variable.name, obj.variable.device)
            for obj in proto.meta_graphs[0].object_graph_def.nodes
            if obj.HasField("variable")]


def _canonical(device):
    from tfpart.cluster import normalize_device_name

    return normalize_device_name(device) or device


def _same_device(a, b):
    return _canonical(a) == _canonical(b)


def timed_calls(fn, repeats, warmup=0):
    """Seconds of each of ``repeats`` calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def time_model(compiled_dir, *, cluster=None, batch_size=None, repeats=20, warmup=3,
               watch=False, seed=0):
    """Median wall time of calls to a compiled model's signature, samples/s, and each
    timed call (``times_s``).

    Runs on ``cluster``'s servers when given (see :func:`verify`), else on local
    logical CPUs standing in for the plan's devices.
    """
    import statistics

    tf = tensorflow()
    with _runnable(compiled_dir, cluster, watch) as (plan, _, local_dir, _), \
            cluster_errors(cluster), model_errors(
                compiled_dir, "load and run it",
                passing=(tf.errors.OpError,) if cluster is not None else ()):
        signature = load(local_dir).signatures[plan["context"]["signature"]]
        batch = batch_size or plan["context"]["batch_size"]
        inputs = random_inputs(signature, batch, seed)

        times = timed_calls(
            lambda: [t.numpy() for t in tensorflow().nest.flatten(signature(**inputs))],
            repeats, warmup)
    median = statistics.median(times)
    return {"batch_size": batch, "median_s": median, "samples_per_s": batch / median,
            "min_s": min(times), "repeats": repeats, "times_s": times,
            "predicted_s": plan["predicted"].get("step_time"),
            "microbatches": plan.get("microbatches", 1)}
