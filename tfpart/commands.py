"""The commands of ``tfpart`` (:mod:`tfpart.cli` parses the arguments and calls one):
each checks its input files before TensorFlow is imported, runs, and prints through
:mod:`tfpart.cli_output`."""
from __future__ import annotations

import functools
import json
import os
import re
import sys
from contextlib import contextmanager

from rich.table import Table

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR, DEVICE_KINDS_FILE
from tfpart.cli_output import (byte_text, console, efficiency_text, print_plan, print_verify,
                               progress_display, run_line)
from tfpart.core.errors import OutputError, TfpartError, VerificationError, model_errors
from tfpart.core.output_files import CLUSTER_FILE, PROFILE, check_output_file
from tfpart.core.output_folders import check_inputs_outside, check_replaceable
from tfpart.core.quiet import user_stderr
from tfpart.op_libraries import check_op_libraries, load_op_libraries, naming_op_libraries
from tfpart.strategy_lines import seconds


def _with_op_library_hints(command):
    """``command``, its errors of an op type no library registered saying which
    ``--op-library`` registers it (:func:`tfpart.op_libraries.naming_op_libraries`)."""
    @functools.wraps(command)
    def run(args):
        with naming_op_libraries():
            return command(args)
    return run


@_with_op_library_hints
def cmd_compile(args):
    model = args.model or str(DEFAULT_MODEL_DIR)
    cluster = args.cluster or str(DEFAULT_CLUSTER_FILE)
    given = [args.inputs] if args.inputs else []
    _check_inputs(models=[model], cluster=cluster, profiles=args.profile, files=given)
    check_op_libraries(args.op_library)
    inputs = [model, cluster, *(args.profile or ()), *given]
    check_inputs_outside(args.output, inputs)
    check_replaceable(args.output, "compile", args.force)
    if args.draw:
        from tfpart.picture import check_drawing

        check_inputs_outside(args.draw, inputs)
        check_drawing(args.draw, args.force)
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
                               whole_tables=args.whole_tables,
                               op_libraries=args.op_library or (), inputs=args.inputs)
    for note in result.notes:
        console.print(f"Note: {note}")
    print_plan(result, default_cluster=args.cluster is None)
    if args.draw:
        from tfpart.picture import draw

        _, note, _ = draw(result.plan, result.graph, args.draw, force=args.force)
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


@_with_op_library_hints
def cmd_profile(args):
    _check_inputs(models=[args.model])
    check_inputs_outside(args.output, [args.model])
    check_output_file(args.output, PROFILE, args.force)
    load_op_libraries(args.op_library)
    from tfpart.profiling import profile_model

    with progress_display() as progress, model_errors(args.model, "profile it"):
        profile = profile_model(args.model, args.batch_size, signature=args.signature,
                                repeats=args.repeats, warmup=args.warmup,
                                intra_threads=args.intra_threads, progress=progress)
    profile.save(args.output, force=args.force)
    timed = sum(op["count"] for op in profile.ops)
    console.print(f"Measured {timed} ops ({len(profile.ops)} op type/shape keys) of "
                  f"{args.model} at batch size {profile.meta['batch_size']} in "
                  f"{profile.meta['profiling_seconds']:.1f} s; step time "
                  f"{seconds(profile.meta['step_time_s'])} "
                  f"({profile.meta['hardware']['cpu']}, TF {profile.meta['tensorflow']})")
    fitted = ", ".join(f"{k} {efficiency_text(v)}"
                       for k, v in profile.fitted["efficiency"].items())
    console.print(f"Fitted efficiency: {fitted}; overhead "
                  f"{seconds(profile.fitted['op_overhead_s'])} per op")
    console.print(f"Wrote {args.output}")
    return 0


def cmd_calibrate(args):
    from tfpart.calibrate import calibrate, check_kinds_output, write_kind

    if args.output:  # the kinds file is updated in place; the measurements never
        check_inputs_outside(args.output, [args.kernels, args.links])
        check_kinds_output(args.output)  # merged into: a kinds file or none

    name, entry, fitted = calibrate(args.kernels, args.links, args.kinds or DEVICE_KINDS_FILE)
    table = Table(title=f"{name}: fitted per kernel class (kernel time = max(launch, "
                        "max(flops / (peak x compute), bytes / (bandwidth x memory)) / "
                        "occupancy of its waves of tiles))")
    for column in ("class", "launch", "memory", "tile elements", "compute by precision"):
        table.add_column(column)
    for cls, value in fitted.items():
        table.add_row(cls, seconds(value.launch_s), f"{value.memory:.3f}",
                      f"{value.tile_elements:.3g}" if value.tile_elements else "-",
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


@_with_op_library_hints
def cmd_simulate(args):
    _check_inputs(models=[args.model], cluster=args.cluster, profiles=args.profile,
                  files=[args.plan])
    check_op_libraries(args.op_library)
    if args.gantt:
        from costmodel.gantt import check_gantt_path

        check_inputs_outside(args.gantt, [args.model, args.plan, args.cluster,
                                          *(args.profile or ())])
        check_gantt_path(args.gantt, args.force)
    from tfpart.compile import simulate_model

    with progress_display() as progress, model_errors(args.model, "read it"):
        progress("reading the model and simulating the plan")
        run, plan = simulate_model(args.model, args.plan, cluster_file=args.cluster,
                                   profiles=args.profile, op_libraries=args.op_library or ())
    schedule, names = run.schedule, run.cost.cluster.device_names
    table = Table(title="Simulated step per device")
    for column in ("device", "ops", "busy", "idle", "peak memory"):
        table.add_column(column, justify="left" if column == "device" else "right")
    for d, name in enumerate(names):
        table.add_row(name, str(int((schedule.device == d).sum())),
                      seconds(schedule.busy[d]), seconds(schedule.idle[d]),
                      byte_text(schedule.peak_memory[d]))
    console.print(table)
    if schedule.link_bytes:
        links = Table(title="Bytes moved per link")
        links.add_column("from")
        links.add_column("to")
        links.add_column("bytes", justify="right")
        for (a, b), nbytes in sorted(schedule.link_bytes.items()):
            links.add_row(names[a], names[b], byte_text(nbytes))
        console.print(links)
    console.print(run_line(run, plan.context.get("batch_size", 1)))
    if args.gantt:
        from costmodel.gantt import write_gantt

        write_gantt(schedule, run.cost, args.gantt, force=args.force)
        console.print(f"Wrote {args.gantt}")
    return 0


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
    from tfpart.rendezvous import (agree_on_cluster, announce_serving, join_launch,
                                   leaving_on_failure)
    from tfpart.servers import StopSignals, start_server

    if args.memory_stats:  # before any rank of a launch reports
        from tfpart import memory_stats

        memory_stats.check_output(args.memory_stats)
    launched = launched_task(os.environ) if args.cluster and args.task is None else None
    with _naming_the_rank(launched):
        check_op_libraries(args.op_library)
    launch = None  # this task's part in the launch (tfpart.rendezvous), if launched
    if launched:
        from tfpart.device_detect import detect_devices

        with _naming_the_rank(launched):
            check_output_file(args.cluster, CLUSTER_FILE, args.force)  # every rank, first
            launch = join_launch(launched, args.cluster, os.environ, args.launch_timeout)
            with leaving_on_failure(launch):
                devices, kinds = detect_devices(prefix=f"/job:worker/task:{launched.rank}")
                agreed = agree_on_cluster(launch, devices, kinds, args.host, args.port,
                                          args.launch_timeout)
                cluster = cluster_from_dict(agreed, source=args.cluster)
        task, job = launched.rank, "worker"
    elif args.cluster:
        cluster, task, job = load_cluster(args.cluster), args.task, args.job
    else:
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise TfpartError("", "give --cluster and --task, or set TF_CONFIG")
        spec, task, job = tf_config_task(raw)
        devices = [{"name": f"/job:{j}/task:{k}/device:CPU:0", "kind": "cpu"}
                   for j, addresses in spec.items() for k in range(len(addresses))]
        cluster = cluster_from_dict({"cluster": spec, "devices": devices}, source="TF_CONFIG")
    if task is None:
        raise TfpartError("", "--task is required with --cluster, unless mpirun or srun "
                          "started this task")
    if args.memory_stats:  # before the server makes its CPU allocator
        memory_stats.use_bfc_allocator()
    with _naming_the_rank(launched), leaving_on_failure(launch):
        load_op_libraries(args.op_library)  # the graphs clients send run its kernels
        server, exposure = start_server(cluster, task, job, args.intra_threads,
                                        args.inter_threads)
        if args.memory_stats:
            memory_stats.serve(args.memory_stats)
    stop = StopSignals()  # before the lines below: whoever reads them may stop it at once
    console.print(f"tfpart worker: {server.target} serving {server.server_def.job_name} "
                  f"task {task}; Ctrl-C or SIGTERM stops it", soft_wrap=True)
    console.print(f"tfpart worker: {exposure}", soft_wrap=True)
    with _naming_the_rank(launched):
        if launched and announce_serving(launch, agreed, args.cluster, args.launch_timeout,
                                         args.force):
            console.print(f"tfpart worker: wrote {args.cluster}: the {launched.size} tasks "
                          f"{launched.launcher} started serve", soft_wrap=True)
    # LocalWorkers names the process a task ends with; a launched task ends with the
    # launcher's daemon that started it, never left behind if that dies
    parent = os.environ.get("TFPART_WORKER_PARENT") or (os.getppid() if launched else None)
    name, code = stop.wait(parent=int(parent) if parent else None)
    console.print(f"tfpart worker: stopped by {name}", soft_wrap=True)
    sys.stdout.flush()
    os._exit(code)  # TensorFlow cannot stop a started server; its destructor would abort


_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # as in TensorFlow's device names
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")


def tf_config_task(raw):
    """The cluster block (job -> task addresses), task index and job of the
    ``TF_CONFIG`` text ``raw``, read like any JSON input (at most
    :data:`~tfpart.core.limits.MAX_TF_CONFIG_BYTES`, bounded depth and numbers) and
    checked field by field: a TfpartError naming TF_CONFIG and the field at fault.

    >>> tf_config_task('{"cluster": {"worker": ["localhost:2222", "[::1]:2223"]}, '
    ...                '"task": {"type": "worker", "index": 1}}')
    ({'worker': ['localhost:2222', '[::1]:2223']}, 1, 'worker')
    >>> tf_config_task('{"cluster": {"worker": ["localhost:2222"]}, '
    ...                '"task": {"type": "worker", "index": 1e400}}')
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: TF_CONFIG: 1e400 is too large for a number (numbers must be finite)
    >>> tf_config_task('{"cluster": {"worker": ["localhost:2222"]}, '
    ...                '"task": {"type": "worker", "index": 1}}')
    Traceback (most recent call last):
    ...
    tfpart.core.errors.TfpartError: TF_CONFIG: task.index: 1 is not a task of job 'worker', which has 1
    """
    from tfpart.core.input_files import parse_json
    from tfpart.core.limits import MAX_TF_CONFIG_BYTES

    size = len(raw.encode("utf-8", "surrogateescape"))
    if size > MAX_TF_CONFIG_BYTES:
        raise TfpartError("TF_CONFIG", f"{size} bytes, more than the {MAX_TF_CONFIG_BYTES} "
                          "it may have")
    config = parse_json(raw.encode("utf-8", "surrogateescape"), "TF_CONFIG")

    def wrong(field, problem):
        return TfpartError("TF_CONFIG", f"{field}: {problem}")

    if not isinstance(config, dict):
        raise TfpartError("TF_CONFIG", 'must be a JSON object with "cluster" and "task"')
    spec, task = config.get("cluster"), config.get("task")
    if not isinstance(spec, dict) or not spec:
        raise wrong("cluster", "must be an object of jobs, each a list of host:port "
                    "addresses")
    for job, addresses in spec.items():
        if not _JOB_NAME.fullmatch(job):
            raise wrong(f"cluster.{job}", "is not a job name (a letter, then letters, "
                        "digits or _)")
        if not isinstance(addresses, list) or not addresses:
            raise wrong(f"cluster.{job}", "must be a list of host:port addresses")
        for k, address in enumerate(addresses):
            found = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
            if not found or int(found.group(2)) > 65535:
                raise wrong(f"cluster.{job}[{k}]", f"{address!r} is not a host:port address")
    if not isinstance(task, dict):
        raise wrong("task", 'must be an object with "type" and "index"')
    job, index = task.get("type"), task.get("index")
    if not isinstance(job, str) or job not in spec:
        raise wrong("task.type", f"{job!r} is not a job of the cluster "
                    f"({', '.join(sorted(spec))})")
    if isinstance(index, bool) or not isinstance(index, int):
        raise wrong("task.index", f"must be an integer, not {index!r}")
    if not 0 <= index < len(spec[job]):
        raise wrong("task.index", f"{index} is not a task of job {job!r}, which has "
                    f"{len(spec[job])}")
    return spec, index, job


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


@_with_op_library_hints
def cmd_verify(args):
    _check_inputs(models=[args.model, args.compiled], files=[
        os.path.join(args.compiled, "plan.json"), *([args.inputs] if args.inputs else [])])
    check_op_libraries(args.op_library)
    from tfpart.verification import verify

    cluster = _run_cluster(args)
    with progress_display() as progress:
        progress("running original and compiled models" +
                 (f" (compiled across {cluster.source})" if cluster else ""))
        report = verify(args.model, args.compiled, cluster=cluster, watch=True,
                        batch_size=args.batch_size, op_libraries=args.op_library or (),
                        inputs=args.inputs)
    print_verify(report)
    if not report.ok:
        raise VerificationError(args.compiled, report.problem)
    return 0


def _write_cluster_file(path, data, command, force=False):
    """Write cluster-file contents ``data`` to ``path`` with tfpart's mark, atomically
    and under the output rule (:mod:`tfpart.core.output_files`), once they load; return
    the :class:`~tfpart.core.cluster.Cluster` they make."""
    from tfpart.core.cluster import cluster_from_dict
    from tfpart.core.output_files import write_json_output

    cluster = cluster_from_dict(data, source=path)
    write_json_output(path, data, CLUSTER_FILE, command, force=force, indent=2)
    return cluster


def update_cluster_file(path, data, before):
    """Write ``data`` over the cluster file ``path`` it updates (``cluster probe``
    without -o), atomically, through a link to the file it names, once it loads. The
    file stays its owner's: it carries tfpart's mark only if ``before``, its old
    contents, did (tfpart wrote it)."""
    from tfpart.core.cluster import cluster_from_dict
    from tfpart.core.input_files import json_text
    from tfpart.core.output_files import marked, write_output_file, written_by_tfpart

    cluster_from_dict(data, source=path)
    text = json_text(marked(data, "cluster probe", path) if written_by_tfpart(before)
                     else data, path, OutputError, indent=2)
    write_output_file(os.path.realpath(path), text, CLUSTER_FILE, force=True)


def cmd_cluster_detect(args):
    """Write this host's devices (:mod:`tfpart.device_detect`) as a cluster file; under
    a launcher, every task's (:func:`tfpart.rendezvous.devices_across`), by rank 0."""
    import socket

    from tfpart.device_detect import detect_devices
    from tfpart.launcher import launched_task
    from tfpart.rendezvous import devices_across

    check_output_file(args.output, CLUSTER_FILE, args.force)  # every task, before any reports
    launched = launched_task(os.environ)
    if launched is None:
        (devices, kinds), name = detect_devices(), socket.gethostname()
    else:
        with _naming_the_rank(launched):
            devices, kinds = devices_across(launched, args.output, os.environ,
                                            args.launch_timeout)
        if launched.rank:
            return 0
        name = f"the {launched.size} tasks {launched.launcher} started"
    cluster = _write_cluster_file(args.output, {
        "name": f"{name}, detected by tfpart cluster detect",
        "devices": devices, **({"kinds": kinds} if kinds else {})}, "cluster detect",
        args.force)
    for device in cluster.devices:
        console.print(f"{device.name}: {device.kind.name}, {byte_text(device.memory)}",
                      soft_wrap=True)
    for name, kind in kinds.items():
        console.print(f"{name}: {kind['source']}", soft_wrap=True)
    console.print(f"Wrote {args.output}", soft_wrap=True)
    return 0


def cmd_cluster_probe(args):
    """Measure every pair of devices' link (:mod:`tfpart.link_probe`) into the file."""
    from tfpart.core.input_files import read_json
    from tfpart.link_probe import probe_cluster, with_probed_links
    from tfpart.servers import cluster_errors, connect

    data = read_json(args.cluster)
    if args.output:  # without -o the cluster file itself is updated, kept its owner's
        check_output_file(args.output, CLUSTER_FILE, args.force)
    cluster = _run_cluster(args)
    if len(cluster.devices) < 2:
        raise TfpartError(args.cluster, "has one device: no link to probe")
    connect(cluster, watch=True)
    with progress_display() as progress, cluster_errors(cluster):  # a task lost: one line
        probed = probe_cluster(cluster, args.rounds, args.repeats, progress)
    new = with_probed_links(data, probed, {d.name for d in cluster.devices
                                           if d.kind.name == "cpu"})
    output = args.output or args.cluster
    if args.output:
        _write_cluster_file(output, new, "cluster probe", args.force)
    else:
        update_cluster_file(output, new, data)
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
    from tfpart.checkpoints import (check_checkpoint_output, checkpoint_to_compiled,
                                    checkpoint_to_original)
    from tfpart.core.plan import Plan

    original = args.original or Plan.load(plan_file).context.get("model")
    if not original:
        raise TfpartError(plan_file, "names no original model; give --original")
    _check_inputs(models=[original])
    check_inputs_outside(args.output, [args.compiled, original, args.checkpoint])
    check_checkpoint_output(args.output, args.force)  # before TensorFlow reads anything
    to_original = args.direction == "to-original"
    move = checkpoint_to_original if to_original else checkpoint_to_compiled
    moved = move(args.checkpoint, args.compiled, original, args.output, force=args.force)
    console.print(f"Wrote checkpoint {args.output} of the "
                  f"{'original' if to_original else 'compiled'} model "
                  f"({moved} variables from {args.checkpoint}); restore it with "
                  "tf.train.Checkpoint(tf.saved_model.load(MODEL)).read(PREFIX)",
                  soft_wrap=True)
    return 0


@_with_op_library_hints
def cmd_run(args):
    _check_inputs(models=[args.compiled], files=[
        os.path.join(args.compiled, "plan.json"), *([args.inputs] if args.inputs else [])])
    check_op_libraries(args.op_library)
    from tfpart.timing import time_model

    cluster = _run_cluster(args)
    with progress_display() as progress:
        progress(f"timing {args.compiled}" + (f" across {cluster.source}" if cluster else ""))
        result = time_model(args.compiled, cluster=cluster, batch_size=args.batch_size,
                            repeats=args.repeats, warmup=args.warmup, watch=True,
                            op_libraries=args.op_library or (), inputs=args.inputs)
    predicted = result["predicted_s"]
    console.print(f"{args.compiled}: batch {result['batch_size']} in "
                  f"{seconds(result['median_s'])} (median of {result['repeats']}; predicted "
                  f"{seconds(predicted) if predicted else 'n/a'}), "
                  f"{result['samples_per_s']:.1f} samples/s, "
                  f"{result['microbatches']} micro-batch(es)")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


@_with_op_library_hints
def cmd_train(args):
    _check_inputs(models=[args.model], cluster=args.cluster, files=[args.data])
    from tfpart.trainer.loop import check_output

    check_output(args.output, [args.model, args.data, args.cluster])  # before TensorFlow
    check_op_libraries(args.op_library)
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
                       restart=args.restart, op_libraries=args.op_library or (),
                       progress=lambda done, total, text: bar.update(
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
