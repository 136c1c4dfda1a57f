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
predicates included, since their outputs are compared (the graph is run with its
function library: branches, loop bodies).

A ragged or sparse input gets a valid value of its spec
(:mod:`rewriters.composite_inputs`; or the user's inputs, :mod:`rewriters.given_inputs`)
whose first row is its shortest: the rows without it pad to the same length, so a
``RaggedTensor``'s padding to its longest row, which ragged reductions do inside,
compares as rows. A second pair of runs, the first row then the longest, names an
output padded so (:func:`padded_outputs`).

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
from rewriters.composite_inputs import MAX_ROW_LENGTH, composite_value, take_rows
from rewriters.functions import private_library, split_input
from rewriters.flatten import flat_at
from rewriters.tf_import import tensorflow
from tfpart.core.errors import ModelError, first_line
from tfpart.core.ops import LOOP_EXIT_OPS

PROBE_ROWS = 3  # the longer run's rows; the shorter one has PROBE_ROWS - 1
LONGEST_FIRST_ROW = MAX_ROW_LENGTH + 1  # values of the first row, longer than any other
OPAQUE_DTYPES = ("resource", "variant")


def batch_mixing_ops(proto, path, signature=None, like=None, given=None):
    """Names of the ops of ``signature`` that mix the samples of a batch (see the
    module docstring), each with why: ``[(op, reason), ...]``, the first in the
    graph's order first. ``like``: an earlier flattening of the signature, to start
    from (:func:`rewriters.flatten.flat_at`); ``given``: the user's inputs
    (:class:`rewriters.given_inputs.GivenInputs`) to run it on instead of random ones.

    Raises
    ------
    tfpart.core.errors.ModelError
        If the graph cannot run on a few rows of random inputs (then no micro-batch or
        replica can be shown exact).
    """
    flat = flat_at(proto, path, PROBE_ROWS, signature, like)
    batches = [_probe_feeds(flat, given)]
    if given is None and any(c.kind == "ragged" for c in flat.composites):
        batches.append(_probe_feeds(flat, None, LONGEST_FIRST_ROW))
    runs = _probe_runs(proto, path, flat, batches, given)
    roles = {name: tensor_role(*values) for name, values in runs[0].items()}
    outputs = flat.outputs_by_key(proto)
    found = mixing_ops(_ops(flat), roles, outputs)
    for padded in runs[1:]:
        found += padded_outputs(outputs, {name: tensor_role(*padded[name])
                                          for name in outputs.values() if name in padded},
                                {op for op, _ in found})
    return found


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


def padded_outputs(outputs, roles, flagged=()):
    """The producers of ``outputs`` (signature key -> tensor) that are not rows along
    axis 0 (by ``roles``) when the probe's first row is a ragged input's longest, as
    ``(op, reason)``, but those ``flagged`` already: an output padded to the batch's
    longest row, which the probe whose first row is the shortest cannot see.

    >>> padded_outputs({"y": "pad:0"}, {"pad:0": ("mixed", None)})
    [('pad', "output 'y' depends on the length of the batch's longest ragged row")]
    """
    found = []
    for key, tensor in sorted(outputs.items()):
        op = split_input(tensor)[0]
        if roles.get(tensor, ("opaque", None)) != ("rows", 0) and op not in flagged:
            found.append((op, f"output {key!r} depends on the length of the batch's "
                              "longest ragged row"))
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


def probe_inputs(flat, rows=PROBE_ROWS, seed=0, first_length=1):
    """Random inputs of ``rows`` rows for the flat signature's inputs, by placeholder:
    floats from a normal distribution, integers 0 or 1, distinct strings per row; a
    ragged or sparse input a valid value of its spec whose first row holds
    ``first_length`` values (:func:`rewriters.composite_inputs.composite_value`: by
    default the shortest row, so that the rows without it pad to the same length)."""
    rng = np.random.default_rng(seed)

    def draw(key, dims):
        dtype = flat.inputs[key][2]
        kind = np.dtype(dtype).kind if dtype not in ("string", "bfloat16") else dtype
        if kind == "string":
            words = rng.integers(0, 5, size=dims)
            return np.vectorize(lambda w: f"w{w} w{(w * 7) % 5}".encode(),
                                otypes=[object])(words)
        if kind in ("f", "bfloat16"):
            return rng.standard_normal(dims).astype(np.float32)
        if kind == "b":
            return rng.integers(0, 2, size=dims).astype(bool)
        return rng.integers(0, 2, size=dims).astype(dtype)

    values = {}
    for composite in flat.composites:
        values.update(composite_value(composite, rows, rng, draw, first_length))
    for key, (_, shape, _) in flat.inputs.items():
        if key not in values:
            values[key] = draw(key, [rows, *shape[1:]] if _batched(flat, key) else shape)
    return {flat.inputs[key][0]: value for key, value in values.items()}


def _batched(flat, key):
    """Whether the batch is the first axis of input ``key`` (of a TF1 signature, which
    names no batch axes: every input's)."""
    return 0 in flat.batch_axes.get(flat.inputs[key][0], (0,))


def _probe_feeds(flat, given, first_length=1):
    """The probe's two batches, by placeholder: :func:`probe_inputs` (or
    :data:`PROBE_ROWS` rows of the ``given`` inputs from the one whose ragged inputs
    are shortest, round again if they hold fewer), and the same rows but the first."""
    from rewriters.given_inputs import cycled, given_rows

    if given is not None:
        full = given_rows(given, cycled(given, PROBE_ROWS, _shortest_row(given)))
    else:
        feeds = probe_inputs(flat, first_length=first_length)
        full = {key: feeds[placeholder] for key, (placeholder, _, _) in flat.inputs.items()}
    rest = list(range(1, PROBE_ROWS))
    part = {key: value[1:] if _batched(flat, key) else value for key, value in full.items()}
    for composite in flat.composites:
        part.update(take_rows(composite, full, rest))
    return ({flat.inputs[key][0]: value for key, value in full.items()},
            {flat.inputs[key][0]: value for key, value in part.items()})


def _shortest_row(given):
    """The row of ``given`` whose ragged inputs hold fewest values in their first
    dimension (the first row if none is ragged)."""
    lengths = sum((np.diff(given.arrays[c.keys[1]]) for c in given.composites
                   if c.kind == "ragged" and c.shape[0] is None), np.zeros(given.rows))
    return int(np.argmin(lengths))


def _probe_runs(proto, path, flat, batches, given=None):
    """For each ``(feeds, fewer)`` of ``batches`` (:func:`_probe_feeds`, of the user's
    inputs ``given`` if not None), every fetchable tensor of the flat graph, by name, as
    ``(full, part)``: its value on ``feeds`` and on ``fewer``, the same rows but the
    first."""
    tf = tensorflow()
    dtypes = {placeholder: dtype for placeholder, _, dtype in flat.inputs.values()}
    if flat.info.format == "tf1":
        run = _tf1_session_runner(proto, path, flat)
    elif any(c.kind in HANDLE_KINDS for c in flat.info.captures.values()):
        run = _function_runner(proto, path, flat)
    else:
        run = _session_runner(proto, path, flat)
    try:
        values = [[run({p: tf.constant(v, dtype=dtypes[p]) for p, v in feed.items()})
                   for feed in pair] for pair in batches]
    except (tf.errors.OpError, ValueError, TypeError) as exc:
        inputs = f"the inputs of {given.source}" if given is not None else \
            "its own random inputs"
        raise ModelError(path, "tfpart's probe for ops that mix a batch's samples failed "
                         f"running the signature on {PROBE_ROWS} rows of {inputs}: "
                         f"{first_line(exc)}") from None
    return [{name: (full[name], part[name]) for name in full if name in part}
            for full, part in values]


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
    outside = flat.bound_outside()
    for node in flat.graph_def.node:
        if not outside(node.name):
            graph_def.node.add().CopyFrom(node)
    graph_def.library.CopyFrom(private_library(graph_def.node, flat.graph_def.library))
    _register_functions(graph_def.library)

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


def _register_functions(library):
    """Add ``library``'s functions to the eager context. A ``tf.function`` that imports a
    graph holding control flow runs its branches and loop bodies as calls of functions
    looked up there (``import_graph_def`` adds them to the traced graph only, and
    running it then fails with ``Op type not registered 'cond_true_35'``). The names
    are :func:`rewriters.functions.private_library`'s, so a function of the same name
    and another definition (a model loaded in this process) is never replaced."""
    from tensorflow.python.eager import context

    for function in library.function:
        context.context().add_function_def(function)


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
