"""Command line: the arguments of ``tfpart compile``, ``verify``, ``run``, ``train``,
``profile``, ``simulate``, ``worker``, ``cluster``, ``checkpoint``, ``calibrate`` and
``diff``, checked and handed to their command (:mod:`tfpart.commands`, which prints
through :mod:`tfpart.cli_output`).

Errors a user can cause print one line, ``tfpart: error: <file>: <problem>``, and exit
with code 2. Arguments and input files are checked before TensorFlow is imported, so
such errors come at once; TensorFlow's own logging is kept out of the output
(:mod:`tfpart.core.quiet`).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

from tfpart.commands import (cmd_calibrate, cmd_checkpoint, cmd_cluster_detect,
                             cmd_cluster_probe, cmd_compile, cmd_diff, cmd_profile, cmd_run,
                             cmd_simulate, cmd_train, cmd_verify, cmd_worker)
from tfpart.core.errors import TfpartError
from tfpart.core.quiet import library_output_captured, user_stderr
from tfpart.strategy_request import STRATEGY_CHOICES


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line like every other error."""

    def error(self, message):
        print(f"tfpart: error: {message} (see {self.prog} --help)", file=user_stderr())
        raise SystemExit(2)


class _ScheduleNames:
    """The pipeline schedules' names (``costmodel.schedules.SCHEDULES``), read only when
    ``--schedule`` is given or help is shown: the cost model's import is not paid by
    every command line."""

    def _names(self):
        from costmodel.schedules import SCHEDULES

        return SCHEDULES

    def __contains__(self, name):
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


def add_op_library_option(parser):
    """``--op-library``, on every command that loads a model (or runs one, a worker)."""
    parser.add_argument("--op-library", action="append", metavar="NAME",
                        help="what registers the model's custom ops, loaded before "
                        "TensorFlow reads it: a Python module to import (tensorflow_text) "
                        "or a .so file to load (tf.load_op_library); repeatable")


def add_inputs_option(parser, runs):
    """``--inputs``: the signature's inputs in an .npz file (rewriters.given_inputs)."""
    parser.add_argument("--inputs", metavar="FILE.npz",
                        help=f"inputs that {runs} run on instead of random ones, where "
                        "random values are not valid (ids a model checks): numpy.savez's "
                        "file, one array per signature input by its key; a ragged input "
                        "NAME as NAME.values and NAME.row_splits (NAME.row_splits_1, ... "
                        "for more ragged dimensions), a sparse one as NAME.indices, "
                        "NAME.values and NAME.dense_shape; rows taken in turn for each "
                        "batch size")


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
    compile_.add_argument("--algorithm", help="placement algorithm (docs/concepts/strategies.md "
                          "lists them; default greedy; `pipeline` is --pipeline)")
    compile_.add_argument("--option", action="append", metavar="KEY=VALUE",
                          help="set a field of the algorithm's options, e.g. "
                          "time_limit=30 or coarsen.target_units=20; repeatable")
    compile_.add_argument("--pipeline", action="store_true", help="cut the model into "
                          "pipeline stages run over micro-batches (for throughput)")
    compile_.add_argument("--microbatches", type=int, help="micro-batches per batch "
                          "(implies --pipeline; default: chosen by simulation)")
    compile_.add_argument("--schedule", choices=_ScheduleNames(), help="order of a "
                          "pipelined training step's forward and backward passes: gpipe "
                          "(fill-drain), 1f1b (less activation memory) or another of "
                          "costmodel.schedules (%(choices)s); implies --pipeline; default: "
                          "the faster within memory")
    compile_.add_argument("--force", action="store_true", help="replace an existing output "
                          "folder tfpart wrote, and a --draw picture of the same format")
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
    compile_.add_argument("--draw", metavar="FILE", help="also draw the placement in the "
                          "format of FILE's suffix (.svg, .png, .pdf with Graphviz's dot "
                          "installed, else its .dot beside it; .dot or .gv)")
    add_op_library_option(compile_)
    add_inputs_option(compile_, "the --verify runs and the probe for ops that mix a "
                      "batch's samples")
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
    profile.add_argument("--force", action="store_true", help="replace a profile tfpart "
                         "did not write (one it wrote is replaced anyway)")
    profile.add_argument("--repeats", type=int, default=20)
    profile.add_argument("--warmup", type=int, default=5)
    profile.add_argument("--intra-threads", type=int, default=1,
                         help="intra-op threads (1: one core per device)")
    add_op_library_option(profile)
    profile.set_defaults(run=cmd_profile)
    calibrate = commands.add_parser("calibrate", help="fit a device kind to measured "
                                    "kernel (and copy) times")
    calibrate.add_argument("kernels",
                           help="kernel table, e.g. ../shared/gpu/h100_kernel_times.json")
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
    simulate.add_argument("--gantt", metavar="FILE", help="write a Gantt chart of the "
                          "schedule, in the format of FILE's suffix: .png, .svg or .pdf")
    simulate.add_argument("--force", action="store_true", help="replace a --gantt picture "
                          "of the same format tfpart did not write")
    add_op_library_option(simulate)
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
    worker.add_argument("--force", action="store_true", help="under a launcher: replace "
                        "a cluster file tfpart did not write (one it wrote for an earlier "
                        "launch is replaced anyway)")
    worker.add_argument("--job", help="job name: worker (the default) or ps")
    worker.add_argument("--intra-threads", type=int, help="intra-op threads")
    worker.add_argument("--inter-threads", type=int, help="inter-op threads")
    worker.add_argument("--memory-stats", metavar="FILE",
                        help="on SIGUSR1 write the CPU allocator's bytes in use and peak "
                        "to FILE as JSON, on SIGUSR2 reset the peak first (BFC allocator; "
                        "see tfpart/memory_stats.py)")
    add_op_library_option(worker)
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
    add_op_library_option(train_)
    train_.set_defaults(run=cmd_train)
    verify_ = commands.add_parser("verify", help="compare a compiled model with its source")
    verify_.add_argument("model")
    verify_.add_argument("compiled")
    verify_.add_argument("--cluster", help="cluster.json whose running `tfpart worker` "
                         "tasks run the compiled model (default: local logical CPUs)")
    verify_.add_argument("--batch-size", type=int, help="batch size of the random inputs "
                         "(default: the compile batch size)")
    add_op_library_option(verify_)
    add_inputs_option(verify_, "both models")
    verify_.set_defaults(run=cmd_verify)
    run = commands.add_parser("run", help="time a compiled model (here or on a cluster)")
    run.add_argument("compiled")
    run.add_argument("--cluster", help="cluster.json whose running `tfpart worker` tasks "
                     "run the model (default: local logical CPUs)")
    run.add_argument("--batch-size", type=int)
    run.add_argument("--repeats", type=int, default=20)
    run.add_argument("--warmup", type=int, default=3)
    run.add_argument("--json", action="store_true", help="also print the figures as JSON")
    add_op_library_option(run)
    add_inputs_option(run, "the timed calls")
    run.set_defaults(run=cmd_run)
    cluster_ = commands.add_parser("cluster", help="describe this machine's devices")
    cluster_commands = cluster_.add_subparsers(dest="cluster_command", required=True)
    detect = cluster_commands.add_parser("detect", help="write a cluster.json of this "
                                         "host's devices, as TensorFlow sees them")
    detect.add_argument("-o", "--output", required=True, help="cluster.json to write")
    detect.add_argument("--force", action="store_true", help="replace a cluster file "
                        "tfpart did not write (one it wrote is replaced anyway)")
    detect.add_argument("--launch-timeout", type=float, default=120.0,
                        help="under mpirun or srun: seconds to wait for every task")
    detect.set_defaults(run=cmd_cluster_detect)
    probe = cluster_commands.add_parser("probe", help="measure the links between a running "
                                        "cluster's devices and write them into its file")
    probe.add_argument("cluster", help="cluster.json whose `tfpart worker` tasks run")
    probe.add_argument("-o", "--output", help="write the probed file here instead of "
                       "updating CLUSTER")
    probe.add_argument("--force", action="store_true", help="with -o: replace a cluster "
                       "file tfpart did not write")
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
    checkpoint.add_argument("--force", action="store_true", help="replace a checkpoint at "
                            "the prefix")
    checkpoint.add_argument("--original", help="the original model's folder (default: the "
                            "one plan.json names)")
    checkpoint.set_defaults(run=cmd_checkpoint)
    return parser


POSITIVE_OPTIONS = ("batch_size", "repeats", "intra_threads", "inter_threads", "microbatches",
                    "steps", "eval_every", "rounds", "updates_per_call", "launch_timeout",
                    "lr")
NON_NEGATIVE_OPTIONS = ("warmup", "task", "port", "seed", "min_shard_bytes", "momentum",
                        "lambda0")


def _upper_bounds():
    """Option -> (its largest value, why), for the options with one
    (:mod:`tfpart.core.limits` gives the reasons)."""
    from tfpart.core import limits

    threads = (limits.max_threads(), f"({limits.MAX_THREADS_PER_CPU} per logical CPU of "
               f"this machine's {os.cpu_count() or 1}; more threads only wait for the cores)")
    return {"batch_size": (limits.MAX_BATCH_SIZE, "(TensorFlow's limit of 2**31-1 elements "
                           "per tensor)"),
            "microbatches": (limits.MAX_MICROBATCHES, "per batch"),
            "intra_threads": threads, "inter_threads": threads,
            "launch_timeout": (limits.MAX_LAUNCH_TIMEOUT_S, "seconds (a day)"),
            "port": (65535, "(the largest TCP port)"),
            "steps": (limits.MAX_TRAIN_STEPS, "updates")}


def option_problem(args):
    """What is wrong with the numbers given on the command line, before any work: every
    float must be finite, each of :data:`POSITIVE_OPTIONS` positive, each of
    :data:`NON_NEGATIVE_OPTIONS` at least 0, none past its bound (a batch size past
    :data:`tfpart.core.limits.MAX_BATCH_SIZE`, threads past
    :func:`tfpart.core.limits.max_threads`, ...: :func:`_upper_bounds`), and no more
    micro-batches than the batch size; None if nothing is.

    >>> option_problem(argparse.Namespace(batch_size=4, microbatches=8))
    '--microbatches 8 is more than --batch-size 4: each micro-batch needs at least one sample'
    >>> print(option_problem(argparse.Namespace(batch_size=10**10, microbatches=None)))
    --batch-size 10000000000 is more than 2147483647 (TensorFlow's limit of 2**31-1 elements per tensor)
    >>> option_problem(argparse.Namespace(launch_timeout=float("nan")))
    '--launch-timeout must be a finite number, not nan'
    >>> option_problem(argparse.Namespace(momentum=1.0))
    '--momentum 1 must be less than 1 (the velocity would grow without bound)'
    """
    import math

    given = {option: value for option, value in vars(args).items()
             if isinstance(value, (int, float)) and not isinstance(value, bool)}

    def flag(option):
        return f"--{option.replace('_', '-')}"

    def shown(number):
        return f"{number:g}" if isinstance(number, float) else str(number)

    for option, value in given.items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"{flag(option)} must be a finite number, not {value}"
    for option in POSITIVE_OPTIONS:
        if option in given and given[option] <= 0:
            return f"{flag(option)} must be positive, not {shown(given[option])}"
    for option in NON_NEGATIVE_OPTIONS:
        if option in given and given[option] < 0:
            return f"{flag(option)} must be at least 0, not {shown(given[option])}"
    for option, (most, why) in _upper_bounds().items():
        if option in given and given[option] > most:
            return f"{flag(option)} {shown(given[option])} is more than {shown(most)} {why}"
    if given.get("momentum", 0) >= 1:
        return (f"--momentum {shown(given['momentum'])} must be less than 1 (the velocity "
                "would grow without bound)")
    batch, microbatches = given.get("batch_size"), given.get("microbatches")
    if microbatches is not None and batch is not None and microbatches > batch:
        return (f"--microbatches {microbatches} is more than --batch-size {batch}: each "
                "micro-batch needs at least one sample")
    return None


def main(argv=None):
    """Run one command; returns the exit code (0 done, 2 bad input, a failed run or a
    failed verification, 128 + the signal's number when interrupted)."""
    try:
        # the parser reads --schedule's choices from the cost model, whose import
        # (numba's) a Ctrl-C can land in: inside, so that it is the one line too
        args = build_parser().parse_args(argv)
        problem = option_problem(args)
        if problem:
            print(f"tfpart: error: {problem}", file=user_stderr())
            return 2
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
        # one) reaches us wrapped in the extension's own error, with ours as its cause;
        # one that lands in an extension's import (protobuf's) may come back as any
        # error, with no cause: after a stop signal, that error is the signal's doing.
        interrupt = _interrupt_behind(exc) or _signal_received()
        if interrupt is None:
            raise
        return _interrupted(interrupt)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what _interrupted reports


def _interrupted(interrupt):
    """Print the one line of an interrupt; its exit code, 128 + the signal's number."""
    signum = getattr(interrupt, "signum", signal.SIGINT)
    print(f"tfpart: interrupted ({signal.Signals(signum).name})", file=user_stderr())
    return 128 + signum


def _end_at_once(code):
    """End the process now with ``code``, its own output flushed. After an interrupt
    every ``finally`` on the way out has run; what would still come is TensorFlow's
    teardown (the destructors of a cluster connection, its threads), which logs to the
    terminal once the library log is closed (46 lines after a sync ``train``) and may
    hang; and Python's own exit sometimes ended an interrupted ``compile`` by SIGINT
    itself (exit -2) rather than with ``code``."""
    for stream in (sys.stdout, user_stderr(), sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to say
            stream.flush()
    os._exit(code)


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


_STOP_SIGNALS_RECEIVED = []  # since entry() began, in order


def _signal_received():
    """The interrupt of the first stop signal :func:`entry`'s handlers caught, if any."""
    if not _STOP_SIGNALS_RECEIVED:
        return None
    signum = _STOP_SIGNALS_RECEIVED[0]
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raise_interrupt(signum, frame):
    _STOP_SIGNALS_RECEIVED.append(signum)
    signal.default_int_handler(signum, frame)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like Ctrl-C's KeyboardInterrupt,
    so that every ``finally`` and clean-up on the way out runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    _STOP_SIGNALS_RECEIVED.append(signum)
    raise Terminated(signum)


def entry(argv=None):
    """The ``tfpart`` command: :func:`main` with TensorFlow's logging kept out of the
    terminal (:mod:`tfpart.core.quiet`); after Ctrl-C, SIGTERM or SIGHUP, nothing follows
    the one line that says so (:func:`_end_at_once`). Once the command is done, such a
    signal only ends the teardown (TensorFlow's can take a second), with the command's
    own exit code."""
    _STOP_SIGNALS_RECEIVED.clear()
    signal.signal(signal.SIGINT, _raise_interrupt)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)
    try:
        with library_output_captured():
            code = main(argv)
            if code in [128 + signum for signum in STOP_SIGNALS]:
                _end_at_once(code)
            for signum in STOP_SIGNALS:
                signal.signal(signum, lambda number, frame: _end_at_once(code))
            return code
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code


def console():
    """The ``tfpart`` console script: :func:`entry`, then, once TensorFlow was
    imported, the end of the process at once with its code (:func:`_end_at_once`):
    TensorFlow's teardown takes about a second, and Python restores the default
    handlers before it, so a Ctrl-C there would kill the process silently."""
    code = entry()
    if isinstance(code, int) and "tensorflow" in sys.modules:
        _end_at_once(code)
    return code


if __name__ == "__main__":
    sys.exit(console())
