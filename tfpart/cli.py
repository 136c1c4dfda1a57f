"""Command line: ``tfpart compile``, ``verify``, ``run``, ``train``, ``profile``,
``simulate`` and ``worker``.

Errors a user can cause print one line, ``tfpart: error: <file>: <problem>``, and exit
with code 2. Arguments and input files are checked before TensorFlow is imported, so
such errors come at once; TensorFlow's own logging is kept out of the output
(:mod:`tfpart.core.quiet`). Tables and progress use ``rich`` (a well-kept terminal library,
rather than hand-aligned columns and spinners).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR, DEVICE_KINDS_FILE
from tfpart.core.errors import OutputError, TfpartError, VerificationError
from tfpart.core.output_folders import check_inputs_outside, check_replaceable
from tfpart.strategy_lines import seconds, strategy_lines
from tfpart.strategy_request import STRATEGY_CHOICES
from tfpart.core.quiet import library_output_captured, user_stderr

console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)



def strategy_line(strategy):
    """Why ``--strategy auto`` chose what it chose (``plan.context["strategy"]``).

    >>> strategy_line({"chosen": "pipeline", "step_times": {"greedy": 0.02,
    ...                "pipeline": 0.012}, "refused": {"data_parallel": "no room"}})
    'Strategy pipeline: the least predicted step (12.000 ms; greedy 20.000 ms; data_parallel impossible: no room)'
    >>> strategy_line({"chosen": "greedy", "step_times": {"greedy": 0.02}, "refused": {},
    ...                "tables cut": {"greedy": 0.03}})
    'Strategy greedy: the least predicted step (20.000 ms; greedy with the tables cut 30.000 ms)'
    """
    chosen, times = strategy["chosen"], strategy["step_times"]
    others = [f"{name} {seconds(t)}" for name, t in sorted(times.items()) if name != chosen]
    others += [f"{name} impossible: {why}" for name, why in sorted(strategy["refused"].items())]
    others += [f"{name} with the {key} {seconds(t)}" for key in ("tables cut", "tables whole")
               for name, t in sorted(strategy.get(key, {}).items())]
    return (f"Strategy {chosen}: the least predicted step ({seconds(times[chosen])}"
            + "".join(f"; {text}" for text in others) + ")")

def _bytes(n):
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"



def plan_table(plan):
    """A rich Table: one row per device with the plan's predicted figures."""
    ops = {}
    for device in plan.assignment.values():
        ops[device] = ops.get(device, 0) + 1
    pipelined = bool(plan.stages) and not plan.replicas
    stage_of_device = {plan.assignment[op]: stage for op, stage in (plan.stages or {}).items()}
    table = Table(title="Placement per device (predicted)")
    columns = ["device", "kind", "ops", "busy", "peak memory", "of memory"]
    if pipelined:
        columns.insert(2, "stage")
    for column in columns:
        table.add_column(column, justify="left" if column in ("device", "kind") else "right")
    for name, figures in plan.predicted.devices.items():
        memory = figures.peak_memory_bytes
        count = figures.ops if plan.replicas else ops.get(name, 0)  # replicas' copies
        row = [name, figures.kind, str(count), seconds(figures.busy_s),
               _bytes(memory), f"{100 * memory / figures.memory_bytes:.1f}%"]
        if pipelined:
            row.insert(2, str(stage_of_device.get(name, "-")))
        table.add_row(*row)
    return table


def print_plan(result, default_cluster):
    plan = result.plan
    if default_cluster:
        console.print(f"No --cluster given: using the shipped default {result.cluster.source}")
    console.print(f"Model {plan.context['model']} (signature {plan.context['signature']}, "
                  f"batch size {plan.context['batch_size']}): {len(result.graph)} ops on "
                  f"cluster '{result.cluster.name}' ({len(result.cluster)} devices)")
    console.print(plan_table(plan))
    unread = plan.context.get("unread_variables") or {}
    if unread.get("count"):
        console.print(f"{unread['count']} variables the signature never reads "
                      f"({_bytes(unread['bytes'])}) stay on the host {unread['device']}, "
                      "outside every device's memory")
    fused = plan.context.get("fusion_groups") or []
    if fused:
        console.print(f"{sum(map(len, fused))} ops in {len(fused)} fused kernels "
                      f"({fusion_kinds(fused, result.graph)}) are each placed as one unit")
    gap = plan.gap
    if plan.context.get("samples_mixed_by"):
        op, why = plan.context["samples_mixed_by"][0]
        console.print(f"Op {op} mixes the samples of a batch ({why}): the stages run whole "
                      "batches (no micro-batches)")
    kept = plan.context.get("kept") or {}
    if kept.get("signatures") or kept.get("endpoints"):
        console.print("Kept from the original: " + "; ".join(
            f"{what} {', '.join(kept[what])}" for what in ("signatures", "endpoints")
            if kept.get(what)) + f" ({kept['runs']})")
    compiled = "; ".join(f"{what} {', '.join(kept[key])}" for what, key in (
        ("signatures", "compiled_signatures"), ("endpoints", "compiled_endpoints"))
        if kept.get(key))
    if compiled:
        console.print(f"Running the compiled signature too: {compiled} (the same signature, "
                      f"or a function {plan.context['signature']} only wraps)")
    for name, why in sorted((kept.get("without_xla") or {}).items()):
        console.print(f"Kept without XLA: {name} ({why})")
    strategy = plan.context.get("strategy")
    if strategy:
        console.print(strategy_line(strategy))
    for line in strategy_lines(plan):
        console.print(line)
    if plan.predicted.transfers is not None:
        console.print(f"{plan.predicted.transfers} tensor copies between devices per step "
                      f"({plan.predicted.cross_host_transfers} between hosts, "
                      f"{_bytes(plan.predicted.bytes_moved)})")
    console.print(f"Predicted step time {seconds(plan.step_time)}; lower bound "
                  f"{seconds(plan.lower_bound)}" + (f" (gap {100 * gap:.1f}%)" if gap is not None else ""))
    console.print("Time: " + ", ".join(f"{k} {v:.2f} s" for k, v in result.timings.items()))
    console.print(f"Wrote {result.out} (with plan.json and report.html)")


def fusion_kinds(groups, graph, most=3):
    """The kinds of the fused kernels ``groups`` (lists of op names of ``graph``), the
    most common first, as their op types joined by "+".

    >>> from tfpart.core.graph import OpGraph
    >>> graph = OpGraph()
    >>> for name, op_type in [("m", "MatMul"), ("b", "BiasAdd"), ("c", "Conv2D"),
    ...                       ("d", "BiasAdd"), ("e", "Conv2D"), ("f", "BiasAdd")]:
    ...     graph.add_op(name, op_type=op_type)
    >>> fusion_kinds([["m", "b"], ["c", "d"], ["e", "f"]], graph)
    'Conv2D+BiasAdd ×2, MatMul+BiasAdd'
    """
    from collections import Counter

    kinds = Counter("+".join(graph.ops[op]["op_type"] for op in group if op in graph.ops)
                    for group in groups)
    shown = [f"{kind} ×{n}" if n > 1 else kind for kind, n in kinds.most_common(most)]
    return ", ".join(shown) + (", ..." if len(kinds) > most else "")


def print_verify(report):
    table = Table(title="Ops TensorFlow placed per device (run metadata)")
    table.add_column("device")
    table.add_column("ops", justify="right")
    inverse = {v: k for k, v in report.device_map.items()}
    for device, count in sorted(report.ops_per_device.items()):
        label = device if inverse.get(device, device) == device else \
            f"{inverse[device]} -> {device}"
        table.add_row(label, str(count))
    console.print(table)
    sizes = ", ".join(str(size) for size, _, _ in report.batches)
    console.print(f"Outputs {'equal' if report.outputs_equal else 'DIFFER'} "
                  + (f"at batch sizes {sizes} " if sizes else "")
                  + f"(max abs difference {report.max_abs_diff:.3g}); "
                  f"{report.ops_checked} ops checked against the plan, "
                  f"{len(report.op_mismatches)} on another device; "
                  f"{len(report.variable_mismatches)} variables misplaced")
    if report.other_signatures:
        same = sorted(name for name, status in report.other_signatures.items()
                      if status == "equal")
        console.print(f"Other signatures: {len(same)} of {len(report.other_signatures)} "
                      "give the original's outputs on the same inputs "
                      f"({', '.join(same) or 'none'})")
    if report.moved_constants:
        console.print(f"{len(report.moved_constants)} constants ran beside what Grappler "
                      "folded them into, not where planned (they hold no work)")
    for op, planned, actual in report.op_mismatches[:5]:
        console.print(f"  {op}: planned {planned}, ran on {actual}")


@contextmanager
def progress_display():
    with console.status("starting") as status:
        yield lambda message: status.update(message + " ...")


def cmd_compile(args):
    model = args.model or str(DEFAULT_MODEL_DIR)
    cluster = args.cluster or str(DEFAULT_CLUSTER_FILE)
    _check_inputs(models=[model], cluster=cluster, profiles=args.profile)
    inputs = [model, cluster, *(args.profile or ())]
    check_inputs_outside(args.output, inputs)
    check_replaceable(args.output, "compile", args.force)
    if args.draw:
        check_inputs_outside(args.draw, inputs)
    from tfpart.compile import compile_model
    from tfpart.strategy_request import resolve_strategy

    request = resolve_strategy(args.strategy, args.algorithm, pipeline=args.pipeline,
                               microbatches=args.microbatches, schedule=args.schedule,
                               options=args.option)  # fails before reading
    with progress_display() as progress:
        result = compile_model(model, cluster, args.output, batch_size=args.batch_size,
                               signature=args.signature, strategy=request,
                               profiles=args.profile, force=args.force, progress=progress,
                               verify=args.verify, tf32=False if args.no_tf32 else None,
                               whole_tables=args.whole_tables)
    for note in result.notes:
        console.print(f"Note: {note}")
    print_plan(result, default_cluster=args.cluster is None)
    if args.draw:
        from tfpart.picture import draw

        _, note, _ = draw(result.plan, result.graph, args.draw)
        console.print(note)
    if result.verification is not None:
        print_verify(result.verification)
    return 0


def cmd_diff(args):
    from tfpart.core.plan import Plan
    from tfpart.plan_diff import diff_plans

    _check_inputs(files=[args.before, args.after])
    for line in diff_plans(Plan.load(args.before), Plan.load(args.after)).lines():
        console.print(line, highlight=False)
    return 0


def _check_inputs(models=(), cluster=None, profiles=(), files=()):
    """Fail early, before TensorFlow starts, on input paths that cannot be read: each
    model a folder of folders and regular files (no FIFO, no device) with a
    saved_model.pb of at most protobuf's 2 GiB, the
    cluster file (and its kinds file) and profiles valid, bounded strict JSON, and
    other files regular files (JSON ones of bounded size, :mod:`tfpart.core.input_files`)."""
    from rewriters.savedmodel_io import check_model_dir
    from tfpart.core.cluster import load_cluster
    from tfpart.core.errors import ModelError
    from tfpart.core.input_files import check_regular_file, check_tree
    from tfpart.core.plan import MAX_PLAN_BYTES

    for model in models:
        check_regular_file(check_model_dir(model), ModelError, max_bytes=MAX_SAVED_MODEL_BYTES)
        check_tree(model, ModelError)
    kinds = load_cluster(cluster).kinds() if cluster else None
    for path in files:
        check_regular_file(path, max_bytes=MAX_PLAN_BYTES if str(path).endswith(".json")
                           else physical_memory())
    if profiles:
        from costmodel.measured import load_profile

        for path in profiles:
            load_profile(path, kinds)


MAX_SAVED_MODEL_BYTES = 2**31 - 1  # protobuf parses no larger message


def physical_memory():
    """Bytes of memory this machine has: the bound on a data file (a training set's
    .npz is read whole into memory)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cmd_profile(args):
    _check_inputs(models=[args.model])
    check_inputs_outside(args.output, [args.model])
    _check_profile_output(args.output)
    from tfpart.profiling import profile_model

    with progress_display() as progress:
        profile = profile_model(args.model, args.batch_size, signature=args.signature,
                                repeats=args.repeats, warmup=args.warmup,
                                intra_threads=args.intra_threads, progress=progress)
    profile.save(args.output)
    timed = sum(op["count"] for op in profile.ops)
    console.print(f"Measured {timed} ops ({len(profile.ops)} op type/shape keys) of "
                  f"{args.model} at batch size {profile.meta['batch_size']} in "
                  f"{profile.meta['profiling_seconds']:.1f} s; step time "
                  f"{seconds(profile.meta['step_time_s'])} "
                  f"({profile.meta['hardware']['cpu']}, TF {profile.meta['tensorflow']})")
    fitted = ", ".join(f"{k} {_efficiency_text(v)}"
                       for k, v in profile.fitted["efficiency"].items())
    console.print(f"Fitted efficiency: {fitted}; overhead "
                  f"{seconds(profile.fitted['op_overhead_s'])} per op")
    console.print(f"Wrote {args.output}")
    return 0


def _check_profile_output(path):
    """An existing ``profile -o`` file is replaced only if it is a profile (tfpart
    deletes only what it wrote)."""
    if not os.path.lexists(path):
        return
    is_profile = False
    if os.path.isfile(path) and not os.path.islink(path):  # never open a FIFO or device
        try:
            with open(path) as handle:
                is_profile = {"device_kind", "ops"} <= set(json.load(handle))
        except (OSError, ValueError, TypeError, RecursionError):
            pass
    if not is_profile:
        raise OutputError(path, "exists and is not a profile tfpart wrote: remove it yourself "
                          "or choose another -o")


def _efficiency_text(value):
    """A fitted fraction, or a KernelEfficiency's JSON, in a few characters."""
    from tfpart.core.cluster import KernelEfficiency

    if isinstance(value, (int, float)):
        return f"{value:.2f}"
    value = KernelEfficiency.parse(value)
    compute = "/".join(f"{p} {c:.2f}" for p, c in sorted(value.compute.items()))
    launch = f", launch {seconds(value.launch_s)}" if value.launch_s else ""
    return f"(compute {compute}, memory {value.memory:.2f}{launch})"


def cmd_calibrate(args):
    from tfpart.calibrate import calibrate, write_kind

    if args.output:  # the kinds file is updated in place; the measurements never
        check_inputs_outside(args.output, [args.kernels, args.links])

    name, entry, fitted = calibrate(args.kernels, args.links, args.kinds or DEVICE_KINDS_FILE)
    table = Table(title=f"{name}: fitted per kernel class (kernel time = max(launch, "
                        "flops / (peak x compute), bytes / (bandwidth x memory)))")
    for column in ("class", "launch", "memory", "compute by precision"):
        table.add_column(column)
    for cls, value in fitted.items():
        table.add_row(cls, seconds(value.launch_s), f"{value.memory:.3f}",
                      ", ".join(f"{p} {c:.3f}" for p, c in sorted(value.compute.items())))
    console.print(table)
    if "host_link_latency" in entry:
        console.print(f"Host link: {entry['host_link_bandwidth'] / 1e9:.1f} GB/s, "
                      f"{seconds(entry['host_link_latency'])} per copy")
    if args.output:
        write_kind(name, entry, args.output)
        console.print(f"Wrote kind {name} into {args.output}")
    else:
        print(json.dumps({"kinds": {name: entry}}, indent=2))
    return 0


def cmd_simulate(args):
    _check_inputs(models=[args.model], cluster=args.cluster, profiles=args.profile,
                  files=[args.plan])
    if args.gantt:
        check_inputs_outside(args.gantt, [args.model, args.plan, args.cluster,
                                          *(args.profile or ())])
    from tfpart.compile import simulate_model

    with progress_display() as progress:
        progress("reading the model and simulating the plan")
        run, plan = simulate_model(args.model, args.plan, cluster_file=args.cluster,
                                   profiles=args.profile)
    schedule, names = run.schedule, run.cost.cluster.device_names
    table = Table(title="Simulated step per device")
    for column in ("device", "ops", "busy", "idle", "peak memory"):
        table.add_column(column, justify="left" if column == "device" else "right")
    for d, name in enumerate(names):
        table.add_row(name, str(int((schedule.device == d).sum())),
                      seconds(schedule.busy[d]), seconds(schedule.idle[d]),
                      _bytes(schedule.peak_memory[d]))
    console.print(table)
    if schedule.link_bytes:
        links = Table(title="Bytes moved per link")
        links.add_column("from")
        links.add_column("to")
        links.add_column("bytes", justify="right")
        for (a, b), nbytes in sorted(schedule.link_bytes.items()):
            links.add_row(names[a], names[b], _bytes(nbytes))
        console.print(links)
    console.print(_run_line(run, plan.context.get("batch_size", 1)))
    if args.gantt:
        from costmodel.gantt import write_gantt

        write_gantt(schedule, run.cost, args.gantt)
        console.print(f"Wrote {args.gantt}")
    return 0


def _run_line(run, batch):
    """The simulated step in one line, with a pipeline's figures if it runs several
    micro-batches."""
    if not run.microbatch_ends:
        return f"Predicted step time {seconds(run.step_time)}"
    return (f"Predicted batch time {seconds(run.step_time)} "
            f"({batch / run.step_time:.1f} samples/s) over {len(run.microbatch_ends)} "
            f"micro-batches; first result after {seconds(run.first_result)}; one "
            f"micro-batch every {seconds(run.interval)}; bubble "
            f"{100 * run.bubble_fraction:.0f}%")


@contextmanager
def _naming_the_rank(launched):
    """Errors of a task a launcher started name its rank (the launcher's own lines do
    not say which task failed)."""
    try:
        yield
    except TfpartError as exc:
        if launched is None:
            raise
        raise TfpartError("", f"rank {launched.rank} of the {launched.launcher} launch: "
                          f"{exc}") from None


def cmd_worker(args):
    from tfpart.core.cluster import cluster_from_dict, load_cluster
    from tfpart.launcher import launched_task
    from tfpart.rendezvous import agree_on_cluster, announce_serving, launch_id
    from tfpart.servers import StopSignals, start_server

    launched = launched_task(os.environ) if args.cluster and args.task is None else None
    if launched:
        launch = launch_id(os.environ)
        with _naming_the_rank(launched):
            agreed = agree_on_cluster(launched, args.cluster, launch, args.host, args.port,
                                      args.launch_timeout)
            cluster = cluster_from_dict(agreed, source=args.cluster)
        task, job = launched.rank, "worker"
    elif args.cluster:
        cluster, task, job = load_cluster(args.cluster), args.task, args.job
    else:
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise TfpartError("", "give --cluster and --task, or set TF_CONFIG")
        try:
            config = json.loads(raw)
            spec = config["cluster"]
            devices = [{"name": f"/job:{j}/task:{k}/device:CPU:0", "kind": "cpu"}
                       for j, addresses in spec.items() for k in range(len(addresses))]
            cluster = cluster_from_dict({"cluster": spec, "devices": devices},
                                        source="TF_CONFIG")
            task, job = int(config["task"]["index"]), config["task"]["type"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TfpartError("TF_CONFIG", f"not a valid TF_CONFIG ({exc})") from None
    if task is None:
        raise TfpartError("", "--task is required with --cluster, unless mpirun or srun "
                          "started this task")
    if args.memory_stats:  # before the server makes its CPU allocator
        from tfpart import memory_stats

        memory_stats.use_bfc_allocator()
    with _naming_the_rank(launched):
        server, exposure = start_server(cluster, task, job, args.intra_threads,
                                        args.inter_threads)
    if args.memory_stats:
        memory_stats.serve(args.memory_stats)
    stop = StopSignals()  # before the lines below: whoever reads them may stop it at once
    console.print(f"tfpart worker: {server.target} serving {server.server_def.job_name} "
                  f"task {task}; Ctrl-C or SIGTERM stops it", soft_wrap=True)
    console.print(f"tfpart worker: {exposure}", soft_wrap=True)
    with _naming_the_rank(launched):
        if launched and announce_serving(launched, args.cluster, launch, agreed,
                                         args.launch_timeout):
            console.print(f"tfpart worker: wrote {args.cluster}: the {launched.size} tasks "
                          f"{launched.launcher} started serve", soft_wrap=True)
    # LocalWorkers names the process a task ends with; a launched task ends with the
    # launcher's daemon that started it, never left behind if that dies
    parent = os.environ.get("TFPART_WORKER_PARENT") or (os.getppid() if launched else None)
    name, code = stop.wait(parent=int(parent) if parent else None)
    console.print(f"tfpart worker: stopped by {name}", soft_wrap=True)
    sys.stdout.flush()
    os._exit(code)  # TensorFlow cannot stop a started server; its destructor would abort


def _run_cluster(args):
    """The cluster named by ``--cluster`` (tasks to connect to), or None (run here)."""
    if not getattr(args, "cluster", None):
        return None
    from tfpart.core.cluster import load_cluster
    from tfpart.servers import check_workers, cluster_spec

    cluster = load_cluster(args.cluster)
    cluster_spec(cluster)  # a cluster block is required to connect
    check_workers(cluster)  # a task down or frozen is named before TensorFlow starts
    return cluster


def cmd_verify(args):
    _check_inputs(models=[args.model, args.compiled], files=[
        os.path.join(args.compiled, "plan.json")])
    from tfpart.verification import verify

    cluster = _run_cluster(args)
    with progress_display() as progress:
        progress("running original and compiled models" +
                 (f" (compiled across {cluster.source})" if cluster else ""))
        report = verify(args.model, args.compiled, cluster=cluster, watch=True,
                        batch_size=args.batch_size)
    print_verify(report)
    if not report.ok:
        raise VerificationError(args.compiled, report.problem)
    return 0


def _write_cluster_file(path, data):
    """Write cluster-file contents ``data`` to ``path``, atomically, once they load;
    return the :class:`~tfpart.core.cluster.Cluster` they make."""
    from tfpart.core.cluster import cluster_from_dict
    from tfpart.core.output_folders import write_file_atomically

    cluster = cluster_from_dict(data, source=path)
    write_file_atomically(path, json.dumps(data))
    return cluster


def cmd_cluster_detect(args):
    """Write this host's devices (:mod:`tfpart.device_detect`) as a cluster file; under
    a launcher, every task's (:func:`tfpart.rendezvous.devices_across`), by rank 0."""
    import socket

    from tfpart.device_detect import detect_devices
    from tfpart.launcher import launched_task
    from tfpart.rendezvous import devices_across, launch_id

    if os.path.exists(args.output) and not args.force:  # every task checks before any reports
        raise TfpartError(args.output, "exists; give --force to replace it")
    launched = launched_task(os.environ)
    if launched is None:
        (devices, kinds), name = detect_devices(), socket.gethostname()
    else:
        with _naming_the_rank(launched):
            devices, kinds = devices_across(launched, args.output, launch_id(os.environ),
                                            args.launch_timeout)
        if launched.rank:
            return 0
        name = f"the {launched.size} tasks {launched.launcher} started"
    cluster = _write_cluster_file(args.output, {
        "name": f"{name}, detected by tfpart cluster detect",
        "devices": devices, **({"kinds": kinds} if kinds else {})})
    for device in cluster.devices:
        console.print(f"{device.name}: {device.kind.name}, {_bytes(device.memory)}",
                      soft_wrap=True)
    for name, kind in kinds.items():
        console.print(f"{name}: {kind['source']}", soft_wrap=True)
    console.print(f"Wrote {args.output}", soft_wrap=True)
    return 0


def cmd_cluster_probe(args):
    """Measure every pair of devices' link (:mod:`tfpart.link_probe`) into the file."""
    from tfpart.core.input_files import read_json
    from tfpart.link_probe import probe_cluster, with_probed_links
    from tfpart.servers import connect

    if args.rounds < 1 or args.repeats < 1:
        raise TfpartError("", "--rounds and --repeats must be at least 1")
    data = read_json(args.cluster)
    cluster = _run_cluster(args)
    if len(cluster.devices) < 2:
        raise TfpartError(args.cluster, "has one device: no link to probe")
    connect(cluster, watch=True)
    with progress_display() as progress:
        probed = probe_cluster(cluster, args.rounds, args.repeats, progress)
    new = with_probed_links(data, probed, {d.name for d in cluster.devices
                                           if d.kind.name == "cpu"})
    output = args.output or args.cluster
    _write_cluster_file(output, new)
    table = Table(title=f"Links probed ({args.rounds} rounds)")
    for column in ("between", "bandwidth (median; rounds)", "latency (median)",
                   "message cost (median)"):
        table.add_column(column)
    for pair in new["links"]["pairs"]:
        if "measured" in pair:
            rounds = ", ".join(f"{b / 1e9:.2f}" for b in pair["measured"]["bandwidth"])
            table.add_row(" - ".join(pair["between"]),
                          f"{pair['bandwidth'] / 1e9:.2f} GB/s ({rounds})",
                          seconds(pair["latency"]), seconds(pair.get("message_cost", 0)))
    console.print(table)
    console.print(f"Step overhead (launching a step on the cluster): "
                  f"{seconds(new['step_overhead'])}; wrote {output}", soft_wrap=True)
    return 0


def cmd_checkpoint(args):
    """Move a checkpoint between a compiled model and its original
    (:mod:`tfpart.checkpoints`)."""
    plan_file = os.path.join(args.compiled, "plan.json")
    _check_inputs(models=[args.compiled], files=[plan_file])
    from tfpart.checkpoints import checkpoint_to_compiled, checkpoint_to_original
    from tfpart.core.plan import Plan

    original = args.original or Plan.load(plan_file).context.get("model")
    if not original:
        raise TfpartError(plan_file, "names no original model; give --original")
    _check_inputs(models=[original])
    to_original = args.direction == "to-original"
    move = checkpoint_to_original if to_original else checkpoint_to_compiled
    moved = move(args.checkpoint, args.compiled, original, args.output)
    console.print(f"Wrote checkpoint {args.output} of the "
                  f"{'original' if to_original else 'compiled'} model "
                  f"({moved} variables from {args.checkpoint}); restore it with "
                  "tf.train.Checkpoint(tf.saved_model.load(MODEL)).read(PREFIX)",
                  soft_wrap=True)
    return 0


def cmd_run(args):
    _check_inputs(models=[args.compiled], files=[os.path.join(args.compiled, "plan.json")])
    from tfpart.timing import time_model

    cluster = _run_cluster(args)
    with progress_display() as progress:
        progress(f"timing {args.compiled}" + (f" across {cluster.source}" if cluster else ""))
        result = time_model(args.compiled, cluster=cluster, batch_size=args.batch_size,
                            repeats=args.repeats, warmup=args.warmup, watch=True)
    predicted = result["predicted_s"]
    console.print(f"{args.compiled}: batch {result['batch_size']} in "
                  f"{seconds(result['median_s'])} (median of {result['repeats']}; predicted "
                  f"{seconds(predicted) if predicted else 'n/a'}), "
                  f"{result['samples_per_s']:.1f} samples/s, "
                  f"{result['microbatches']} micro-batch(es)")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


def cmd_train(args):
    _check_inputs(models=[args.model], cluster=args.cluster, files=[args.data])
    from tfpart.trainer.loop import check_output

    check_output(args.output, [args.model, args.data, args.cluster])  # before TensorFlow
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    from tfpart.trainer.loop import TrainOptions, train

    options = TrainOptions(mode=args.mode, steps=args.steps, batch_size=args.batch_size,
                           learning_rate=args.lr, momentum=args.momentum,
                           lambda0=args.lambda0, eval_every=args.eval_every,
                           eval_fraction=args.eval_fraction, seed=args.seed,
                           updates_per_call=args.updates_per_call,
                           **({} if args.min_shard_bytes is None
                              else {"min_shard_bytes": args.min_shard_bytes}))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[text]}"))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"{args.mode} updates", total=args.steps, text="starting")
        result = train(args.model, args.cluster, args.data, args.output, options,
                       restart=args.restart, progress=lambda done, total, text: bar.update(
                           task, completed=done, text=text))
    summary = result.summary
    accuracy = summary["final_accuracy"]
    console.print(f"{args.mode}: {summary['updates']} updates in {summary['wall_s']:.1f} s; "
                  f"held-out loss {summary['final_loss']:.4f}"
                  + (f", accuracy {accuracy:.3f}" if accuracy is not None else ""))
    for worker, delays in summary["delays"].items():
        if worker != "-1":
            console.print(f"  worker {worker}: {delays['updates']} updates, delay mean "
                          f"{delays['mean']:.2f}, p95 {delays['p95']:.0f}, max {delays['max']}")
    if result.resumed == args.steps:
        console.print(f"Nothing to do: {args.output} holds all {args.steps} updates "
                      "(--restart trains again)")
    elif result.resumed is not None:
        console.print(f"Resumed at update {result.resumed} from its checkpoint")
    console.print(f"Wrote {args.output} (updates.csv, evaluations.csv, train.json, "
                  "plan.json, run.json, checkpoint/)")
    sys.stdout.flush()
    user_stderr().flush()
    os._exit(0)  # the coordinator's threads and cluster connection would hold the exit


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line like every other error."""

    def error(self, message):
        print(f"tfpart: error: {message} (see {self.prog} --help)", file=user_stderr())
        raise SystemExit(2)


def build_parser():
    parser = _Parser(prog="tfpart", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    compile_ = commands.add_parser("compile", help="place a SavedModel on a cluster")
    compile_.add_argument("model", nargs="?", help="SavedModel directory "
                          "(default: the shipped example model)")
    compile_.add_argument("--cluster", help="cluster.json (default: the shipped "
                          "three-logical-CPU cluster)")
    compile_.add_argument("-o", "--output", required=True, help="output directory")
    compile_.add_argument("--batch-size", type=int, help="compile batch size "
                          "(default: from the signature, else 1)")
    compile_.add_argument("--signature", help="signature to optimise "
                          "(default: serving_default)")
    compile_.add_argument("--strategy", choices=STRATEGY_CHOICES,
                          help="auto (the default without --algorithm, --option or "
                          "pipeline flags): the fastest by predicted step of an op "
                          "placement, a pipeline, data-parallel replicas, an op "
                          "placement with convolutions and matmuls split across "
                          "devices, and replicas of an op placement or of a pipeline "
                          "(hybrid); or force "
                          "one")
    compile_.add_argument("--algorithm", help="placement algorithm (see the README's "
                          "table; default greedy; `pipeline` is --pipeline)")
    compile_.add_argument("--option", action="append", metavar="KEY=VALUE",
                          help="set a field of the algorithm's options, e.g. "
                          "time_limit=30 or coarsen.target_units=20; repeatable")
    compile_.add_argument("--pipeline", action="store_true", help="cut the model into "
                          "pipeline stages run over micro-batches (for throughput)")
    compile_.add_argument("--microbatches", type=int, help="micro-batches per batch "
                          "(implies --pipeline; default: chosen by simulation)")
    compile_.add_argument("--schedule", choices=["gpipe", "1f1b"], help="order of a "
                          "pipelined training step's forward and backward passes: gpipe "
                          "(fill-drain) or 1f1b (less activation memory); implies "
                          "--pipeline; default: the faster within memory")
    compile_.add_argument("--force", action="store_true", help="replace an existing output")
    compile_.add_argument("--profile", action="append", help="measured profile "
                          "(tfpart profile output) of a device kind; repeatable")
    compile_.add_argument("--verify", action="store_true",
                          help="then run original and compiled models and compare")
    compile_.add_argument("--no-tf32", action="store_true",
                          help="price float32 matmuls and convolutions at the fp32 peak "
                          "(for programs that turn TF32 off; default: the cluster's "
                          "\"tf32\", which is on)")
    compile_.add_argument("--whole-tables", action="store_true",
                          help="cut no table that fits a device into row shards (by "
                          "default one is cut when that is predicted faster)")
    compile_.add_argument("--draw", metavar="FILE", help="also draw the placement "
                          "(.svg, .png, .pdf with Graphviz's dot installed, else .dot)")
    compile_.set_defaults(run=cmd_compile)
    diff = commands.add_parser("diff", help="what changed between two plan.json files")
    diff.add_argument("before")
    diff.add_argument("after")
    diff.set_defaults(run=cmd_diff)
    profile = commands.add_parser("profile", help="measure every op of a model here")
    profile.add_argument("model")
    profile.add_argument("--batch-size", type=int)
    profile.add_argument("--signature")
    profile.add_argument("-o", "--output", required=True, help="profile JSON to write")
    profile.add_argument("--repeats", type=int, default=20)
    profile.add_argument("--warmup", type=int, default=5)
    profile.add_argument("--intra-threads", type=int, default=1,
                         help="intra-op threads (1: one core per device)")
    profile.set_defaults(run=cmd_profile)
    calibrate = commands.add_parser("calibrate", help="fit a device kind to measured "
                                    "kernel (and copy) times")
    calibrate.add_argument("kernels", help="kernel table, e.g. ../shared/gpu/h100_kernels.json")
    calibrate.add_argument("--links", help="host<->device copy times, e.g. "
                           "../shared/gpu/h100_links.json")
    calibrate.add_argument("--kinds", help="kinds file with the kind's datasheet "
                           "(default: the shipped profiles/device_kinds.json)")
    calibrate.add_argument("-o", "--output", help="kinds file to write the calibrated kind "
                           "into (other kinds kept); default: print it")
    calibrate.set_defaults(run=cmd_calibrate)
    simulate = commands.add_parser("simulate", help="simulate a plan.json on its model")
    simulate.add_argument("model")
    simulate.add_argument("plan")
    simulate.add_argument("--cluster", help="cluster.json (default: the one the plan names)")
    simulate.add_argument("--profile", action="append",
                          help="measured profile(s) (default: those the plan used)")
    simulate.add_argument("--gantt", help="write a Gantt chart (PNG) of the schedule")
    simulate.set_defaults(run=cmd_simulate)
    worker = commands.add_parser("worker", help="run one task's TensorFlow server")
    worker.add_argument("--cluster", help="cluster.json with a 'cluster' block "
                        "(default: the TF_CONFIG environment variable); under mpirun or "
                        "srun without --task, the file the tasks write for the client")
    worker.add_argument("--task", type=int, help="task index in the job")
    worker.add_argument("--host", help="under a launcher: the address this task serves on "
                        "(default: its host name's address)")
    worker.add_argument("--port", type=int, default=0, help="under a launcher: the port "
                        "(default: one free on the host)")
    worker.add_argument("--launch-timeout", type=float, default=120.0,
                        help="under a launcher: seconds to wait for every task to start")
    worker.add_argument("--job", help="job name: worker (the default) or ps")
    worker.add_argument("--intra-threads", type=int, help="intra-op threads")
    worker.add_argument("--inter-threads", type=int, help="inter-op threads")
    worker.add_argument("--memory-stats", metavar="FILE",
                        help="on SIGUSR1 write the CPU allocator's bytes in use and peak "
                        "to FILE as JSON, on SIGUSR2 reset the peak first (BFC allocator; "
                        "see tfpart/memory_stats.py)")
    worker.set_defaults(run=cmd_worker)
    train_ = commands.add_parser("train", help="train a model's weights on a cluster "
                                 "(sync, async, dc-asgd, ddc-asgd)")
    train_.add_argument("model", help="a training-step SavedModel "
                        "(tfpart.export_train_step)")
    train_.add_argument("--cluster", required=True, help="cluster.json whose running "
                        "`tfpart worker` tasks train (a 'ps' job for the asynchronous modes)")
    train_.add_argument("--data", required=True, help=".npz with the step's inputs x and y")
    train_.add_argument("-o", "--output", required=True, help="output folder; if it holds "
                        "a run of tfpart train, training resumes from its latest checkpoint")
    train_.add_argument("--mode", default="dc-asgd",
                        choices=("sync", "async", "dc-asgd", "ddc-asgd"))
    train_.add_argument("--steps", type=int, default=200, help="updates to run")
    train_.add_argument("--batch-size", type=int, default=32,
                        help="samples per update and worker")
    train_.add_argument("--lr", type=float, default=0.05, help="learning rate (async modes; "
                        "sync uses the exported optimizer)")
    train_.add_argument("--momentum", type=float, default=0.0)
    train_.add_argument("--lambda0", type=float, default=2.0,
                        help="DC-ASGD's compensation strength")
    train_.add_argument("--eval-every", type=int, default=25,
                        help="updates between evaluations and checkpoints")
    train_.add_argument("--eval-fraction", type=float, default=0.2,
                        help="share of the data held out")
    train_.add_argument("--seed", type=int, default=0)
    train_.add_argument("--updates-per-call", type=int, default=4,
                        help="async modes: updates a worker makes per function the client "
                        "schedules, one after the other, each on freshly read weights (a "
                        "call costs the client a few ms)")
    train_.add_argument("--min-shard-bytes", type=int,
                        help="async modes: a weight of at least twice this many bytes "
                        "(default 256 KiB, as TensorFlow's MinSizePartitioner) is "
                        "cut along its first axis over the ps tasks (0: every weight over "
                        "every ps task)")
    train_.add_argument("--restart", "--force", action="store_true",
                        help="start over: empty the output (a tfpart train output) instead "
                        "of resuming from its latest checkpoint (--force: the same)")
    train_.set_defaults(run=cmd_train)
    verify_ = commands.add_parser("verify", help="compare a compiled model with its source")
    verify_.add_argument("model")
    verify_.add_argument("compiled")
    verify_.add_argument("--cluster", help="cluster.json whose running `tfpart worker` "
                         "tasks run the compiled model (default: local logical CPUs)")
    verify_.add_argument("--batch-size", type=int, help="batch size of the random inputs "
                         "(default: the compile batch size)")
    verify_.set_defaults(run=cmd_verify)
    run = commands.add_parser("run", help="time a compiled model (here or on a cluster)")
    run.add_argument("compiled")
    run.add_argument("--cluster", help="cluster.json whose running `tfpart worker` tasks "
                     "run the model (default: local logical CPUs)")
    run.add_argument("--batch-size", type=int)
    run.add_argument("--repeats", type=int, default=20)
    run.add_argument("--warmup", type=int, default=3)
    run.add_argument("--json", action="store_true", help="also print the figures as JSON")
    run.set_defaults(run=cmd_run)
    cluster_ = commands.add_parser("cluster", help="describe this machine's devices")
    cluster_commands = cluster_.add_subparsers(dest="cluster_command", required=True)
    detect = cluster_commands.add_parser("detect", help="write a cluster.json of this "
                                         "host's devices, as TensorFlow sees them")
    detect.add_argument("-o", "--output", required=True, help="cluster.json to write")
    detect.add_argument("--force", action="store_true", help="replace an existing file")
    detect.add_argument("--launch-timeout", type=float, default=120.0,
                        help="under mpirun or srun: seconds to wait for every task")
    detect.set_defaults(run=cmd_cluster_detect)
    probe = cluster_commands.add_parser("probe", help="measure the links between a running "
                                        "cluster's devices and write them into its file")
    probe.add_argument("cluster", help="cluster.json whose `tfpart worker` tasks run")
    probe.add_argument("-o", "--output", help="write the probed file here instead of "
                       "updating CLUSTER")
    probe.add_argument("--rounds", type=int, default=3, help="times the whole probe runs")
    probe.add_argument("--repeats", type=int, default=30,
                       help="calls timed per copy size (fewer leave a pair's latency "
                       "noisy by tenths of a millisecond on loopback)")
    probe.set_defaults(run=cmd_cluster_probe)
    checkpoint = commands.add_parser("checkpoint", help="move a checkpoint between a "
                                     "compiled model and its original")
    checkpoint.add_argument("direction", choices=["to-original", "to-compiled"],
                            help="to-original: CHECKPOINT is the compiled model's; "
                            "to-compiled: the original's")
    checkpoint.add_argument("compiled", help="the compiled model's folder (with plan.json)")
    checkpoint.add_argument("checkpoint", help="the checkpoint prefix to read "
                            "(a SavedModel's is DIR/variables/variables)")
    checkpoint.add_argument("-o", "--output", required=True, help="checkpoint prefix to write")
    checkpoint.add_argument("--original", help="the original model's folder (default: the "
                            "one plan.json names)")
    checkpoint.set_defaults(run=cmd_checkpoint)
    return parser


POSITIVE_OPTIONS = ("batch_size", "repeats", "intra_threads", "inter_threads", "microbatches",
                    "steps", "eval_every")


def option_problem(args):
    """What is wrong with the sizes given on the command line, before any work: each
    must be positive, a batch size at most :data:`tfpart.core.limits.MAX_BATCH_SIZE`,
    micro-batches at most :data:`tfpart.core.limits.MAX_MICROBATCHES` and no more than the
    batch size; None if nothing is.

    >>> option_problem(argparse.Namespace(batch_size=4, microbatches=8))
    '--microbatches 8 is more than --batch-size 4: each micro-batch needs at least one sample'
    >>> print(option_problem(argparse.Namespace(batch_size=10**10, microbatches=None)))
    --batch-size 10000000000 is more than 2147483647 (TensorFlow's limit of 2**31-1 elements per tensor)
    """
    from tfpart.core.limits import MAX_BATCH_SIZE, MAX_MICROBATCHES

    for option in POSITIVE_OPTIONS:
        if getattr(args, option, None) is not None and getattr(args, option) <= 0:
            return f"--{option.replace('_', '-')} must be positive"
    batch, microbatches = getattr(args, "batch_size", None), getattr(args, "microbatches", None)
    if batch is not None and batch > MAX_BATCH_SIZE:
        return (f"--batch-size {batch} is more than {MAX_BATCH_SIZE} (TensorFlow's limit "
                "of 2**31-1 elements per tensor)")
    if microbatches is not None and microbatches > MAX_MICROBATCHES:
        return f"--microbatches {microbatches} is more than {MAX_MICROBATCHES} per batch"
    if microbatches is not None and batch is not None and microbatches > batch:
        return (f"--microbatches {microbatches} is more than --batch-size {batch}: each "
                "micro-batch needs at least one sample")
    return None


def main(argv=None):
    """Run one command; returns the exit code (0 done, 2 bad input, a failed run or a
    failed verification)."""
    args = build_parser().parse_args(argv)
    problem = option_problem(args)
    if problem:
        print(f"tfpart: error: {problem}", file=user_stderr())
        return 2
    try:
        return args.run(args)
    except TfpartError as exc:
        print(f"tfpart: error: {exc}", file=user_stderr())
        servers = sys.modules.get("tfpart.servers")
        if servers is not None and servers.connected:
            # TensorFlow's teardown of a broken cluster connection may hang or log.
            sys.stdout.flush()
            user_stderr().flush()
            os._exit(2)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "tensorflow":
            raise
        print("tfpart: error: TensorFlow is not installed; install tfpart[cpu] "
              "(tensorflow-cpu) or tfpart[gpu], or TensorFlow 2.20–2.21 yourself",
              file=user_stderr())
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:
        # A signal that lands inside a C extension's callback (numba's unpickling, for
        # one) reaches us wrapped in the extension's own error, with ours as its cause.
        interrupt = _interrupt_behind(exc)
        if interrupt is None:
            raise
        return _interrupted(interrupt)


def _interrupted(interrupt):
    signum = getattr(interrupt, "signum", signal.SIGINT)
    print(f"tfpart: interrupted ({signal.Signals(signum).name})", file=user_stderr())
    return 128 + signum


def _interrupt_behind(exc):
    """The ``KeyboardInterrupt`` an error was raised from, if any.

    >>> try:
    ...     try:
    ...         raise KeyboardInterrupt
    ...     except KeyboardInterrupt as interrupt:
    ...         raise SystemError("wrapped") from interrupt
    ... except SystemError as error:
    ...     type(_interrupt_behind(error)).__name__
    'KeyboardInterrupt'
    >>> _interrupt_behind(ValueError("plain")) is None
    True
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like Ctrl-C's KeyboardInterrupt,
    so that every ``finally`` and clean-up on the way out runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def entry(argv=None):
    """The ``tfpart`` command: :func:`main` with TensorFlow's logging kept out of the
    terminal (:mod:`tfpart.core.quiet`)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)
    try:
        with library_output_captured():
            return main(argv)
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code


if __name__ == "__main__":
    sys.exit(entry())
