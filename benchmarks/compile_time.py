"""Compile time per phase and peak memory, for real models and synthetic graphs.

    python -m benchmarks.compile_time                  # every model, a table
    python -m benchmarks.compile_time --models example resnet50 --markdown
    python -m benchmarks.compile_time --models resnet50 --batch-size 32 --synthetic

Each real model (exported by Keras with random weights, once, into ``--work``) is
compiled with ``tfpart compile`` on the default cluster, without ``--verify``, in a
fresh process, once per strategy of ``--strategies`` (default: one op placement by
the greedy, then ``auto``, which plans every strategy and keeps the fastest), twice
each: the first run after an empty numba cache (``first``: the kernels compile), the
second with the cache (the time a user sees from then on). A row gives the phases of
the second run (:mod:`tfpart.core.phases`), its total wall time, that time over the
first strategy's (``x first``: auto's cost beside one placement, measured in the same
run), the first run's wall time and the peak resident memory. The synthetic graphs
(random DAGs of 10k and 100k ops on 8 GPUs, :mod:`benchmarks.synthetic`) time the cost
model and the greedy partitioner alone, in this process.
"""
import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PHASES = ("read", "analyse", "cost", "partition", "rewrite", "write", "picture", "report")


def export_dense_10k(path, layers=1250):
    """A deep Keras MLP of about 10,000 ops (each Dense layer is MatMul, BiasAdd, Relu
    and their variable reads)."""
    import keras

    sys.setrecursionlimit(50_000)  # Keras walks a functional model's layers recursively
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))
    x = inputs
    for _ in range(layers):
        x = keras.layers.Dense(32, activation="relu")(x)
    keras.Model(inputs, x).export(str(path), verbose=False)
    return path


APPLICATIONS = {"resnet50": "ResNet50", "nasnet_mobile": "NASNetMobile"}


def model_path(name, work):
    """The SavedModel of ``name``, exported into ``work`` the first time."""
    from profiles import DEFAULT_MODEL_DIR

    if name == "example":
        return DEFAULT_MODEL_DIR
    path = Path(work) / name
    if not (path / "saved_model.pb").exists():  # in a child: Keras keeps its graphs
        call = f"export_keras_application({str(path)!r}, {APPLICATIONS[name]!r})" \
            if name in APPLICATIONS else f"export_{name}({str(path)!r})"
        subprocess.run([sys.executable, "-c", "from benchmarks.compile_time import *; "
                        f"from examples.models import export_keras_application; {call}"],
                       check=True, capture_output=True)
    return path


CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from tfpart.compile import compile_model
result = compile_model(sys.argv[1], sys.argv[2], sys.argv[3], batch_size=int(sys.argv[4]),
                       strategy=sys.argv[5])
print(json.dumps({"timings": result.timings, "ops": len(result.graph),
                  "chosen": result.strategy,
                  "wall": time.perf_counter() - start,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def compile_once(model, out, numba_cache, batch_size=1, strategy="placement"):
    """Phase times, op count, the strategy chosen, wall seconds (imports included) and
    peak MB of one compile of ``model`` with ``strategy`` in a fresh process."""
    import os

    from profiles import DEFAULT_CLUSTER_FILE

    done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(DEFAULT_CLUSTER_FILE),
                           str(out), str(batch_size), strategy],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(numba_cache),
                               "TF_CPP_MIN_LOG_LEVEL": "2"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_rows(name, work, strategies=("placement", "auto"), batch_size=1):
    """A row per strategy of ``strategies`` for model ``name``, compiled at
    ``batch_size``, one strategy after the other on the same machine."""
    model = model_path(name, work)
    rows, baseline = [], None
    for strategy in strategies:
        with tempfile.TemporaryDirectory() as scratch:
            first, second = (compile_once(model, Path(scratch) / run, Path(scratch) / "numba",
                                          batch_size, strategy)
                             for run in ("first", "second"))
        baseline = baseline or second["wall"]
        row = {"model": name, "strategy": f"{strategy} ({second['chosen']})",
               "ops": second["ops"]}
        row.update({phase: f"{second['timings'].get(phase, 0.0):.2f}" for phase in PHASES})
        row.update({"total s": f"{second['wall']:.1f}",
                    "x first": f"{second['wall'] / baseline:.2f}",
                    "first run s": f"{first['wall']:.1f}",
                    "peak MB": f"{second['peak_mb']:.0f}"})
        rows.append(row)
    return rows


def synthetic_row(ops):
    from benchmarks.synthetic import random_cluster, random_dag
    from costmodel import CostModel
    from partitioner.registry import get

    rng = np.random.default_rng(0)
    graph, cluster = random_dag(ops, rng, window=50), random_cluster(8, rng)
    start = time.perf_counter()
    cost = CostModel(graph, cluster)
    costed = time.perf_counter()
    get("greedy").partition(cost)
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    row = {"model": f"random DAG {ops // 1000}k (partition only)", "strategy": "greedy",
           "ops": ops}
    row.update({phase: "" for phase in PHASES})
    row.update({"cost": f"{costed - start:.2f}", "partition": f"{done - costed:.2f}",
                "total s": f"{done - start:.1f}", "x first": "", "first run s": "",
                "peak MB": f"{peak / 1024:.0f}"})
    return row


def main(argv=None):
    from rich.console import Console

    from benchmarks.markdown import show_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["example", "resnet50",
                                                        "nasnet_mobile", "dense_10k"])
    parser.add_argument("--strategies", nargs="+", default=["placement", "auto"],
                        help="the --strategy of each compile, side by side")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--synthetic", nargs="*", type=int, default=[10_000, 100_000])
    parser.add_argument("--work", default=Path(tempfile.gettempdir()) / "tfpart-compile-time")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    rows = [row for name in args.models
            for row in model_rows(name, args.work, args.strategies, args.batch_size)]
    rows += [synthetic_row(ops) for ops in args.synthetic]
    show_rows(Console(), "Compile time per phase (s), default cluster, batch "
              f"{args.batch_size}", rows, args.markdown)


if __name__ == "__main__":
    main()
