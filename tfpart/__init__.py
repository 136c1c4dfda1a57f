"""tfpart: an offline graph-partitioning compiler for TensorFlow SavedModels.

The Python API: ``compile_model`` (the whole pipeline) and ``plan_model`` (read and
partition without writing), of a SavedModel folder, a Keras model or a ``tf.Module``,
giving a ``CompileResult`` or a ``PlanResult``; ``clusters`` and ``examples`` (the
shipped cluster files and example models, by name: ``clusters.load("local_3cpu")``,
``examples.saved_model("residual_cnn")``); ``load`` (load a compiled model with its variable devices),
``connect`` (become a client of a cluster's ``tfpart worker`` tasks), ``verify``
(compare original and compiled), ``time_model``, ``LocalWorkers`` (a multi-host cluster
on this machine), ``export_train_step`` (a Keras model's training step as a
SavedModel signature), ``train`` and ``TrainOptions`` (train its weights on a cluster,
synchronously or asynchronously on parameter servers), ``trained_weights``, ``draw``
(a picture of a plan), ``diff_plans`` (what changed between two plans),
``load_cluster``, ``Plan``, ``Cluster``; ``checkpoint_to_original`` and
``checkpoint_to_compiled`` (a checkpoint moved between a compiled model and its
original, a table's row shards included); ``CostModel``, ``simulate_execution`` and
``write_gantt`` (price a plan, whatever its strategy, and chart its simulated
schedule), ``simulate_plan`` (an op placement's schedule); ``runnable`` (a
compiled model made runnable on this machine's logical CPUs, a ``RunnableModel``) and ``compiled_inputs``
(inputs to run it on: random, its ragged and sparse inputs valid, or an ``.npz``'s
rows); ``load_op_libraries`` (register a model's custom ops, as ``op_libraries=`` does
for the functions above, before loading it yourself); ``ensure_local_cpus``;
``resolve_strategy`` (what a compile's flags ask for); ``load_moirai`` and
``load_tarnawski_stages`` (published cost-annotated graphs); the shipped examples
``DEFAULT_MODEL_DIR``, ``DEFAULT_CLUSTER_FILE`` and ``CLUSTERS_DIR``.
Names resolve lazily, so ``import tfpart`` neither starts TensorFlow nor creates
import cycles with the packages below it.

>>> import tfpart
>>> tfpart.load_cluster.__module__
'tfpart.core.cluster'
>>> tfpart.clusters.names()[0]
'4xT4_one_host'
"""
from importlib import import_module

_API = {"Cluster": "tfpart.core.cluster", "load_cluster": "tfpart.core.cluster",
        "Plan": "tfpart.core.plan", "TfpartError": "tfpart.core.errors",
        "compile_model": "tfpart.compile", "plan_model": "tfpart.compile",
        "CompileResult": "tfpart.compile", "PlanResult": "tfpart.compile",
        "clusters": "tfpart.clusters", "examples": "tfpart.examples",
        "load": "tfpart.runtime", "verify": "tfpart.verification", "connect": "tfpart.servers",
        "time_model": "tfpart.timing", "LocalWorkers": "tfpart.local_workers",
        "export_train_step": "tfpart.training", "draw": "tfpart.picture",
        "diff_plans": "tfpart.plan_diff", "train": "tfpart.trainer.loop",
        "TrainOptions": "tfpart.trainer.loop",
        "trained_weights": "tfpart.trainer.loop",
        "CostModel": "costmodel", "simulate_plan": "costmodel.simulate",
        "simulate_execution": "costmodel.execution",
        "write_gantt": "costmodel.gantt", "runnable": "tfpart.runtime",
        "RunnableModel": "tfpart.runtime",
        "compiled_inputs": "tfpart.runtime", "load_op_libraries": "tfpart.op_libraries",
        "ensure_local_cpus": "tfpart.runtime", "resolve_strategy": "tfpart.strategy_request",
        "load_moirai": "tfpart.importers", "load_tarnawski_stages": "tfpart.importers",
        "DEFAULT_MODEL_DIR": "profiles", "DEFAULT_CLUSTER_FILE": "profiles",
        "CLUSTERS_DIR": "profiles", "checkpoint_to_original": "tfpart.checkpoints",
        "checkpoint_to_compiled": "tfpart.checkpoints"}

__all__ = sorted(_API)


def __getattr__(name):
    if name not in _API:
        raise AttributeError(f"module 'tfpart' has no attribute {name!r}")
    module = import_module(_API[name])
    return module if module.__name__ == f"tfpart.{name}" else getattr(module, name)
