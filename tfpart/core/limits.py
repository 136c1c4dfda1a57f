"""The bounds on every size a user controls, checked before the work they size starts.

Each limit is a constant here, and each check a small function raising one line of
:mod:`tfpart.core.errors` that names the file at fault and the limit:

- :data:`MAX_TENSOR_ELEMENTS`: no tensor of the model, at the compile batch size, may
  hold more elements than TensorFlow's int32-indexed kernels address (2**31 - 1):
  Grappler crashed the process on the example model at a batch of 10**7, whose
  largest tensor held 3.3e11. So :data:`MAX_BATCH_SIZE` is that number too (a larger
  batch puts every batch-carrying tensor over it), and :func:`check_tensor_sizes`
  finds, from the shapes TensorFlow's shape inference gives, the largest batch the
  model allows.
- :data:`MAX_GRAPH_OPS`: the ops of the model once its function calls are inlined
  (a 31 KB SavedModel whose functions call each other twice per level inlines into
  millions), and of the graph the simulator runs for a pipelined plan (every
  micro-batch a copy of the model). Reading a model took about 1 ms and 25 KB per
  op here (32,768 ops: 68 s, 1.4 GB), so 200,000 ops (130 ResNet50s) take minutes
  and about 5 GB. Calls nest at most :data:`MAX_CALL_DEPTH` deep (the reader
  inlines them recursively).
- :data:`MAX_MICROBATCHES`, and never more micro-batches than samples in the batch.
- :data:`MAX_COMPILED_OPS`: the ops of a compiled graph with micro-batches, which holds
  a copy of every op per micro-batch (:func:`check_microbatches`, and
  :func:`largest_microbatches` for the count a compile chooses itself). The pipeline
  pass imports each stage's copy into one growing graph, and TensorFlow's
  ``import_graph_def`` takes time in proportion to the graph it imports into, so the
  rewrite grows faster than the graph: the example model (92 ops) at 128, 256 and 512
  micro-batches took 21 s, 84 s and 188 s (3 GB) to rewrite on a busy 2-core machine,
  at 543 (49,956 ops) 306 s (167 s of CPU), and at 1024 (94,208 ops) ran past 300 s
  before the check. So 50,000 ops, minutes, as reading :data:`MAX_GRAPH_OPS` takes;
  the simulator alone handles :data:`MAX_GRAPH_OPS` in seconds (``tfpart simulate``).
- Threads (:func:`max_threads`): TensorFlow makes every thread of a pool it is given
  at once and aborts the process when one cannot be made (``pthread_create`` failing
  with EAGAIN: past the process ids, the memory maps or the address space left;
  under an 8 GB address-space limit ``tfpart worker --intra-threads 100000`` died of
  SIGSEGV, and 1000 of SIGABRT, "Thread tf_numa_-1_Eigen creation via
  pthread_create() failed"). Each thread also takes a process id from the whole
  machine, which has 32,768 here. Past the cores, more threads only
  wait for them (TensorFlow's default is one per core), so a pool may have at most
  :data:`MAX_THREADS_PER_CPU` per logical CPU; Linux's default ``pid_max`` is at
  least 1024 per CPU (32,768 on small machines), so even both pools together take
  a small share of it.
- :data:`MAX_LAUNCH_TIMEOUT_S`: the tasks of one launch start within minutes (a
  launcher starts them together, after any queue wait); a day is past any of that.
- :data:`MAX_TF_CONFIG_BYTES`: ``TF_CONFIG`` is read like any JSON input (depth,
  numbers: :mod:`tfpart.core.input_files`); a cluster of 10,000 tasks is 190 KB
  of it (Linux passes at most 128 KiB in one variable to a new program).
- :data:`MAX_TRAIN_STEPS`: ``tfpart train`` lists its function calls before it
  starts, 8 bytes each: ``--steps 10**12`` (four updates a call) asks for 2 TB and
  fails with a MemoryError.
- :data:`MAX_PLANNED_DEVICES`: the algorithms and the simulator keep tables over every
  pair of devices (a queue per directed link), and the greedy tries every device for
  every placement unit: 300 ops took 42 s on 128 devices and 5 minutes on 512 on a
  busy 2-core machine. A cluster of more devices loads (its links are held per host
  and kind, :class:`tfpart.core.cluster.LinkTable`) but is not planned or simulated.

Examples
--------
>>> check_microbatches(8, batch_size=4, ops=10, source="model")
Traceback (most recent call last):
...
tfpart.core.errors.PlacementError: model: 8 micro-batches of a batch of 4: each micro-batch needs at least one sample (use --microbatches 4 or fewer, or a larger --batch-size)
"""
from __future__ import annotations

import math
import os

from tfpart.core.dtypes import tensor_bytes
from tfpart.core.errors import ClusterError, ModelError, PlacementError

MAX_TENSOR_ELEMENTS = 2**31 - 1  # TensorFlow's int32 element limit
MAX_BATCH_SIZE = MAX_TENSOR_ELEMENTS  # a larger batch breaks it in any batched tensor
MAX_GRAPH_OPS = 200_000  # ops read (inlined) or simulated (see above)
MAX_CALL_DEPTH = 200  # nested function calls inlined (Keras models nest about ten)
MAX_MICROBATCHES = 1024  # per batch; each is a copy of every stage in the compiled model
MAX_PLANNED_DEVICES = 512  # the greedy's time grows with the devices (see above)
MAX_COMPILED_OPS = 50_000  # micro-batches x ops of a compiled graph (see above)
MAX_THREADS_PER_CPU = 16  # threads of one TensorFlow pool per logical CPU (see above)
MAX_LAUNCH_TIMEOUT_S = 86_400.0  # seconds a launch's tasks may take to start
MAX_TF_CONFIG_BYTES = 2**20
MAX_TRAIN_STEPS = 10**8  # tfpart train --steps: a day at a millisecond per update


def check_batch_size(batch_size, source="", what="batch size"):
    """ModelError unless ``batch_size`` is a positive int of at most
    :data:`MAX_BATCH_SIZE`.

    >>> check_batch_size(10**12, "plan.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.ModelError: plan.json: batch size 1000000000000 is more than 2147483647 (TensorFlow's limit of 2**31-1 elements per tensor)
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ModelError(source, f"{what} must be a positive integer, not {batch_size!r}")
    if batch_size > MAX_BATCH_SIZE:
        raise ModelError(source, f"{what} {batch_size} is more than {MAX_BATCH_SIZE} "
                         "(TensorFlow's limit of 2**31-1 elements per tensor)")


def largest_tensor(graph):
    """``(elements, op, shape, dtype)`` of the largest output of an OpGraph's ops
    (``(0, None, (), None)`` for a graph without outputs).

    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph()
    >>> g.add_op("a", outputs=[((8, 1000), "float32")])
    >>> g.add_op("b", outputs=[((8, 10), "float32"), ((8, 5000), "int32")])
    >>> largest_tensor(g)
    (40000, 'b', (8, 5000), 'int32')
    """
    best = (0, None, (), None)
    for name, attrs in graph.ops.items():
        for shape, dtype in attrs.get("outputs") or ():
            elements = math.prod(shape)
            if elements > best[0]:
                best = (elements, name, tuple(shape), dtype)
    return best


def largest_batch(graph, batch_size, limit=MAX_TENSOR_ELEMENTS):
    """The largest batch size at which every output whose first dimension is
    ``batch_size`` keeps at most ``limit`` elements (per-sample sizes scaled); None
    if no output carries the batch.

    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph(); g.add_op("conv", outputs=[((4, 32, 32, 32), "float32")])
    >>> largest_batch(g, 4)
    65535
    """
    per_sample = [math.prod(shape[1:]) for attrs in graph.ops.values()
                  for shape, _ in attrs.get("outputs") or ()
                  if len(shape) and shape[0] == batch_size]
    if not per_sample:
        return None
    return limit // max(max(per_sample), 1)


def check_tensor_sizes(graph, batch_size, source=""):
    """ModelError if an output of ``graph`` (shapes at ``batch_size``) has more than
    :data:`MAX_TENSOR_ELEMENTS` elements, naming the op and the largest batch size
    that keeps every tensor within the limit.

    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph(); g.add_op("conv", outputs=[((10**7, 32, 32, 32), "float32")])
    >>> check_tensor_sizes(g, 10**7, "model")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.ModelError: model: at batch size 10000000 op conv outputs 327680000000 elements (shape (10000000, 32, 32, 32)), more than TensorFlow's limit of 2**31-1 per tensor; the largest batch size this model allows is 65535
    """
    elements, op, shape, _ = largest_tensor(graph)
    if elements <= MAX_TENSOR_ELEMENTS:
        return
    largest = largest_batch(graph, batch_size)
    advice = f"the largest batch size this model allows is {largest}" if largest else \
        "it does not depend on the batch size"
    raise ModelError(source, f"at batch size {batch_size} op {op} outputs {elements} "
                     f"elements (shape {shape}), more than TensorFlow's limit of 2**31-1 "
                     f"per tensor; {advice}")


def check_tensors_fit(graph, batch_size, memory, source=""):
    """PlacementError if one output of ``graph`` alone needs more than ``memory``
    bytes (the whole cluster's: even split by samples it could not be held).

    >>> from tfpart.core.graph import OpGraph
    >>> g = OpGraph(); g.add_op("x", outputs=[((1000, 1000, 1000), "float32")])
    >>> check_tensors_fit(g, 1000, 2e9, "cluster.json")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: cluster.json: at batch size 1000 op x outputs 4000.0 MB, more than the cluster's 2000.0 MB of memory; the largest batch size that fits is 500
    """
    elements, op, shape, dtype = largest_tensor(graph)
    nbytes = tensor_bytes(shape, dtype) if op is not None else 0
    if nbytes <= memory:
        return
    per_byte = elements / nbytes
    largest = largest_batch(graph, batch_size, int(memory * per_byte))
    advice = f"; the largest batch size that fits is {largest}" if largest else ""
    raise PlacementError(source, f"at batch size {batch_size} op {op} outputs "
                         f"{nbytes / 1e6:.1f} MB, more than the cluster's "
                         f"{memory / 1e6:.1f} MB of memory{advice}")


def check_graph_ops(count, source="", what="the model"):
    """ModelError if ``count`` ops exceed :data:`MAX_GRAPH_OPS`.

    >>> check_graph_ops(2**21, "m", "the model's functions, inlined,")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.ModelError: m: the model's functions, inlined, would make 2097152 ops, more than the 200000 tfpart handles
    >>> check_graph_ops(2**200, "m")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.ModelError: m: the model would make about 10**60 ops, more than the 200000 tfpart handles
    """
    if count > MAX_GRAPH_OPS:
        shown = count if count < 10**12 else f"about 10**{len(str(count)) - 1}"
        raise ModelError(source, f"{what} would make {shown} ops, more than the "
                         f"{MAX_GRAPH_OPS} tfpart handles")


def check_microbatches(microbatches, batch_size=None, ops=None, source="",
                       max_ops=MAX_GRAPH_OPS, making="to simulate"):
    """PlacementError unless ``microbatches`` is at most :data:`MAX_MICROBATCHES`, at
    most ``batch_size`` (if known) and, times ``ops`` (if known), at most ``max_ops``
    (a graph with micro-batches holds a copy of every op per micro-batch):
    :data:`MAX_GRAPH_OPS` to simulate, :data:`MAX_COMPILED_OPS` to compile.

    >>> check_microbatches(1024, 1024, ops=92, source="model", max_ops=MAX_COMPILED_OPS,
    ...                    making="to compile")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: model: 1024 micro-batches of 92 ops make 94208 ops to compile, more than the 50000 tfpart handles; at most 543 micro-batches for this model
    """
    if microbatches > MAX_MICROBATCHES:
        raise PlacementError(source, f"{microbatches} micro-batches: at most "
                             f"{MAX_MICROBATCHES} per batch")
    if batch_size is not None and microbatches > batch_size:
        raise PlacementError(source, f"{microbatches} micro-batches of a batch of "
                             f"{batch_size}: each micro-batch needs at least one sample "
                             f"(use --microbatches {batch_size} or fewer, or a larger "
                             "--batch-size)")
    if ops is not None and microbatches * ops > max_ops:
        raise PlacementError(source, f"{microbatches} micro-batches of {ops} ops make "
                             f"{microbatches * ops} ops {making}, more than the "
                             f"{max_ops} tfpart handles; at most "
                             f"{max(max_ops // ops, 1)} micro-batches for this model")


def largest_microbatches(ops):
    """The most micro-batches :func:`check_microbatches` allows a model of ``ops`` ops:
    the bound a compile that chooses its own count keeps to (at least 1: one
    micro-batch is the model itself).

    >>> largest_microbatches(92), largest_microbatches(10), largest_microbatches(10**6)
    (543, 1024, 1)
    """
    return max(min(MAX_MICROBATCHES, MAX_COMPILED_OPS // max(ops, 1)), 1)


def max_threads(cpus=None):
    """The most threads one of TensorFlow's thread pools may be given here:
    :data:`MAX_THREADS_PER_CPU` per logical CPU (``cpus``, default this machine's).

    >>> max_threads(2), max_threads(128)
    (32, 2048)
    """
    return MAX_THREADS_PER_CPU * (cpus or os.cpu_count() or 1)


def check_planned_devices(cluster):
    """ClusterError if ``cluster`` has more devices than the algorithms and the
    simulator take (:data:`MAX_PLANNED_DEVICES`).

    >>> from tfpart.core.cluster import cluster_of_devices
    >>> check_planned_devices(cluster_of_devices(["cpu"] * 3))
    """
    if len(cluster) > MAX_PLANNED_DEVICES:
        raise ClusterError(cluster.source, f"{len(cluster)} devices: tfpart plans and "
                           f"simulates clusters of at most {MAX_PLANNED_DEVICES} devices "
                           "(its solvers keep a table over every pair of devices)")


# The tasks of one launch (`mpirun`, `srun`: tfpart.launcher): every rank waits on a
# report from each of the others through a shared folder, so a launch of 10**9 tasks
# would never meet; eight times the devices tfpart plans (MAX_PLANNED_DEVICES) is ample.
MAX_LAUNCHED_TASKS = 4096
