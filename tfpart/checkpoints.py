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

* :func:`to_original` writes the compiled model's variables as a checkpoint of the
  original: the original's object graph and keys, each table whole (its shards
  concatenated in order), and the original's own values for what the compiled model
  does not hold (the second, unread copy of a Keras export's variables). The original
  reads it with ``tf.train.Checkpoint(tf.saved_model.load(original)).read(prefix)``, or
  loads it as the ``variables/variables`` of a copy of its folder.
* :func:`to_compiled` writes a checkpoint of the original (the original's
  ``variables/variables``, or one the original wrote as above) as a checkpoint of the
  compiled model, each shard its rows: ``tf.train.Checkpoint(tf.saved_model.load(
  compiled)).read(prefix)`` restores it.

Both write every key of the target's own checkpoint (its object graph included), so a
restore matches every variable and nothing is left over.
"""
from __future__ import annotations

from pathlib import Path

from tfpart.core.errors import ModelError, TfpartError
from tfpart.core.plan import Plan
from tfpart.core.row_shards import first_rows, shard_name, shard_of

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE = "VARIABLE_VALUE"


def variables_prefix(model_dir):
    """The checkpoint prefix of a SavedModel's variables."""
    return str(Path(model_dir) / "variables" / "variables")


def to_original(compiled_dir, original_dir, prefix):
    """Write ``compiled_dir``'s variables as a checkpoint of ``original_dir`` at
    ``prefix`` (see the module docstring); returns how many values came from the
    compiled model."""
    plan = Plan.load(Path(compiled_dir) / "plan.json")
    compiled = _read(variables_prefix(compiled_dir))
    original = _read(variables_prefix(original_dir))
    values = dict(original)
    moved = 0
    for op, compiled_keys in _compiled_keys(compiled[OBJECT_GRAPH_KEY], plan).items():
        key = _original_key(original[OBJECT_GRAPH_KEY], op, original_dir)
        shards = _shards_of(op, plan)
        if shards:
            import numpy as np

            values[key] = np.concatenate([compiled[compiled_keys[shard]] for shard in shards])
        else:
            values[key] = compiled[compiled_keys[op]]
        moved += 1
    _check_shapes(values, original, prefix)
    _write(prefix, values)
    return moved


def to_compiled(checkpoint, compiled_dir, original_dir, prefix):
    """Write ``checkpoint`` (keyed as ``original_dir``'s variables) as a checkpoint of
    ``compiled_dir`` at ``prefix`` (see the module docstring); returns how many values
    came from it."""
    plan = Plan.load(Path(compiled_dir) / "plan.json")
    compiled = _read(variables_prefix(compiled_dir))
    source = _read(checkpoint)
    original_graph = _read(variables_prefix(original_dir))[OBJECT_GRAPH_KEY]
    values = dict(compiled)
    moved = 0
    for op, compiled_keys in _compiled_keys(compiled[OBJECT_GRAPH_KEY], plan).items():
        key = _original_key(original_graph, op, original_dir)
        if key not in source:
            raise ModelError(checkpoint, f"has no value for variable {op} (key {key})")
        shards = _shards_of(op, plan)
        if shards:
            sizes = plan.row_shards[op].sizes
            for shard, first, rows in zip(shards, first_rows(sizes), sizes):
                values[compiled_keys[shard]] = source[key][first:first + rows]
        else:
            values[compiled_keys[op]] = source[key]
        moved += 1
    _check_shapes(values, compiled, prefix)
    _write(prefix, values)
    return moved


def _shards_of(table, plan):
    """The shard op names of ``table`` in order, or [] if it is whole."""
    shards = (plan.row_shards or {}).get(table)
    return [shard_name(table, i) for i in range(len(shards.sizes))] if shards else []


def _compiled_keys(object_graph, plan):
    """Original variable op -> {compiled variable op: checkpoint key} for the variables a
    rebuilt model holds by op (``variables_by_op``; a shard under its table); empty for
    a model with the original's own keys. Replicas' copies are not mapped: they start
    from the same values (refused when there are any)."""
    nodes = object_graph.nodes
    root = {child.local_name: child.node_id for child in nodes[0].children}
    if "variables_by_op" not in root:
        return {}
    if "replica_variables" in root:
        raise TfpartError("", "the compiled model holds a copy of its variables per replica; "
                          "moving checkpoints is built for one copy")
    mapped = {}
    for child in nodes[root["variables_by_op"]].children:
        key = next(a.checkpoint_key for a in nodes[child.node_id].attributes if a.name == VALUE)
        found = shard_of(child.local_name)
        table = found[0] if found and plan.row_shards and found[0] in plan.row_shards \
            else child.local_name
        mapped.setdefault(table, {})[child.local_name] = key
    return mapped


def _original_key(object_graph, op, model_dir):
    """The original checkpoint's key of the variable whose flat op is ``op``
    (``variables/<node id>/...``)."""
    parts = op.split("/")
    if len(parts) < 2 or parts[0] != "variables" or not parts[1].isdigit():
        raise ModelError(model_dir, f"variable op {op} does not name an object of the model")
    node_id = int(parts[1])
    if node_id >= len(object_graph.nodes):
        raise ModelError(model_dir, f"has no object {node_id} (variable op {op})")
    keys = [a.checkpoint_key for a in object_graph.nodes[node_id].attributes if a.name == VALUE]
    if not keys:
        raise ModelError(model_dir, f"object {node_id} (variable op {op}) is not a variable")
    return keys[0]


def _read(prefix):
    """Every tensor of the checkpoint at ``prefix``, by key (the object graph parsed)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except (tf.errors.OpError, ValueError) as exc:
        raise ModelError(prefix, f"cannot read the checkpoint: {str(exc).splitlines()[0]}") \
            from None
    values = {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}
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
    """Write ``values`` (the object graph among them) as the checkpoint ``prefix``."""
    import tensorflow as tf

    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    keys = sorted(values)
    tensors = [tf.constant(values[key].SerializeToString()) if key == OBJECT_GRAPH_KEY
               else tf.constant(values[key]) for key in keys]
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=keys, shape_and_slices=[""] * len(keys),
                      tensors=tensors)


__all__ = ["to_compiled", "to_original", "variables_prefix"]
