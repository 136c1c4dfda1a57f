"""What each tensor's values depend on, as far as the samples of a batch go: the roles
:mod:`rewriters.batch_flow` gives every tensor of a graph, starting from the inputs
whose axis 0 is the batch, and the rules that give an op's outputs theirs.

=============  ========================================================================
role           what the tensor's values depend on
=============  ========================================================================
static         not the batch (weights, constants, shapes of the other axes)
size           the batch's size only (``tf.shape(x)[0]``), with the elements of a shape
               vector that hold it
rows           each sample's own values, one slice per sample along ``axis``
sample         the values of the one sample a loop over the batch reads on this trip
               (``tf.map_fn``'s element)
mixed          the values of several samples, with ``why``: the op where they met;
               ``proven`` False where the analysis only lost track of the rows (an
               op it does not know, a rank, axis or layout it cannot read): perhaps
               each sample's own values, perhaps not
list, samples  a ``TensorList`` whose elements all have one role, or whose element
               ``i`` is sample ``i`` (``tf.map_fn``'s input and output lists)
=============  ========================================================================

Ops known to keep each sample's values in its own rows (element-wise ops, matmuls and
convolutions with weights, reductions and slices along other axes, reshapes that keep
the batch axis, gathers from a table, …) give ``rows``. Ops known to combine the rows
of several samples (reductions, matmuls and cumulative ops along the batch axis, a slice
that picks some of its rows, a batch normalization in training) give ``mixed``, naming
themselves; any other op that reads ``rows``, and any rule that cannot read a rank, an
axis or a layout, gives a ``mixed`` that is not ``proven``: no proof that samples mix,
left to the random probe of :mod:`rewriters.batch_check`.

Examples
--------
>>> rows, static = Role("rows", axis=0), Role("static")
>>> join(rows, static), join(rows, Role("rows", axis=1), "Merge at op m").kind
(Role(kind='rows', axis=0), 'mixed')
>>> steered(rows, Role("size", why="Shape at op s"), "loop w").why
'loop w, steered by the batch size (Shape at op s)'
>>> steered(rows, Role("mixed", why="Max over the batch at op m"), "loop w").why
'Max over the batch at op m'
>>> maybe_mixed("Roll at op r, which may combine the rows of the batch")
Role(kind='mixed', proven=False)
"""
from __future__ import annotations

from dataclasses import dataclass, field

LIST_KINDS = ("list", "samples")

PASS_THROUGH = {"Identity", "PlaceholderWithDefault", "Snapshot", "StopGradient",
                "EnsureShape", "CheckNumerics", "PreventGradient", "NextIteration",
                "RefNextIteration", "Enter", "RefEnter", "LoopCond", "_Retval", "Print"}
SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank", "TensorListLength", "TensorListElementShape",
             "VariableShape"}
ELEMENTWISE = {
    "Abs", "Acos", "Acosh", "Add", "AddN", "AddV2", "Angle", "ApproximateEqual",
    "Asin", "Asinh", "AsString", "Atan", "Atan2", "Atanh", "BiasAdd", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor", "Bucketize", "Cast", "Ceil", "ClipByValue", "Complex",
    "ComplexAbs", "Conj", "Cos", "Cosh", "Digamma", "Div", "DivNoNan", "Elu", "Equal",
    "Erf", "Erfc", "Erfinv", "Exp", "Expm1", "Floor", "FloorDiv", "FloorMod", "Gelu",
    "Greater", "GreaterEqual", "Imag", "Inv", "Invert", "IsFinite", "IsInf", "IsNan",
    "LeakyRelu", "LeftShift", "Less", "LessEqual", "Lgamma", "Log", "Log1p", "LogicalAnd",
    "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mod", "Mul", "MulNoNan", "Ndtri",
    "Neg", "NotEqual", "OnesLike", "Pow", "QuantizeAndDequantizeV2",
    "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4", "FakeQuantWithMinMaxVars",
    "FakeQuantWithMinMaxArgs", "Real", "RealDiv", "Reciprocal", "Relu", "Relu6",
    "RightShift", "Rint", "Round", "Rsqrt", "Select", "SelectV2", "Selu", "Sigmoid",
    "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Square", "SquaredDifference",
    "StaticRegexFullMatch", "StaticRegexReplace", "StringLower", "StringStrip",
    "StringToHashBucket", "StringToHashBucketFast", "StringToHashBucketStrong",
    "StringToNumber", "StringUpper", "Sub", "Tan", "Tanh", "TruncateDiv", "TruncateMod",
    "Xdivy", "Xlog1py", "Xlogy", "ZerosLike", "Zeta"}
REDUCTIONS = {"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm",
              "ArgMax", "ArgMin"}
BATCH_FIRST_OPS = {  # data input 0 keeps its batch axis 0 when the other inputs are static
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "_FusedConv2D", "MaxPool", "AvgPool",
    "MaxPoolV2", "MaxPool3D", "AvgPool3D", "LRN", "FusedBatchNorm", "FusedBatchNormV2",
    "FusedBatchNormV3", "_FusedBatchNormEx", "FusedResizeAndPadConv2D", "ResizeBilinear",
    "ResizeNearestNeighbor", "ResizeBicubic", "ResizeArea", "DepthToSpace", "SpaceToDepth",
    "ExtractImagePatches", "Dilation2D", "_FusedMatMul", "MatrixBandPart", "MatrixDiag",
    "MatrixDiagV3", "MatrixDiagPartV3", "MatrixSetDiagV3", "ImageProjectiveTransformV3"}
TABLE_LOOKUPS = {"LookupTableFind", "LookupTableFindV2"}  # keys are input 1


@dataclass(frozen=True)
class Role:
    """What a tensor's values depend on (see the module docstring). ``axis``: the batch
    axis of ``rows``; ``dims``: the elements of a ``size`` vector that hold the batch
    size (None: unknown, or a scalar); ``loop``: the loop whose trip a ``sample`` is, or
    whose trip counter a ``static`` is; ``elem``: every element's role, of a ``list``;
    ``why``: where a ``mixed`` tensor's samples met, or a ``size`` came from;
    ``proven``: whether a ``mixed`` tensor's samples are known to meet (False: an op or
    a layout the analysis does not follow)."""

    kind: str
    axis: int | None = None
    dims: tuple | None = None
    loop: str | None = None
    elem: "Role | None" = None
    why: str = field(default="", compare=False)
    proven: bool = True

    def __repr__(self):
        shown = [f"{name}={value!r}" for name, value in
                 (("axis", self.axis), ("dims", self.dims), ("loop", self.loop),
                  ("elem", self.elem)) if value is not None]
        shown += [] if self.proven else ["proven=False"]
        return f"Role(kind={self.kind!r}{''.join(', ' + s for s in shown)})"


STATIC = Role("static")


def mixed(why):
    """The role of values of several samples, met where ``why`` says."""
    return Role("mixed", why=why)


def maybe_mixed(why):
    """The role of values of the batch that ``why`` (an op not known, a rank or an axis
    not read) may or may not have combined: no proof that samples mix."""
    return Role("mixed", why=why, proven=False)


def proves_mixing(role):
    """Whether values of ``role`` are known to combine several samples."""
    return role.kind == "mixed" and role.proven


def _most_mixed(roles):
    """The first proven ``mixed`` of ``roles``, else the first ``mixed``, else None."""
    found = [r for r in roles if r is not None and r.kind == "mixed"]
    return next((r for r in found if r.proven), found[0] if found else None)


def join(a, b, why="values of several samples"):
    """The role of a value that is either ``a`` or ``b`` (a loop variable's start and
    its next value, the outputs of two branches); ``why`` names the place, should the
    two be different samples' values. None stands for no value yet."""
    if a is None or b is None or a == b:
        return b if a is None else a
    if "mixed" in (a.kind, b.kind):
        return _most_mixed([a, b])
    if a.kind in LIST_KINDS or b.kind in LIST_KINDS:
        return _join_lists(a, b, why)
    if "static" in (a.kind, b.kind):
        other = b if a.kind == "static" else a
        return STATIC if other.kind == "static" else other
    if a.kind == b.kind == "size":
        return Role("size", dims=a.dims if a.dims == b.dims else None, why=a.why)
    return maybe_mixed(why)  # two layouts of the rows: one the analysis cannot hold


def _join_lists(a, b, why):
    if a.kind not in LIST_KINDS or b.kind not in LIST_KINDS:
        return maybe_mixed(why)
    if a.kind == b.kind == "list":
        return Role("list", elem=join(a.elem, b.elem, why))
    samples, other = (a, b) if a.kind == "samples" else (b, a)
    return samples if other.kind == "samples" or other.elem == STATIC else \
        Role("list", elem=maybe_mixed(why))


def steered(role, by, why):
    """The role of ``role``'s value once a predicate of role ``by`` has chosen it, or
    once a loop whose stop condition has role ``by`` has run its trips; ``why`` names
    the branch or loop."""
    if by.kind == "static" or role.kind == "mixed" and not proves_mixing(by):
        return role
    if role.kind == "mixed" and role.proven:
        return role
    if by.kind in ("mixed", "rows"):
        return Role("mixed", why=by.why or why, proven=by.proven)
    if role.kind == "samples":
        return role if by.kind == "size" else Role("list", elem=mixed(why))
    if role.kind == "list":
        return Role("list", elem=steered(role.elem, by, why))
    if by.kind == "size":
        if role.kind in ("static", "size"):
            return Role("size", why=by.why)
        # the branches or trips may well give the same rows at every batch size
        return maybe_mixed(f"{why}, steered by the batch size ({by.why})")
    if role.kind == "static" or role == by:  # by: one sample
        return Role("sample", loop=by.loop)
    return mixed(f"{why}, which combines one sample with others")


def combined(roles, rank, ranks, why):
    """The role of an element-wise result of rank ``rank`` from inputs of ``roles``
    (each of rank ``ranks``, broadcast against each other); ``why`` names the op.

    >>> combined([Role("rows", axis=0), STATIC], 2, [2, 1], "Add at op a")
    Role(kind='rows', axis=0)
    >>> combined([Role("rows", axis=0), Role("size")], 2, [2, 0], "Mul at op m").why
    'the batch size, made into values by Mul at op m'
    """
    roles = [r for r in roles if r is not None]
    first_mixed = _most_mixed(roles)
    if first_mixed is not None:
        return first_mixed
    kinds = {r.kind for r in roles}
    if kinds & set(LIST_KINDS):
        return maybe_mixed(f"{why}, which reads a list")
    if "rows" in kinds:
        rows = [(r, n) for r, n in zip(roles, ranks) if r.kind == "rows"]
        if len(rows) == 1 and all(n == 0 for r, n in zip(roles, ranks) if r.kind != "rows"):
            axes = {rows[0][0].axis}  # scalars broadcast moves no axis
        elif rank is None or any(n is None for _, n in rows):
            return maybe_mixed(f"{why}, of unknown rank")
        else:
            axes = {rank - n + r.axis for r, n in rows}
        if "size" in kinds:
            return mixed(f"the batch size, made into values by {why}")
        if len(axes) > 1 or "sample" in kinds:
            return mixed(f"{why}, which combines different samples")
        return Role("rows", axis=axes.pop())
    if "sample" in kinds:
        loops = {r.loop for r in roles if r.kind == "sample"}
        if len(loops) > 1 or "size" in kinds:
            return mixed(f"{why}, which combines one sample with others")
        return Role("sample", loop=loops.pop())
    sizes = [r for r in roles if r.kind == "size"]
    if sizes:
        dims = sizes[0].dims if rank == 1 and all(r.dims == sizes[0].dims for r in sizes) \
            else None
        return Role("size", dims=dims, why=sizes[0].why)
    return STATIC


def constant_of(tensor):
    """The value of a scalar or a vector computed from constants alone, else None."""
    from tensorflow.python.framework import tensor_util

    try:
        value = tensor_util.constant_value(tensor)
    except (TypeError, ValueError, NotImplementedError):
        return None
    if value is None or value.ndim > 1:
        return None
    return value.item() if value.ndim == 0 else tuple(value.tolist())


def _rank(tensor):
    return tensor.shape.rank


def _axes(value, rank):
    """Axes named by a constant (a scalar or a vector), made non-negative."""
    if value is None:
        return None
    values = value if isinstance(value, tuple) else (value,)
    if rank is None:
        return None if any(a < 0 for a in values) else {int(a) for a in values}
    return {int(a) % rank if rank else int(a) for a in values}


def op_roles(op, inputs, name):
    """The roles of the outputs of ``op`` (a ``tf.Operation`` that runs no function),
    its inputs having ``inputs``; ``name`` is its full name."""
    n = len(op.outputs)
    rule = _RULES.get(op.type)
    if rule is not None:
        found = rule(op, inputs, name)
        if found is not None:
            return found if isinstance(found, list) else [found] * n
    if op.type in PASS_THROUGH:
        return [inputs[0]] * n if inputs else [STATIC] * n
    if op.type in ELEMENTWISE:
        return [combined(inputs, _rank(op.outputs[0]), [_rank(t) for t in op.inputs],
                         f"{op.type} at op {name}")] * n
    return [_generic(op, inputs, name)] * n


def _generic(op, inputs, name):
    """An op not known to keep rows apart: perhaps mixing, if it reads the batch's
    values (no proof: the random probe is to tell)."""
    kinds = {r.kind for r in inputs}
    if "mixed" in kinds:
        return _most_mixed(inputs)
    if kinds & {"rows", *LIST_KINDS}:
        return maybe_mixed(f"{op.type} at op {name}, which may combine the rows of the "
                           "batch")
    return combined(inputs, None, [None] * len(inputs), f"{op.type} at op {name}")


# Rules: (op, input roles, name) -> a role for every output, a list of roles, or None
# for the element-wise rule.

def _shape(op, inputs, name):
    data = inputs[0]
    if op.type == "Rank":
        return STATIC
    if op.type == "ShapeN":
        return [_shape_of(r, f"ShapeN at op {name}") for r in inputs]
    if op.type == "TensorListLength":
        return Role("size", why=f"{op.type} at op {name}")
    if op.type == "TensorListElementShape":
        elem = data.elem if data.kind == "list" else STATIC
        return _shape_of(elem, f"{op.type} at op {name}")
    if op.type == "Size":
        return _shape_of(data, f"Size at op {name}", scalar=True)
    return _shape_of(data, f"{op.type} at op {name}")


def _shape_of(role, why, scalar=False):
    if role.kind == "rows":
        return Role("size", dims=None if scalar else (role.axis,), why=why)
    if role.kind in ("sample", "mixed"):
        return role
    return STATIC


def _strided_slice(op, inputs, name):
    data = inputs[0]
    if data.kind not in ("rows", "size") or any(r.kind != "static" for r in inputs[1:]):
        return None  # bounds from the batch: the generic rule
    spec = [_spec_values(t) for t in op.inputs[1:4]]
    masks = {key: op.get_attr(key) for key in ("begin_mask", "end_mask", "ellipsis_mask",
                                                "new_axis_mask", "shrink_axis_mask")}
    rank = _rank(op.inputs[0])
    if data.kind == "size":
        return _sliced_size(data, op, spec, masks) if None not in spec else \
            Role("size", why=data.why)
    if rank is None or spec[0] is None:
        return maybe_mixed(f"StridedSlice at op {name}, of unknown rank")
    # bounds that are not constant are still static ones (a loop's counter, a weight)
    where = _slice_axis(data.axis, rank, op.inputs[0].shape[data.axis], spec, masks)
    if where is not None:
        return Role("rows", axis=where)
    picked = mixed if all(s is not None and None not in s for s in spec) else maybe_mixed
    return picked(f"StridedSlice at op {name}, which picks some rows of the batch")


def _spec_values(tensor):
    """A strided slice's begins, ends or strides: a tuple with None where an entry is
    not constant, or None if even their count is unknown."""
    value = constant_of(tensor)
    if value is not None:
        return value if isinstance(value, tuple) else (value,)
    count = tensor.shape[0] if tensor.shape.rank == 1 else None
    return None if count is None else (None,) * count


def _spec_entries(rank, count, masks):
    """``(input axis or None, output axis or None, entry)`` of each of a strided slice's
    ``count`` entries: a new axis has no input axis, a shrunk one no output axis; the
    ellipsis expands (its axes, and the axes after the last entry, have entry None)."""
    named = sum(1 for e in range(count) if not (masks["new_axis_mask"] >> e) & 1
                and not (masks["ellipsis_mask"] >> e) & 1)
    entries, axis, out = [], 0, 0
    for e in range(count):
        if (masks["ellipsis_mask"] >> e) & 1:
            for _ in range(rank - named):
                entries.append((axis, out, None))
                axis, out = axis + 1, out + 1
        elif (masks["new_axis_mask"] >> e) & 1:
            entries.append((None, out, e))
            out += 1
        elif (masks["shrink_axis_mask"] >> e) & 1:
            entries.append((axis, None, e))
            axis += 1
        else:
            entries.append((axis, out, e))
            axis, out = axis + 1, out + 1
    while axis < rank:
        entries.append((axis, out, None))
        axis, out = axis + 1, out + 1
    return entries


def _slice_axis(axis, rank, size, spec, masks):
    """The output axis of input ``axis`` when a strided slice keeps all of it, else
    None (also where that takes a begin, end or stride that is not constant)."""
    begins, ends, strides = spec
    for inp, out, e in _spec_entries(rank, len(begins), masks):
        if inp != axis:
            continue
        if e is None:
            return out
        if out is None or strides is None or strides[e] != 1:
            return None
        whole_start = (masks["begin_mask"] >> e) & 1 or begins[e] == 0
        whole_end = (masks["end_mask"] >> e) & 1 or (
            ends is not None and ends[e] is not None and (
                (size is not None and ends[e] >= size) or ends[e] >= 2 ** 31 - 1))
        return out if whole_start and whole_end else None
    return None


def _sliced_size(data, op, spec, masks):
    """A slice of a shape vector: size where it keeps an element holding the batch."""
    length = op.inputs[0].shape[0] if _rank(op.inputs[0]) == 1 else None
    begins, ends, strides = spec
    if data.dims is None or length is None or None in begins + ends + strides:
        return Role("size", why=data.why)
    (_, out, e), = [entry for entry in _spec_entries(1, len(begins), masks)
                    if entry[0] == 0] or [(0, 0, None)]
    if e is None:
        kept = list(range(length))
    elif out is None:
        kept = [begins[e] % length]
    else:
        start = None if (masks["begin_mask"] >> e) & 1 else begins[e]
        stop = None if (masks["end_mask"] >> e) & 1 else ends[e]
        kept = list(range(length))[slice(start, stop, strides[e])]
    dims = tuple(i for i, k in enumerate(kept) if k in data.dims)
    if not dims:
        return STATIC
    return Role("size", dims=None if out is None else dims, why=data.why)


def _slice(op, inputs, name):
    data, begin, size = inputs[0], constant_of(op.inputs[1]), constant_of(op.inputs[2])
    if data.kind != "rows":
        return None if data.kind != "size" else Role("size", why=data.why)
    k = data.axis
    if isinstance(begin, tuple) and isinstance(size, tuple) and begin[k] == 0 and \
            (size[k] == -1 or size[k] == op.inputs[0].shape[k]):
        return data
    picked = mixed if isinstance(begin, tuple) and isinstance(size, tuple) else maybe_mixed
    return picked(f"Slice at op {name}, which picks some rows of the batch")


def _gather(op, inputs, name):
    params, indices = inputs[0], inputs[1]
    axis = 0 if op.type in ("Gather", "ResourceGather") else constant_of(op.inputs[2])
    batch_dims = op.get_attr("batch_dims") if "batch_dims" in op.node_def.attr else 0
    rank, index_rank = _rank(op.inputs[0]), _rank(op.inputs[1])
    if op.type == "ResourceGather":
        params, rank = STATIC, None
    if params.kind == "size" and indices.kind == "static" and params.dims is not None:
        picked = constant_of(op.inputs[1])
        if picked is None:
            return Role("size", why=params.why)
        values = picked if isinstance(picked, tuple) else (picked,)
        dims = tuple(i for i, v in enumerate(values) if v in params.dims)
        return STATIC if not dims else Role(
            "size", dims=None if not isinstance(picked, tuple) else dims, why=params.why)
    if axis is None or index_rank is None:
        return None if "rows" not in (params.kind, indices.kind) else \
            maybe_mixed(f"{op.type} at op {name}, which may pick rows of the batch")
    if rank is not None:
        axis %= rank
    if params.kind == "static" and indices.kind == "rows":
        return Role("rows", axis=axis + indices.axis)
    if params.kind == "rows" and axis == params.axis and index_rank == 0 and \
            indices.loop is not None:  # tf.gather(x, i): the loop's own sample
        return Role("sample", loop=indices.loop)
    if params.kind == "rows" and indices.kind == "static" and axis != params.axis:
        return Role("rows", axis=params.axis if params.axis < axis else
                    params.axis + index_rank - 1 - batch_dims)
    if params.kind == indices.kind == "rows" and params.axis == indices.axis == 0 < batch_dims:
        return Role("rows", axis=0)
    if "rows" in (params.kind, indices.kind):
        # rows picked by constants or by the batch's values; other indices (a loop's
        # counter) are not followed
        picked = mixed if indices.kind == "rows" or constant_of(op.inputs[1]) is not None \
            else maybe_mixed
        return picked(f"{op.type} at op {name}, which picks rows of the batch")
    return None


def _gather_nd(op, inputs, name):
    params, indices = inputs
    if params.kind == "static" and indices.kind == "rows" and \
            _rank(op.inputs[1]) is not None and indices.axis < _rank(op.inputs[1]) - 1:
        return indices
    return _generic(op, inputs, name)


def _pack(op, inputs, name):
    axis = op.get_attr("axis")
    rank = _rank(op.outputs[0])
    if all(r.kind in ("static", "size") for r in inputs):
        if rank != 1:
            return combined(inputs, None, [], name)
        dims = tuple(i for i, r in enumerate(inputs) if r.kind == "size")
        sizes = [r for r in inputs if r.kind == "size"]
        return Role("size", dims=dims, why=sizes[0].why) if dims else STATIC
    role = combined(inputs, rank - 1 if rank is not None else None,
                    [_rank(t) for t in op.inputs], f"Pack at op {name}")
    if role.kind != "rows":
        return role
    axis %= rank
    return Role("rows", axis=role.axis if role.axis < axis else role.axis + 1)


def _unpack(op, inputs, name):
    data = inputs[0]
    axis = op.get_attr("axis") % max(_rank(op.inputs[0]) or 1, 1)
    if data.kind == "size":
        if data.dims is None:
            return Role("size", why=data.why)
        return [Role("size", why=data.why) if i in data.dims else STATIC
                for i in range(len(op.outputs))]
    if data.kind != "rows":
        return None
    if axis == data.axis:
        return maybe_mixed(f"Unpack at op {name}, which splits the batch into its samples")
    return Role("rows", axis=data.axis - (axis < data.axis))


def _concat(op, inputs, name):
    values, axis_input = (inputs[:-1], op.inputs[-1]) if op.type == "ConcatV2" else \
        (inputs[1:], op.inputs[0])
    tensors = op.inputs[:-1] if op.type == "ConcatV2" else op.inputs[1:]
    axis, rank = constant_of(axis_input), _rank(op.outputs[0])
    if all(r.kind in ("static", "size") for r in values) and rank == 1:
        dims, offset = [], 0
        for role, tensor in zip(values, tensors):
            length = tensor.shape[0] if _rank(tensor) == 1 else None
            if role.kind == "size" and (role.dims is None or length is None):
                return Role("size", why=role.why)
            if role.kind == "size":
                dims += [offset + d for d in role.dims]
            offset += length or 0
        sizes = [r for r in values if r.kind == "size"]
        return Role("size", dims=tuple(dims), why=sizes[0].why) if sizes else STATIC
    role = combined(values, rank, [_rank(t) for t in tensors], f"{op.type} at op {name}")
    if role.kind == "rows" and (axis is None or axis % rank == role.axis):
        return maybe_mixed(f"{op.type} at op {name}, which joins tensors along the batch "
                           "axis")
    return role


def _reshape_like(op, inputs, name):
    data = inputs[0]
    if data.kind != "rows":
        return None if data.kind != "size" else Role("size", why=data.why)
    if op.type == "ExpandDims":
        axis = constant_of(op.inputs[1])
        rank = _rank(op.outputs[0])
        if axis is not None and rank is not None:
            axis %= rank
            return Role("rows", axis=data.axis + (axis <= data.axis))
    if op.type == "Squeeze":
        dims = op.get_attr("squeeze_dims")
        rank = _rank(op.inputs[0])
        if dims and rank is not None and data.axis not in {d % rank for d in dims}:
            return Role("rows", axis=data.axis - sum(d % rank < data.axis for d in dims))
    where = _reshaped_axis(op.inputs[0].shape, op.outputs[0].shape, data.axis)
    return Role("rows", axis=where) if where is not None else \
        maybe_mixed(f"{op.type} at op {name}, which folds the batch into other dimensions")


def _reshaped_axis(before, after, axis):
    """The axis of ``after`` that holds axis ``axis`` of ``before`` whole, when a
    row-major reshape keeps it (the dimensions before it and after it hold as many
    elements on both sides), else None.

    >>> _reshaped_axis([None, 2, 4], [None, 8], 0), _reshaped_axis([4, 8], [8, 4], 0)
    (0, None)
    """
    before = [getattr(d, "value", d) for d in before]
    after = [getattr(d, "value", d) for d in after]

    def product(dims):
        total = 1
        for d in dims:
            if d is None:
                return None
            total *= d
        return total

    head, tail = product(before[:axis]), product(before[axis + 1:])
    matches = [j for j in range(len(after))
               if head is not None and tail is not None and product(after[:j]) == head
               and product(after[j + 1:]) == tail and after[j] == before[axis]]
    return matches[0] if len(matches) == 1 else None


def _transpose(op, inputs, name):
    data, perm = inputs[0], constant_of(op.inputs[1])
    if data.kind != "rows":
        return None
    if not isinstance(perm, tuple) or data.axis >= len(perm):
        return maybe_mixed(f"Transpose at op {name}, with an unknown permutation")
    return Role("rows", axis=perm.index(data.axis))


def _matmul(op, inputs, name):
    a, b = inputs[:2]
    if op.type in ("MatMul", "_FusedMatMul"):
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        extra = inputs[2:]
        if any(r.kind not in ("static",) for r in extra) and "rows" in (a.kind, b.kind):
            return maybe_mixed(f"{op.type} at op {name}, which may combine the rows of "
                               "the batch")
        if a.kind == "rows" and b.kind == "static" and a.axis == (1 if ta else 0):
            return Role("rows", axis=0)
        if b.kind == "rows" and a.kind == "static" and b.axis == (0 if tb else 1):
            return Role("rows", axis=1)
        if "rows" in (a.kind, b.kind):
            return mixed(f"{op.type} at op {name}, which multiplies along the batch axis")
        return None
    adj_a = op.get_attr("adj_x") if "adj_x" in op.node_def.attr else False
    adj_b = op.get_attr("adj_y") if "adj_y" in op.node_def.attr else False
    ranks, rank = [_rank(t) for t in op.inputs[:2]], _rank(op.outputs[0])
    if rank is None or None in ranks or "rows" not in (a.kind, b.kind):
        return None if "rows" not in (a.kind, b.kind) else \
            maybe_mixed(f"{op.type} at op {name}, of unknown rank")
    axes = set()
    # an operand's axis that becomes the result's rows (x) or columns (y)
    for role, n, row_axis, col_axis in ((a, ranks[0], ranks[0] - 2 + adj_a, None),
                                        (b, ranks[1], None, ranks[1] - 1 - adj_b)):
        if role.kind != "rows":
            if role.kind != "static":
                return maybe_mixed(f"{op.type} at op {name}, which may combine rows of "
                                   "the batch")
            continue
        if role.axis < n - 2:
            axes.add(rank - n + role.axis)
        elif role.axis == row_axis:
            axes.add(rank - 2)
        elif role.axis == col_axis:
            axes.add(rank - 1)
        else:
            return mixed(f"{op.type} at op {name}, which multiplies along the batch axis")
    return Role("rows", axis=axes.pop()) if len(axes) == 1 else \
        mixed(f"{op.type} at op {name}, which combines different samples")


def _einsum(op, inputs, name):
    equation = op.get_attr("equation").decode().replace(" ", "")
    if "rows" not in {r.kind for r in inputs}:
        return None
    if "->" not in equation or "." in equation:
        return maybe_mixed(f"Einsum at op {name}, whose equation is not followed")
    operands, result = equation.split("->")
    labels = set()
    for role, term in zip(inputs, operands.split(",")):
        if role.kind == "rows":
            labels.add(term[role.axis])
        elif role.kind != "static":
            return maybe_mixed(f"Einsum at op {name}, which may combine the rows of the "
                               "batch")
    for role, term in zip(inputs, operands.split(",")):
        if role.kind == "static" and labels & set(term):
            return mixed(f"Einsum at op {name}, which multiplies along the batch axis")
    if len(labels) != 1 or next(iter(labels)) not in result:
        return mixed(f"Einsum over the batch at op {name}")
    return Role("rows", axis=result.index(labels.pop()))


def _batch_first(op, inputs, name):
    data, others = inputs[0], inputs[1:]
    training = op.type.startswith(("FusedBatchNorm", "_FusedBatchNorm")) and \
        op.get_attr("is_training")
    if data.kind == "rows" and data.axis == 0 and not training and \
            all(r.kind in ("static", "size") for r in others):
        return [data] + [STATIC] * (len(op.outputs) - 1)
    if data.kind == "rows" and training:
        return mixed(f"{op.type} at op {name}, a batch normalization over the batch")
    return None if data.kind != "rows" else \
        maybe_mixed(f"{op.type} at op {name}, which may combine the rows of the batch")


def _conv_backprop_input(op, inputs, name):
    sizes, kernel, gradient = inputs
    if gradient.kind == "rows" and gradient.axis == 0 and kernel.kind == "static" and \
            sizes.kind in ("static", "size"):
        return gradient
    return None if gradient.kind != "rows" else \
        maybe_mixed(f"{op.type} at op {name}, which may combine the rows of the batch")


def _reduction(op, inputs, name):
    data = inputs[0]
    if data.kind != "rows":
        return None
    rank = _rank(op.inputs[0])
    axes = _axes(constant_of(op.inputs[1]), rank)
    if axes is None and not _every_axis(op.inputs[1]):
        return maybe_mixed(f"{op.type} at op {name}, over axes not known")
    if axes is None:  # a reduction over every axis of a tensor of unknown rank
        return mixed(f"{op.type} over the batch at op {name}")
    if data.axis in axes:
        return mixed(f"{op.type} over the batch at op {name}")
    keep = op.get_attr("keep_dims") if "keep_dims" in op.node_def.attr else False
    return Role("rows", axis=data.axis if keep else
                data.axis - sum(a < data.axis for a in axes))


def _every_axis(tensor):
    """Whether ``tensor`` is ``tf.range(tf.rank(t))``: every axis of ``t``."""
    op = tensor.op
    return op.type == "Range" and constant_of(op.inputs[0]) == 0 and \
        constant_of(op.inputs[2]) == 1 and op.inputs[1].op.type == "Rank"


def _along_axis(op, inputs, name):
    """Ops along one axis given as an input (cumulative sums, reversals, splits)."""
    data_index = {"Split": 1}.get(op.type, 0)
    axis_index = {"Split": 0, "SplitV": 2}.get(op.type, 1)
    data = inputs[data_index]
    if data.kind != "rows":
        return None
    axes = _axes(constant_of(op.inputs[axis_index]), _rank(op.inputs[data_index]))
    if axes is None:
        return maybe_mixed(f"{op.type} at op {name}, along an axis not known")
    if data.axis in axes:
        return mixed(f"{op.type} over the batch at op {name}")
    return data


def _last_axis(op, inputs, name):
    """Ops along the last axis (softmax, top-k, …)."""
    data = inputs[0]
    if data.kind != "rows":
        return None
    rank = _rank(op.inputs[0])
    if rank is not None and data.axis == rank - 1:
        return mixed(f"{op.type} over the batch at op {name}")
    if rank is None or any(r.kind not in ("static", "size") for r in inputs[1:]):
        return maybe_mixed(f"{op.type} at op {name}, which may combine the rows of the "
                           "batch")
    return data


def _tile(op, inputs, name):
    data, multiples = inputs[0], constant_of(op.inputs[1])
    if data.kind != "rows":
        return None
    if isinstance(multiples, tuple) and multiples[data.axis] == 1:
        return data
    return maybe_mixed(f"Tile at op {name}, which repeats the batch")


def _pad(op, inputs, name):
    data = inputs[0]
    if data.kind != "rows":
        return None
    paddings = _padding_rows(op.inputs[1])
    if paddings is not None and paddings[data.axis] == (0, 0) and \
            all(r.kind == "static" for r in inputs[2:]):
        return data
    return maybe_mixed(f"{op.type} at op {name}, which pads the batch")


def _padding_rows(tensor):
    from tensorflow.python.framework import tensor_util

    try:
        value = tensor_util.constant_value(tensor)
    except (TypeError, ValueError):
        return None
    return None if value is None else [tuple(int(v) for v in row) for row in value]


def _fill(op, inputs, name):
    dims, value = inputs[0], inputs[1]
    if op.type == "BroadcastTo":
        value, dims = inputs[0], inputs[1]
        if value.kind == "rows" and dims.kind in ("static", "size"):
            rank, before = _rank(op.outputs[0]), _rank(op.inputs[0])
            if rank is None or before is None:
                return maybe_mixed(f"BroadcastTo at op {name}, of unknown rank")
            return Role("rows", axis=value.axis + rank - before)
    if dims.kind == "size" and value.kind == "static":
        if dims.dims is not None and len(dims.dims) == 1:
            return Role("rows", axis=dims.dims[0])
        return maybe_mixed(f"{op.type} at op {name}, whose shape follows the batch size")
    return None


def _one_hot(op, inputs, name):
    data = inputs[0]
    if data.kind != "rows" or any(r.kind != "static" for r in inputs[1:]):
        return None if data.kind != "rows" else _generic(op, inputs, name)
    axis, rank = op.get_attr("axis"), _rank(op.outputs[0])
    if rank is None:
        return maybe_mixed(f"OneHot at op {name}, of unknown rank")
    axis %= rank
    return Role("rows", axis=data.axis + (axis <= data.axis))


def _select_v1(op, inputs, name):
    condition = inputs[0]
    if _rank(op.inputs[0]) == 1 and (_rank(op.inputs[1]) or 0) > 1:
        shown = Role("rows", axis=0) if condition.kind == "rows" and condition.axis == 0 \
            else condition
        ranks = [_rank(op.inputs[1])] + [_rank(t) for t in op.inputs[1:]]
        return combined([shown, *inputs[1:]], _rank(op.outputs[0]), ranks,
                        f"Select at op {name}")
    return None


def _table_lookup(op, inputs, name):
    keys = inputs[1]
    if keys.kind == "rows" and inputs[0].kind == "static" and inputs[2].kind == "static":
        return keys
    return None


def _random(op, inputs, name):
    shape = inputs[0] if inputs else STATIC
    if shape.kind == "size" and shape.dims is not None and len(shape.dims) == 1 and \
            all(r.kind in ("static", "size") for r in inputs):
        return Role("rows", axis=shape.dims[0])
    return None


def _list_from_tensor(op, inputs, name):
    data = inputs[0]
    if data.kind == "rows":
        return Role("samples") if data.axis == 0 else \
            Role("list", elem=Role("rows", axis=data.axis - 1))
    if data.kind in LIST_KINDS:
        return maybe_mixed(f"{op.type} at op {name}, which reads a list")
    return Role("list", elem=data)


def _list_get(op, inputs, name):
    listed, index = inputs[0], inputs[1]
    if listed.kind == "samples":
        if index.kind == "static" and index.loop is not None:
            return Role("sample", loop=index.loop)
        return maybe_mixed(f"{op.type} at op {name}, which reads a sample of the batch "
                           "other than the loop's own")
    if listed.kind == "list":
        return steered(listed.elem, index, f"{op.type} at op {name}")
    return _generic(op, inputs, name)


def _list_set(op, inputs, name):
    listed, index, item = inputs[0], inputs[1], inputs[2]
    counted = index.kind == "static" and index.loop is not None
    if item.kind == "sample" and counted and item.loop == index.loop and \
            (listed.kind == "samples" or listed == Role("list", elem=STATIC)):
        return Role("samples")
    if listed.kind == "samples":
        return Role("list", elem=maybe_mixed(f"{op.type} at op {name}, which writes a "
                                             "sample into another sample's slot"))
    if listed.kind == "list":
        return Role("list", elem=join(listed.elem, steered(item, index, name),
                                      f"{op.type} at op {name}"))
    return _generic(op, inputs, name)


def _list_push(op, inputs, name):
    listed, item = inputs[0], inputs[1]
    if listed.kind == "list":
        return Role("list", elem=join(listed.elem, item, f"{op.type} at op {name}"))
    return _generic(op, inputs, name)


def _list_new(op, inputs, name):
    return Role("list", elem=STATIC)


def _list_stack(op, inputs, name):
    listed = inputs[0]
    if listed.kind == "samples":
        return Role("rows", axis=0)
    if listed.kind == "list":
        elem = listed.elem
        return Role("rows", axis=elem.axis + 1) if elem.kind == "rows" else elem
    return _generic(op, inputs, name)


def _list_pop(op, inputs, name):
    listed = inputs[0]
    if listed.kind == "list":
        return [listed, listed.elem]
    return _generic(op, inputs, name)


_RULES = {
    "IdentityN": lambda op, inputs, name: list(inputs),
    **dict.fromkeys(SHAPE_OPS, _shape),
    "StridedSlice": _strided_slice, "Slice": _slice,
    **dict.fromkeys(("Gather", "GatherV2", "ResourceGather"), _gather),
    "GatherNd": _gather_nd, "Pack": _pack, "Unpack": _unpack,
    **dict.fromkeys(("ConcatV2", "Concat"), _concat),
    **dict.fromkeys(("Reshape", "ExpandDims", "Squeeze"), _reshape_like),
    "Transpose": _transpose,
    **dict.fromkeys(("MatMul", "_FusedMatMul", "BatchMatMul", "BatchMatMulV2",
                     "BatchMatMulV3"), _matmul),
    "Einsum": _einsum,
    **dict.fromkeys(BATCH_FIRST_OPS - {"_FusedMatMul"}, _batch_first),
    **dict.fromkeys(("Conv2DBackpropInput", "Conv3DBackpropInputV2"), _conv_backprop_input),
    **dict.fromkeys(REDUCTIONS, _reduction),
    **dict.fromkeys(("Cumsum", "Cumprod", "CumulativeLogsumexp", "ReverseV2", "Split",
                     "SplitV"), _along_axis),
    **dict.fromkeys(("Softmax", "LogSoftmax", "TopKV2", "InTopKV2", "L2Normalize"),
                    _last_axis),
    "Tile": _tile, **dict.fromkeys(("Pad", "PadV2", "MirrorPad"), _pad),
    **dict.fromkeys(("Fill", "BroadcastTo"), _fill), "OneHot": _one_hot,
    "Select": _select_v1, **dict.fromkeys(TABLE_LOOKUPS, _table_lookup),
    **dict.fromkeys(("RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                     "StatelessRandomUniformV2", "StatelessRandomNormalV2"), _random),
    "TensorListFromTensor": _list_from_tensor, "TensorListGetItem": _list_get,
    "TensorListSetItem": _list_set, "TensorListPushBack": _list_push,
    **dict.fromkeys(("TensorListReserve", "EmptyTensorList"), _list_new),
    "TensorListStack": _list_stack, "TensorListPopBack": _list_pop,
}


__all__ = ["LIST_KINDS", "Role", "STATIC", "combined", "constant_of", "join",
           "maybe_mixed", "mixed", "op_roles", "proves_mixing", "steered"]
