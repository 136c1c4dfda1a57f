"""Peak memory per worker: tfpart's prediction against TensorFlow's allocator.

    python -m benchmarks.memory_accuracy [--workers 2] [--steps 3] [--markdown]
                                         [--allocation-log]

For each case (an example model, for inference or as an Adam training step, compiled
as a placement or as a pipeline over micro-batches) on ``--workers`` local
``tfpart worker`` processes, each pinned to its own core and started with
``--memory-stats`` (:mod:`tfpart.memory_stats`), fresh for each case:

1. compile the model for the workers (:func:`tfpart.compile.compile_model`);
2. in a fresh client process, load it and run two warm-up steps (the functions are
   built and the workers' first-step allocations made);
3. reset every worker's peak (the allocator's bytes in use then are "held": what a
   worker keeps between steps), run ``--steps`` more steps, and read every worker's
   peak.

What "measured" is: the most bytes in use on the worker's CPU allocator (TensorFlow's
BFC allocator, which keeps these statistics; ``get_memory_info("CPU:0")`` in the
worker process, which sees every tensor the server allocates for its client) during
the measured steps, less what that allocator held right after the worker's server
started, before any client connected. That start figure is 0 bytes on TensorFlow
2.21 (the server allocates nothing of its own on the allocator), so in practice
nothing is subtracted. Everything the model puts on the worker counts: its variables
(which the prediction counts too), optimizer slots, the constants of its functions,
received copies of tensors from the other worker or the client (the inputs), the
activations, and the BFC allocator's rounding of each buffer up to a multiple of
256 bytes. Tensors the client process holds (its random inputs, the outputs it
fetches) are on the client's allocator and are not counted.

With ``--allocation-log`` the workers also log every tensor TensorFlow allocates and
frees (``TF_CPP_VMODULE=log_memory=2``), and two more columns replay that log over the
measured steps (:func:`tfpart.memory_stats.tensor_peak`): "tensors MB", the most bytes
of tensors alive at once at their own sizes, which is what the prediction models, and
its error. The allocator's peak is above it by the BFC allocator's rounding: it hands
out a free chunk of up to twice the size asked for whole, so one 2 MB activation may
hold a 4 MB chunk; which chunks are free depends on the order buffers came and went.
Each worker reserves one large region when it starts, as a GPU's allocator does
(:func:`tfpart.memory_stats.reserve_one_region`), so new buffers are cut from it rather
than given the remainders of small regions the CPU's allocator would otherwise grow by.

What "predicted" is: the plan's ``peak_memory_bytes`` for the device (``plan.json``),
the simulator's live-range peak: variables for the whole step, every other tensor from
when it is produced (or starts arriving) until its last reader there ends, in the
simulated schedule (of the micro-batches, for a pipeline). "old bound" is the figure
tfpart used before, every tensor alive for the whole step
(``costmodel.memory.all_alive_memory``, formerly ``device_memory``, through
:func:`old_bound`). Error is (predicted - measured) / measured; "variables" are the
plan's (the ``param_bytes`` of the ops it puts there) and "held" the measured bytes in
use between steps, which they should make up nearly all of.

Not modelled: the allocator's reuse of freed chunks (above); the order in which tensors arrive from
another worker, which the simulated timing only approximates (on conv_tower's placed
training step, the activations the first worker sends wait on the second); the scratch
buffers kernels allocate for themselves other than Einsum's copies (convolution
backprop: with ``TF_ENABLE_ONEDNN_OPTS=0`` Eigen's made conv_tower's training peak
twice the prediction).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from benchmarks.markdown import show_rows

MB = 1e6
# name -> (mode, exporter(path), batch size, signature to compile)
MODELS = {
    "residual_cnn": ("inference", lambda path: _models().export_residual_cnn(path), 64, None),
    "transformer_encoder": ("inference",
                            lambda path: _models().export_transformer_encoder(path), 256,
                            None),
    "conv_tower adam": ("training", lambda path: _models().export_training_step(
        path, "conv_tower", "adam"), 32, "train_step"),
}
STRATEGIES = {"placed": {}, "pipeline": {"microbatches": 4}}  # -> compile_model options


def _models():
    from examples import models

    return models


def old_bound(graph, assignment, device_names):
    """Bytes per device name of the all-alive bound (every activation held for the
    whole step), or None where it cannot be had: the function behind it,
    ``costmodel.memory.device_memory``, is being renamed (``all_alive_memory``), and
    it needs an assignment of every op of ``graph``."""
    from costmodel import memory

    bound = getattr(memory, "device_memory", None) or getattr(memory, "all_alive_memory",
                                                              None)
    if bound is None:
        return None
    try:
        return bound(graph, assignment, device_names)
    except KeyError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="steps measured per case")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of: {', '.join(MODELS)}")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--allocation-log", action="store_true",
                        help="also replay the workers' allocation logs: tensors' own bytes")
    parser.add_argument("--client", nargs=2, metavar=("CLUSTER", "OUT"),
                        help=argparse.SUPPRESS)  # internal: the process that runs a model
    args = parser.parse_args(argv)
    if args.client:
        return run_client(*args.client, args.steps)
    console = Console(width=170)
    work = Path(tempfile.mkdtemp(prefix="tfpart-memory-"))
    rows = []
    started = time.perf_counter()
    try:
        for name in args.models.split(","):
            mode, export, batch, signature = MODELS[name]
            model = export(work / name.replace(" ", "_"))
            for strategy in args.strategies.split(","):
                rows += measure_case(console, work, name, mode, strategy, model, batch,
                                     signature, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    onednn = "off" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "on"
    show_rows(console, f"Peak memory per worker, predicted vs measured ({args.workers} "
              f"pinned workers, {args.steps} measured steps, oneDNN {onednn})", rows,
              args.markdown)
    for column, what in (("error %", "the allocator's peak"),
                         ("error vs tensors %", "the peak of tensors' own bytes")):
        within = [r for r in rows if r.get(column) not in (None, "", "-")]
        if within:
            good = sum(abs(float(r[column])) <= 10 for r in within)
            console.print(f"Within 10% of {what}: {good} of {len(within)} devices that run "
                          "ops and have a prediction")
    console.print(f"({time.perf_counter() - started:.0f} s)")
    return 0


def measure_case(console, work, name, mode, strategy, model, batch, signature, args):
    """Compile ``model`` one way for fresh workers, run it, and return a row per device."""
    from tfpart.core.cluster import normalize_device_name
    from tfpart.compile import compile_model
    from tfpart.local_workers import LocalWorkers

    folder = work / f"{name.replace(' ', '_')}-{strategy}"
    folder.mkdir()
    with LocalWorkers(args.workers, folder, memory_stats=True,
                      allocation_log=args.allocation_log) as workers:
        out = folder / "out"
        result = compile_model(model, workers.path, out, batch_size=batch,
                               signature=signature, **STRATEGIES[strategy])
        plan = result.plan
        names = result.cluster.device_names  # full names, as the plan's
        bound = old_bound(result.graph, plan.assignment, names)
        held, peaks, tensors = run_and_measure(workers, out, args.steps)
    held, peaks, tensors = ({normalize_device_name(d): v for d, v in figures.items()}
                            if figures else None for figures in (held, peaks, tensors))
    variables = dict.fromkeys(names, 0)
    for op, attrs in result.graph.ops.items():
        if op in plan.assignment:
            variables[plan.assignment[op]] += attrs["param_bytes"]
    rows = []
    for device in names:
        figures = plan.predicted.devices[device]
        start = peaks[device]["start"]
        measured = peaks[device]["peak"] - start
        predicted = figures.peak_memory_bytes
        error = _error(predicted, measured)
        rows.append({"model": name, "mode": mode,
                     "strategy": strategy + (f" M={plan.microbatches}"
                                             if plan.microbatches > 1 else ""),
                     "device": device.split("/device:")[0].replace("/replica:0", ""),
                     "ops": figures.ops,
                     "variables MB": f"{variables[device] / MB:.2f}",
                     "held MB": f"{(held[device]['current'] - start) / MB:.2f}",
                     "predicted MB": "" if predicted is None else f"{predicted / MB:.2f}",
                     "measured MB": f"{measured / MB:.2f}",
                     "error %": error,
                     **({"tensors MB": f"{tensors[device]['requested'] / MB:.2f}",
                         "error vs tensors %": _error(predicted, tensors[device]['requested'])}
                        if tensors else {}),
                     "old bound MB": "" if bound is None else f"{bound[device] / MB:.2f}"})
    console.print(f"{name} {strategy}: batch {batch}, "
                  + ", ".join(f"{r['device']} {r['predicted MB'] or '-'} predicted / "
                              f"{r['measured MB']} measured MB" for r in rows))
    return rows


def _error(predicted, measured):
    """(predicted - measured) / measured in percent, as the table shows it."""
    if predicted is None:
        return ""
    return f"{100 * (predicted - measured) / measured:+.0f}" if measured else "-"


def run_and_measure(workers, out, steps):
    """Run the compiled model in a fresh client process: two warm-up steps, reset the
    workers' peaks, ``steps`` steps; returns the workers' figures at the reset and
    after the steps, and the tensor peaks of their allocation logs over those steps
    (None without the log)."""
    client = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.memory_accuracy", "--steps", str(steps),
         "--client", str(workers.path), str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(client, "warm")
        held = workers.reset_memory()
        mark = workers.log_lines() if workers.allocation_log else None
        client.stdin.write("go\n")
        client.stdin.flush()
        _wait_for(client, "done")
        peaks = workers.memory()
        tensors = workers.tensor_peaks(mark) if workers.allocation_log else None
        client.stdin.write("exit\n")
        client.stdin.flush()
        client.wait(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    return held, peaks, tensors


def _wait_for(client, word):
    for line in client.stdout:
        if line.strip() == word:
            return
    client.wait()
    raise RuntimeError(f"the client stopped before '{word}':\n{client.stderr.read()[-3000:]}")


def run_client(cluster_file, out, steps):
    """The client process: load the compiled model ``out`` on the cluster's workers,
    two warm-up steps, print ``warm``, wait for a line, ``steps`` steps, print
    ``done``, wait for a line (the model stays loaded until then)."""
    import numpy as np

    from rewriters.tf_import import tensorflow
    from tfpart.core.cluster import load_cluster
    from tfpart.runtime import load, random_inputs, runnable

    tf = tensorflow()
    with runnable(out, load_cluster(cluster_file)) as compiled:
        plan = compiled.plan
        step = load(compiled.directory).signatures[plan.context["signature"]]
        inputs = random_inputs(step, plan.context["batch_size"], 0)

        def run():
            [np.asarray(t) for t in tf.nest.flatten(step(**inputs))]

        for _ in range(2):
            run()
        print("warm", flush=True)
        sys.stdin.readline()
        for _ in range(steps):
            run()
        print("done", flush=True)
        sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
