"""Timing compiled models: median wall time of repeated calls, here or across a
cluster's servers.
"""
from __future__ import annotations

import numpy as np

from rewriters.tf_import import tensorflow
from tfpart.core.errors import model_errors
from tfpart.core.phases import timed_calls
from tfpart.runtime import (SessionSignature, compiled_inputs, load, on_connected_cluster,
                            runnable)
from tfpart.servers import cluster_errors


def _step(compiled, batch, seed=0, inputs=None):
    """One call of ``compiled``'s (a :class:`~tfpart.runtime.RunnableModel`) signature
    on a fixed batch of ``batch`` rows, its outputs read into this process."""
    plan, proto, local_dir = compiled.plan, compiled.proto, compiled.directory
    signature = SessionSignature(local_dir, plan.context["signature"], len(
        plan.context.get("devices") or ())) if plan.context.get("format") == "tf1" \
        else load(local_dir).signatures[plan.context["signature"]]
    feed = compiled_inputs(plan, proto, signature, batch, seed, inputs)
    return lambda: [np.asarray(t) for t in tensorflow().nest.flatten(signature(**feed))]


def time_model(compiled_dir, *, cluster=None, batch_size=None, repeats=20, warmup=3,
               watch=False, seed=0, op_libraries=(), inputs=None):
    """Median wall time of calls to a compiled model's signature, samples/s, and each
    timed call (``times_s``).

    Runs on ``cluster``'s servers when given (see :func:`verify`), else on local
    logical CPUs standing in for the plan's devices, on random inputs (a ragged or
    sparse input a valid value of its spec) or on the rows of ``inputs``, an ``.npz``
    file (:func:`tfpart.runtime.compiled_inputs`). The op libraries the plan names and
    ``op_libraries`` are loaded first.
    """
    import statistics

    with runnable(compiled_dir, cluster, watch, op_libraries) as compiled, \
            cluster_errors(cluster), model_errors(
                compiled_dir, "load and run it",
                passing=(tensorflow().errors.OpError,) if cluster is not None else ()):
        plan = compiled.plan
        batch = batch_size or plan.context["batch_size"]
        times = timed_calls(_step(compiled, batch, seed, inputs), repeats, warmup)
    median = statistics.median(times)
    return {"batch_size": batch, "median_s": median, "samples_per_s": batch / median,
            "min_s": min(times), "repeats": repeats, "times_s": times,
            "predicted_s": plan.step_time,
            "microbatches": plan.microbatches}


def time_models(compiled_dirs, cluster, *, rounds=5, repeats=10, warmup=3, seed=0):
    """Each of several compiled models of ``cluster`` timed in turn, on one connection
    to its servers: every model loaded, then ``rounds`` rounds that each time
    ``repeats`` calls of every model. What drifts on shared cores (other processes, the
    servers' threads, the order the client's threads landed on cores) hits the models
    alike, which separate runs on fresh servers do not: their step times differ by up to
    2x from run to run on two shared cores, more than the plans compared differ.

    Returns
    -------
    dict
        Each folder of ``compiled_dirs`` (as given) -> the seconds of its timed calls.
    """
    with runnable(compiled_dirs[0], cluster) as first, cluster_errors(cluster):
        steps = {}
        for directory in compiled_dirs:
            with model_errors(directory, "load and run it",
                              passing=(tensorflow().errors.OpError,)):
                compiled = first if directory == compiled_dirs[0] else \
                    on_connected_cluster(directory, cluster)
                steps[directory] = _step(compiled, compiled.plan.context["batch_size"], seed)
                timed_calls(steps[directory], 0, warmup)
        times = {directory: [] for directory in compiled_dirs}
        for _ in range(rounds):
            for directory, step in steps.items():
                times[directory] += timed_calls(step, repeats)
    return times
