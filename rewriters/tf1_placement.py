"""Device placement rewriter for TF1 SavedModels: a Plan's devices on the graph's nodes.

A TF1 SavedModel (:mod:`rewriters.tf1_reader`) runs its top-level graph: the
``tf.compat.v1`` loader restores the variables with the ``saver_def``'s ops and runs a
signature's tensors in a session; ``tf.saved_model.load`` prunes the same graph into a
function. Every node gets, in this order:

1. the plan's device, for the ops of the compiled signature (named as in the graph);
2. the device of the node it is colocated with (``_class: loc:@x``), if that one has
   one by now: an initializer or a restore ``Assign`` with its variable;
3. the device it already names (the saver's ops on the host CPU);
4. the device of a variable it takes as an input (a resource variable's restore and
   read ops);
5. the plan's host device, for variables the signature does not read; the cluster's
   first device for the rest.

Control-flow v2 bodies (``If``, ``While``) run wholly on their op's device, cloned where
two ops of different devices share one. ``_class`` attributes are kept only where both
ends share a device.

Examples
--------
>>> from tensorflow.core.protobuf import saved_model_pb2
>>> from tfpart.core.plan import Plan
>>> proto = saved_model_pb2.SavedModel()
>>> meta = proto.meta_graphs.add()
>>> for name, op, inputs in [("w", "VarHandleOp", []), ("read", "ReadVariableOp", ["w"]),
...                          ("restore", "AssignVariableOp", ["w", "value"])]:
...     _ = meta.graph_def.node.add(name=name, op=op, input=inputs)
>>> placed = place_tf1_devices(proto, Plan(assignment={"w": "/device:CPU:1",
...                                                    "read": "/device:CPU:1"}),
...                            "/device:CPU:0")
>>> [(n.name, n.device) for n in placed.meta_graphs[0].graph_def.node]
[('w', '/device:CPU:1'), ('read', '/device:CPU:1'), ('restore', '/device:CPU:1')]
"""
from __future__ import annotations

from rewriters.function_devices import FunctionWriter, drop_split_colocation, retarget
from rewriters.functions import body_functions, split_input
from rewriters.savedmodel_io import SavedModelParts
from tfpart.core.ops import VARIABLE_OPS


def tf1_placement_pass(model, plan, workdir):
    """The pass: ``model`` (a TF1 SavedModel) with ``plan``'s devices written in, its
    variables unchanged (``workdir`` is not needed)."""
    default = (plan.context.get("devices") or [None])[0]
    return SavedModelParts(place_tf1_devices(model.proto, plan, default), model.directory)


def place_tf1_devices(proto, plan, default_device=None):
    """A copy of the TF1 SavedModel ``proto`` with ``plan``'s devices on every node
    (see the module docstring for the rules).

    Parameters
    ----------
    proto : saved_model_pb2.SavedModel
    plan : tfpart.core.plan.Plan
    default_device : str, optional
        For nodes no rule places (default: the first device the plan uses).

    Returns
    -------
    saved_model_pb2.SavedModel
    """
    from tensorflow.core.protobuf import saved_model_pb2

    new = saved_model_pb2.SavedModel()
    new.CopyFrom(proto)
    default_device = default_device or sorted(plan.assignment.values())[0]
    host = plan.context.get("unread_variables", {}).get("device", default_device)
    for meta in new.meta_graphs:
        nodes = list(meta.graph_def.node)
        devices = node_devices(nodes, plan.assignment, host, default_device)
        writer = FunctionWriter(meta.graph_def.library, {}, default_device)
        for node in nodes:
            node.device = devices[node.name]
            retarget(node, {body: writer.place_uniform(body, node.device)
                            for body in body_functions(node) if body in writer.functions})
        drop_split_colocation(nodes, devices)
    return new


def node_devices(nodes, assignment, host, default_device):
    """The device of each of ``nodes`` (NodeDefs of one graph) by the module's rules.

    >>> from tensorflow.core.framework import node_def_pb2
    >>> v = node_def_pb2.NodeDef(name="v", op="VariableV2")
    >>> init = node_def_pb2.NodeDef(name="v/Assign", op="Assign", input=["v", "c"])
    >>> init.attr["_class"].list.s.append(b"loc:@v")
    >>> save = node_def_pb2.NodeDef(name="save", op="SaveV2", input=["v"],
    ...                             device="/device:CPU:0")
    >>> node_devices([v, init, save], {}, "/device:CPU:9", "/device:GPU:0")
    {'v': '/device:CPU:9', 'v/Assign': '/device:CPU:9', 'save': '/device:CPU:0'}
    """
    by_name = {node.name: node for node in nodes}
    devices = {}

    def colocated(node):
        if "_class" not in node.attr:
            return None
        targets = [v.decode()[5:] for v in node.attr["_class"].list.s
                   if v.decode().startswith("loc:@")]
        return next((device_of(t) for t in targets if t in by_name), None)

    def device_of(name):
        if name in devices:
            return devices[name]
        node = by_name[name]
        devices[name] = None  # a colocation cycle ends here
        variables = [split_input(t)[0] for t in node.input if not t.startswith("^")
                     and by_name.get(split_input(t)[0]) is not None
                     and by_name[split_input(t)[0]].op in VARIABLE_OPS]
        device = assignment.get(name) or colocated(node) or node.device or (
            device_of(variables[0]) if variables else None) or (
            host if node.op in VARIABLE_OPS else default_device)
        devices[name] = device
        return device

    for node in nodes:
        device_of(node.name)
    return devices


__all__ = ["node_devices", "place_tf1_devices", "tf1_placement_pass"]
