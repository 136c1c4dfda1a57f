"""Device placement rewriter: write a Plan's devices into a SavedModel proto.

Mechanism only; the policy is the Plan. The rewritten proto carries

* on every node of every function reachable from the compiled signature, the device
  the plan gives the op it became when inlined (call-site prefixed names, as the
  reader made them); a function inlined at several call sites with different devices
  is cloned, one copy per distinct placement; control-flow bodies run wholly on their
  op's device;
* on every other function reachable from the object graph or the top-level graph
  (other signatures, restored methods, saver functions), ops that use a variable on
  that variable's device and the rest on the cluster's first device, keeping a device
  already set (the savers' CPU ops);
* ``SavedVariable.device`` for every variable (those the signature does not read on
  the plan's host device, ``plan.context["unread_variables"]["device"]``), and the
  top-level ``VarHandleOp``s on the same devices;
* ``SavedResource.device`` for every resource (a hash table: the plan's device of its
  op, else the host device), the functions that create and fill it when the model
  is loaded wholly on that device, and its top-level op on it too;
* ``_class`` colocation attributes only where both ends share a device;
* no device on the call and return ops of each signature's own function (the wrapper
  TensorFlow writes around it): they run where the caller is, as in a function
  TensorFlow traces (:func:`leave_to_the_caller`).

As a pass of :mod:`rewriters.passes` it is :func:`placement_pass`, run for plans
without pipeline stages.

Examples
--------
Unit tests on hand-made protos are in ``tests/rewriters/test_placement.py``; the
round trip is ``place_devices(read_saved_model(d), plan)`` then ``write_saved_model``.
"""
from __future__ import annotations

from rewriters.captures import capture_kind, capture_op_name, resource_functions
from rewriters.function_devices import FunctionWriter
from rewriters.functions import callee, library_index, split_input
from rewriters.flat_signature import choose_signature, signature_call
from rewriters.savedmodel_io import SavedModelParts
from tfpart.core.errors import ModelError
from tfpart.core.ops import IDENTITY_OPS


def placement_pass(model, plan, workdir):
    """The pass: ``model`` with ``plan``'s devices written in, its variables and
    assets unchanged (``workdir`` is not needed).

    Parameters
    ----------
    model : rewriters.savedmodel_io.SavedModelParts
    plan : tfpart.core.plan.Plan
        Read: ``assignment``, ``context["signature"]``, ``context["devices"]`` (the
        first is the device of ops the plan does not name) and
        ``context["unread_variables"]``.
    workdir : pathlib.Path

    Returns
    -------
    rewriters.savedmodel_io.SavedModelParts
    """
    default = (plan.context.get("devices") or [None])[0]
    return SavedModelParts(place_devices(model.proto, plan, default), model.directory)


def place_devices(proto, plan, default_device=None):
    """A copy of ``proto`` with ``plan``'s devices on every node and variable.

    Parameters
    ----------
    proto : saved_model_pb2.SavedModel
    plan : tfpart.core.plan.Plan
    default_device : str, optional
        For ops the plan does not name (default: the first device the plan uses).

    Returns
    -------
    saved_model_pb2.SavedModel
    """
    from tensorflow.core.protobuf import saved_model_pb2

    new = saved_model_pb2.SavedModel()
    new.CopyFrom(proto)
    meta = new.meta_graphs[0]
    signature = choose_signature(meta, plan.context.get("signature"), "")
    call, root, top_nodes = signature_call(meta, signature, "")
    default_device = default_device or sorted(plan.assignment.values())[0]
    writer = FunctionWriter(meta.graph_def.library, plan.assignment, default_device)
    writer.place_planned(root, "")

    objects = meta.object_graph_def
    variable_device = {}  # node id -> device, of variables and resources
    host = plan.context.get("unread_variables", {}).get("device", default_device)
    for node_id, node in enumerate(objects.nodes):
        if node.HasField("variable") or node.HasField("resource"):
            device = plan.assignment.get(capture_op_name(node_id, node), host)
            getattr(node, capture_kind(node)).device = device
            variable_device[node_id] = device
        if node.HasField("resource"):  # made and filled where it lives, when loaded
            for fname in resource_functions(objects, node_id):
                if fname in writer.functions:
                    writer.place_uniform(fname, device)
    for fname in sorted(objects.concrete_functions):
        if fname in writer.functions:
            bound = objects.concrete_functions[fname].bound_inputs
            n_args = len(writer.functions[fname].signature.input_arg)
            # a captured constant (not a variable) binds no device
            args = [None] * (n_args - len(bound)) + [variable_device.get(b) for b in bound]
            writer.place_by_rule(fname, args)
    _place_top_level(meta, writer, objects, variable_device, top_nodes)
    for name, signature_def in meta.signature_def.items():
        if not name.startswith("__") and signature_def.outputs:
            leave_to_the_caller(meta, name)
    return new


def leave_to_the_caller(meta, signature):
    """Clear the device of :func:`caller_ops` of ``signature``.

    Placed on a remote task, they make the whole call one remote function whose outputs
    stay on that task, fetched by one more round trip each when the caller reads them:
    about 0.6 ms a step over loopback, for a step the cost model prices with its outputs
    delivered (as :func:`tfpart.link_probe.launch_cost` measures a launch). The body's
    ops keep their planned devices, which inlining keeps.
    """
    for node in caller_ops(meta, signature):
        node.device = ""


def caller_ops(meta, signature):
    """The call and return ops (``Identity``, ``NoOp``, calls) of ``signature``'s own
    function, the wrapper TensorFlow writes around what it computes: none if a node of
    the top-level graph computes it.

    >>> from tensorflow.core.protobuf import meta_graph_pb2
    >>> meta = meta_graph_pb2.MetaGraphDef()
    >>> f = meta.graph_def.library.function.add(); f.signature.name = "wrapper"
    >>> call = f.node_def.add(name="call", op="StatefulPartitionedCall", device="/task:1")
    >>> call.attr["f"].func.name = "body"
    >>> _ = f.node_def.add(name="Identity", op="Identity", device="/task:1")
    >>> _ = f.node_def.add(name="mul", op="Mul", device="/task:1")
    >>> top = meta.graph_def.node.add(name="sig", op="StatefulPartitionedCall")
    >>> top.attr["f"].func.name = "wrapper"
    >>> meta.signature_def["serving"].outputs["y"].name = "sig:0"
    >>> [node.name for node in caller_ops(meta, "serving")]
    ['call', 'Identity']
    """
    functions = library_index(meta.graph_def.library)
    try:
        _, root, _ = signature_call(meta, signature, "")
    except ModelError:
        return []
    return [node for node in functions[root].node_def
            if node.op in IDENTITY_OPS | {"NoOp"} or callee(node, functions)]


def _top_level_variable_devices(meta, objects, variable_device, functions):
    """Top-level VarHandleOp name -> device, through the signature call nodes."""
    devices = {}
    nodes = {n.name: n for n in meta.graph_def.node}
    for fname, concrete in objects.concrete_functions.items():
        for node in meta.graph_def.node:
            if callee(node, functions) != fname:
                continue
            bound = list(concrete.bound_inputs)
            captured = list(node.input)[len(node.input) - len(bound):] if bound else []
            for text, node_id in zip(captured, bound):
                source = split_input(text)[0]
                if nodes.get(source) is not None and node_id in variable_device:
                    devices[source] = variable_device[node_id]
    return devices


def _place_top_level(meta, writer, objects, variable_device, top_nodes):
    known = _top_level_variable_devices(meta, objects, variable_device, writer.functions)
    writer.place_nodes(meta.graph_def.node, {}, known)
