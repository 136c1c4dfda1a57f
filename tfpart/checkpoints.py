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
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rewriters.captures import object_paths, reading_checkpoint, variables_prefix
from tfpart.core.errors import ModelError, TfpartError
from tfpart.core.output_folders import TEMPORARY_TAG, os_errors
from tfpart.core.plan import Plan
from tfpart.core.row_shards import first_rows, shard_name, shard_of

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE = "VARIABLE_VALUE"


def checkpoint_to_original(checkpoint, compiled_dir, original_dir, prefix):
    """Write ``checkpoint`` (the compiled model's: its SavedModel's ``variables/variables``,
    or one written with ``tf.train.Checkpoint(loaded_compiled)``) as a checkpoint of
    ``original_dir`` at ``prefix`` (see the module docstring); returns how many
    variables came from it."""
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
    _write(prefix, values)
    return moved


def checkpoint_to_compiled(checkpoint, compiled_dir, original_dir, prefix):
    """Write ``checkpoint`` (the original's: its SavedModel's ``variables/variables``, or
    one written with ``tf.train.Checkpoint(loaded_original)`` or by
    :func:`checkpoint_to_original`)
    as a checkpoint of ``compiled_dir`` at ``prefix`` (see the module docstring);
    returns how many variables came from it."""
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
    _write(prefix, values)
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
    ModelError naming it if it cannot be read."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    with reading_checkpoint(prefix) as reader:
        values = {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}
    if OBJECT_GRAPH_KEY not in values:
        raise ModelError(prefix, "is not an object-based checkpoint (it has no object graph)")
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(values[OBJECT_GRAPH_KEY])
    values[OBJECT_GRAPH_KEY] = graph
    return values


def _check_shapes(values, target, prefix):
    for key, value in values.items():
        if key != OBJECT_GRAPH_KEY and getattr(value, "shape", None) != \
                getattr(target[key], "shape", None):
            raise TfpartError(prefix, f"{key}: shape {value.shape} where the model holds "
                              f"{target[key].shape}")


def _write(prefix, values):
    """Write ``values`` (the object graph among them) as the checkpoint ``prefix``: into
    temporary files beside it, renamed into place once whole (the index last, so a
    reader never finds an index without its data); a file system's refusal is a
    one-line OutputError. An existing checkpoint is refused."""
    import os

    import tensorflow as tf

    prefix = Path(prefix)
    if any(prefix.parent.glob(f"{prefix.name}.index")) or \
            any(prefix.parent.glob(f"{prefix.name}.data-*")):
        raise TfpartError(prefix, "a checkpoint exists there; give another prefix")
    staging = prefix.with_name(f".{prefix.name}{TEMPORARY_TAG}{os.getpid()}-")
    keys = sorted(values)
    with os_errors(prefix, also=(tf.errors.OpError,)):
        prefix.parent.mkdir(parents=True, exist_ok=True)
        tensors = [tf.constant(values[key].SerializeToString()) if key == OBJECT_GRAPH_KEY
                   else tf.constant(values[key]) for key in keys]
        try:
            tf.raw_ops.SaveV2(prefix=str(staging), tensor_names=keys,
                              shape_and_slices=[""] * len(keys), tensors=tensors)
            data = sorted(prefix.parent.glob(f"{staging.name}.data-*"))
            for path in [*data, staging.with_name(f"{staging.name}.index")]:
                os.replace(path, prefix.with_name(prefix.name + path.name[len(staging.name):]))
        finally:
            for path in prefix.parent.glob(f"{staging.name}*"):
                path.unlink()


__all__ = ["checkpoint_to_compiled", "checkpoint_to_original"]
