"""Every ``keras.applications`` model compiled with ``--verify``: the model zoo table.

    python -m benchmarks.model_zoo                       # all of them, a table
    python -m benchmarks.model_zoo --models ResNet50 Xception --cluster gpu --markdown
    python -m benchmarks.model_zoo --memory-fraction 0.6 --markdown   # bigger than a device
    python -m benchmarks.model_zoo --families keras-hub tf-keras tfrs --markdown

``--families`` picks the families of models (``applications``, the default, and the
keras-hub, tf-keras and TF Recommenders models of :mod:`benchmarks.zoo_models`, whose
packages ``benchmarks/requirements-zoo.txt`` installs); ``--models`` names some of them.

Each model is built with random weights (``weights=None``, 10 classes) at the smallest
input its builder accepts among 32 x 32 and 75 x 75, exported with Keras 3's
``model.export``, and compiled at batch 2 with ``--strategy auto`` and ``--verify`` on
the default cluster (or the A100 + 2 L4 + CPU cluster mapped onto logical CPUs,
``--cluster gpu``), each in a fresh process with a time limit. A row gives the ops
read, the predicted step of the plan auto chose, the compile's wall time (export
excluded), whether the outputs equal the original's, the ops found on another device
than planned, or the one-line error.

With ``--memory-fraction F`` each model is instead compiled twice with ``--verify``, as
an op placement and as a pipeline, for the default cluster's three logical CPUs each
holding F times the model's predicted single-device peak (the first also holding the
Keras export's unread copy of the variables, which is kept there): a model bigger than
any one device. A row gives that peak, each compile's result with its fullest device's
predicted peak against its memory, or the one-line error.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 75}  # their minimum

CHILD = """
import sys
from examples.models import export_keras_application
export_keras_application(sys.argv[3], sys.argv[1], int(sys.argv[2]), classes=10)
"""

FAMILY_CHILD = """
import sys
from benchmarks.zoo_models import export_model
export_model(sys.argv[1], sys.argv[2], sys.argv[3])
"""
APPLICATIONS = "applications"

COMPILE = """
import json, sys, time
from tfpart.compile import compile_model
from tfpart.core.errors import TfpartError
from tfpart.strategy_lines import seconds
start = time.perf_counter()
try:
    result = compile_model(sys.argv[1], sys.argv[2], sys.argv[3], batch_size=2,
                           strategy="auto", verify=True)
except TfpartError as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(0)
report = result.verification
print(json.dumps({"ops": len(result.graph), "seconds": time.perf_counter() - start,
                  "step": seconds(result.plan.predicted.step_time),
                  "equal": bool(report.outputs_equal), "diff": float(report.max_abs_diff),
                  "off_plan": len(report.op_mismatches) + len(report.variable_mismatches),
                  "strategy": result.plan.context.get("strategy", {}).get("chosen")}))
"""


FRACTION_COMPILE = """
import json, sys, time
from benchmarks.memory_fit import single_device_peak, with_memory
from profiles import DEFAULT_CLUSTER_FILE
from tfpart.compile import compile_model
from tfpart.core.errors import TfpartError
model, out, fraction = sys.argv[1], sys.argv[2], float(sys.argv[3])
peak, unread = single_device_peak(model, 2)
cluster = with_memory(json.loads(open(DEFAULT_CLUSTER_FILE).read()), int(fraction * peak),
                      unread)
path = out + ".json"
open(path, "w").write(json.dumps(cluster))
row = {"peak MB": f"{peak / 1e6:.1f}"}
for strategy, options in (("placement", {}), ("pipeline", {"pipeline": True})):
    start = time.perf_counter()
    try:
        result = compile_model(model, path, out + "-" + strategy, batch_size=2, verify=True,
                               **options)
        report = result.verification
        fullest = max(d.peak_memory_bytes / d.memory_bytes
                      for d in result.plan.predicted.devices.values())
        row[strategy] = (f"{'equal' if report.outputs_equal else 'DIFFER'}, "
                         f"{len(report.op_mismatches)} off-plan, fullest {100 * fullest:.0f}%, "
                         f"{time.perf_counter() - start:.0f} s")
    except TfpartError as exc:
        row[strategy] = str(exc).split(": ", 1)[-1][:150]
print(json.dumps(row))
"""


def export_application(name, model, timeout, family=APPLICATIONS):
    """Export the model ``name`` of ``family`` (a Keras application by default) to
    ``model`` in a fresh process unless it is there already; returns None, or why the
    export failed."""
    if (Path(model) / "saved_model.pb").exists():
        return None
    if family == APPLICATIONS:
        exported = run(CHILD, [name, SIZES.get(name, 32), model], timeout)
    else:
        from benchmarks.zoo_models import environment

        exported = run(FAMILY_CHILD, [family, name, model], timeout, environment(family))
    return f"export failed: {exported['error']}" if exported.get("error") else None


def model_input(family, name):
    """What a row's ``input`` column says: an application's image size, or the input
    of the family's models."""
    from benchmarks.zoo_models import INPUTS

    return SIZES.get(name, 32) if family == APPLICATIONS else INPUTS[family]


def model_folder(work, family, name):
    return Path(work) / name if family == APPLICATIONS else Path(work) / family / name


def model_label(family, name):
    return name if family == APPLICATIONS else f"{family}: {name}"


def fraction_row(family, name, fraction, work, timeout):
    """A row of the ``--memory-fraction`` table for one model."""
    model = model_folder(work, family, name)
    row = {"model": model_label(family, name), "input": model_input(family, name)}
    failed = export_application(name, model, timeout, family)
    if failed:
        return {**row, "placement": failed}
    with tempfile.TemporaryDirectory() as scratch:
        got = run(FRACTION_COMPILE, [model, Path(scratch) / "out", fraction], 2 * timeout)
    return {**row, **({"placement": got["error"]} if got.get("error") else got)}


def application_names():
    import keras

    return sorted(name for name in dir(keras.applications) if name[:1].isupper())


def family_names(family):
    """The names of ``family``'s models, in the order of its table."""
    if family == APPLICATIONS:
        return application_names()
    from benchmarks.zoo_models import FAMILIES

    return list(FAMILIES[family])


def run(code, argv, timeout, environment=None):
    """The last JSON line ``code`` prints in a fresh process (with ``environment``'s
    variables added to this one's), or an error row."""
    try:
        done = subprocess.run([sys.executable, "-c", code, *map(str, argv)],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                   **(environment or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"over the {timeout} s limit"}
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {last[:160]}"}
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def zoo_row(family, name, cluster, work, timeout):
    """A row of the zoo table: the model ``name`` of ``family`` compiled by ``auto``
    with ``--verify`` for ``cluster``."""
    label, size = model_label(family, name), model_input(family, name)
    model = model_folder(work, family, name)
    failed = export_application(name, model, timeout, family)
    if failed:
        return {"model": label, "input": size, "ops": "", "predicted step": "",
                "compile s": "", "result": failed}
    with tempfile.TemporaryDirectory() as scratch:
        began = time.perf_counter()
        got = run(COMPILE, [model, cluster, Path(scratch) / "out"], timeout)
        wall = time.perf_counter() - began
    if got.get("error"):
        result = got["error"]
    else:
        result = (f"{'equal' if got['equal'] else 'DIFFER'} (max diff {got['diff']:.2g}), "
                  f"{got['off_plan']} off-plan, {got['strategy']}")
    return {"model": label, "input": size, "ops": got.get("ops", ""),
            "predicted step": got.get("step", ""),
            "compile s": f"{got.get('seconds', wall):.1f}", "result": result}


def main(argv=None):
    from rich.console import Console

    from benchmarks.markdown import show_rows
    from profiles import CLUSTERS_DIR, DEFAULT_CLUSTER_FILE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=[APPLICATIONS],
                        choices=[APPLICATIONS, "keras-hub", "tf-keras", "tfrs"])
    parser.add_argument("--models", nargs="+", default=None,
                        help="only these of the families' models")
    parser.add_argument("--cluster", choices=["default", "gpu"], default="default")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--work", default=Path(tempfile.gettempdir()) / "tfpart-model-zoo")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--memory-fraction", type=float, default=None,
                        help="devices each holding this fraction of a model's peak")
    args = parser.parse_args(argv)
    cluster = DEFAULT_CLUSTER_FILE if args.cluster == "default" else \
        CLUSTERS_DIR / "a100_l4_one_host.json"
    Path(args.work).mkdir(parents=True, exist_ok=True)
    console = Console()
    rows = []
    chosen = [(family, name) for family in args.families for name in family_names(family)
              if args.models is None or name in args.models]
    if not chosen:
        parser.error(f"none of {args.families}'s models is named {args.models}")
    for family, name in chosen:
        rows.append(zoo_row(family, name, cluster, args.work, args.timeout)
                    if args.memory_fraction is None else
                    fraction_row(family, name, args.memory_fraction, args.work, args.timeout))
        console.print(rows[-1])  # a long run shows its progress
    models = ", ".join("keras.applications" if family == APPLICATIONS else family
                       for family in args.families)
    title = f"{models} compiled with --verify ({args.cluster} cluster, batch 2)" \
        if args.memory_fraction is None else \
        (f"{models} compiled with --verify for 3 logical CPUs each holding "
         f"{args.memory_fraction} x its single-device peak (batch 2)")
    show_rows(console, title, rows, args.markdown)


if __name__ == "__main__":
    main()
