"""Which ops mix the samples of a batch (so micro-batches or replicas would change it).

Micro-batches and replicas run the model on slices of a batch and concatenate what
comes out, which is exact only when every output row depends on its own input row
alone, whatever rows share its batch. tfpart checks that by running the signature's
flattened graph twice: on ``n + 1`` rows of random inputs, and on the same rows but the
first. Every tensor the graph computes (the outputs of every op, control-flow ops as
one) is compared between the two runs and given a role:

==========  ===========================================================================
role        the longer run's tensor, against the shorter run's
==========  ===========================================================================
rows        one axis is ``k`` longer (``k`` rows per sample), and without its first
            ``k`` slices along that axis it equals the shorter one: every sample's own
static      equal: it does not depend on the batch (weights, constants)
size        integers of the same shape that differ (a shape, the batch size)
offsets     integers, an axis ``k`` longer, and without the first ``k`` slices they
            differ from the shorter one by a constant (``RaggedTensor`` row splits,
            ``tf.where`` indices: positions in the batch)
mixed       anything else: values that depend on other samples
opaque      variants and resource handles (TensorLists, tables), not compared
==========  ===========================================================================

An op that computes a mixed tensor though none of its inputs is mixed is where samples
mix: a reduction over the batch, a ``tf.cond`` on a batch statistic (seen at the
reduction), a loop that runs once per sample, a position in the batch that reaches a
value (``tf.range`` over the batch added to the data), a random op. So is a signature
output that is not ``rows`` along its first axis (micro-batches concatenate outputs
along it). Loops and conditionals are judged by what they compute, bodies and
predicates included, since their outputs are compared.

This is a test on one random input, not a proof: a mixing that leaves these values
equal goes unseen (a batch sum of rows that happen to cancel). ``verify`` runs the
compiled model on other batches and sizes.

Examples
--------
>>> import numpy as np
>>> x = np.arange(12.0).reshape(3, 4)
>>> tensor_role(x, x[1:]), tensor_role(x.sum(0), x[1:].sum(0))
(('rows', 0), ('mixed', None))
>>> tensor_role(np.array([3, 4]), np.array([2, 4])), tensor_role(np.array([0, 3, 5, 9]),
...                                                               np.array([0, 2, 6]))
(('size', None), ('offsets', 0))
>>> tensor_role(np.array([[0, 0], [1, 0], [1, 1], [2, 0]]),  # tf.where's [row, column]
...             np.array([[0, 0], [0, 1], [1, 0]]))
('offsets', 0)
"""
from __future__ import annotations

import numpy as np

from rewriters.captures import HANDLE_KINDS, load_captured, state_input_map, variable_values
from rewriters.functions import split_input
from rewriters.flatten import flat_at
from rewriters.tf_import import tensorflow
from tfpart.core.errors import ModelError
from tfpart.core.ops import LOOP_EXIT_OPS

PROBE_ROWS = 3  # the longer run's rows; the shorter one has PROBE_ROWS - 1
OPAQUE_DTYPES = ("resource", "variant")


def batch_mixing_ops(proto, path, signature=None, like=None):
    """Names of the ops of ``signature`` that mix the samples of a batch (see the
    module docstring), each with why: ``[(op, reason), ...]``, the first in the
    graph's order first. ``like``: an earlier flattening of the signature, to start
    from (:func:`rewriters.flatten.flat_at`).

    Raises
    ------
    tfpart.core.errors.ModelError
        If the graph cannot run on a few rows of random inputs (then no micro-batch or
        replica can be shown exact).
    """
    flat = flat_at(proto, path, PROBE_ROWS, signature, like)
    runs = _probe_runs(proto, path, flat)
    roles = {name: tensor_role(*values) for name, values in runs.items()}
    return mixing_ops(_ops(flat), roles, flat.outputs_by_key(proto))


def tensor_role(full, part):
    """The role (see the module docstring) of a tensor computed from ``n + 1`` rows
    (``full``) and from the last ``n`` (``part``), with its batch axis (or None)."""
    full, part = np.asarray(full), np.asarray(part)
    integers = full.dtype.kind in "iu" and part.dtype.kind in "iu"
    if full.shape == part.shape:
        if _close(full, part):
            return "static", None
        return ("size" if integers else "mixed"), None
    if full.ndim != part.ndim:
        return "mixed", None
    longer = [a for a, (f, p) in enumerate(zip(full.shape, part.shape)) if f != p]
    axis = longer[0]
    extra = full.shape[axis] - part.shape[axis]
    if len(longer) != 1 or extra <= 0:
        return "mixed", None
    tail = np.take(full, np.arange(extra, full.shape[axis]), axis=axis)
    if _close(tail, part):
        return "rows", axis
    shift = tail.astype(np.int64) - part.astype(np.int64) if integers else None
    if shift is not None and shift.size and np.all(shift == np.take(shift, [0], axis=axis)):
        return "offsets", axis
    return "mixed", None


def mixing_ops(ops, roles, outputs):
    """The ops of ``ops`` (``(name, type, input tensors, output tensors)`` in graph
    order) that compute a mixed tensor from inputs none of which is mixed, and the
    producers of ``outputs`` (signature key -> tensor) that are not rows along axis 0,
    each as ``(op, reason)``; ``roles`` gives each tensor's :func:`tensor_role` (a
    tensor it lacks is opaque).

    >>> roles = {"x:0": ("rows", 0), "m:0": ("mixed", None), "y:0": ("mixed", None)}
    >>> mixing_ops([("m", "Mean", ["x:0"], ["m:0"]), ("y", "Sub", ["x:0", "m:0"], ["y:0"])],
    ...            roles, {"y": "y:0"})
    [('m', 'Mean computes values that depend on other samples of the batch')]
    """
    def role(tensor):
        return roles.get(tensor, ("opaque", None))[0]

    found = []
    for name, op_type, inputs, outputs_of in ops:
        if any(role(t) == "mixed" for t in outputs_of) and \
                not any(role(t) == "mixed" for t in inputs):
            found.append((name, f"{op_type} turns the batch's size or its rows' positions "
                                "into values" if any(role(t) in ("size", "offsets")
                                                     for t in inputs) else
                          f"{op_type} computes values that depend on other samples of the "
                          "batch"))
    flagged = {name for name, _ in found}
    for key, tensor in sorted(outputs.items()):
        kind, axis = roles.get(tensor, ("opaque", None))
        op = split_input(tensor)[0]
        if (kind, axis) != ("rows", 0) and kind != "mixed" and op not in flagged:
            found.append((op, f"output {key!r} is {_described(kind, axis)}, not one row per "
                              "sample along its first axis"))
    return found


def _described(kind, axis):
    return {"static": "the same for every batch", "size": "the batch's size",
            "offsets": "positions in the batch", "opaque": "a handle",
            "rows": f"one row per sample along axis {axis}"}[kind]


def _close(a, b):
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "OSUb" or b.dtype.kind in "OSUb":
        return bool(np.array_equal(a, b))
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return bool(np.array_equal(a, b))
    if a.dtype != b.dtype or a.dtype.kind != "f":
        a, b = a.astype(np.float64), b.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(b), initial=0.0, where=np.isfinite(b))))
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5 * scale, equal_nan=True))


def _ops(flat):
    """``(name, type, input tensors, output tensors)`` of the flat graph's ops."""
    from rewriters.flat_signature import import_flat

    graph = import_flat(flat, "")
    return [(op.name, op.type, [t.name for t in op.inputs], [t.name for t in op.outputs])
            for op in graph.get_operations()]


def probe_inputs(flat, rows=PROBE_ROWS, seed=0):
    """Random inputs of ``rows`` rows for the flat signature's inputs, by placeholder:
    floats from a normal distribution, integers 0 or 1, distinct strings per row."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for placeholder, shape, dtype in flat.inputs.values():
        dims = [rows, *shape[1:]]
        kind = np.dtype(dtype).kind if dtype not in ("string", "bfloat16") else dtype
        if kind == "string":
            words = rng.integers(0, 5, size=dims)
            value = np.vectorize(lambda w: f"w{w} w{(w * 7) % 5}".encode(),
                                 otypes=[object])(words)
        elif kind in ("f", "bfloat16"):
            value = rng.standard_normal(dims).astype(np.float32)
        elif kind == "b":
            value = rng.integers(0, 2, size=dims).astype(bool)
        else:
            value = rng.integers(0, 2, size=dims).astype(dtype)
        feeds[placeholder] = value
    return feeds


def _probe_runs(proto, path, flat):
    """Every fetchable tensor of the flat graph, by name, as ``(full, part)``: its value
    on :func:`probe_inputs` and on the same rows but the first."""
    tf = tensorflow()
    feeds = probe_inputs(flat)
    dtypes = {placeholder: dtype for placeholder, _, dtype in flat.inputs.values()}
    if flat.info.format == "tf1":
        run = _tf1_session_runner(proto, path, flat)
    elif any(c.kind in HANDLE_KINDS for c in flat.info.captures.values()):
        run = _function_runner(proto, path, flat)
    else:
        run = _session_runner(proto, path, flat)
    try:
        full = run({p: tf.constant(v, dtype=dtypes[p]) for p, v in feeds.items()})
        part = run({p: tf.constant(v[1:], dtype=dtypes[p]) for p, v in feeds.items()})
    except (tf.errors.OpError, ValueError, TypeError) as exc:
        raise ModelError(path, "cannot run the signature on a few rows of random inputs to "
                         f"check that micro-batches are exact: {str(exc).splitlines()[0]}"
                         ) from None
    return {name: (full[name], part[name]) for name in full if name in part}


def _session_runner(proto, path, flat):
    """A callable running the flat graph of a TF2 signature that captures no table or
    asset in a ``tf.compat.v1`` session, its inputs of any batch size and its
    variables assigned their checkpoint values (fetching a thousand tensors from a
    session costs little, from a ``tf.function`` seconds of tracing); returns every
    numeric, boolean or string tensor's value, by name."""
    tf = tensorflow()
    values = variable_values(path, proto, flat)
    graph_def = type(flat.graph_def)()
    graph_def.CopyFrom(flat.graph_def)
    placeholders = {p for p, _, _ in flat.inputs.values()}
    for node in graph_def.node:
        if node.name in placeholders and node.attr["shape"].shape.dim:
            node.attr["shape"].shape.dim[0].size = -1
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        initial = {name: tf.compat.v1.placeholder(value.dtype, value.shape)
                   for name, value in values.items()}
        assign = [tf.raw_ops.AssignVariableOp(resource=graph.get_tensor_by_name(f"{name}:0"),
                                              value=initial[name]) for name in values]
    wanted = {node.name for node in graph_def.node}
    fetches = [t.name for op in graph.get_operations() if op.name in wanted
               for t in op.outputs if t.dtype.name not in OPAQUE_DTYPES]
    session = tf.compat.v1.Session(graph=graph)
    session.run(assign, {initial[name]: value for name, value in values.items()})

    def run(feeds):
        found = session.run(fetches, {f"{p}:0": value.numpy() for p, value in feeds.items()})
        return dict(zip(fetches, found))
    return run


def _function_runner(proto, path, flat):
    """A callable running the flat graph of a TF2 signature in a ``tf.function`` on
    placeholder -> tensor feeds, its variables and tables bound to loaded copies;
    returns every numeric, boolean or string tensor's value, by name."""
    tf = tensorflow()
    meta = proto.meta_graphs[0]
    variables = {name: tf.Variable(value) for name, value in
                 variable_values(path, proto, flat).items()}
    captured = load_captured(path, meta, flat.info.captures, path)
    graph_def = type(flat.graph_def)()
    graph_def.versions.CopyFrom(flat.graph_def.versions)
    graph_def.library.CopyFrom(flat.graph_def.library)
    outside = flat.bound_outside()
    for node in flat.graph_def.node:
        if not outside(node.name):
            graph_def.node.add().CopyFrom(node)

    placeholders = sorted(p for p, _, _ in flat.inputs.values())
    specs = {p: tf.TensorSpec([None, *shape[1:]], dtype)
             for p, shape, dtype in flat.inputs.values()}

    @tf.function(autograph=False, input_signature=[[specs[p] for p in placeholders]])
    def probe(values):
        graph = tf.compat.v1.get_default_graph()
        input_map = state_input_map(graph, captured, variables)
        input_map.update({f"{p}:0": value for p, value in zip(placeholders, values)})
        tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="probe")
        return {t.name.removeprefix("probe/"): t for op in graph.get_operations()
                if op.name.startswith("probe/") for t in op.outputs
                if t.dtype.name not in OPAQUE_DTYPES}

    def run(feeds):
        return {name: value.numpy() for name, value in
                probe([feeds[p] for p in placeholders]).items()}
    return run


def _tf1_session_runner(proto, path, flat):
    """A callable running a TF1 signature in a ``tf.compat.v1`` session of the whole
    model (its variables restored, its tables filled by the loader); returns every
    fetchable tensor of the flat graph outside ``tf.compat.v1`` control-flow contexts
    (which cannot be fetched), by name."""
    tf = tensorflow()
    tags = list(proto.meta_graphs[0].meta_info_def.tags)
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    tf.compat.v1.saved_model.load(session, tags, str(path))
    wanted = {node.name for node in flat.graph_def.node}
    outer = [op for op in graph.get_operations() if op.name in wanted and (
        op.type in LOOP_EXIT_OPS or (op._get_control_flow_context() is None  # noqa: SLF001
                                     and op.type not in ("Switch", "RefSwitch")))]
    fetches = [t.name for op in outer for t in op.outputs
               if t.dtype.base_dtype.name not in OPAQUE_DTYPES]

    def run(feeds):
        values = session.run(fetches, {f"{p}:0": value.numpy() for p, value in feeds.items()})
        return dict(zip(fetches, values))
    return run


__all__ = ["batch_mixing_ops", "mixing_ops", "probe_inputs", "tensor_role"]
