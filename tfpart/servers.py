"""TensorFlow servers: starting a task's ``tf.distribute.Server``, checking and watching
the tasks of a cluster, connecting this process to them as a client, and turning a
cluster's failures into one-line errors that name the lost task.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager

from rewriters.tf_import import tensorflow
from tfpart.errors import TfpartError, first_line
from tfpart.quiet import to_library_log

connected = False  # set once this process is a client of a cluster (see connect)

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
    job = job or ("worker" if "worker" in cluster.tf_cluster else sorted(cluster.tf_cluster)[0])
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
        to_library_log(f"tfpart: the run across the cluster failed:\n{exc}")
        _name_a_lost_task(cluster)
        raise TfpartError(cluster.source, "the run across the cluster failed: "
                          f"{first_line(exc)}") from None

def _name_a_lost_task(cluster, wait=2.0, interval=0.2):
    """Raise check_workers' error naming a task that stopped accepting connections
    within ``wait`` seconds: a killed task's connections can reset before the kernel
    has closed its listening port, so a single probe may still find it up."""
    deadline = time.monotonic() + wait
    while True:
        check_workers(cluster, timeout=1.0)
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)

def connect(cluster, watch=False):
    """Make this process a client of ``cluster``'s TensorFlow servers, after checking
    that every task is up; with ``watch``, exit cleanly if one goes away later."""
    global connected  # process-wide, as TensorFlow's own context is
    check_workers(cluster)
    tensorflow().config.experimental_connect_to_cluster(cluster_spec(cluster))
    connected = True
    if watch:
        watch_workers(cluster)
