"""A table bigger than a device, cut into row shards on three local workers (issue 39):
tfpart's compiled recommender against TensorFlow's own ``ParameterServerStrategy``.

    .venv/bin/python -m benchmarks.sharded_tables [--items 2000000] [--batch-size 1024]
        [--memory-mb 300] [--workers 3] [--home-plan] [--train OPTIMIZER] [--whole-too]
        [--profile-first] [--markdown]

**tfpart**: three ``tfpart worker`` processes on loopback (``--workers``), their links measured by
``tfpart cluster probe``, each declared to hold 300 MB. The two-tower recommender of
:func:`examples.models.recommender` (a 2M x 64 item table of 512 MB at the default) fits
none of them, so ``tfpart compile`` cuts the table into row shards over the three
(:mod:`rewriters.row_shard`); ``tfpart run --cluster`` times the compiled model on
fresh workers (median of 30 batches, a fresh client). The plan's predicted step stands
beside it. On workers started anew with their allocator's figures on (``tfpart worker
--memory-stats``), each worker's peak over three batches (the restore of its shard
included) stands beside the plan's predicted peak and the memory it was declared to
hold.

With ``--home-plan``, a plan by hand beside it: every op on the task of the first shard
but the other shards and their gathers, predicted by the same simulator and timed the
same way (what the greedy's spread costs, measured).

**ParameterServerStrategy**: what a user would write by hand for the same model: the
tables and the MLP as ``tf.Variable``s created under a ``ParameterServerStrategy`` whose
``FixedShardsPartitioner`` cuts the item table over as many ``ps`` tasks (a
``ShardedVariable``), ``tf.nn.embedding_lookup`` of it (which looks each id up on its
shard) and the same MLP, run by one worker task through a ``ClusterCoordinator``: one
step at a time (schedule, then fetch its result) and 30 steps in flight (schedule all,
then join). The ids are drawn on the worker, so no input crosses from the client.

Lookups per second are item ids looked up per second: the batch size over the time of
a step.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from benchmarks.markdown import show_rows
from benchmarks.pipeline_throughput import tfpart_json
from examples.models import export_recommender, export_table_training
from tfpart.local_workers import LocalWorkers

REPEATS = 30
USERS, HIDDEN = 1000, 64


def tfpart_sharded(model, batch, memory, work, console, workers=3, home_plan_too=False,
                   signature=None, whole_too=False, profile_first=False):
    """The compiled model's predicted and measured step on ``workers`` local workers, its
    row shards, each worker's peak memory, with ``home_plan_too`` the predicted
    and measured step of :func:`home_plan`, and with ``whole_too`` those of the model
    compiled with ``--whole-tables`` (no table that fits a device cut). With
    ``profile_first`` the model's ops are measured here first (``tfpart profile``, one
    intra-op thread, as each worker has one core) and every plan is made with that
    profile."""
    (work / "probe").mkdir()
    with LocalWorkers(workers, work / "probe") as tasks:
        probed = work / "probed.json"
        tfpart_json("cluster", "probe", tasks.path, "-o", probed)
    cluster = json.loads(probed.read_text())
    links = {"links": cluster["links"], "step_overhead": cluster["step_overhead"]}
    for device in cluster["devices"]:
        device["memory"] = memory
    probed.write_text(json.dumps(cluster))
    signed = ["--signature", signature] if signature else []
    profiles = [work / "profile.json"] if profile_first else []
    if profile_first:
        console.print(tfpart_json("profile", model, "--batch-size", batch, "-o", profiles[0],
                                  *signed))
    planned = [*signed, *(argument for path in profiles for argument in ("--profile", path))]
    out = work / "compiled"
    console.print(tfpart_json("compile", model, "--cluster", probed, "--strategy", "placement",
                              "--batch-size", batch, "-o", out, *planned))
    plan = json.loads((out / "plan.json").read_text())
    measured = timed_on_fresh_workers(out, links, batch, work / "run", workers)
    whole = None
    if whole_too:
        console.print(tfpart_json("compile", model, "--cluster", probed, "--strategy",
                                  "placement", "--batch-size", batch, "-o", work / "whole",
                                  "--whole-tables", *planned))
        whole = (json.loads((work / "whole" / "plan.json").read_text())["predicted"]
                 ["step_time"], timed_on_fresh_workers(work / "whole", links, batch,
                                                       work / "whole_run", workers))
    (work / "memory").mkdir()
    with LocalWorkers(workers, work / "memory", memory_stats=True) as tasks:
        counted = work / "memory" / "counted.json"
        counted.write_text(json.dumps(dict(tasks.cluster, **links)))
        tfpart_json("run", out, "--cluster", counted, "--batch-size", batch, "--repeats", 3)
        peaks = {name.split("/device:")[0]: figures["peak"]
                 for name, figures in tasks.memory().items()}
    memory = [{"worker": task,
               "predicted peak": f"{figures['peak_memory_bytes'] / 1e6:.1f} MB",
               "measured peak": f"{peaks[task.replace('/replica:0', '')] / 1e6:.1f} MB",
               "memory": f"{memory / 1e6:.0f} MB"}
              for task, figures in ((name.split("/device:")[0], figures) for name, figures
                                    in sorted(plan["predicted"]["devices"].items()))]
    home = home_plan(model, probed, batch, links, work, workers, profiles, signature) \
        if home_plan_too else None
    return plan["predicted"]["step_time"], measured, plan["row_shards"], memory, home, whole


def timed_on_fresh_workers(out, links, batch, folder, workers):
    """Median step of the compiled model ``out`` on ``workers`` fresh workers whose file
    has the probed ``links``, timed by a fresh client."""
    folder.mkdir()
    with LocalWorkers(workers, folder) as tasks:
        timed = folder / "timed.json"
        timed.write_text(json.dumps(dict(tasks.cluster, **links)))
        run = json.loads(tfpart_json("run", out, "--cluster", timed, "--batch-size", batch,
                                     "--repeats", REPEATS, "--json").strip().splitlines()[-1])
    return run["median_s"]


def home_plan(model, cluster_file, batch, links, work, workers, profiles=(), signature=None):
    """The plan by hand that keeps every op on the first shard's task but the other
    shards and their gathers: its predicted and measured step (a check on the
    simulator's view of spreading ops over tasks), priced with ``profiles``."""
    import copy
    import dataclasses

    from costmodel import CostModel
    from costmodel.simulate import simulate_plan
    from tfpart.compile import _compile_into, load_profiles, plan_model
    from tfpart.core.cluster import load_cluster
    from tfpart.core.output_folders import new_staging_folder, removed_on_failure
    from tfpart.core.row_shards import SCOPE, SHARD

    cluster = load_cluster(cluster_file)
    planned = plan_model(model, cluster, batch_size=batch, strategy="placement",
                         profiles=profiles, signature=signature)
    plan, graph = planned.plan, planned.graph
    pinned = {op: device for op, device in plan.assignment.items()
              if f"/{SHARD}" in op or f"/{SCOPE}/rows" in op}
    first = pinned[next(op for op in pinned if op.endswith(f"/{SHARD}0"))]
    home = copy.deepcopy(plan)
    home.assignment = {op: pinned.get(op, first) for op in plan.assignment}
    measured = load_profiles(profiles, cluster)
    home.predicted.step_time = simulate_plan(home, CostModel(graph, cluster,
                                                             measured=measured)).makespan
    out = work / "home"
    staging = new_staging_folder(out, False)
    with removed_on_failure(staging):
        _compile_into(staging, model, cluster, out, dataclasses.replace(
            planned, plan=home, step_time=home.predicted.step_time), profiles=profiles,
            force=False, progress=None, verify=False)
    return home.predicted.step_time, timed_on_fresh_workers(out, links, batch,
                                                            work / "home_run", workers)


def parameter_servers(items, dim, batch, work, shards):
    """Seconds per step of the same model under ``ParameterServerStrategy`` (one worker,
    ``shards`` ps tasks), from a fresh client process: one step at a time, and with
    ``REPEATS`` steps in flight; and the item table's shards."""
    (work / "ps").mkdir()
    with LocalWorkers(1, work / "ps", ps=shards) as workers:
        done = subprocess.run([sys.executable, "-m", "benchmarks.sharded_tables",
                               "--ps-client", str(workers.path), "--items", str(items),
                               "--dim", str(dim), "--batch-size", str(batch)],
                              capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def ps_client(cluster_file, items, dim, batch):
    """Run in a fresh process: the ``ParameterServerStrategy`` client's timings, as one
    JSON line."""
    import tensorflow as tf

    from tfpart import servers
    from tfpart.core.cluster import load_cluster

    cluster = load_cluster(cluster_file)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        servers.cluster_spec(cluster), rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners
        .FixedShardsPartitioner(len(cluster.tf_cluster["ps"])))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    def uniform(shape):
        return lambda: tf.random.uniform(shape, -0.05, 0.05, seed=1)

    with strategy.scope():
        item_table = tf.Variable(uniform((items, dim)), shape=(items, dim), dtype=tf.float32)
        user_table = tf.Variable(uniform((USERS, dim)), shape=(USERS, dim), dtype=tf.float32)
        kernel = tf.Variable(uniform((2 * dim, HIDDEN))())
        bias = tf.Variable(tf.zeros([HIDDEN]))
        head = tf.Variable(uniform((HIDDEN, 1))())
        head_bias = tf.Variable(tf.zeros([1]))

    @tf.function
    def step():
        item_ids = tf.random.uniform([batch], 0, items, dtype=tf.int64)
        user_ids = tf.random.uniform([batch], 0, USERS, dtype=tf.int64)
        rows = tf.concat([tf.nn.embedding_lookup(user_table, user_ids),
                          tf.nn.embedding_lookup(item_table, item_ids)], axis=1)
        hidden = tf.nn.relu(tf.matmul(rows, kernel) + bias)
        return tf.reduce_sum(tf.sigmoid(tf.matmul(hidden, head) + head_bias))

    for _ in range(3):  # trace and warm up
        coordinator.schedule(step).fetch()
    one_at_a_time = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        coordinator.schedule(step).fetch()
        one_at_a_time.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(REPEATS):
        coordinator.schedule(step)
    coordinator.join()
    in_flight = (time.perf_counter() - start) / REPEATS
    shards = [list(v.shape) for v in item_table.variables]
    print(json.dumps({"median_s": sorted(one_at_a_time)[REPEATS // 2],
                      "in_flight_s": in_flight, "shards": shards}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--memory-mb", type=float, default=300.0,
                        help="memory each worker is declared to hold")
    parser.add_argument("--workers", type=int, default=3,
                        help="worker tasks (and parameter-server tasks)")
    parser.add_argument("--home-plan", action="store_true", help="also time a plan by "
                        "hand: every op on one task but the other shards' gathers")
    parser.add_argument("--train", choices=["sgd", "sgd_momentum", "adam"],
                        help="time a training step instead (examples.models."
                        "export_table_training: one table, this optimizer), without the "
                        "ParameterServerStrategy rows")
    parser.add_argument("--whole-too", action="store_true", help="also time the model "
                        "compiled with --whole-tables (for a table that fits a worker, "
                        "which tfpart cuts when that is predicted faster)")
    parser.add_argument("--profile-first", action="store_true", help="measure the model's "
                        "ops here first (tfpart profile) and plan with that profile")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    parser.add_argument("--keep", metavar="FOLDER", help="work in FOLDER (new) and keep "
                        "it: the probed cluster file, the compiled models and their plans")
    parser.add_argument("--ps-client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ps_client:
        return ps_client(args.ps_client, args.items, args.dim, args.batch_size)
    console = Console()
    batch = args.batch_size
    with (contextlib.nullcontext(args.keep) if args.keep else
          tempfile.TemporaryDirectory()) as scratch:
        work = Path(scratch)
        work.mkdir(exist_ok=True)
        if args.train:
            model = export_table_training(work / "model", args.items, args.dim, args.train)
        else:
            model = export_recommender(work / "model", items=args.items, users=USERS,
                                       dim=args.dim)
        predicted, measured, shards, memory, home, whole = tfpart_sharded(
            model, batch, args.memory_mb * 1e6, work, console, args.workers, args.home_plan,
            "train_step" if args.train else None, args.whole_too, args.profile_first)
        ps = None if args.train else parameter_servers(args.items, args.dim, batch, work,
                                                        args.workers)
    cut = next(iter(shards.values()), {"sizes": ["whole"]})  # slots are cut the same way
    what = f"training step, {args.train}" if args.train else "row shards"
    ids = batch * (2 if args.train else 1)  # ids looked up per step
    rows = [{"system": f"tfpart {what} ({args.workers} workers)", "shards (rows)": "/".join(
                 map(str, cut["sizes"])),
             "step predicted": f"{predicted * 1e3:.2f} ms",
             "step measured": f"{measured * 1e3:.2f} ms",
             "error": f"{(predicted / measured - 1) * 100:+.0f}%",
             "lookups/s": f"{ids / measured:,.0f}"},
            *([{"system": "tfpart, by hand: one task but the other shards' gathers",
                "shards (rows)": "/".join(map(str, cut["sizes"])),
                "step predicted": f"{home[0] * 1e3:.2f} ms",
                "step measured": f"{home[1] * 1e3:.2f} ms",
                "error": f"{(home[0] / home[1] - 1) * 100:+.0f}%",
                "lookups/s": f"{batch / home[1]:,.0f}"}] if home else []),
            *([{"system": "tfpart --whole-tables", "shards (rows)": "whole",
                "step predicted": f"{whole[0] * 1e3:.2f} ms",
                "step measured": f"{whole[1] * 1e3:.2f} ms",
                "error": f"{(whole[0] / whole[1] - 1) * 100:+.0f}%",
                "lookups/s": f"{ids / whole[1]:,.0f}"}] if whole else []),
            *(_parameter_server_rows(ps, batch) if ps else [])]
    table_mib = args.items * args.dim * 4 / 2**20
    show_rows(console, f"{'Table regressor' if args.train else 'Recommender'}, a "
              f"{args.items:,} x {args.dim} item table "
              f"({table_mib:.0f} MiB) over {args.workers} tasks of {args.memory_mb:.0f} MB, "
              f"batch {batch}", rows, args.markdown)
    show_rows(console, "Each worker's peak memory (its allocator's, over 3 batches after "
              "the restore)", memory, args.markdown)
    return 0


def _parameter_server_rows(ps, batch):
    return [{"system": "ParameterServerStrategy, one step at a time",
             "shards (rows)": "/".join(str(s[0]) for s in ps["shards"]),
             "step predicted": "", "step measured": f"{ps['median_s'] * 1e3:.2f} ms",
             "error": "", "lookups/s": f"{batch / ps['median_s']:,.0f}"},
            {"system": f"ParameterServerStrategy, {REPEATS} steps in flight",
             "shards (rows)": "/".join(str(s[0]) for s in ps["shards"]),
             "step predicted": "", "step measured": f"{ps['in_flight_s'] * 1e3:.2f} ms",
             "error": "", "lookups/s": f"{batch / ps['in_flight_s']:,.0f}"}]


if __name__ == "__main__":
    sys.exit(main())
