"""Time a compiled SavedModel in a fresh process (used by the benchmarks).

    python -m benchmarks.run_compiled OUT --logical-cpus 3
    python -m benchmarks.run_compiled OUT --cluster cluster.json      # across its servers
    python -m benchmarks.run_compiled --measure-link --cluster cluster.json
    python -m benchmarks.run_compiled --measure-call

Prints one JSON line: the median step time over ``--repeats`` calls after ``--warmup``
(or, with ``--measure-link``, the fitted latency and bandwidth between the first two
tasks). TensorFlow gets ``--intra``/``--inter`` threads, one each by default, so a
device is one core running one op at a time, as the simulator assumes.
"""
import argparse
import json
import os
import statistics
import sys

import numpy as np

from tfpart.timing import timed_calls


def time_calls(fn, repeats, warmup):
    """Median seconds of a call (see :func:`tfpart.timing.timed_calls`)."""
    return statistics.median(timed_calls(fn, repeats, warmup))


def measure_link(tf, cluster, repeats):
    """Latency and bandwidth between task 0 and task 1, by timing tensors sent across."""
    first, second = cluster.device_names[:2]

    @tf.function
    def nothing():
        with tf.device(first):
            return tf.constant(0.0) + 1.0

    @tf.function
    def nothing_here():
        return tf.constant(0.0) + 1.0
    # What launching a step on a remote worker costs beyond running it in this process.
    dispatch = max(time_calls(lambda: nothing().numpy(), repeats, 3) -
                   time_calls(lambda: nothing_here().numpy(), repeats, 3), 0.0)
    sizes, seconds = [], []
    for elements in (256, 262_144, 1_048_576, 4_194_304):
        with tf.device(first):
            x = tf.random.uniform([elements])

        @tf.function
        def across(x=x):
            with tf.device(second):
                return tf.reduce_max(x)

        @tf.function
        def local(x=x):
            with tf.device(first):
                return tf.reduce_max(x)
        remote = time_calls(lambda: across().numpy(), repeats, 3)
        here = time_calls(lambda: local().numpy(), repeats, 3)
        sizes.append(elements * 4)
        seconds.append(max(remote - here, 1e-6))
    # Bandwidth from the large tensors; latency is what the smallest one costs beyond it
    # (a remote call's fixed cost, which a straight-line fit would hide).
    slope = np.polyfit(sizes[1:], seconds[1:], 1)[0]
    bandwidth = float(1 / max(slope, 1e-12))
    return {"latency_s": max(seconds[0] - sizes[0] / bandwidth, 1e-6), "bandwidth": bandwidth,
            "step_overhead_s": dispatch, "points": list(zip(sizes, seconds))}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?")
    parser.add_argument("--logical-cpus", type=int, default=1)
    parser.add_argument("--cluster")
    parser.add_argument("--measure-link", action="store_true")
    parser.add_argument("--measure-call", action="store_true",
                        help="time calling a trivial tf.function here")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--intra", type=int, default=1)
    parser.add_argument("--inter", type=int, default=1)
    args = parser.parse_args(argv)

    from tfpart.core.cluster import load_cluster
    from tfpart.core.plan import Plan
    from tfpart.runtime import ensure_local_cpus, load, random_inputs
    from tfpart.servers import connect, set_threads

    if not args.cluster and hasattr(os, "sched_setaffinity"):
        # Logical CPU devices share this process's cores; give them as many cores as
        # intra-op threads, as `tfpart profile` has (kernels spread over every core
        # otherwise).
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.intra])
    set_threads(args.intra, args.inter)
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    if args.measure_call:
        @tf.function
        def nothing():
            return tf.constant(0.0) + 1.0
        print(json.dumps({"call_overhead_s": time_calls(lambda: nothing().numpy(),
                                                        args.repeats, 5)}))
        return 0
    if args.cluster:
        cluster = load_cluster(args.cluster)
        connect(cluster)
        if args.measure_link:
            print(json.dumps(measure_link(tf, cluster, args.repeats)))
            return 0
    else:
        ensure_local_cpus(args.logical_cpus)
    plan = Plan.load(f"{args.model}/plan.json")
    model = load(args.model)
    fn = model.signatures[plan.context["signature"]]
    inputs = random_inputs(fn, args.batch_size or plan.context["batch_size"])
    median = time_calls(lambda: [t.numpy() for t in tf.nest.flatten(fn(**inputs))],
                        args.repeats, args.warmup)
    print(json.dumps({"median_s": median}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
