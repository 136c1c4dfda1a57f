"""Inputs a user gives for a signature (``--inputs data.npz``), where random ones cannot
be valid (ids into a table a spec does not name, a sparse input whose dense shape the
model checks).

The file is what ``numpy.savez`` writes: one array per signature input, named by its
key; a ragged input ``NAME`` as ``NAME.values`` (its flat values) and
``NAME.row_splits`` (``NAME.row_splits_1``, … for each further ragged dimension), a
sparse one as ``NAME.indices``, ``NAME.values`` and ``NAME.dense_shape``
(:attr:`rewriters.composite_inputs.CompositeInput.file_names`). Every input's first
dimension, where the signature leaves it open, is the batch: every input holds the same
rows. Strings are numpy strings (``str`` or ``bytes`` arrays; an array of Python
objects needs pickle, which is never loaded). :func:`given_rows` cuts a batch of any
size from them, taking the rows in turn.

Examples
--------
>>> import numpy as np, os, tempfile
>>> from tensorflow.core.protobuf import meta_graph_pb2
>>> meta = meta_graph_pb2.MetaGraphDef()
>>> x = meta.signature_def["serving_default"].inputs["x"]
>>> x.name, x.dtype = "serving_default_x:0", 1  # float32
>>> for size in (-1, 4):
...     x.tensor_shape.dim.add().size = size
>>> path = os.path.join(tempfile.mkdtemp(), "data.npz")
>>> np.savez(path, x=np.arange(12.0).reshape(3, 4))
>>> given = read_given_inputs(path, meta)
>>> given.rows, given_rows(given, [2, 0])["x"][:, 0].tolist()
(3, [8.0, 0.0])
>>> np.savez(path, x=np.zeros((3, 5)))
>>> read_given_inputs(path, meta)
Traceback (most recent call last):
...
tfpart.core.errors.TfpartError: ...data.npz: input 'x' has shape (3, 5); signature 'serving_default' takes (None, 4)
"""
from __future__ import annotations

import zipfile
from collections import Counter
from dataclasses import dataclass

import numpy as np

from rewriters.composite_inputs import composite_inputs, take_rows, value_problem, value_rows
from rewriters.flat_signature import choose_signature
from tfpart.core.errors import TfpartError
from tfpart.core.input_files import check_regular_file

MAX_INPUT_FILE_BYTES = 2**34  # 16 GiB: batches of inputs, not a model


@dataclass(frozen=True)
class GivenInputs:
    """Arrays by signature input key (a composite input's by its components' keys),
    each of ``rows`` rows along its first axis where the signature leaves it open
    (``batched``: those keys)."""

    arrays: dict
    rows: int
    batched: frozenset
    composites: tuple
    source: str = ""


def signature_specs(meta, signature):
    """``{key: (shape with None where open, dtype name)}`` of a signature's inputs."""
    from tensorflow.python.framework import dtypes

    return {key: (tuple(d.size if d.size >= 0 else None for d in info.tensor_shape.dim),
                  dtypes.as_dtype(info.dtype).name)
            for key, info in meta.signature_def[signature].inputs.items()}


def read_given_inputs(path, meta, signature=None, composites=None):
    """The :class:`GivenInputs` in the ``.npz`` file ``path`` for ``signature`` (default
    ``serving_default``) of the MetaGraphDef ``meta``, whose ragged and sparse inputs are
    ``composites`` (default: as ``meta`` says,
    :func:`rewriters.composite_inputs.composite_inputs`; a model the pipeline pass
    rebuilt takes their components as plain tensors, and plan.json records them).

    Raises
    ------
    tfpart.core.errors.TfpartError
        Naming ``path``: missing, not an ``.npz`` file, an input missing or of another
        shape or dtype than the signature's, an array that is no input, a ragged or
        sparse input that is no valid value, inputs of different batch sizes.
    """
    signature = choose_signature(meta, signature, path)
    specs = signature_specs(meta, signature)
    if composites is None:
        composites = composite_inputs(meta, signature)
    arrays = read_npz(path)
    names = {}  # name in the file -> signature key
    for composite in composites:
        names.update(zip(composite.file_names, composite.keys))
    parts = set(names.values())
    names.update({key: key for key in specs if key not in parts})
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        raise TfpartError(path, f"holds {unknown[0]!r}, which is no input of signature "
                          f"{signature!r} (its inputs: {', '.join(sorted(names))})")
    missing = [name for name in sorted(names) if name not in arrays]
    if missing:
        raise TfpartError(path, f"lacks input {missing[0]!r} of signature {signature!r}")
    values = {names[name]: _converted(path, name, array, specs[names[name]][1])
              for name, array in arrays.items()}
    rows = {}  # name -> its rows
    for composite in composites:
        problem = value_problem(composite, values) or _shape_problem(composite, values)
        if problem:
            raise TfpartError(path, f"{composite.kind} input {composite.name!r}: {problem}")
        if composite.shape[0] is None:
            rows[composite.name] = value_rows(composite, values)
    for name, key in names.items():
        if key in parts:
            continue
        shape = specs[key][0]
        if values[key].ndim != len(shape) or any(
                d is not None and d != have for d, have in zip(shape, values[key].shape)):
            raise TfpartError(path, f"input {name!r} has shape {values[key].shape}; signature "
                              f"{signature!r} takes {_shape_text(shape)}")
        if shape and shape[0] is None:
            rows[name] = values[key].shape[0]
    if len(set(rows.values())) > 1:  # name one input of other rows than most
        usual = Counter(rows.values()).most_common(1)[0][0]
        name = next(n for n, r in sorted(rows.items()) if r != usual)
        first = next(n for n, r in sorted(rows.items()) if r == usual)
        raise TfpartError(path, f"input {name!r} holds {rows[name]} rows but {first!r} "
                          f"holds {usual}: every input holds one batch")
    if rows and not next(iter(rows.values())):
        raise TfpartError(path, "holds no rows (a batch of at least one sample is needed)")
    batched = frozenset(key for key in specs if key not in parts and specs[key][0]
                        and specs[key][0][0] is None)
    return GivenInputs(values, next(iter(rows.values()), 1), batched, composites, str(path))


def given_rows(given, rows):
    """The inputs made of rows ``rows`` (indices into ``given.rows``, repeats allowed)
    of each batched input of ``given``, by key; inputs without a batch dimension as
    they are."""
    found = {key: value[np.asarray(rows, dtype=np.int64)] if key in given.batched else value
             for key, value in given.arrays.items()}
    for composite in given.composites:
        found.update(take_rows(composite, given.arrays, rows) if composite.shape[0] is None
                     else {key: given.arrays[key] for key in composite.keys})
    return found


def cycled(given, size, start=0):
    """``size`` row indices into ``given``, from ``start`` on and round again.

    >>> cycled(GivenInputs({}, 3, frozenset(), ()), 5, start=2)
    [2, 0, 1, 2, 0]
    """
    return [(start + i) % given.rows for i in range(size)]


def read_npz(path):
    """The arrays of the ``.npz`` file ``path`` by name: a regular file of at most
    :data:`MAX_INPUT_FILE_BYTES`, packed or unpacked, no pickled objects; TfpartError
    naming the file otherwise."""
    check_regular_file(path, TfpartError, MAX_INPUT_FILE_BYTES)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        archive = None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise TfpartError(path, "not an .npz file (one array per input, as numpy.savez "
                          "writes)")
    unpacked = sum(info.file_size for info in archive.zip.infolist())
    if unpacked > MAX_INPUT_FILE_BYTES:  # a compressed file may unpack to far more
        archive.close()
        raise TfpartError(path, f"its arrays unpack to {unpacked:,} bytes, more than "
                          f"{MAX_INPUT_FILE_BYTES:,}")
    arrays = {}
    with archive:
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except ValueError:
                raise TfpartError(path, f"array {name!r} holds Python objects, which need "
                                  "pickle; save strings as a str or bytes array") from None
            except (OSError, EOFError, zipfile.BadZipFile):
                raise TfpartError(path, f"array {name!r} cannot be read (a damaged "
                                  ".npz file)") from None
    return arrays


def _converted(path, name, array, dtype):
    """``array`` as the input ``name`` of ``dtype`` takes it (strings as bytes objects),
    or an error if its values are of another kind."""
    kind = array.dtype.kind
    if dtype == "string" and kind in "SU":
        return (np.char.encode(array, "utf-8") if kind == "U" else array).astype(object)
    if dtype == "bool" and kind == "b":
        return array
    if dtype.startswith(("int", "uint")) and kind in "iu":
        return array.astype(dtype)
    if dtype.startswith(("float", "bfloat", "half")) and kind in "fiu":
        return array.astype(np.float32 if dtype == "bfloat16" else dtype)
    raise TfpartError(path, f"input {name!r} holds {array.dtype} values; the signature takes "
                      f"{dtype}")


def _shape_problem(composite, values):
    """What makes a valid value's shape other than ``composite``'s, or None."""
    if composite.kind == "sparse":
        dense_shape = values[composite.keys[2]]
        known = [(d, have) for d, have in zip(composite.shape, dense_shape.tolist())
                 if d is not None]
        if any(d != have for d, have in known):
            return (f"its dense shape is {dense_shape.tolist()}; the signature takes "
                    f"{_shape_text(composite.shape)}")
        return None
    inner = composite.shape[composite.ragged_rank + 1:]
    have = values[composite.keys[0]].shape
    if len(have) != len(inner) + 1 or any(d is not None and d != h
                                          for d, h in zip(inner, have[1:])):
        return (f"its values have shape {have}; the signature takes values of shape "
                f"{_shape_text((None, *inner))}")
    return None


def _shape_text(shape):
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


__all__ = ["GivenInputs", "cycled", "given_rows", "read_given_inputs", "signature_specs"]
