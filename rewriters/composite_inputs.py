"""Composite inputs of a signature (``tf.RaggedTensor``, ``tf.SparseTensor``) and valid
values for them.

A SavedModel signature takes a composite argument as its component tensors, each a
signature input of its own: a ragged ``tokens`` as ``tokens`` (its flat values) and
``tokens_1`` (its row splits; one more per ragged dimension), a sparse ``features`` as
``features`` (indices), ``features_1`` (values) and ``features_2`` (dense shape). Which
inputs belong together, and the composite's spec, are in the object graph: the
signature's wrapper function calls the user's function, whose input signature holds
the ``tf.RaggedTensorSpec`` or ``tf.SparseTensorSpec`` (:func:`composite_inputs`).

Filling each component on its own (integers 0 or 1) gives row splits and indices that
describe no tensor, so a model with such an input cannot run. Here a value is built
from the spec (:func:`composite_value`): a ragged input's rows get 1 to
:data:`MAX_ROW_LENGTH` values each (a known dimension keeps its length) and row splits
that add them up, a sparse input 1 to :data:`MAX_ROW_LENGTH` entries per row, its
indices sorted in row-major order within a dense shape whose first dimension is the
batch size. :func:`take_rows` selects rows of such a value (the batch-mixing probe's
batch without its first row, a batch cut from a user's inputs), and
:func:`tensor_rows` does it in a TensorFlow graph (the pipeline's micro-batches and
replicas' shares).

In the flattened signature a row-splits input holds ``batch + 1`` values
(:func:`row_splits_keys`), every other component one value per row.

Examples
--------
>>> import numpy as np
>>> tokens = CompositeInput("ragged", ("tokens", "tokens_1"), (None, None), "int64",
...                         ragged_rank=1)
>>> rng = np.random.default_rng(0)
>>> value = composite_value(tokens, 3, rng, lambda key, shape: np.arange(shape[0]))
>>> value["tokens_1"].tolist(), value["tokens"].tolist()
([0, 3, 5, 7], [0, 1, 2, 3, 4, 5, 6])
>>> {k: v.tolist() for k, v in take_rows(tokens, value, [1, 2]).items()}
{'tokens': [3, 4, 5, 6], 'tokens_1': [0, 2, 4]}
>>> tokens.file_names
('tokens.values', 'tokens.row_splits')
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rewriters.flat_signature import choose_signature, signature_call
from rewriters.functions import callee, library_index, split_input
from rewriters.tf_import import tensorflow
from tfpart.core.errors import ModelError

MAX_ROW_LENGTH = 3  # values of a ragged row, entries of a sparse row: 1 to this many
UNKNOWN_DIM = 4  # the length drawn for a dimension neither the spec nor the batch fixes


@dataclass(frozen=True)
class CompositeInput:
    """One composite argument of a signature: its ``kind`` (``"ragged"`` or
    ``"sparse"``), the signature input ``keys`` of its components in TensorFlow's
    order (:attr:`parts`), its ``shape`` (None where unknown) and ``dtype``, and for a
    ragged one its ``ragged_rank`` and ``row_splits_dtype``."""

    kind: str
    keys: tuple
    shape: tuple
    dtype: str
    ragged_rank: int = 0
    row_splits_dtype: str = "int64"

    @property
    def name(self):
        """The argument's name: the signature input key of its first component."""
        return self.keys[0]

    @property
    def parts(self):
        """The components' names, in the order of :attr:`keys`."""
        if self.kind == "sparse":
            return ("indices", "values", "dense_shape")
        return ("values", "row_splits",
                *(f"row_splits_{level}" for level in range(1, self.ragged_rank)))

    @property
    def file_names(self):
        """The name of each component in a ``--inputs`` file: ``NAME.PART``."""
        return tuple(f"{self.name}.{part}" for part in self.parts)

    def key(self, part):
        return self.keys[self.parts.index(part)]

    def splits_keys(self):
        """The keys of a ragged input's row splits, outermost first."""
        return self.keys[1:] if self.kind == "ragged" else ()


def composite_inputs(meta, signature=None):
    """The :class:`CompositeInput` arguments of ``signature`` of a TF2 MetaGraphDef,
    from the input signature of the function its wrapper calls (empty for a TF1
    model, or where no such call is found)."""
    from tensorflow.python.saved_model import nested_structure_coder

    tf = tensorflow()
    concrete = meta.object_graph_def.concrete_functions
    if not concrete:
        return ()
    signature = choose_signature(meta, signature, "")
    try:
        call, root, _ = signature_call(meta, signature, "")
    except ModelError:
        return ()
    functions = library_index(meta.graph_def.library)
    key_of = {split_input(info.name)[0]: key
              for key, info in meta.signature_def[signature].inputs.items()}
    arg_keys = {arg.name: key_of.get(split_input(source)[0])
                for arg, source in zip(functions[root].signature.input_arg, call.input)}
    for node in functions[root].node_def:
        inner = callee(node, functions)
        if inner is None or inner not in concrete or not concrete[inner].HasField(
                "canonicalized_input_signature"):
            continue
        try:
            leaves = tf.nest.flatten(nested_structure_coder.decode_proto(
                concrete[inner].canonicalized_input_signature))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a spec this TensorFlow cannot rebuild (an unregistered type)
        sources = [arg_keys.get(split_input(s)[0]) for s in node.input if not s.startswith("^")]
        found, position = [], 0
        for leaf in leaves:
            count = len(tf.nest.flatten(leaf, expand_composites=True)) \
                if isinstance(leaf, tf.TypeSpec) else 0
            composite = _composite(leaf, tuple(sources[position:position + count]))
            position += count
            if composite is not None:
                found.append(composite)
        if found:
            return tuple(found)
    return ()


def _composite(spec, keys):
    """The :class:`CompositeInput` of a ragged or sparse ``spec`` whose components are
    the signature inputs ``keys``, else None."""
    tf = tensorflow()
    if None in keys or spec.shape.rank is None:
        return None
    shape = tuple(spec.shape.as_list())
    if isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank > 0:
        return CompositeInput("ragged", keys, shape, spec.dtype.name, spec.ragged_rank,
                              spec.row_splits_dtype.name)
    if isinstance(spec, tf.SparseTensorSpec):
        return CompositeInput("sparse", keys, shape, spec.dtype.name)
    return None


def recorded_composites(records):
    """The :class:`CompositeInput` of each of ``records`` (plan.json's
    ``context.composite_inputs``: each one's fields, lists for tuples).

    >>> recorded_composites([{"kind": "ragged", "keys": ["t", "t_1"], "shape": [None, None],
    ...                       "dtype": "int64", "ragged_rank": 1}])[0].keys
    ('t', 't_1')
    """
    return tuple(CompositeInput(**{field: tuple(value) if isinstance(value, list) else value
                                   for field, value in record.items()})
                 for record in records or ())


def row_splits_keys(composites):
    """The inputs whose first dimension holds one more than the rows (row splits).

    >>> row_splits_keys([CompositeInput("ragged", ("t", "t_1"), (None, None), "int64", 1)])
    {'t_1'}
    """
    return {key for composite in composites for key in composite.splits_keys()}


def composite_value(composite, rows, rng, draw, first_length=None, length=None):
    """A valid value of ``composite`` with ``rows`` rows (see the module docstring), as
    arrays by component key; ``draw(key, shape)`` gives the values (an array of
    ``shape``) of the values component ``key``. ``first_length``: the values of the
    first row at every ragged level, the entries of a sparse input's first row (at
    most its cells), instead of 1 to :data:`MAX_ROW_LENGTH`: 1 keeps the batch's
    longest row (the width a ``RaggedTensor.to_tensor`` pads to) without it, more than
    :data:`MAX_ROW_LENGTH` makes it the longest. ``length``: the same for every row (1:
    the shapes the flattened signature has, one value per row).

    >>> features = CompositeInput("sparse", ("f", "f_1", "f_2"), (None, 10), "float32")
    >>> value = composite_value(features, 2, np.random.default_rng(1),
    ...                         lambda key, shape: np.ones(shape, np.float32))
    >>> value["f"].tolist(), value["f_2"].tolist()
    ([[0, 4], [0, 7], [1, 1]], [2, 10])
    """
    rows = composite.shape[0] if composite.shape[0] is not None else rows
    if composite.kind == "sparse":
        return _sparse_value(composite, rows, rng, draw, first_length, length)
    splits, count, first = [], rows, min(rows, 1)  # ``first``: the first row's rows
    for level in range(1, composite.ragged_rank + 1):
        fixed = composite.shape[level] if composite.shape[level] is not None else length
        lengths = np.full(count, fixed) if fixed is not None else \
            rng.integers(1, MAX_ROW_LENGTH + 1, size=count)
        if fixed is None and first_length is not None:
            lengths[:first] = first_length
        first = int(np.sum(lengths[:first]))
        splits.append(np.concatenate([[0], np.cumsum(lengths)]).astype(
            composite.row_splits_dtype))
        count = int(splits[-1][-1])
    inner = [UNKNOWN_DIM if d is None else d for d in composite.shape[composite.ragged_rank + 1:]]
    values = np.asarray(draw(composite.keys[0], [count, *inner]))
    return dict(zip(composite.keys, [values, *splits]))


def _sparse_value(composite, rows, rng, draw, first_length, length):
    cells = [UNKNOWN_DIM if d is None else d for d in composite.shape[1:]]
    per_row = int(np.prod(cells))
    indices = []
    for row in range(rows):
        count = min(length, per_row) if length is not None else \
            int(rng.integers(1, min(MAX_ROW_LENGTH, per_row) + 1)) if per_row else 0
        if row == 0 and first_length is not None:
            count = min(first_length, per_row)
        chosen = np.sort(rng.choice(per_row, size=count, replace=False))
        indices.extend((row, *position) for position in
                       zip(*np.unravel_index(chosen, cells)))
    indices = np.array(indices, dtype=np.int64).reshape(-1, len(composite.shape))
    values = np.asarray(draw(composite.keys[1], [len(indices)]))
    dense_shape = np.array([rows, *cells], dtype=np.int64)
    return dict(zip(composite.keys, [indices, values, dense_shape]))


def value_rows(composite, arrays):
    """How many rows the value ``arrays`` (by component key) of ``composite`` has."""
    if composite.kind == "sparse":
        return int(arrays[composite.keys[2]][0])
    return len(arrays[composite.keys[1]]) - 1


def take_rows(composite, arrays, rows):
    """The value made of rows ``rows`` (indices, in order, repeats allowed) of the
    value ``arrays`` of ``composite`` (by component key).

    >>> f = CompositeInput("sparse", ("f", "f_1", "f_2"), (None, 4), "float32")
    >>> value = {"f": np.array([[0, 1], [2, 0], [2, 3]]), "f_1": np.array([1., 2., 3.]),
    ...          "f_2": np.array([3, 4])}
    >>> {k: v.tolist() for k, v in take_rows(f, value, [2, 0]).items()}
    {'f': [[0, 0], [0, 3], [1, 1]], 'f_1': [2.0, 3.0, 1.0], 'f_2': [2, 4]}
    """
    rows = np.asarray(rows, dtype=np.int64)
    if composite.kind == "sparse":
        indices, values, dense_shape = (arrays[key] for key in composite.keys)
        picked = [np.flatnonzero(indices[:, 0] == row) for row in rows]
        entries = np.concatenate([np.zeros(0, np.int64), *picked])
        new_rows = np.repeat(np.arange(len(rows)), [len(p) for p in picked])
        taken = indices[entries].copy()
        taken[:, 0] = new_rows
        shape = np.array([len(rows), *dense_shape[1:]], dtype=dense_shape.dtype)
        return dict(zip(composite.keys, [taken, values[entries], shape]))
    values, *splits = (arrays[key] for key in composite.keys)
    taken = []
    for level in splits:
        starts, stops = level[rows], level[rows + 1]
        taken.append(np.concatenate([[0], np.cumsum(stops - starts)]).astype(level.dtype))
        rows = np.concatenate([np.zeros(0, np.int64)] + [np.arange(a, b) for a, b in
                                                          zip(starts, stops)])
    return dict(zip(composite.keys, [values[rows], *taken]))


def value_problem(composite, arrays):
    """What makes ``arrays`` (by component key) no value of ``composite`` (row splits
    that do not start at 0, decrease or end elsewhere than the next level's length;
    indices outside the dense shape), or None.

    >>> t = CompositeInput("ragged", ("t", "t_1"), (None, None), "int64", 1)
    >>> value_problem(t, {"t": np.arange(4), "t_1": np.array([0, 3, 5])})
    'its row splits end at 5, not at the 4 values'
    """
    if composite.kind == "sparse":
        indices, values, dense_shape = (arrays[key] for key in composite.keys)
        rank = len(composite.shape)
        if indices.ndim != 2 or indices.shape[1] != rank or dense_shape.shape != (rank,):
            return (f"its indices have shape {indices.shape} and its dense shape "
                    f"{dense_shape.shape}, not (entries, {rank}) and ({rank},)")
        if values.shape != (len(indices),):
            return f"it has {len(indices)} indices but values of shape {values.shape}"
        if len(indices) and (indices.min() < 0 or np.any(indices >= dense_shape)):
            return f"an index lies outside its dense shape {dense_shape.tolist()}"
        return None
    values, *splits = (arrays[key] for key in composite.keys)
    for level, level_splits in enumerate(splits):
        length = len(splits[level + 1]) - 1 if level + 1 < len(splits) else len(values)
        what = "values" if level + 1 == len(splits) else "rows of the next level"
        if level_splits.ndim != 1 or not len(level_splits) or level_splits[0] != 0:
            return "its row splits do not start at 0"
        if np.any(np.diff(level_splits) < 0):
            return "its row splits decrease"
        if level_splits[-1] != length:
            return f"its row splits end at {level_splits[-1]}, not at the {length} {what}"
    return None


def batch_rows(composites, inputs, keys):
    """The batch's rows (a scalar tensor) of a signature's ``inputs`` (key -> tensor):
    the first axis of the first of ``keys`` that is no component of ``composites``,
    else the rows of the first composite."""
    tf = tensorflow()
    parts = {key for composite in composites for key in composite.keys}
    plain = [key for key in keys if key not in parts]
    if plain or not composites:
        return tf.shape(inputs[(plain or list(keys))[0]])[0]
    composite = composites[0]
    if composite.kind == "sparse":
        return tf.cast(inputs[composite.keys[2]][0], tf.int32)
    return tf.shape(inputs[composite.keys[1]])[0] - 1


def tensor_rows(composites, inputs, start, stop):
    """Rows ``start`` to ``stop`` (scalar tensors) of each composite input, as its
    components' tensors by key (``inputs``: key -> tensor, every component's)."""
    tf = tensorflow()
    found = {}
    for composite in composites:
        parts = [inputs[key] for key in composite.keys]
        if composite.kind == "ragged":
            ragged = tf.RaggedTensor.from_nested_row_splits(
                parts[0], parts[1:], validate=False)[start:stop]
            found.update(zip(composite.keys, [ragged.flat_values,
                                              *ragged.nested_row_splits]))
            continue
        indices, values, dense_shape = parts
        low, high = tf.cast(start, tf.int64), tf.cast(stop, tf.int64)
        kept = tf.logical_and(indices[:, 0] >= low, indices[:, 0] < high)
        offset = tf.concat([[low], tf.zeros_like(dense_shape[1:])], 0)
        found.update(zip(composite.keys, [
            tf.boolean_mask(indices, kept) - offset, tf.boolean_mask(values, kept),
            tf.concat([[high - low], dense_shape[1:]], 0)]))
    return found


__all__ = ["CompositeInput", "MAX_ROW_LENGTH", "batch_rows", "composite_inputs",
           "composite_value", "recorded_composites", "row_splits_keys", "take_rows",
           "tensor_rows", "value_problem", "value_rows"]
