"""Models bigger than a device, measured: each model compiled for three ``tfpart worker``
processes that each hold a fraction of its predicted single-device peak, as an op
placement and as a pipeline, verified, run, and every worker's allocator peak read.

    python -m benchmarks.memory_fit [--models DenseNet121 MobileNetV2 ...]
                                    [--fraction 0.6] [--markdown] [--smallest]

The models are ``keras.applications`` built as :mod:`benchmarks.model_zoo` builds them
(random weights, 10 classes, 32 x 32 or their smallest input) at batch 2; without
``--models``, all of them. Each worker holds ``fraction`` x the model's predicted peak
on one device of the default cluster; the first also holds the Keras export's unread
copy of the variables, which is kept there. The workers are started with
``--memory-stats`` (TensorFlow's BFC allocator, one large region reserved at the start
as a GPU's allocator does: :mod:`tfpart.memory_stats`); the compiled model runs two
warm-up steps and two measured ones from a fresh client
(:func:`benchmarks.memory_accuracy.run_and_measure`). A row gives, for each strategy,
whether the outputs equal the original's, and the fullest worker's predicted and
measured peak against its memory, or the one-line error.

With ``--smallest`` nothing runs: each model is planned (:func:`smallest_fraction`,
a bisection) for ever smaller devices, and a row gives the smallest fraction of its
single-device peak that each of the three devices can hold and still get a placement,
or a pipeline.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

STRATEGIES = {"placement": {}, "pipeline": {"pipeline": True}}


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's peak for one compiled strategy, in bytes."""
    predicted: int
    measured: int
    memory: int


def single_device_peak(model, batch):
    """The predicted peak of ``model`` alone on one device of the default cluster, and
    the bytes of the variables its signature never reads (a Keras export's second copy,
    kept on the first device's host: on a CPU cluster, that device)."""
    from profiles import DEFAULT_CLUSTER_FILE
    from tfpart.compile import plan_model
    from tfpart.core.cluster import load_cluster

    plan = plan_model(model, load_cluster(DEFAULT_CLUSTER_FILE), batch_size=batch,
                      algorithm="single").plan
    unread = plan.context["unread_variables"]["bytes"]
    return sum(d.peak_memory_bytes for d in plan.predicted.devices.values()) - unread, unread


def with_memory(cluster, memory, unread):
    """``cluster`` (a cluster.json dict) with every device holding ``memory`` bytes, the
    first also ``unread`` (a Keras export's unread copy of the variables, kept there).

    >>> with_memory({"devices": [{"name": "a"}, {"name": "b"}]}, 10, 3)["devices"]
    [{'name': 'a', 'memory': 13}, {'name': 'b', 'memory': 10}]
    """
    for device in cluster["devices"]:
        device["memory"] = memory
    cluster["devices"][0]["memory"] += unread
    return cluster


def fraction_cluster(fraction, peak, unread):
    """The default cluster with every device holding ``fraction`` x ``peak`` bytes
    (:func:`with_memory`)."""
    from profiles import DEFAULT_CLUSTER_FILE
    from tfpart.core.cluster import cluster_from_dict

    cluster = json.loads(Path(DEFAULT_CLUSTER_FILE).read_text())
    return cluster_from_dict(with_memory(cluster, int(fraction * peak), unread),
                             source=f"{fraction:.3f} x the peak")


def smallest_fraction(model, peak, unread, batch=2, strategy="placement", low=1 / 3,
                      high=1.0, steps=6):
    """The smallest fraction of ``model``'s single-device ``peak`` (and ``unread``:
    :func:`single_device_peak`) each of the default cluster's three devices can hold
    and still get a ``strategy`` plan, by bisection between ``low`` (three devices of a
    third of the peak hold no more than one device of all of it) and ``high`` over
    ``steps`` plans; None if ``high`` gets none."""
    from tfpart.compile import plan_model
    from tfpart.core.errors import TfpartError

    def fits(fraction):
        try:
            plan_model(model, fraction_cluster(fraction, peak, unread), batch_size=batch,
                       **STRATEGIES[strategy])
            return True
        except TfpartError:
            return False

    if not fits(high):
        return None
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def fit_and_measure(model, work, fraction, batch=2, strategies=tuple(STRATEGIES)):
    """Compile ``model`` for three local workers each holding ``fraction`` x its
    single-device peak, verify it, run it and read every worker's peak; fresh workers
    for each strategy.

    Returns
    -------
    dict
        strategy -> ``(verification, {device: WorkerMemory})``; the compile's
        :class:`tfpart.core.errors.TfpartError` propagates.
    """
    from benchmarks.memory_accuracy import run_and_measure
    from tfpart.compile import compile_model
    from tfpart.core.cluster import normalize_device_name
    from tfpart.local_workers import LocalWorkers

    work = Path(work)
    peak, unread = single_device_peak(model, batch)
    results = {}
    for strategy in strategies:
        folder = work / strategy
        folder.mkdir(parents=True, exist_ok=True)
        # fresh workers: an allocator that ran another model first hands out its
        # freed chunks whole, up to twice a request (measured: 22.1 MB instead of
        # 19.4 MB for MobileNet's pipeline after its placement)
        with LocalWorkers(3, folder, memory_stats=True) as workers:
            cluster_file = folder / "small.json"
            cluster_file.write_text(json.dumps(with_memory(
                json.loads(workers.path.read_text()), int(fraction * peak), unread)))
            out = folder / "out"
            result = compile_model(model, cluster_file, out, batch_size=batch, verify=True,
                                   **STRATEGIES[strategy])
            _, peaks, _ = run_and_measure(workers, out, 2)
        measured = {normalize_device_name(d): f["peak"] - f["start"] for d, f in peaks.items()}
        results[strategy] = (result.verification, {
            name: WorkerMemory(d.peak_memory_bytes, measured[name], d.memory_bytes)
            for name, d in result.plan.predicted.devices.items()})
    return results


def fit_row(name, fraction, work, timeout, smallest=False):
    """A row of the table for one Keras application, built and measured (or with
    ``smallest``, planned for ever smaller devices) in a fresh process."""
    from benchmarks.model_zoo import export_application, run

    model = Path(work) / name
    row = {"model": name}
    exported = export_application(name, model, timeout)
    if exported:
        return {**row, **{s: exported for s in STRATEGIES}}
    if smallest:
        got = run(SMALLEST_CHILD, [model], 4 * timeout)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            got = run(CHILD, [model, scratch, fraction], 2 * timeout)
    return {**row, **({s: got["error"] for s in STRATEGIES} if got.get("error") else got)}


SMALLEST_CHILD = """
import json, sys
from benchmarks.memory_fit import single_device_peak, smallest_fraction
peak, unread = single_device_peak(sys.argv[1], 2)
row = {"peak MB": f"{peak / 1e6:.1f}"}
for strategy in ("placement", "pipeline"):
    fraction = smallest_fraction(sys.argv[1], peak, unread, strategy=strategy)
    row[strategy] = "none at 1.0" if fraction is None else \\
        f"{fraction:.3f} x ({fraction * peak / 1e6:.1f} MB)"
print(json.dumps(row))
"""

CHILD = """
import json, sys
from benchmarks.memory_fit import fit_and_measure, describe
from tfpart.core.errors import TfpartError
try:
    results = fit_and_measure(sys.argv[1], sys.argv[2], float(sys.argv[3]))
except TfpartError as exc:
    print(json.dumps({"error": str(exc).split(": ", 1)[-1][:150]}))
    sys.exit(0)
print(json.dumps({strategy: describe(*result) for strategy, result in results.items()}))
"""


def describe(verification, workers):
    """One cell: outputs equal or not, then the fullest worker's predicted and measured
    peak against its memory (MB), and how many workers the measured peak overflows.

    >>> from types import SimpleNamespace
    >>> describe(SimpleNamespace(outputs_equal=True, op_mismatches=[]),
    ...          {"a": WorkerMemory(4_300_000, 4_420_000, 5_700_000),
    ...           "b": WorkerMemory(1_000_000, 1_100_000, 5_700_000)})
    'equal, 0 off-plan; fullest 4.30 / 4.42 / 5.70 MB (78%); 0 over'
    """
    fullest = max(workers.values(), key=lambda w: w.measured / w.memory)
    over = sum(1 for w in workers.values() if w.measured > w.memory)
    return (f"{'equal' if verification.outputs_equal else 'DIFFER'}, "
            f"{len(verification.op_mismatches)} off-plan; fullest "
            f"{fullest.predicted / 1e6:.2f} / {fullest.measured / 1e6:.2f} / "
            f"{fullest.memory / 1e6:.2f} MB ({100 * fullest.measured / fullest.memory:.0f}%); "
            f"{over} over")


def main(argv=None):
    from rich.console import Console

    from benchmarks.markdown import show_rows
    from benchmarks.model_zoo import application_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--work", default=Path(tempfile.gettempdir()) / "tfpart-model-zoo")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--smallest", action="store_true",
                        help="instead, the smallest fraction that still plans (no run)")
    args = parser.parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    console = Console()
    rows = []
    for name in args.models or application_names():
        rows.append(fit_row(name, args.fraction, args.work, args.timeout, args.smallest))
        console.print(rows[-1])  # a long run shows its progress
    show_rows(console, "keras.applications: the smallest of three devices that gets a plan, "
              "as a fraction of the single-device peak (batch 2)" if args.smallest else
              f"keras.applications on 3 workers each holding {args.fraction} x its "
              "single-device peak (batch 2): predicted / measured / memory",
              rows, args.markdown)


if __name__ == "__main__":
    main()
