"""Time a compiled SavedModel in a fresh process (used by the benchmarks).

    python -m benchmarks.run_compiled OUT --logical-cpus 3
    python -m benchmarks.run_compiled OUT --cluster cluster.json      # across its servers
    python -m benchmarks.run_compiled OUT1 OUT2 --cluster cluster.json --rounds 5
    python -m benchmarks.run_compiled --measure-link --cluster cluster.json
    python -m benchmarks.run_compiled --measure-call

Prints one JSON line: the median step time over ``--repeats`` calls after ``--warmup``
(or, with ``--measure-link``, the fitted latency and bandwidth between the first two
tasks; with several models, each one's timed calls, ``--rounds`` rounds of
``--repeats`` calls of every model in turn: :func:`tfpart.timing.time_models`).
TensorFlow gets ``--intra``/``--inter`` threads, one each by default, so a device is
one core running one op at a time, as the simulator assumes.
"""
import argparse
import json
import os
import sys

from tfpart.link_probe import median_call


def measure_link(tf, cluster, repeats):
    """Latency and bandwidth from task 0 to task 1, and what launching a step on task 0
    costs beyond running it here (:mod:`tfpart.link_probe`, as ``tfpart cluster
    probe`` measures them)."""
    from tfpart.link_probe import launch_cost, probe_pair

    first, second = cluster.device_names[:2]
    return {**probe_pair(tf, first, second, repeats),
            "step_overhead_s": launch_cost(tf, first, repeats)}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="*")
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
    parser.add_argument("--rounds", type=int, default=5, help="with several models")
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
        print(json.dumps({"call_overhead_s": median_call(lambda: nothing().numpy(),
                                                         args.repeats, 5)}))
        return 0
    if len(args.model) > 1:
        from tfpart.timing import time_models

        print(json.dumps({"times_s": time_models(args.model, load_cluster(args.cluster),
                                                 rounds=args.rounds, repeats=args.repeats,
                                                 warmup=args.warmup)}))
        return 0
    if args.cluster:
        cluster = load_cluster(args.cluster)
        connect(cluster)
        if args.measure_link:
            print(json.dumps(measure_link(tf, cluster, args.repeats)))
            return 0
    else:
        ensure_local_cpus(args.logical_cpus)
    plan = Plan.load(f"{args.model[0]}/plan.json")
    model = load(args.model[0])
    fn = model.signatures[plan.context["signature"]]
    inputs = random_inputs(fn, args.batch_size or plan.context["batch_size"])
    median = median_call(lambda: [t.numpy() for t in tf.nest.flatten(fn(**inputs))],
                         args.repeats, args.warmup)
    print(json.dumps({"median_s": median}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
