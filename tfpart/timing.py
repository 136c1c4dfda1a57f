"""Timing compiled models: median wall time of repeated calls, here or across a
cluster's servers.
"""
from __future__ import annotations

import numpy as np

from rewriters.tf_import import tensorflow
from tfpart.core.errors import model_errors
from tfpart.core.phases import timed_calls
from tfpart.runtime import SessionSignature, compiled_inputs, load, runnable
from tfpart.servers import cluster_errors

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

    tf = tensorflow()
    with runnable(compiled_dir, cluster, watch, op_libraries) as compiled, \
            cluster_errors(cluster), model_errors(
                compiled_dir, "load and run it",
                passing=(tf.errors.OpError,) if cluster is not None else ()):
        plan, proto, local_dir = compiled.plan, compiled.proto, compiled.directory
        signature = SessionSignature(local_dir, plan.context["signature"], len(
            plan.context.get("devices") or ())) if plan.context.get("format") == "tf1" \
            else load(local_dir).signatures[plan.context["signature"]]
        batch = batch_size or plan.context["batch_size"]
        feed = compiled_inputs(plan, proto, signature, batch, seed, inputs)

        times = timed_calls(
            lambda: [np.asarray(t) for t in tensorflow().nest.flatten(signature(**feed))],
            repeats, warmup)
    median = statistics.median(times)
    return {"batch_size": batch, "median_s": median, "samples_per_s": batch / median,
            "min_s": min(times), "repeats": repeats, "times_s": times,
            "predicted_s": plan.step_time,
            "microbatches": plan.microbatches}
