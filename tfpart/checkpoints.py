"""Checkpoints between an original SavedModel and the model tfpart compiled from it, both
ways (issue 39).

A compiled model that is the original proto with devices written in (an op placement)
has the original's variables under the original's keys: its checkpoints are the
original's. A model the pipeline pass rebuilt (stages, replicas, filter splits, row
shards) holds each variable the signature reads under ``variables_by_op/<op>`` (and a
replica's copy under ``replica_variables/<r>/<op>``), and a table cut into row shards
as one variable per shard (:mod:`tfpart.core.row_shards`). The mapping between the two
is by the variable's op in the flattened signature (``variables/<node id>/<name>``:
node ``<node id>`` of the original's object graph), and for a shard by the rows it
holds: shard ``i`` of a table holds its rows ``first[i]`` to ``first[i] + sizes[i] - 1``
(plan.json's ``row_shards``).

* :func:`checkpoint_to_original` writes the compiled model's variables as a checkpoint
  of the original: the original's object graph and keys, each table whole (its shards
  concatenated in order), and the original's own values for what the compiled model
  does not hold (the second, unread copy of a Keras export's variables). The original
  reads it with ``tf.train.Checkpoint(tf.saved_model.load(original)).read(prefix)``, or
  loads it as the ``variables/variables`` of a copy of its folder.
* :func:`checkpoint_to_compiled` writes a checkpoint of the original (the original's
  ``variables/variables``, or one the original wrote as above) as a checkpoint of the
  compiled model, each shard its rows: ``tf.train.Checkpoint(tf.saved_model.load(
  compiled)).read(prefix)`` restores it.

Both write every key of the target's own checkpoint (its object graph included), so a
restore matches every variable and nothing is left over.

Writing ``-o PREFIX`` follows the output rule of :mod:`tfpart.core.output_files` for a
checkpoint's several files, ``PREFIX.index`` and ``PREFIX.data-NNNNN-of-NNNNN``
(:func:`check_checkpoint_output`): where none exists, the checkpoint is created; where
one does, it is replaced only with ``--force``, and only if those files are a
checkpoint (an index in TensorFlow's table format, shards named as TensorFlow names
them); a link, a folder or any other file there is refused. A checkpoint carries no
mark of tfpart's, unlike the other outputs: a key more would be left over in every
restore that checks all were used, so ``--force`` is needed to replace even one tfpart
wrote. The files are written under a temporary prefix beside ``PREFIX`` and renamed
into place, the index last; an old checkpoint's index is removed first, so a reader
finds the old checkpoint, none, or the new one, never an index with another's data.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from rewriters.captures import object_paths, variables_prefix
from tfpart.core.errors import ModelError, OutputError, TfpartError, first_line
from tfpart.core.input_files import check_regular_file
from tfpart.core.output_folders import TEMPORARY_TAG, os_errors
from tfpart.core.plan import Plan
from tfpart.core.row_shards import first_rows, shard_name, shard_of

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE = "VARIABLE_VALUE"
DATA_SHARD = re.compile(r"\.data-\d{5}-of-\d{5}")  # after the prefix, as TensorFlow names it
# the last 8 bytes of a TensorFlow table (a checkpoint's index): kTableMagicNumber
TABLE_MAGIC = (0xdb4775248b80fb57).to_bytes(8, "little")


def checkpoint_to_original(checkpoint, compiled_dir, original_dir, prefix, force=False):
    """Write ``checkpoint`` (the compiled model's: its SavedModel's ``variables/variables``,
    or one written with ``tf.train.Checkpoint(loaded_compiled)``) as a checkpoint of
    ``original_dir`` at ``prefix`` (see the module docstring; ``force``: replace a
    checkpoint there); returns how many variables came from it."""
    plan = Plan.load(Path(compiled_dir) / "plan.json")
    source = _read(checkpoint)
    original = _read(variables_prefix(original_dir))
    values, moved = dict(original), 0
    for table, keys in _compiled_keys(source[OBJECT_GRAPH_KEY], plan, checkpoint).items():
        key = _original_key(original[OBJECT_GRAPH_KEY], table, original_dir)
        shards = _shards_of(table, plan)
        if shards:
            values[key] = np.concatenate([source[keys[shard]] for shard in shards])
        else:
            values[key] = source[keys[table]]
        moved += 1
    _check_shapes(values, original, prefix)
    _write(prefix, values, force)
    return moved


def checkpoint_to_compiled(checkpoint, compiled_dir, original_dir, prefix, force=False):
    """Write ``checkpoint`` (the original's: its SavedModel's ``variables/variables``, or
    one written with ``tf.train.Checkpoint(loaded_original)`` or by
    :func:`checkpoint_to_original`)
    as a checkpoint of ``compiled_dir`` at ``prefix`` (see the module docstring;
    ``force``: replace a checkpoint there); returns how many variables came from it."""
    plan = Plan.load(Path(compiled_dir) / "plan.json")
    compiled = _read(variables_prefix(compiled_dir))
    source = _read(checkpoint)
    saved = _read(variables_prefix(original_dir))[OBJECT_GRAPH_KEY]
    paths = object_paths(saved)  # the same variable is found in ``checkpoint`` by its path
    values, moved = dict(compiled), 0
    for table, keys in _compiled_keys(compiled[OBJECT_GRAPH_KEY], plan, compiled_dir).items():
        path = paths.get(_node_of(table, saved, original_dir))
        key = _key_at(source[OBJECT_GRAPH_KEY], path.split(".")[1:]) if path else None
        if key is None:
            raise ModelError(checkpoint, f"has no value for variable {table}")
        shards = _shards_of(table, plan)
        if shards:
            sizes = plan.row_shards[table].sizes
            for shard, first, rows in zip(shards, first_rows(sizes), sizes):
                values[keys[shard]] = source[key][first:first + rows]
        else:
            values[keys[table]] = source[key]
        moved += 1
    _check_shapes(values, compiled, prefix)
    _write(prefix, values, force)
    return moved


def _shards_of(table, plan):
    """The shard op names of ``table`` in order, or [] if it is whole."""
    shards = (plan.row_shards or {}).get(table)
    return [shard_name(table, i) for i in range(len(shards.sizes))] if shards else []


def _compiled_keys(object_graph, plan, path):
    """Original variable op -> {compiled variable op: checkpoint key} for the variables a
    rebuilt model holds by op (``variables_by_op``; a shard under its table).

    Raises
    ------
    TfpartError
        If the compiled model keeps the original's own keys (nothing to move) or holds
        a copy of its variables per replica."""
    nodes = object_graph.nodes
    root = {child.local_name: child.node_id for child in nodes[0].children}
    if "variables_by_op" not in root:
        raise TfpartError(path, "holds the original's variables under their own keys: its "
                          "checkpoints are the original's")
    if "replica_variables" in root:
        raise TfpartError(path, "holds a copy of its variables per replica; moving "
                          "checkpoints is built for one copy")
    mapped = {}
    for child in nodes[root["variables_by_op"]].children:
        found = shard_of(child.local_name)
        table = found[0] if found and found[0] in (plan.row_shards or {}) \
            else child.local_name
        mapped.setdefault(table, {})[child.local_name] = _value_key(nodes[child.node_id])
    return mapped


def _original_key(object_graph, op, model_dir):
    """The checkpoint key, in ``object_graph`` (the original SavedModel's), of the
    variable whose flat op is ``op``."""
    return _value_key(object_graph.nodes[_node_of(op, object_graph, model_dir)])


def _node_of(op, object_graph, model_dir):
    """The object-graph node of the variable whose flat op is ``op``
    (``variables/<node id>/<name>``)."""
    parts = op.split("/")
    if len(parts) < 2 or parts[0] != "variables" or not parts[1].isdigit() or \
            int(parts[1]) >= len(object_graph.nodes) or \
            _value_key(object_graph.nodes[int(parts[1])]) is None:
        raise ModelError(model_dir, f"variable op {op} names no variable of the model")
    return int(parts[1])


def _key_at(object_graph, path):
    """The checkpoint key of the variable at ``path`` in ``object_graph``, or None."""
    node = 0
    for name in path:
        node = next((c.node_id for c in object_graph.nodes[node].children
                     if c.local_name == name), None)
        if node is None:
            return None
    return _value_key(object_graph.nodes[node])


def _value_key(node):
    return next((a.checkpoint_key for a in node.attributes if a.name == VALUE), None)


def _read(prefix):
    """Every tensor of the checkpoint at ``prefix``, by key (the object graph parsed);
    ModelError naming the file at fault if it cannot be read (:func:`checkpoint_values`)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    values = dict(checkpoint_values(prefix))
    if OBJECT_GRAPH_KEY not in values:
        raise ModelError(prefix, "is not an object-based checkpoint (it has no object graph)")
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    try:
        graph.ParseFromString(values[OBJECT_GRAPH_KEY])
    except DecodeError:
        raise ModelError(prefix, "its object graph cannot be parsed") from None
    values[OBJECT_GRAPH_KEY] = graph
    return values


def check_checkpoint_input(prefix):
    """ModelError unless every value of the checkpoint at ``prefix`` can be read: a
    missing, truncated or corrupt file of it is named, with what is wrong, before a
    restore or a run meets it (where TensorFlow's error names no file, or is taken for
    a fault of the cluster the run is on). Reads each value once and keeps none."""
    for _ in checkpoint_values(prefix):
        pass


def check_saved_model_variables(model_dir):
    """:func:`check_checkpoint_input` of the SavedModel ``model_dir``'s variables, when
    it has any (a model without variables has no checkpoint)."""
    prefix = variables_prefix(model_dir)
    if checkpoint_files(prefix):
        check_checkpoint_input(prefix)


def checkpoint_values(prefix):
    """``(key, value)`` of every value of the checkpoint at ``prefix`` (or the latest
    checkpoint of a folder a ``tf.train.CheckpointManager`` writes), read one at a time.

    Raises
    ------
    ModelError
        Naming the file at fault: the index when it is missing or TensorFlow cannot
        read it, the data file when it is missing, ends before a value its index lists
        (truncated) or holds a value whose checksum does not match (corrupt)."""
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    prefix = _checkpoint_prefix(tf, prefix)
    index = Path(f"{prefix}.index")
    if not index.is_file():
        raise ModelError(index, f"no such file (no checkpoint has the prefix {prefix})")
    for path in checkpoint_files(prefix):  # a FIFO would block TensorFlow's reader
        check_regular_file(path, ModelError, max_bytes=math.inf)
    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except (ValueError, IndexError, tf.errors.OpError) as exc:
        raise ModelError(index, "cannot read the variables: not a checkpoint index "
                         f"TensorFlow can read, or corrupt ({_cause(exc)})") from None
    data = [path for path in checkpoint_files(prefix) if path != index]
    keys = sorted(reader.get_variable_to_shape_map())
    if keys and not data:
        raise ModelError(f"{prefix}.data-*", "cannot read the variables: no data file "
                         f"({index.name} lists values in one)")
    for key in keys:
        try:
            value = reader.get_tensor(key)
        except (ValueError, IndexError, tf.errors.OpError) as exc:
            at_fault = data[0] if len(data) == 1 else f"{prefix}.data-*"
            raise ModelError(at_fault, "cannot read the variables: "
                             f"{_value_problem(key, exc, index.name)}") from None
        yield key, value


def _checkpoint_prefix(tf, prefix):
    """``prefix``, or the latest checkpoint of the folder ``prefix`` names."""
    if not Path(prefix).is_dir():
        return Path(prefix)
    latest = tf.train.latest_checkpoint(str(prefix))
    if latest is None:
        raise ModelError(prefix, "is a folder with no checkpoint named in it; give a "
                         "checkpoint's prefix (a SavedModel's is DIR/variables/variables)")
    return Path(latest)


def _value_problem(key, exc, index_name):
    """What reading the value ``key`` of a checkpoint's data file raising ``exc`` says
    of that file.

    >>> _value_problem("w", IndexError("Read less bytes than requested"), "c.index")
    'the file is truncated (it ends before the value of w that c.index lists)'
    >>> _value_problem("w", ValueError("TensorBundle at c shard 0 (64 bytes): Checksum "
    ...                "does not match: stored 1 vs. calculated on the restored bytes 2"),
    ...                "c.index")
    'value w: Checksum does not match: stored 1 vs. calculated on the restored bytes 2'
    """
    if isinstance(exc, IndexError):  # TensorFlow's OUT_OF_RANGE: the file ended early
        return (f"the file is truncated (it ends before the value of {key} that "
                f"{index_name} lists)")
    return f"value {key}: {_cause(exc)}"


def _cause(exc):
    """TensorFlow's reason in the error ``exc``, without the file and context it names
    first.

    >>> _cause(ValueError("Unable to read file (/a/c.index). Perhaps the file is corrupt "
    ...                   "(failed to seek to header entry): block checksum mismatch"))
    'block checksum mismatch'
    >>> _cause(ValueError("not an sstable (bad magic number)"))
    'not an sstable (bad magic number)'
    """
    text = (str(exc).strip().splitlines() or [""])[0]
    return first_line(text.partition("): ")[2] or text or type(exc).__name__)


def _check_shapes(values, target, prefix):
    for key, value in values.items():
        if key != OBJECT_GRAPH_KEY and getattr(value, "shape", None) != \
                getattr(target[key], "shape", None):
            raise TfpartError(prefix, f"{key}: shape {value.shape} where the model holds "
                              f"{target[key].shape}")


def checkpoint_files(prefix):
    """The files of the checkpoint at ``prefix`` that exist: its index, then its data
    shards (other files beside it are not its, whatever their names).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> for name in ("ckpt.index", "ckpt.data-00000-of-00001", "ckpt.data-notes.txt"):
    ...     _ = (folder / name).write_text("")
    >>> [path.name for path in checkpoint_files(folder / "ckpt")]
    ['ckpt.index', 'ckpt.data-00000-of-00001']
    """
    prefix = Path(prefix)
    index = prefix.with_name(prefix.name + ".index")
    try:
        names = os.listdir(prefix.absolute().parent)
    except OSError:  # no folder there (yet): no file; writing will say why it cannot
        names = []
    data = sorted(prefix.with_name(name) for name in names if name.startswith(prefix.name)
                  and DATA_SHARD.fullmatch(name[len(prefix.name):]))
    return ([index] if os.path.lexists(index) else []) + data


def checkpoint_problem(prefix, force=False):
    """Why a checkpoint may not be written at ``prefix`` (None: it may); see the module
    docstring."""
    files = checkpoint_files(prefix)
    for path in files:
        if path.is_symlink() or not path.is_file():
            return f"{path.name} is a link, a folder or a device, not a checkpoint's file"
    if not files:
        return None
    if not force:
        return (f"a checkpoint exists there ({files[0].name}): give --force to replace "
                "it, or another prefix")
    index = Path(f"{prefix}.index")
    if files[0] != index:
        return (f"{files[0].name} is there without {index.name}: not a checkpoint tfpart "
                "replaces (remove it yourself or choose another prefix)")
    try:
        with open(index, "rb") as file:
            file.seek(max(0, os.fstat(file.fileno()).st_size - len(TABLE_MAGIC)))
            checkpoint = file.read() == TABLE_MAGIC
    except OSError as exc:
        return f"{index.name} cannot be read: {exc.strerror}"
    if not checkpoint:
        return (f"{index.name} is not a checkpoint's index: tfpart replaces only a "
                "checkpoint (remove it yourself or choose another prefix)")
    return None


def check_checkpoint_output(prefix, force=False):
    """OutputError unless a checkpoint may be written at ``prefix``
    (:func:`checkpoint_problem`). Checked before any work."""
    problem = checkpoint_problem(prefix, force)
    if problem:
        raise OutputError(prefix, problem)


def _write(prefix, values, force=False):
    """Write ``values`` (the object graph among them) as the checkpoint ``prefix``: into
    temporary files beside it, renamed into place once whole, an old checkpoint's index
    removed first and the new index last (see the module docstring); a file system's
    refusal is a one-line OutputError."""
    import tensorflow as tf

    prefix = Path(prefix)
    check_checkpoint_output(prefix, force)
    staging = prefix.with_name(f".{prefix.name}{TEMPORARY_TAG}{os.getpid()}-")
    keys = sorted(values)
    with os_errors(prefix, also=(tf.errors.OpError,)):
        prefix.parent.mkdir(parents=True, exist_ok=True)
        tensors = [tf.constant(values[key].SerializeToString()) if key == OBJECT_GRAPH_KEY
                   else tf.constant(values[key]) for key in keys]
        try:
            tf.raw_ops.SaveV2(prefix=str(staging), tensor_names=keys,
                              shape_and_slices=[""] * len(keys), tensors=tensors)
            check_checkpoint_output(prefix, force)  # written meanwhile: judged again
            old = checkpoint_files(prefix)
            if old:
                old[0].unlink()  # the index: from now on no reader takes the old as whole
            data = sorted(prefix.parent.glob(f"{staging.name}.data-*"))
            new = [prefix.with_name(prefix.name + path.name[len(staging.name):])
                   for path in [*data, staging.with_name(f"{staging.name}.index")]]
            for path, target in zip([*data, staging.with_name(f"{staging.name}.index")], new):
                os.replace(path, target)
            for path in set(old) - set(new):  # shards of an old checkpoint cut otherwise
                path.unlink(missing_ok=True)
        finally:
            for path in prefix.parent.glob(f"{staging.name}*"):
                path.unlink()


__all__ = ["check_checkpoint_output", "checkpoint_to_compiled", "checkpoint_to_original"]
