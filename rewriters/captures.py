"""What a TensorFlow 2 signature captures, each kind rebuilt for what it is.

A signature's function takes the tensors it captured as trailing arguments, in the
order of its concrete function's ``bound_inputs`` (object-graph node ids). The reader
feeds each from one node of the flat graph, named by the object it stands for:

=============  ==========================================  ===========================
object kind    flat node                                   name
=============  ==========================================  ===========================
variable       ``VarHandleOp`` of the variable's dtype     ``variables/<id>/<name>``
               and shape
constant       the ``Const`` the object names (Keras       ``constants/<id>/<op>``
               ``Normalization``'s mean and variance)
resource       the op that made the handle in the          ``resources/<id>``
               top-level graph (``HashTableV2``,
               ``MutableHashTableV2``, ...)
asset          a string ``Const``: the file's path          ``assets/<id>``
               under ``assets/``
=============  ==========================================  ===========================

Any other capture is a one-line :class:`~tfpart.core.errors.ModelError` naming it and why.

Examples
--------
>>> from tensorflow.core.protobuf import saved_object_graph_pb2
>>> obj = saved_object_graph_pb2.SavedObject()
>>> obj.constant.operation = "Const_4"
>>> capture_kind(obj), capture_op_name(7, obj)
('constant', 'constants/7/Const_4')
>>> obj = saved_object_graph_pb2.SavedObject()
>>> obj.resource.device = ""
>>> capture_kind(obj), capture_op_name(14, obj)
('resource', 'resources/14')
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rewriters.functions import split_input
from tfpart.core.errors import ModelError, first_line

KINDS = ("variable", "constant", "resource", "asset")
HANDLE_KINDS = ("resource", "asset")  # captures a rebuilt model must take from the original
# Functions of a resource object that create, fill and free it (run when it is loaded).
RESOURCE_FUNCTIONS = ("_create_resource", "_initialize", "_destroy_resource")


@dataclass(frozen=True)
class Capture:
    """One captured input of the signature: object ``node_id`` of ``kind``, fed by the
    flat graph's op ``op_name``."""

    node_id: int
    kind: str
    op_name: str


def capture_kind(obj):
    """The kind of a ``SavedObject`` (``variable``, ``constant``, ``resource``, ``asset``,
    or another of the object graph's kinds, which no signature can capture)."""
    return obj.WhichOneof("kind")


def capture_op_name(node_id, obj):
    """Name in the flat graph of the op feeding capture ``node_id`` (see the table)."""
    kind = capture_kind(obj)
    if kind == "variable":
        variable = obj.variable
        return f"variables/{node_id}/{variable.name}" if variable.name else \
            f"variables/{node_id}"
    if kind == "constant":
        return f"constants/{node_id}/{obj.constant.operation}"
    return f"{kind}s/{node_id}"


def add_capture(flat, meta, node_id, source, path="", top=None):
    """Add to the GraphDef ``flat`` the op(s) feeding capture ``node_id`` of ``meta``'s
    object graph; ``source`` is the top-level tensor the signature's call node passes
    for it; ``top`` maps the names of ``meta``'s top-level nodes to them (made here if
    not given: a caller adding many captures makes it once). Returns the
    :class:`Capture`.

    Raises
    ------
    tfpart.core.errors.ModelError
        If the capture is of a kind no signature should capture, or its source cannot
        be rebuilt outside the model.
    """
    obj = meta.object_graph_def.nodes[node_id]
    kind = capture_kind(obj)
    name = capture_op_name(node_id, obj)
    if top is None and kind in ("constant", "resource"):
        top = {node.name: node for node in meta.graph_def.node}
    if kind == "variable":
        _add_variable(flat, name, obj.variable)
    elif kind == "constant":
        node = top.get(obj.constant.operation)
        if node is None or node.op != "Const":
            raise ModelError(path, f"captured constant {node_id} names op "
                             f"{obj.constant.operation!r}, which is not a Const of the graph")
        _copy_node(flat, node, name)
    elif kind == "resource":
        _add_resource(flat, name, node_id, split_input(source)[0], top, path)
    elif kind == "asset":
        filename = meta.asset_file_def[obj.asset.asset_file_def_index].filename
        node = flat.node.add(name=name, op="Const")
        node.attr["dtype"].type = 7  # DT_STRING
        node.attr["value"].tensor.dtype = 7
        node.attr["value"].tensor.string_val.append(f"assets/{filename}".encode())
    else:
        raise ModelError(path, f"the signature captures object {node_id}, a {kind or 'empty'}"
                         " object; only variables, constants, resources (hash tables) and"
                         " assets can be captured")
    return Capture(node_id, kind, name)


def _add_variable(flat, name, variable):
    node = flat.node.add(name=name, op="VarHandleOp")
    node.attr["dtype"].type = variable.dtype
    node.attr["shape"].shape.CopyFrom(variable.shape)
    node.attr["shared_name"].s = name.encode()
    node.attr["container"].s = b""


def _copy_node(flat, node, name, inputs=()):
    copy = flat.node.add()
    copy.CopyFrom(node)
    copy.name = name
    copy.device = ""
    del copy.input[:]
    copy.input.extend(inputs)
    copy.attr.pop("_class", None)
    return copy


def _add_resource(flat, name, node_id, source, top, path):
    """The top-level op that made the resource, with the ops it reads (constants, such
    as a dense hash table's empty key), under ``name``."""
    def why_not(node_name):
        node = top.get(node_name)
        if node is None:
            return f"its handle comes from {node_name!r}, not an op of the graph"
        if node.op in ("Placeholder", "PartitionedCall", "StatefulPartitionedCall"):
            return f"its handle comes from {node.name} ({node.op}), which tfpart cannot rebuild"
        return None

    order, stack = [], [source]
    while stack:
        node_name = stack.pop()
        problem = why_not(node_name)
        if problem:
            raise ModelError(path, f"cannot read captured resource {node_id}: {problem}")
        if node_name not in order:
            order.append(node_name)
            stack.extend(split_input(i)[0] for i in top[node_name].input)
    renamed = {source: name, **{n: f"{name}/{n}" for n in order[1:]}}
    for node_name in reversed(order):
        node = top[node_name]
        inputs = []
        for text in node.input:
            producer, output, control = split_input(text)
            inputs.append(("^" if control else "") + renamed[producer]
                          + (f":{output}" if output else ""))
        _copy_node(flat, node, renamed[node_name], inputs)


def resource_bytes(meta, node_id, model_dir=None):
    """Bytes a resource object holds once loaded, as far as its initializer says: the
    constants (keys and values of a hash table) and asset files (a vocabulary file) its
    ``_initialize`` function captures; 0 when it has none (a mutable table starts
    empty).

    >>> from tensorflow.core.protobuf import meta_graph_pb2
    >>> resource_bytes(meta_graph_pb2.MetaGraphDef(), 0)
    0
    """
    from tensorflow.python.framework import tensor_util

    objects = meta.object_graph_def
    if node_id >= len(objects.nodes):
        return 0
    top = {node.name: node for node in meta.graph_def.node}
    total = 0
    for child in objects.nodes[node_id].children:
        if child.local_name != "_initialize":
            continue
        function = objects.nodes[child.node_id]
        names = list(function.function.concrete_functions) if function.HasField(
            "function") else [function.bare_concrete_function.concrete_function_name]
        for fname in names:
            for bound in objects.concrete_functions[fname].bound_inputs:
                obj = objects.nodes[bound]
                if obj.HasField("constant") and obj.constant.operation in top:
                    value = tensor_util.MakeNdarray(
                        top[obj.constant.operation].attr["value"].tensor)
                    total += sum(len(v) for v in value.flat) if value.dtype == object \
                        else value.nbytes
                elif obj.HasField("asset") and model_dir is not None:
                    filename = meta.asset_file_def[obj.asset.asset_file_def_index].filename
                    asset = Path(model_dir) / "assets" / filename
                    total += asset.stat().st_size if asset.is_file() else 0
    return int(total)


def resource_functions(objects, node_id):
    """Concrete functions that create, initialise and free resource ``node_id`` (they
    run on the resource's device when the model is loaded)."""
    names = []
    for child in objects.nodes[node_id].children:
        if child.local_name not in RESOURCE_FUNCTIONS:
            continue
        function = objects.nodes[child.node_id]
        if function.HasField("function"):
            names.extend(function.function.concrete_functions)
        elif function.HasField("bare_concrete_function"):
            names.append(function.bare_concrete_function.concrete_function_name)
    return names


def object_paths(objects):
    """Each object's shortest path from the root (``root.child.grandchild``), by node
    id, as :func:`tf.__internal__.saved_model.load_partial` names them.

    >>> from tensorflow.core.protobuf import saved_object_graph_pb2
    >>> graph = saved_object_graph_pb2.SavedObjectGraph()
    >>> root, table, _ = graph.nodes.add(), graph.nodes.add(), graph.nodes.add()
    >>> _ = root.children.add(local_name="lookup", node_id=1)
    >>> _ = table.children.add(local_name="_initialize", node_id=2)
    >>> object_paths(graph)
    {0: 'root', 1: 'root.lookup', 2: 'root.lookup._initialize'}
    """
    paths, queue = {0: "root"}, [0]
    while queue:
        node_id = queue.pop(0)
        for child in objects.nodes[node_id].children:
            if child.node_id not in paths and "." not in child.local_name:
                paths[child.node_id] = f"{paths[node_id]}.{child.local_name}"
                queue.append(child.node_id)
    return paths


def load_captured(model_dir, meta, captures, path="", root=None):
    """The loaded resources and assets of ``captures`` (node id -> :class:`Capture`),
    by flat op name, for a new function to capture in their place: a table loaded
    this way is made and filled by the model's own functions, and saved with them.
    ``root``: the model already loaded (:func:`load_root`).

    Raises
    ------
    tfpart.core.errors.ModelError
        If an object cannot be reached from the root, or the model not loaded.
    """
    wanted = {node_id: capture for node_id, capture in captures.items()
              if capture.kind in HANDLE_KINDS}
    if not wanted:
        return {}
    # the whole model: a partial load would miss what the tables' functions capture
    root = root if root is not None else load_root(model_dir)
    found = loaded_objects(root, meta, wanted, path)
    return {capture.op_name: found[node_id] for node_id, capture in wanted.items()}


def load_root(model_dir):
    """The whole SavedModel ``model_dir`` loaded (``tf.saved_model.load``).

    Raises
    ------
    tfpart.core.errors.ModelError
        If it does not load; naming the variables files when they are what is corrupt.
    """
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    try:
        return tf.saved_model.load(str(model_dir))
    except Exception as exc:  # noqa: BLE001 - TensorFlow raises several kinds here
        check_checkpoint(model_dir)
        raise ModelError(model_dir, f"cannot load the model: {first_line(exc)}") from None


def check_checkpoint(model_dir):
    """Read every tensor of the checkpoint of ``model_dir`` (if it has one).

    Raises
    ------
    tfpart.core.errors.ModelError
        Naming the variables prefix, if a file of it is corrupt or truncated.
    """
    prefix = variables_prefix(model_dir)
    if not Path(f"{prefix}.index").exists():
        return
    with reading_checkpoint(prefix) as reader:
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)


def variables_prefix(model_dir):
    """The checkpoint prefix of a SavedModel's variables.

    >>> variables_prefix("model").as_posix()
    'model/variables/variables'
    """
    return Path(model_dir) / "variables" / "variables"


@contextmanager
def reading_checkpoint(prefix):
    """A checkpoint reader of ``prefix``; whatever a corrupt or truncated file raises
    while it is read becomes a ModelError naming the prefix."""
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    try:  # a truncated file raises IndexError
        yield tf.train.load_checkpoint(str(prefix))
    except (ValueError, IndexError, tf.errors.OpError) as exc:
        raise ModelError(prefix, f"cannot read the variables: {first_line(exc)}") from None


def loaded_objects(root, meta, node_ids, path=""):
    """The objects of the loaded ``root`` that are nodes ``node_ids`` of the object
    graph of ``meta``, by node id, reached by their names from the root."""
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    paths = object_paths(meta.object_graph_def)
    unreachable = sorted(set(node_ids) - set(paths))
    if unreachable:
        raise ModelError(path, f"captured object {unreachable[0]} cannot be reached from "
                         "the model's root object by name")
    found = {}
    for node_id in node_ids:
        obj = root
        for name in paths[node_id].split(".")[1:]:
            obj = tf.train.TrackableView(obj).children(obj)[name]
        found[node_id] = obj
    return found


def captured_tensor(obj):
    """The tensor a function captures for a loaded resource (its handle) or asset (its
    path)."""
    return obj.resource_handle if hasattr(obj, "resource_handle") else obj.asset_path


def state_input_map(graph, captured, variables):
    """The input map that binds a flat graph imported into the function ``graph``
    (a FuncGraph being traced) to loaded state: each table or asset of ``captured``
    and each ``tf.Variable`` of ``variables``, both by flat op name, captured."""
    return {**{f"{name}:0": graph.capture(captured_tensor(obj))
               for name, obj in captured.items()},
            **{f"{name}:0": graph.capture(var.handle) for name, var in variables.items()}}


def variable_values(model_dir, proto, flat):
    """Checkpoint value of every variable the signature reads, by its flat op name."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = variables_prefix(model_dir)
    with reading_checkpoint(prefix) as reader:
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
        keys = {node_id: attr.checkpoint_key for node_id, node in enumerate(graph.nodes)
                for attr in node.attributes if attr.name == "VARIABLE_VALUE"}
        missing = sorted(set(flat.variable_ops) - set(keys))
        if missing:
            raise ModelError(prefix, f"has no value for variable object {missing[0]}")
        return {name: reader.get_tensor(keys[node_id])
                for node_id, name in flat.variable_ops.items()}


__all__ = ["Capture", "HANDLE_KINDS", "KINDS", "add_capture", "capture_kind", "capture_op_name",
           "captured_tensor", "check_checkpoint", "load_captured", "load_root",
           "loaded_objects", "object_paths", "reading_checkpoint", "resource_bytes",
           "resource_functions", "state_input_map", "variable_values", "variables_prefix"]
