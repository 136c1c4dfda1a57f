"""Train an example model's exported training step and its compiled version side by
side, in this process only (``python -m tests.train_compare DIR MODEL OPTIMIZER``),
and print what tests/e2e/test_training.py asserts on, as JSON.

One case per process: its intra-op threads and logical CPUs are set before TensorFlow
starts. The training step is exported here, or once per test run by the tests
(``--source``: ``tests/conftest.py``'s ``training_step``).
"""
import argparse
import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np

STEPS = 20
BATCH = 6
# Links fast enough that a small model's replica spreads over its group's devices.
FAST_LINKS = {"same_host": {"bandwidth": "50GB/s", "latency": "1us"}}


def batches(signature, seed=0):
    """``STEPS`` seeded (x, y) batches shaped for ``signature``."""
    rng = np.random.default_rng(seed)
    specs = sorted(signature.structured_input_signature[1].items())  # its order varies
    return [{name: rng.standard_normal([BATCH, *spec.shape[1:]]).astype(np.float32)
             for name, spec in specs} for _ in range(STEPS)]


def weights_of(model):
    weights = model.signatures["weights"]()
    return [weights[k].numpy() for k in sorted(weights)]


def train(model, data, weights=weights_of):
    step = model.signatures["train_step"]
    return [float(step(**batch)["loss"]) for batch in data], weights(model)


def slots_by_name(assignment):
    """``(variable, slot)`` op-name pairs by Keras 3's slot naming
    (``<optimizer>/<variable path with _>_<slot>``), found independently of tfpart."""
    variables = {name.split("/", 2)[2].replace("/", "_"): name for name in assignment
                 if name.startswith("variables/") and name.count("/") >= 2}
    pairs = []
    for name in assignment:
        if not name.startswith("variables/") or name.count("/") < 3:
            continue
        slot = name.split("/", 3)[3]
        for suffix in ("_momentum", "_velocity"):
            if slot.endswith(suffix) and slot[:-len(suffix)] in variables:
                pairs.append((variables[slot[:-len(suffix)]], name))
    return pairs


def uneven(cluster):
    """``cluster`` with its last device a CPU kind a third as fast as the others:
    data-parallel shares become uneven."""
    from examples.clusters import with_slower_cpu

    return with_slower_cpu(cluster, len(cluster["devices"]) - 1, 3.0, "cpu_third")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("model")
    parser.add_argument("optimizer")
    parser.add_argument("--source", type=Path,
                        help="MODEL's training step with OPTIMIZER, already exported")
    parser.add_argument("--microbatches", type=int)
    parser.add_argument("--schedule")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--replicas", type=int, help="data-parallel replicas")
    parser.add_argument("--reduce", choices=["one_device", "all_reduce"],
                        help="how data-parallel (or hybrid) replicas reduce their gradients")
    parser.add_argument("--split", action="store_true",
                        help="split every convolution and matmul across the devices")
    parser.add_argument("--hybrid", choices=["placement", "pipeline"],
                        help="two replicas of a placement or of a pipeline over four "
                        "devices")
    args = parser.parse_args(argv)
    import tensorflow as tf

    # One intra-op thread: oneDNN's multi-threaded reductions (the backward-filter
    # convolution's) are not bitwise repeatable, so even two runs of the original would
    # drift apart over 20 steps. The comparison is of placements, not of thread races.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    from tfpart.runtime import ensure_local_cpus

    ensure_local_cpus(4 if args.hybrid else 3)

    from examples.models import export_training_step
    from tests.conftest import local_cluster
    from tfpart.core.cluster import load_cluster
    from tfpart.local_workers import LocalWorkers

    directory = args.directory
    source = args.source or export_training_step(directory / "model", args.model,
                                                 args.optimizer)
    workers = LocalWorkers(args.workers, directory) if args.workers else nullcontext()
    with workers:
        cluster_file = workers.path if args.workers else directory / "cluster.json"
        if not args.workers:
            cluster_file.write_text(json.dumps(
                # the interleaved schedule needs devices of one kind
                dict(local_cluster(4) if args.schedule == "interleaved"
                     else uneven(local_cluster(4)), links=FAST_LINKS) if args.hybrid
                else uneven(local_cluster(3)) if args.replicas or args.split
                else local_cluster(3)))
        cluster = load_cluster(cluster_file) if args.workers else None
        print(json.dumps(compare(source, directory / "out", cluster_file, cluster, args)))


def compare(source, out, cluster_file, cluster, args):
    """Compile, verify, then train the original and the compiled model side by side."""
    import tensorflow as tf

    from tfpart.compile import compile_model
    from tfpart.core.splits import part_of
    from tfpart.runtime import load, runnable
    from tfpart.training import weight_variable_ops
    from tfpart.verification import verify

    pipelined = args.microbatches is not None or args.replicas is not None or args.split \
        or args.hybrid
    if args.hybrid:
        how = {"algorithm": "hybrid", "options": {
            "groups": 2, "form": args.hybrid, **{key: value for key, value in [
                ("reduce", args.reduce), ("schedule", args.schedule),
                ("microbatches", args.microbatches)] if value is not None}}}
    elif args.replicas is not None:
        how = {"algorithm": "data_parallel", "options": {
            "replicas": args.replicas, **({"reduce": args.reduce} if args.reduce else {})}}
    elif args.split:  # whatever the cost model says: split every splittable op
        how = {"algorithm": "filter_split", "options": {"min_gain": -1e9, "candidates": 10**6}}
    else:
        how = {"microbatches": args.microbatches,
               "options": {"schedule": args.schedule} if args.schedule else None}
    result = compile_model(source, cluster_file, out, batch_size=BATCH,
                           signature="train_step", **how)
    report = verify(source, out, cluster=cluster)
    original = tf.saved_model.load(str(source))
    data = batches(original.signatures["train_step"])
    initial = weights_of(original)
    expected_losses, expected_weights = train(original, data)
    with runnable(out, cluster) as here:
        by_op = weight_variable_ops(source)
        compiled = load(here.directory)
        losses, weights = train(compiled, data, (lambda m: [
            m.variables_by_op[name].numpy() for name in by_op]) if pipelined else weights_of)
        copies_apart = [float(np.max(np.abs(copy[name].numpy() - weight)))
                        for copy in getattr(compiled, "replica_variables", [])
                        for name, weight in zip(by_op, weights)]
    assignment = result.plan.assignment
    slots = slots_by_name(assignment)
    return {
        "devices_used": len(result.plan.devices_used()),
        "replicas": result.plan.replicas and result.plan.replicas.to_dict(),
        "splits": result.plan.splits and {op: split.to_dict()
                                          for op, split in result.plan.splits.items()},
        "split_types": sorted({result.graph.ops[op]["op_type"]
                               for op in result.plan.splits or ()}),
        "splits_read": [op for op in result.plan.splits or ()
                        if result.graph.out_degree(op)],
        "parts_ran_on": sorted({(copy.origin, report.placement[name])
                                for name, copy in report.copies.items()
                                if part_of(copy.origin) is not None}),
        "microbatches": result.plan.microbatches, "schedule": result.plan.schedule,
        "stages": len(set((result.plan.stages or {}).values())),
        "slots": len(slots),
        "slots_apart": [pair for pair in slots if assignment[pair[0]] != assignment[pair[1]]],
        "copies_apart": max(copies_apart, default=None),
        "ran_on": sorted(set(report.placement.values())),
        # (not the Send and Recv TensorFlow names after them: a loss goes to the client)
        "all_reduced_on": sorted({device for name, device in report.placement.items()
                                  if "/tfpart_allreduce/" in name
                                  and name.endswith("/CollectiveReduceV2")}),
        "outputs_equal": report.outputs_equal, "ops_checked": report.ops_checked,
        "op_mismatches": report.op_mismatches, "variables_misplaced":
            report.variable_mismatches,
        "losses": losses, "expected_losses": expected_losses,
        "weights_trained": any(not np.allclose(a, b) for a, b in
                               zip(initial, expected_weights)),
        "weights": [w.tolist() for w in weights],
        "expected_weights": [w.tolist() for w in expected_weights]}


if __name__ == "__main__":
    main()
