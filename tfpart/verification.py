"""Verification: run an original and a compiled SavedModel on the same random inputs,
compare the outputs, and read from TensorFlow's own run metadata on which device every
op ran, against the plan.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rewriters.composite_inputs import composite_inputs
from rewriters.given_inputs import read_given_inputs
from rewriters.input_ranges import input_domains
from rewriters.savedmodel_io import read_saved_model
from rewriters.tf_import import tensorflow
from tfpart.core.errors import TfpartError, model_errors
from tfpart.core.plan import copy_devices
from tfpart.runtime import (SessionSignature, canonical_device, given_feed, load,
                            random_inputs, runnable, same_device)
from tfpart.servers import cluster_errors

RUNTIME_OPS = {"_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval",
               "_DeviceArg", "_DeviceRetval", "NoOp"}

@dataclass
class VerifyReport:
    max_abs_diff: float
    outputs_equal: bool
    ops_per_device: dict  # device -> ops TensorFlow placed there (from run metadata)
    ops_checked: int  # ops found in both the plan and TensorFlow's placement
    op_mismatches: list = field(default_factory=list)  # (op, planned, actual)
    # Constants elsewhere than planned: Grappler's constant folding re-creates them
    # beside what it folded; they hold no work, so they are listed, not failed.
    moved_constants: list = field(default_factory=list)  # (op, planned, actual)
    variable_mismatches: list = field(default_factory=list)
    device_map: dict = field(default_factory=dict)
    placement: dict = field(default_factory=dict)  # op -> device TensorFlow ran it on
    # op that ran -> the rewriters.copies.OpCopy it computes (ops that are copies only)
    copies: dict = field(default_factory=dict)
    batches: list = field(default_factory=list)  # (batch size, max abs difference, equal)
    # the original's other signatures: name -> "equal", "missing", "other inputs or
    # outputs" or "other values (max abs difference …)"
    other_signatures: dict = field(default_factory=dict)

    @property
    def ok(self):
        return self.outputs_equal and not self.op_mismatches and \
            not self.variable_mismatches and \
            all(status == "equal" for status in self.other_signatures.values())

    @property
    def problem(self):
        """What failed, in one line (None if nothing did).

        >>> VerifyReport(9.4, False, {}, 3, batches=[(4, 0.0, True), (5, 9.4, False)]).problem
        "the compiled model's outputs differ from the original's at batch size 5 (max abs difference 9.4)"
        >>> VerifyReport(0.0, True, {}, 3, op_mismatches=[("a", "CPU:1", "CPU:0")]).problem
        'op a ran on CPU:0, not on CPU:1 as planned (1 op elsewhere in all)'
        """
        differing = [(b, d) for b, d, equal in self.batches if not equal]
        if differing or not self.outputs_equal:
            batch, diff = (differing or [(None, self.max_abs_diff)])[0]
            return ("the compiled model's outputs differ from the original's"
                    + (f" at batch size {batch}" if batch is not None else "")
                    + f" (max abs difference {diff:.3g})")
        if self.op_mismatches:
            op, planned, actual = self.op_mismatches[0]
            count = len(self.op_mismatches)
            return (f"op {op} ran on {actual}, not on {planned} as planned ({count} op"
                    f"{'s' if count > 1 else ''} elsewhere in all)")
        if self.variable_mismatches:
            name, device = self.variable_mismatches[0]
            return f"variable {name} was not loaded on {device} as planned"
        for name, status in sorted(self.other_signatures.items()):
            if status != "equal":
                return f"the original's signature {name!r} is {status} in the compiled model"
        return None

def run_with_placement(fn, inputs):
    """Call ``fn(**inputs)``; return (outputs, {op name: device}, {op name: op type})
    from TensorFlow's run metadata (the partition graphs it really ran)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        # drop what an earlier call left (a function another model instantiated while
        # no metadata was asked for comes out with the next export)
        ctx.export_run_metadata()
        outputs = fn(**inputs)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    placed, op_types = {}, {}
    for function_graph in metadata.function_graphs:
        for partition in function_graph.partition_graphs:
            for node in partition.node:
                if node.op not in RUNTIME_OPS:
                    placed[node.name] = node.device
                    op_types[node.name] = node.op
    return outputs, placed, op_types

def _as_arrays(outputs):
    tf = tensorflow()
    return [np.asarray(t) for t in tf.nest.flatten(outputs)]

def _variable_devices(obj):
    """(name, device) of every variable reachable from a loaded object."""
    from tensorflow.python.checkpoint import graph_view

    tf = tensorflow()
    objects, _ = graph_view.ObjectGraphView(obj).breadth_first_traversal()
    return sorted((v.name.split(":")[0], v.device) for v in objects
                  if isinstance(v, tf.Variable))

def verify_batch_sizes(batch):
    """The batch sizes ``verify`` runs: the compile's, 1, and one it did not see (which
    cuts into micro-batches and replica shares unevenly).

    >>> verify_batch_sizes(4), verify_batch_sizes(1)
    ([4, 1, 5], [1, 2])
    """
    return list(dict.fromkeys([batch, 1, batch + 1]))


def verify(original_dir, compiled_dir, *, rtol=1e-5, atol=1e-6, seed=0, batch_size=None,
           cluster=None, watch=False, op_libraries=(), inputs=None):
    """Run both models on the same random inputs, at each of
    :func:`verify_batch_sizes` (of ``batch_size``, default the compile's); compare the
    outputs, and the placement of the first run against the plan. A ragged or sparse
    input gets a valid value of its spec (:mod:`rewriters.composite_inputs`). With
    ``inputs`` (an ``.npz`` file, :mod:`rewriters.given_inputs`) the compiled
    signature's batches are rows of those instead, taken in turn.

    Without ``cluster`` the compiled model's devices are mapped onto local logical CPUs
    (one per cluster device). With a :class:`~tfpart.core.cluster.Cluster` whose ``cluster``
    block names running ``tfpart worker`` tasks, this process connects to them and runs
    the compiled model as it is, across the tasks (the original runs here).

    The op libraries the plan names and ``op_libraries`` (modules, shared objects that
    register the models' custom ops) are loaded first.
    """
    from rewriters.copies import OpCopy, copies_in, copy_of
    from rewriters.placement import caller_ops

    tf = tensorflow()
    with runnable(compiled_dir, cluster, watch, op_libraries) as compiled:
        plan, proto, local_dir, device_map = (compiled.plan, compiled.proto,
                                              compiled.directory, compiled.device_map)
        signature = plan.context["signature"]
        sizes = verify_batch_sizes(batch_size or plan.context["batch_size"])
        with model_errors(original_dir, "load and run it"):
            original_proto = read_saved_model(original_dir)
            meta = original_proto.meta_graphs[0]
            given = read_given_inputs(inputs, meta, signature) if inputs else None
            root = tf.saved_model.load(str(original_dir))
            signatures = root.signatures
            original = signatures[signature]

            found = {}  # each signature flattened and imported once, not once per batch

            def domains(name):
                if name not in found:
                    try:
                        found[name] = input_domains(original_proto, original_dir, name, root)
                    except TfpartError:
                        if name == signature:
                            raise
                        found[name] = {}  # a signature tfpart cannot read: random inputs
                return found[name]
            feeds = _batches(original, sizes, seed, given, lambda: domains(signature),
                             composite_inputs(meta, signature))
            expected = [_as_arrays(original(**feed)) for feed in feeds]
        with cluster_errors(cluster), model_errors(
                compiled_dir, "load and run it",
                passing=(tf.errors.OpError,) if cluster is not None else ()):
            if plan.context.get("format") == "tf1":  # its variables are ops of the graph
                def signature_of(name):
                    return SessionSignature(local_dir, name, len(device_map))
                compiled = signature_of(signature)
                outputs, placed, op_types = compiled.run_with_placement(feeds[0])
                variables = []
            else:
                loaded = load(local_dir)
                signature_of = loaded.signatures.get
                compiled = loaded.signatures[signature]
                outputs, placed, op_types = run_with_placement(compiled, feeds[0])
                variables = _variable_devices(loaded)
            actual = [_as_arrays(outputs)] + [_as_arrays(compiled(**feed))
                                              for feed in feeds[1:]]
            other_results = {name: _other_signature(signature_of, name, fn, sizes[0], seed,
                                                    domains(name), rtol, atol,
                                                    composite_inputs(meta, name))
                             for name, fn in signatures.items()
                             if name != signature}
    batches = [(size, *_compare(a, e, rtol, atol))
               for size, a, e in zip(sizes, actual, expected)]
    copies = copies_in(proto.meta_graphs[0])
    callers = set() if plan.context.get("format") == "tf1" else {
        node.name for node in caller_ops(proto.meta_graphs[0], signature) if not node.device}
    runs = [(name, copy_of(name, copies), device, op_types[name])
            for name, device in placed.items() if name not in callers]
    # each micro-batch's imported copy of the source's ops (a TF1 model's variables and
    # tables are its graph's own, shared by the copies)
    if plan.reimported and plan.context.get("format") != "tf1":
        runs = [run for run in runs if run[1] is not None]
    planned = copy_devices(plan)
    checked = []  # (source op, planned device, device it ran on, op type)
    for name, copy, device, op in runs:
        copy = copy or OpCopy(name)  # an op of the source model itself
        want = planned(copy.origin, copy.replica)
        if want is not None:
            checked.append((copy.origin, device_map[want], device, op))
    elsewhere = [(name, want, device, op) for name, want, device, op in checked
                 if not same_device(want, device)]
    mismatches = [(name, want, got) for name, want, got, op in elsewhere if op != "Const"]
    moved_constants = [(name, want, got) for name, want, got, op in elsewhere if op == "Const"]
    expected_vars = sorted(_saved_variable_devices(proto))  # proto is already remapped
    variable_mismatches = [pair for pair in Counter(expected_vars) - Counter(
        (n, canonical_device(d)) for n, d in variables)]
    return VerifyReport(other_signatures=other_results,
                        max_abs_diff=max(d for _, d, _ in batches),
                        outputs_equal=all(equal for _, _, equal in batches), batches=batches,
                        ops_per_device=dict(Counter(placed.values())),
                        ops_checked=len(checked), op_mismatches=mismatches,
                        moved_constants=moved_constants,
                        variable_mismatches=variable_mismatches, device_map=device_map,
                        placement=placed, copies={name: copy for name, copy, _, _ in runs
                                                  if copy is not None})

def _batches(original, sizes, seed, given, domains, composites):
    """The inputs of the ``original`` signature at each of ``sizes``: random
    (:func:`tfpart.runtime.random_inputs`, with the ``domains()`` of its inputs and
    its ``composites``), or the rows of the ``given`` inputs in turn."""
    if given is None:
        return [random_inputs(original, size, seed + k, domains(), composites)
                for k, size in enumerate(sizes)]
    starts = np.cumsum([0, *sizes[:-1]])
    return [given_feed(original, given, size, int(start)) for size, start in zip(sizes, starts)]


def _other_signature(signature_of, name, original, batch, seed, domains, rtol, atol,
                     composites=()):
    """How signature ``name`` of the compiled model compares with the ``original``'s:
    its inputs' names, shapes and dtypes and its outputs' structure, then its outputs
    on the same random inputs ("equal", "missing", "other inputs or outputs", or
    "other values (max abs difference …)"); ``composites``: its ragged and sparse
    inputs."""
    tf = tensorflow()
    try:
        compiled = signature_of(name)
    except KeyError:
        compiled = None
    if compiled is None:
        return "missing"

    def structure(function):
        return (function.structured_input_signature,
                tf.nest.map_structure(lambda s: (s.shape.as_list(), s.dtype),
                                      function.structured_outputs))
    if structure(compiled) != structure(original):
        return "other inputs or outputs"
    feed = random_inputs(original, batch, seed, domains, composites)
    diff, equal = _compare(_as_arrays(compiled(**feed)), _as_arrays(original(**feed)),
                           rtol, atol)
    return "equal" if equal else f"other values (max abs difference {diff:.3g})"


def _compare(actual, expected, rtol, atol):
    """(max abs difference, equal) of two lists of output arrays (a difference of
    ``inf`` for outputs of other shapes or unequal strings).

    >>> _compare([np.ones(2)], [np.ones(3)], 1e-5, 0), _compare([np.array([b"a"])],
    ...                                                    [np.array([b"a"])], 1e-5, 0)
    ((inf, False), (0.0, True))
    """
    def difference(a, e):
        if a.shape != e.shape:
            return float("inf")
        if a.dtype.kind in "OSU" or e.dtype.kind in "OSU":
            return 0.0 if np.array_equal(a, e) else float("inf")
        return float(np.max(np.abs(a.astype(float) - e.astype(float)))) if a.size else 0.0

    diffs = [difference(a, e) for a, e in zip(actual, expected)]
    equal = len(actual) == len(expected) and all(
        d == 0.0 or (np.isfinite(d) and np.allclose(a, e, rtol=rtol, atol=atol))
        for d, a, e in zip(diffs, actual, expected))
    return max(diffs, default=0.0), equal


def _saved_variable_devices(proto):
    return [(obj.variable.name, obj.variable.device)
            for obj in proto.meta_graphs[0].object_graph_def.nodes
            if obj.HasField("variable")]
