"""A SavedModel's ``saver_def``, written as plain graph nodes instead of traced.

TensorFlow's C++ and TF1 loaders (``tf.compat.v1.saved_model.loader.load``, TF
Serving) restore a SavedModel's variables by running the MetaGraph's ``saver_def``:
feed a checkpoint prefix to its filename tensor, run its restore op. ``tf.saved_model
.save`` builds that saver by tracing two ``tf.function``\\ s over every variable, which
for the thousand variables of a model with replicas costs seconds of Python op
building (ResNet50 as data parallel on three devices: about 10 s of a compile).

:func:`add_graph_saver` writes the same saver into the MetaGraph of a model saved with
``SaveOptions(experimental_skip_saver=True)``, as NodeDefs: one ``RestoreV2`` of every
variable's checkpoint key with an ``AssignVariableOp`` to its handle, one ``SaveV2`` of
every variable's value and of the checkpoint's object graph (what TensorFlow's own
saver writes, so a checkpoint the TF1 saver writes reads back into the TF2 object
graph). The keys come from the checkpoint ``tf.saved_model.save`` wrote: its object
graph numbers its nodes as the SavedModel's object graph does. Each variable's handle
in the MetaGraph's graph is the op the save named after the variable
(``SavedVariable.name``), made unique in the order the save makes them
(:func:`_handle_names`; a Keras export names many variables twice). It refuses
(returns False, changing nothing) any model it cannot match so: a checkpoint value
that is not a variable's (a table's contents), a handle missing or of another dtype or
shape, another handle op whose name could have shifted a variable's; the caller then
saves with TensorFlow's saver.

Examples
--------
>>> import tempfile, tensorflow as tf
>>> from rewriters.savedmodel_io import read_saved_model
>>> module, folder = tf.Module(), tempfile.mkdtemp()
>>> module.v = tf.Variable([1.0, 2.0], name="v")
>>> tf.saved_model.save(module, folder,
...                     options=tf.saved_model.SaveOptions(experimental_skip_saver=True))
>>> proto = read_saved_model(folder)
>>> add_graph_saver(proto.meta_graphs[0], f"{folder}/variables/variables")
True
>>> proto.meta_graphs[0].saver_def.restore_op_name
'tfpart_saver/restore_all'
"""
from __future__ import annotations

from rewriters.node_defs import make_node, shape_attr, type_attr
from rewriters.tf_import import tensorflow

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
SCOPE = "tfpart_saver"
SAVER_OPS = ("Placeholder", "Const", "RestoreV2", "AssignVariableOp", "NoOp",
             "ReadVariableOp", "SaveV2", "Identity")  # what _saver_nodes uses


def add_graph_saver(meta_graph, prefix):
    """Give ``meta_graph`` (a ``MetaGraphDef`` saved without a saver) a ``saver_def``
    over the variables of the checkpoint at ``prefix`` (the SavedModel's
    ``variables/variables``); True if it did, False (``meta_graph`` unchanged) if the
    checkpoint holds anything but variables or the handles cannot be matched."""
    from tensorflow.core.protobuf import saver_pb2

    object_graph = _object_graph_bytes(prefix)  # read once: the handles and the saver's
    handles = _variable_handles(meta_graph, object_graph)
    if handles is None or any(node.name.startswith(f"{SCOPE}/")
                              for node in meta_graph.graph_def.node):
        return False
    keys = sorted(handles)
    dtypes = [handles[key][1] for key in keys]
    nodes = _saver_nodes(keys, [handles[key][0] for key in keys], dtypes, object_graph)
    meta_graph.graph_def.node.extend(nodes)
    _add_op_defs(meta_graph)
    meta_graph.saver_def.CopyFrom(saver_pb2.SaverDef(
        filename_tensor_name=f"{SCOPE}/filename:0", save_tensor_name=f"{SCOPE}/save/saved:0",
        restore_op_name=f"{SCOPE}/restore_all", version=saver_pb2.SaverDef.V2))
    return True


def _saver_nodes(keys, handles, dtypes, object_graph):
    """The saver's NodeDefs: a filename placeholder; a ``RestoreV2`` of ``keys`` on the
    CPU, each value assigned to its variable's ``handles`` op (of ``dtypes``), the
    assignments joined in ``restore_all``; a ``SaveV2`` of the variables' values under
    ``keys`` and of the checkpoint's ``object_graph`` (bytes), ``save/saved`` the
    filename once it has run.

    >>> nodes = _saver_nodes(["v/.ATTRIBUTES/VARIABLE_VALUE"], ["v"], [1], b"")
    >>> [node.op for node in nodes if node.name.endswith("V2")]
    ['RestoreV2', 'SaveV2']
    >>> [node.op for node in _saver_nodes([], [], [], b"") if node.name.endswith("V2")]
    ['SaveV2']
    """
    tf = tensorflow()
    cpu, string = "/device:CPU:0", type_attr("string")
    filename = make_node(f"{SCOPE}/filename", "Placeholder", [], dtype=string,
                         shape=shape_attr([]))
    restore = make_node(f"{SCOPE}/restore/RestoreV2", "RestoreV2",
                        [filename.name, f"{SCOPE}/restore/tensor_names",
                         f"{SCOPE}/restore/shape_and_slices"], dtypes=_types(dtypes))
    assigns = [make_node(f"{SCOPE}/restore/assign_{i}", "AssignVariableOp",
                         [handle, f"{restore.name}:{i}"],
                         dtype=tf.compat.v1.AttrValue(type=dtype))
               for i, (handle, dtype) in enumerate(zip(handles, dtypes))]
    reads = [make_node(f"{SCOPE}/save/read_{i}", "ReadVariableOp", [handle],
                       dtype=tf.compat.v1.AttrValue(type=dtype))
             for i, (handle, dtype) in enumerate(zip(handles, dtypes))]
    save = make_node(f"{SCOPE}/save/SaveV2", "SaveV2",
                     [filename.name, f"{SCOPE}/save/tensor_names",
                      f"{SCOPE}/save/shape_and_slices", *(read.name for read in reads),
                      f"{SCOPE}/save/object_graph"],
                     dtypes=_types([*dtypes, string.type]))
    restores = [restore, _strings(f"{SCOPE}/restore/tensor_names", keys),
                _strings(f"{SCOPE}/restore/shape_and_slices", [""] * len(keys))] \
        if keys else []  # RestoreV2 takes one tensor or more
    saves = [save, _strings(f"{SCOPE}/save/tensor_names", [*keys, OBJECT_GRAPH_KEY]),
             _strings(f"{SCOPE}/save/shape_and_slices", [""] * (len(keys) + 1)),
             _strings(f"{SCOPE}/save/object_graph", object_graph)]
    for node in [*restores, *saves]:
        node.device = cpu
    return [filename, *restores, *assigns,
            make_node(f"{SCOPE}/restore_all", "NoOp", [f"^{a.name}" for a in assigns]),
            *reads, *saves,
            make_node(f"{SCOPE}/save/saved", "Identity", [filename.name, f"^{save.name}"],
                      T=string)]


def holds_only_variables(prefix):
    """Whether the checkpoint at ``prefix`` (a SavedModel's ``variables/variables``;
    none there: nothing) holds variables' values alone, so that a model saved with its
    objects can take :func:`add_graph_saver`'s saver."""
    from pathlib import Path

    from tensorflow.core.protobuf import trackable_object_graph_pb2

    if not Path(f"{prefix}.index").is_file():
        return True
    checkpointed = trackable_object_graph_pb2.TrackableObjectGraph()
    checkpointed.ParseFromString(_object_graph_bytes(prefix))
    return not any(node.HasField("registered_saver") or any(
        attribute.name != "VARIABLE_VALUE" for attribute in node.attributes)
        for node in checkpointed.nodes)


def _variable_handles(meta_graph, object_graph):
    """Checkpoint key -> (name of the variable's handle op in the graph, dtype enum),
    of the checkpoint whose serialized object graph is ``object_graph``; or None if
    the checkpoint holds a value that is not a variable's, a variable's
    handle is not found where :func:`_handle_names` says (of its dtype and shape), or
    another handle op could have taken a name the save would give a variable."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    objects = meta_graph.object_graph_def.nodes
    checkpointed = trackable_object_graph_pb2.TrackableObjectGraph()
    checkpointed.ParseFromString(object_graph)
    if len(checkpointed.nodes) > len(objects):  # the save appends captured constants
        return None
    ops = {node.name: node for node in meta_graph.graph_def.node if node.op == "VarHandleOp"}
    names = _handle_names(meta_graph.object_graph_def)
    if not set(names.values()) <= set(ops) or _may_clash(
            set(ops) - set(names.values()),
            {obj.variable.name for obj in objects if obj.HasField("variable")}):
        return None
    handles = {}
    for node_id, (obj, saved) in enumerate(zip(objects, checkpointed.nodes)):
        if saved.HasField("registered_saver"):
            return None
        for attribute in saved.attributes:
            op = ops.get(names.get(node_id))
            if attribute.name != "VARIABLE_VALUE" or op is None or \
                    attribute.full_name != obj.variable.name or \
                    op.attr["dtype"].type != obj.variable.dtype or \
                    op.attr["shape"].shape != obj.variable.shape:
                return None
            handles[attribute.checkpoint_key] = (op.name, op.attr["dtype"].type)
    return handles


def _may_clash(others, variable_names):
    """Whether a handle op of ``others`` (not a variable of the object graph: a
    resource a function captured) has a name the save might have given a variable of
    ``variable_names`` (``name``, ``name_1``, ...), which would shift theirs.

    >>> _may_clash({"Variable"}, {"dense/kernel"}), _may_clash({"v_2"}, {"V"})
    (False, True)
    """
    taken = {name.lower() for name in variable_names}
    for name in others:
        key = name.lower()
        while True:
            if key in taken:
                return True
            base, _, suffix = key.rpartition("_")
            if not (base and suffix.isdigit()):
                break
            key = base
    return False


def _handle_names(object_graph):
    """The name ``tf.saved_model.save`` gives each variable's handle op in the
    MetaGraph's graph, by node id: the variable's name, made unique as ``tf.Graph``
    does (``name_1``, ``name_2``, ... case-blind), in the order it creates them (its
    dependency order of the object graph, ``SavedObject.dependencies``)."""
    from tensorflow.python.trackable import trackable_utils

    order = trackable_utils.order_by_dependency(
        {node_id: [dep.node_id for dep in obj.dependencies]
         for node_id, obj in enumerate(object_graph.nodes)})
    in_use, names = {}, {}
    for node_id in order:
        obj = object_graph.nodes[node_id]
        if obj.HasField("variable"):
            names[node_id] = _unique_name(obj.variable.name, in_use)
    return names


def _unique_name(name, in_use):
    """``name`` made unique among ``in_use`` (lower-cased name -> count, updated) as
    ``tf.Graph.unique_name`` makes it.

    >>> in_use = {}
    >>> [_unique_name(name, in_use) for name in ["a", "A", "a", "a_1"]]
    ['a', 'A_1', 'a_2', 'a_1_1']
    """
    key = name.lower()
    i = in_use.get(key, 0)
    in_use[key] = i + 1
    if i == 0:
        return name
    base = key
    while key in in_use:
        key = f"{base}_{i}"
        i += 1
    in_use[key] = 1
    return f"{name}_{i - 1}"


def _object_graph_bytes(prefix):
    """The checkpoint's serialized object graph (``TrackableObjectGraph``)."""
    return tensorflow().train.load_checkpoint(str(prefix)).get_tensor(OBJECT_GRAPH_KEY)


def _strings(name, values):
    """A ``Const`` of the strings (or bytes) ``values``; a scalar if ``values`` is
    one ``bytes``."""
    tf = tensorflow()
    return make_node(name, "Const", [], dtype=type_attr("string"),
                     value=tf.compat.v1.AttrValue(tensor=tf.make_tensor_proto(values,
                                                                             tf.string)))


def _types(dtypes):
    """The AttrValue of a list of dtype enums."""
    tf = tensorflow()
    return tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(type=dtypes))


def _add_op_defs(meta_graph):
    """The saver's ops in the MetaGraph's list of the ops its graph uses."""
    from tensorflow.python.framework import op_def_registry

    listed = meta_graph.meta_info_def.stripped_op_list
    have = {op.name for op in listed.op}
    for name in SAVER_OPS:
        if name not in have:
            listed.op.add().CopyFrom(op_def_registry.get(name))


__all__ = ["add_graph_saver", "holds_only_variables"]
