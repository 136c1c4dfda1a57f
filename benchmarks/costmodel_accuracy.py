"""How well does the cost model predict real step times on this machine?

For each model (MLP, residual CNN, transformer encoder, ResNet50) the script measures a
per-op profile here (``tfpart profile``: one core, one op at a time), compiles the model
for several placements with that profile, and compares the simulator's predicted step
time with the compiled model's measured step time (the least over ``--rounds`` fresh
processes, the cases timed in turn, of each one's median of ``--repeats`` calls; one
intra-op and one inter-op thread).

Each core of the shared machine this runs on changes speed by itself, in phases of
0.5–10 s: a 256×256 float32 matmul takes 210–280 µs in one phase and 340–410 µs in the
other (``--core-speed`` shows it). A profile taken in a slow phase prices every op up
to 1.45× high, a step timed in one runs that much slower. Both sides are therefore
taken at the machine's own speed: the model is profiled ``--profiles`` times, in fresh
processes, and the profile with the least step time is kept; each case's step is the
least of its rounds' medians.

* ``1 device``: the whole model on one CPU device;
* ``3 logical CPUs``: greedy, and a contiguous three-way split, on three logical CPU
  devices of one process (they share its executor: ``core_group``);
* ``2 workers``: greedy, and a two-way split, across two local ``tfpart worker``
  processes pinned to separate cores (``taskset``), linked over loopback gRPC, the
  link probed at the start of the run by ``tfpart cluster probe`` (latency, bandwidth
  and each message's executor time at both ends, which the workers' own cores pay).

Each cluster's ``step_overhead`` is measured at the start too: the cost of calling a
trivial ``tf.function`` from Python (and, for the workers, of launching it remotely).

Run from the repository root::

    .venv/bin/python -m benchmarks.costmodel_accuracy [--models mlp,cnn] [--markdown]

``--gpu`` runs the GPU section instead (no GPU needed): predictions against the real
H100 kernel times in ``../shared/gpu``, cross-validated per model
(:mod:`benchmarks.gpu_costmodel_accuracy`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from examples import models as example_models
from tfpart.local_workers import LocalWorkers

MODELS = {  # name -> (exporter, batch size)
    "mlp": (example_models.export_mlp_module, 256),
    "cnn": (example_models.export_residual_cnn, 16),
    "transformer": (example_models.export_transformer_encoder, 32),
    "resnet50": (example_models.export_resnet50, 2),
}
PYTHON = sys.executable


def tfpart_command():
    return shutil.which("tfpart", path=os.path.dirname(PYTHON)) or "tfpart"


def run_json(args, timeout=900):
    done = subprocess.run([PYTHON, "-m", "benchmarks.run_compiled", *args], capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


class AccuracyWorkers(LocalWorkers):
    """Two ``tfpart worker`` processes on loopback, each pinned to its own core."""

    def __init__(self, directory):
        super().__init__(2, directory, extra={"name": "2 local workers"})

    def probed(self, call_overhead, rounds=2):
        """Their cluster file with links probed by ``tfpart cluster probe`` (latency,
        bandwidth, the executor time per message) and a step's launch; its
        ``step_overhead`` also holds ``call_overhead``, the local call of the step."""
        path = self.path.with_name("workers_probed.json")
        subprocess.run([tfpart_command(), "cluster", "probe", str(self.path), "-o", str(path),
                        "--rounds", str(rounds)], check=True, capture_output=True)
        data = json.loads(path.read_text())
        data["step_overhead"] += call_overhead
        path.write_text(json.dumps(data))
        return path, data


def fastest_profile(model, batch, stem, count):
    """Profile ``model`` ``count`` times, each in a fresh ``tfpart profile`` process:
    the path of the profile whose own measured step is the least, and every profile's
    step (seconds)."""
    steps = {}
    for k in range(count):
        path = stem.with_name(f"{stem.name}.profile{k}.json")
        subprocess.run([tfpart_command(), "profile", str(model), "--batch-size", str(batch),
                        "-o", str(path)], check=True, capture_output=True)
        steps[path] = json.loads(path.read_text())["step_time_s"]
    return min(steps, key=steps.get), list(steps.values())


def matmul_speed(core, seconds):
    """Print ``core`` and the median time (µs) of a 256x256 float32 matmul over each
    half second, for ``seconds``, pinned to ``core``."""
    os.sched_setaffinity(0, [core])
    import numpy as np

    matrix, medians = np.ones((256, 256), np.float32), []
    end = time.time() + seconds
    while time.time() < end:
        times, stop = [], time.perf_counter() + 0.5
        while time.perf_counter() < stop:
            start = time.perf_counter()
            matrix @ matrix
            times.append(time.perf_counter() - start)
        medians.append(round(statistics.median(times) * 1e6))
    print(core, medians)


def show_core_speed(seconds):
    """Print, per core, :func:`matmul_speed` (every core at once, each in a process of
    its own, one BLAS thread): how the machine's speed moves."""
    runs = [subprocess.Popen(
        [PYTHON, "-c", "from benchmarks.costmodel_accuracy import matmul_speed; "
                       f"matmul_speed({core}, {seconds})"],
        text=True, stdout=subprocess.PIPE, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        for core in sorted(os.sched_getaffinity(0))]
    for run in runs:
        core, medians = run.communicate()[0].split(" ", 1)
        print(f"core {core}: 256x256 matmul, µs per half second: {medians.strip()}")
    return 0


def logical_cluster(directory, n, call_overhead):
    path = Path(directory) / f"logical{n}.json"
    path.write_text(json.dumps({"name": f"{n} logical CPUs", "step_overhead": call_overhead,
                                "devices": [
        {"name": f"/device:CPU:{i}", "kind": "cpu", "core_group": "process"}
        for i in range(n)], "links": {"same_host": {"bandwidth": "20GB/s", "latency": "2us"}}}))
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=15, help="steps timed per process")
    parser.add_argument("--rounds", type=int, default=5,
                        help="fresh processes per case, the cases in turn; the least of "
                             "their medians")
    parser.add_argument("--profiles", type=int, default=3,
                        help="profiles per model, each in a fresh process; the one with "
                             "the least step time is kept")
    parser.add_argument("--core-speed", type=float, metavar="SECONDS",
                        help="only show each core's speed over time: a 256x256 matmul's "
                             "median per half second, for this long")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown")
    parser.add_argument("--gpu", action="store_true", help="the GPU section instead: "
                        "cross-validated on measured H100 kernels "
                        "(benchmarks.gpu_costmodel_accuracy)")
    args = parser.parse_args(argv)
    if args.core_speed:
        return show_core_speed(args.core_speed)
    if args.gpu:
        from benchmarks import gpu_costmodel_accuracy

        return gpu_costmodel_accuracy.main(["--markdown"] if args.markdown else [])

    from tfpart.profiling import onednn_enabled
    from tfpart.compile import compile_model

    console = Console(width=150)
    console.print(f"oneDNN {'on' if onednn_enabled() else 'off'} (TF_ENABLE_ONEDNN_OPTS="
                  f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}); profiles time the "
                  "graph as TensorFlow runs it, Grappler's fusions included")
    work = Path(tempfile.mkdtemp(prefix="tfpart-accuracy-"))
    workers = AccuracyWorkers(work)
    rows = []
    try:
        call = run_json(["--measure-call", "--repeats", "200"])["call_overhead_s"]
        probed, data = workers.probed(call)
        pair = data["links"]["pairs"][0]
        console.print(f"Loopback gRPC between workers (tfpart cluster probe): latency "
                      f"{pair['latency'] * 1e6:.0f} µs, bandwidth {pair['bandwidth'] / 1e9:.2f} "
                      f"GB/s, {pair.get('message_cost', 0) * 1e6:.0f} µs of executor time a "
                      f"message; launching a step on the workers "
                      f"{(data['step_overhead'] - call) * 1e6:.0f} µs beyond a local call "
                      f"({call * 1e6:.0f} µs)")
        cases = [("1 device", logical_cluster(work, 1, call), "single", ["--logical-cpus", "1"]),
                 ("3 logical CPUs, greedy", logical_cluster(work, 3, call), "greedy",
                  ["--logical-cpus", "3"]),
                 ("3 logical CPUs, split", logical_cluster(work, 3, call), "topo_split",
                  ["--logical-cpus", "3"]),
                 ("2 workers, greedy", probed, "greedy", ["--cluster", str(workers.path)]),
                 ("2 workers, split", probed, "topo_split", ["--cluster", str(workers.path)])]
        for name in args.models.split(","):
            exporter, batch = MODELS[name]
            model = exporter(work / name)
            t0 = time.perf_counter()
            profile_path, steps = fastest_profile(model, batch, work / name, args.profiles)
            console.print(f"{name}: profiled {args.profiles} times in "
                          f"{time.perf_counter() - t0:.1f} s (fresh `tfpart profile` "
                          f"processes), steps {', '.join(f'{s * 1e3:.2f}' for s in steps)} ms:"
                          f" kept the {min(steps) * 1e3:.2f} ms one")
            compiled = []
            for case, cluster, algorithm, run_args in cases:
                out = work / f"{name}-{case.replace(' ', '_').replace(',', '')}"
                result = compile_model(model, cluster, out, batch_size=batch,
                                       algorithm=algorithm, profiles=[profile_path], force=True)
                compiled.append((case, out, run_args, result.plan))
            medians = {case: [] for case, *_ in compiled}
            for _ in range(args.rounds):  # the cases in turn: drift hits them alike
                for case, out, run_args, _ in compiled:
                    medians[case].append(run_json([str(out), "--repeats", str(args.repeats),
                                                   *run_args])["median_s"])
            for case, _, _, plan in compiled:
                used = sum(1 for d in plan.predicted.devices.values() if d.busy_s > 0)
                rows.append((name, batch, case, used, plan.step_time, min(medians[case])))
    finally:
        workers.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_results(console, rows, args.markdown)
    return 0


def print_results(console, rows, markdown):
    table = Table(title="Predicted vs measured step time (this machine)")
    for column in ("model", "batch", "placement", "devices busy", "predicted", "measured",
                   "error"):
        table.add_column(column, justify="left" if column in ("model", "placement") else "right")
    errors = {}
    lines = ["| model | batch | placement | devices busy | predicted (ms) | measured (ms) | error |",
             "|---|---|---|---|---|---|---|"]
    for name, batch, case, used, predicted, measured in rows:
        error = (predicted - measured) / measured
        errors.setdefault(name, []).append(abs(error))
        cells = (name, str(batch), case, str(used), f"{predicted * 1e3:.2f}",
                 f"{measured * 1e3:.2f}", f"{100 * error:+.1f}%")
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    summary = [f"{name}: MAPE {100 * statistics.mean(e):.1f}%" for name, e in errors.items()]
    overall = statistics.mean(e for es in errors.values() for e in es)
    console.print("; ".join(summary) + f"; overall MAPE {100 * overall:.1f}%")
    if markdown:
        print("\n".join(lines))
        print("\n" + "; ".join(summary) + f"; **overall MAPE {100 * overall:.1f}%**")


if __name__ == "__main__":
    sys.exit(main())
