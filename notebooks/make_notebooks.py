"""Write the notebooks of this folder from the cells below and execute them in place, so
they are committed with their outputs (``python notebooks/make_notebooks.py``; the
tests execute them again, see tests/test_notebooks.py)."""
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent

SETUP = '''\
import os, tempfile
from pathlib import Path
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tfpart
tfpart.ensure_local_cpus(8)  # logical CPUs standing in for a cluster's devices, before Keras starts TF
WORK = Path(tempfile.mkdtemp(prefix="tfpart-notebook-"))
def per_device(plan):
    print(f"{'device':48s} {'kind':6s} {'ops':>5s} {'busy ms':>9s} {'peak MB':>9s}")
    for name, d in plan.predicted.devices.items():
        print(f"{name:48s} {d.kind:6s} {d.ops:5d} {d.busy_s * 1e3:9.3f} "
              f"{(d.peak_memory_bytes or 0) / 1e6:9.1f}")
    print(f"predicted step {plan.step_time * 1e3:.3f} ms, lower bound "
          f"{plan.lower_bound * 1e3:.3f} ms")'''

KERAS_CNN = '''\
import keras
import tensorflow as tf
tf.get_logger().setLevel("ERROR")  # no "Assets written to" lines
keras.utils.set_random_seed(0)
inputs = keras.Input((32, 32, 3), name="image")
x = inputs
for width in (32, 64, 64, 128):
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
x = keras.layers.GlobalAveragePooling2D()(x)
outputs = keras.layers.Dense(10)(x)
model = keras.Model(inputs, outputs, name="small_cnn")'''

NOTEBOOKS = {
    "01_quickstart.ipynb": [
        ("markdown", "# Quickstart\n\nCompile a Keras model for a heterogeneous "
                     "cluster (2×V100 + 2×T4 on two hosts), look at the plan, verify it, "
                     "and load the result with plain TensorFlow."),
        ("code", SETUP),
        ("code", KERAS_CNN),
        ("code", '''\
result = tfpart.compile_model(model, tfpart.clusters.load("hetero_2v100_2t4"), WORK / "out",
                              batch_size=16, verify=True)
per_device(result.plan)
print("verified:", result.verification.ok,
      "max abs difference", result.verification.max_abs_diff)'''),
        ("markdown", "The placement picture: name scopes per device, red edges cross "
                     "devices with the bytes they carry."),
        ("code", '''\
from IPython.display import SVG, Image, display
path, note, picture = tfpart.draw(result.plan, result.graph, WORK / "placement.svg")
print(note)
display(SVG(filename=str(path)) if path.suffix == ".svg" else note)'''),
        ("markdown", "The simulated step as a Gantt chart (one row per device and link)."),
        ("code", '''\
run = tfpart.simulate_execution(result.plan, tfpart.CostModel(result.graph, result.cluster))
display(Image(filename=str(tfpart.write_gantt(run.schedule, run.cost, WORK / "gantt.png"))))'''),
        ("markdown", "The output is a SavedModel that stock TensorFlow loads; on this "
                     "machine its GPUs and hosts are stood in for by logical CPUs."),
        ("code", '''\
import numpy as np
x = np.random.default_rng(0).standard_normal((16, 32, 32, 3)).astype(np.float32)
with tfpart.runnable(result.out) as here:  # a copy whose devices are this machine's CPUs
    compiled = tf.saved_model.load(str(here.directory)).signatures["serving_default"]
    (got,) = compiled(image=x).values()
difference = float(np.abs(got.numpy() - model(x).numpy()).max())
print(f"largest difference between original and compiled outputs: {difference:.2e}")'''),
    ],
    "02_what_if.ipynb": [
        ("markdown", "# What if\n\nThe same model on several clusters and with each "
                     "algorithm: predicted step time against the lower bound, memory per "
                     "device, and how a measured profile changes the plan."),
        ("code", SETUP),
        ("code", KERAS_CNN),
        ("code", '''\
saved = WORK / "model"  # 23 plans of one model below: exported once, not at each plan
model.export(str(saved), verbose=False)
CLUSTERS = ["4xT4_one_host", "hetero_2v100_2t4", "a100_l4_one_host"]
ALGORITHMS = ["greedy", "m_etf", "m_topo", "topo_split", "round_robin", "single", "ilp"]
rows = {}
for name in CLUSTERS:
    cluster = tfpart.clusters.load(name)
    for algorithm in ALGORITHMS:
        options = {"time_limit": 10} if algorithm == "ilp" else None
        plan = tfpart.plan_model(saved, cluster, batch_size=32, algorithm=algorithm,
                                 options=options).plan
        rows[(name, algorithm)] = plan
        print(f"{name:18s} {algorithm:12s} step {plan.step_time * 1e3:8.3f} ms  "
              f"bound {plan.lower_bound * 1e3:8.3f} ms  devices {len(plan.devices_used())}")'''),
        ("code", '''\
import matplotlib.pyplot as plt
import numpy as np
fig, axes = plt.subplots(1, len(CLUSTERS), figsize=(15, 4), sharey=False)
for ax, name in zip(axes, CLUSTERS):
    steps = [rows[(name, a)].step_time * 1e3 for a in ALGORITHMS]
    ax.bar(ALGORITHMS, steps, color="#4e79a7")
    ax.axhline(rows[(name, "greedy")].lower_bound * 1e3, color="#e15759", label="lower bound")
    ax.set_title(name); ax.set_ylabel("predicted step (ms)"); ax.tick_params(axis="x", rotation=60)
    ax.legend()
fig.tight_layout()'''),
        ("code", '''\
fig, axes = plt.subplots(1, len(CLUSTERS), figsize=(15, 4))
for ax, name in zip(axes, CLUSTERS):
    plan = rows[(name, "greedy")]
    devices = list(plan.predicted.devices)
    peak = [plan.predicted.devices[d].peak_memory_bytes / 1e6 for d in devices]
    ax.bar([d.split("/")[-1] + "\\n" + d.split("/")[-3] for d in devices], peak,
           color="#59a14f")
    ax.set_title(f"{name}: greedy, peak memory"); ax.set_ylabel("MB")
    ax.tick_params(axis="x", labelsize=7)
fig.tight_layout()'''),
        ("markdown", "A measured profile: time every op of the model on this machine "
                     "(`tfpart profile`), then plan for three CPUs with and without it."),
        ("code", '''\
import subprocess, sys
profile_file = WORK / "cpu_profile.json"  # profiled in a fresh process: its own threads
subprocess.run([str(Path(sys.executable).parent / "tfpart"), "profile", str(saved),
                "--batch-size", "32", "--repeats", "5", "-o", str(profile_file)],
               check=True, capture_output=True)
cluster = tfpart.clusters.load("local_3cpu")
roofline = tfpart.plan_model(saved, cluster, batch_size=32)
measured = tfpart.plan_model(saved, cluster, batch_size=32, profiles=[profile_file])
moved = sum(roofline.plan.assignment[op] != measured.plan.assignment[op]
            for op in roofline.graph.ops)
for name, planned in (("roofline", roofline), ("measured", measured)):
    print(f"{name}: step {planned.step_time * 1e3:.2f} ms on "
          f"{len(planned.plan.devices_used())} devices")
print(f"{moved} of {len(roofline.graph)} ops placed differently with the measured profile")'''),
    ],
    "03_pipelining.ipynb": [
        ("markdown", "# Pipelining\n\nThroughput and bubble against the number of "
                     "micro-batches, the stages drawn, fill-drain (GPipe) against 1F1B memory "
                     "for a training step, and a run on two local workers with the measured "
                     "throughput beside the prediction."),
        ("code", SETUP),
        ("code", KERAS_CNN),
        ("code", '''\
cluster = tfpart.clusters.load("4xT4_one_host")
figures = {}
for m in (1, 2, 4, 8, 16):
    planned = tfpart.plan_model(model, cluster, batch_size=64, microbatches=m)
    p = planned.plan.predicted.pipeline
    figures[m] = (p.throughput, p.bubble_fraction, len(p.stages))
    print(f"M={m:2d}: {p.throughput:9.0f} samples/s, bubble {p.bubble_fraction:5.1%}, "
          f"{len(p.stages)} stages")'''),
        ("code", '''\
import matplotlib.pyplot as plt
ms = list(figures)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(ms, [figures[m][0] for m in ms], "o-", label="throughput")
ax.set_xscale("log", base=2); ax.set_xlabel("micro-batches M"); ax.set_ylabel("samples/s")
ax2 = ax.twinx(); ax2.plot(ms, [figures[m][1] for m in ms], "s--", color="#e15759", label="bubble")
ax2.set_ylabel("bubble fraction"); fig.legend(loc="lower right"); fig.tight_layout()'''),
        ("code", '''\
from IPython.display import SVG, display
staged = tfpart.plan_model(model, cluster, batch_size=64, microbatches=4)
path, note, picture = tfpart.draw(staged.plan, staged.graph, WORK / "stages.svg")
print(note)
display(SVG(filename=str(path)) if path.suffix == ".svg" else note)'''),
        ("markdown", "A training step (forward, backward, Adam update) pipelined with "
                     "GPipe and with 1F1B: 1F1B keeps fewer micro-batches' activations."),
        ("code", '''\
step_dir = tfpart.export_train_step(model, keras.optimizers.Adam(1e-3), "mse",
                                    WORK / "train_step")
for schedule in ("gpipe", "1f1b"):
    planned = tfpart.plan_model(step_dir, cluster, batch_size=64, signature="train_step",
                                microbatches=8, schedule=schedule)
    peak = max(d.peak_memory_bytes or 0 for d in planned.plan.predicted.devices.values())
    print(f"{schedule:6s}: step {planned.step_time * 1e3:8.3f} ms, "
          f"largest device peak {peak / 1e6:7.1f} MB")'''),
        ("markdown", "Two `tfpart worker` processes on this machine (TensorFlow servers on "
                     "loopback), the pipelined model run across them."),
        ("code", '''\
with tfpart.LocalWorkers(2, WORK) as workers:
    two = tfpart.load_cluster(workers.path)
    result = tfpart.compile_model(model, two, WORK / "piped", batch_size=64, microbatches=4)
    timed = tfpart.time_model(result.out, cluster=two, repeats=10)
predicted = result.plan.predicted.pipeline.throughput
print(f"predicted {predicted:.0f} samples/s, measured {timed['samples_per_s']:.0f} samples/s")'''),
    ],
    "04_published_graphs.ipynb": [
        ("markdown", "# Published graphs\n\nEvery algorithm on the cost-annotated graphs "
                     "in `../shared/benchmarks/`: the Moirai heterogeneous graphs against "
                     "the lower bound, and Tarnawski et al.'s pipeline graphs against their "
                     "published optimal max-load."),
        ("code", SETUP),
        ("code", '''\
from partitioner import HEURISTICS, ilp
from partitioner.ilp import ILPOptions
SHARED = Path.cwd().resolve().parent.parent / "shared" / "benchmarks"
moirai = {}
for name in ("GoogLeNet", "inceptionv4"):
    graph, cluster = tfpart.load_moirai(SHARED / "moirai" / f"{name}.json")
    cost = tfpart.CostModel(graph, cluster)
    moirai[name] = {}
    for algorithm, module in dict(HEURISTICS, ilp=ilp).items():
        options = {"options": ILPOptions(time_limit=10)} if algorithm == "ilp" else {}
        plan = module.partition(cost, **options)
        moirai[name][algorithm] = plan.step_time / plan.lower_bound
    print(name, {k: round(v, 3) for k, v in moirai[name].items()})'''),
        ("code", '''\
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(14, 4))
for ax, (name, ratios) in zip(axes, moirai.items()):
    ax.bar(list(ratios), list(ratios.values()), color="#4e79a7")
    ax.axhline(1.0, color="#e15759"); ax.set_yscale("log")
    ax.set_title(f"{name}: step / lower bound (log)"); ax.tick_params(axis="x", rotation=60)
fig.tight_layout()'''),
        ("code", '''\
from partitioner.stage_dp import solve as solve_stages
PUBLISHED = {"LayerGraphs/bert24_inference": 17.7899, "LayerGraphs/bert24_training": 41.7458,
             "LayerGraphs/resnet50_inference": 33.7747, "LayerGraphs/resnet50_training": 78.6318}
found = {}
for name, optimum in PUBLISHED.items():
    problem, _ = tfpart.load_tarnawski_stages(SHARED / "tarnawski" / f"{name}.json")
    found[name] = solve_stages(problem).max_load
    print(f"{name:34s} published optimum {optimum:9.4f}  tfpart {found[name]:9.4f}")
fig, ax = plt.subplots(figsize=(8, 3.5))
names = list(PUBLISHED)
ax.bar([n.split("/")[1] for n in names], [found[n] / PUBLISHED[n] for n in names],
       color="#59a14f")
ax.axhline(1.0, color="#e15759"); ax.set_ylabel("tfpart / published optimum")
fig.tight_layout()'''),
    ],
}


def build(name, cells):
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    notebook.cells = [nbformat.v4.new_markdown_cell(text) if kind == "markdown" else
                      nbformat.v4.new_code_cell(text) for kind, text in cells]
    return notebook


def execute(path, timeout=600):
    """Run the notebook at ``path`` top to bottom in its folder; return it executed."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def main(names=None):
    for name, cells in NOTEBOOKS.items():
        if names and name not in names:
            continue
        path = HERE / name
        nbformat.write(build(name, cells), path)
        nbformat.write(execute(path), path)
        print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1:])
