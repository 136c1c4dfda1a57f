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
* ``_class`` colocation attributes only where both ends share a device.

As a pass of :mod:`rewriters.passes` it is :func:`placement_pass`, run for plans
without pipeline stages.

Examples
--------
Unit tests on hand-made protos are in ``tests/rewriters/test_placement.py``; the
round trip is ``place_devices(read_saved_model(d), plan)`` then ``write_saved_model``.
"""
from __future__ import annotations

from collections import Counter

from rewriters.functions import (body_functions, callee, library_index,
                                 split_input, topological_nodes)
from rewriters.captures import capture_kind, capture_op_name, resource_functions
from rewriters.reader import choose_signature, signature_call
from rewriters.savedmodel_io import SavedModelParts
from tfpart.ops import CONTROL_FLOW_OPS, IDENTITY_OPS


def placement_pass(model, plan, workdir):
    """The pass: ``model`` with ``plan``'s devices written in, its variables and
    assets unchanged (``workdir`` is not needed).

    Parameters
    ----------
    model : rewriters.savedmodel_io.SavedModelParts
    plan : tfpart.plan.Plan
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
    plan : tfpart.plan.Plan
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
    writer = _FunctionWriter(meta.graph_def.library, plan.assignment, default_device)
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
                writer.place_uniform(fname, device)
    for fname in sorted(objects.concrete_functions):
        if fname in writer.functions:
            bound = objects.concrete_functions[fname].bound_inputs
            n_args = len(writer.functions[fname].signature.input_arg)
            # a captured constant (not a variable) binds no device
            args = [None] * (n_args - len(bound)) + [variable_device.get(b) for b in bound]
            writer.place_by_rule(fname, args)
    _place_top_level(meta, writer, objects, variable_device, top_nodes)
    return new


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


class _FunctionWriter:
    """Writes device maps into FunctionDefs, cloning a function when two call sites
    need different placements of it."""

    def __init__(self, library, assignment, default_device):
        self.library = library
        self.functions = library_index(library)
        self.assignment = assignment
        self.default_device = default_device
        self.written = {}  # function name -> key of the placement written into it
        self.clones = {}  # (original name, key) -> clone name

    # -- emission ------------------------------------------------------------------------
    def _emit(self, fname, devices, callees):
        key = (tuple(sorted(devices.items())),
               tuple(sorted((name, tuple(sorted(renames.items())))
                            for name, renames in callees.items())))
        if self.written.get(fname, key) == key:
            target = fname
        elif (fname, key) in self.clones:
            return self.clones[(fname, key)]
        else:
            target = f"{fname}_tfpart{len(self.clones)}"
            clone = self.library.function.add()
            clone.CopyFrom(self.functions[fname])
            clone.signature.name = target
            self.functions[target] = clone
            self.clones[(fname, key)] = target
        fdef = self.functions[target]
        for node in fdef.node_def:
            node.device = devices[node.name]
            _retarget(node, callees.get(node.name, {}))
        _drop_split_colocation(fdef.node_def, devices)
        self.written[target] = key
        return target

    # -- the compiled signature: devices from the plan -----------------------------------
    def place_planned(self, fname, prefix):
        devices, callees = {}, {}
        for node in self.functions[fname].node_def:
            name = prefix + node.name
            target = callee(node, self.functions)
            if target is not None:
                child = self.place_planned(target, f"{name}/")
                callees[node.name] = {target: child}
                devices[node.name] = self._majority(f"{name}/")
            elif name in self.assignment:
                devices[node.name] = self.assignment[name]
                callees[node.name] = {b: self.place_uniform(b, devices[node.name])
                                      for b in body_functions(node)}
            else:  # pruned as unreachable by the import; keep it valid anyway
                devices[node.name] = self.default_device
        return self._emit(fname, devices, callees)

    def _majority(self, prefix):
        counts = Counter(d for op, d in self.assignment.items() if op.startswith(prefix))
        return counts.most_common(1)[0][0] if counts else self.default_device

    def place_uniform(self, fname, device):
        """Every node of ``fname`` and of what it calls on ``device``."""
        devices, callees = {}, {}
        for node in self.functions[fname].node_def:
            devices[node.name] = device
            nested = body_functions(node)
            target = callee(node, self.functions)
            if target is not None and target not in nested:
                nested.append(target)
            callees[node.name] = {b: self.place_uniform(b, device) for b in nested}
        return self._emit(fname, devices, callees)

    # -- everything else: by the variables each op uses ----------------------------------
    def place_by_rule(self, fname, arg_devices):
        """Place a function not in the plan; ``arg_devices[i]`` is the device of the
        variable bound to argument i (None for data arguments)."""
        if fname in self.written:
            return fname
        fdef = self.functions[fname]
        resource_device = {arg.name: dev for arg, dev in
                           zip(fdef.signature.input_arg, arg_devices) if dev is not None}
        devices, callees = self.place_nodes(fdef.node_def, resource_device, {},
                                            write=False)
        return self._emit(fname, devices, callees)

    def place_nodes(self, nodes, resource_device, known, write=True):
        """Devices (and retargeted callees) for ``nodes`` of one graph or function.

        ``resource_device`` maps names whose outputs are variable handles to the
        variable's device; ``known`` fixes devices of named nodes outright.
        """
        home = Counter(list(resource_device.values()) + list(known.values()))
        home = home.most_common(1)[0][0] if home else self.default_device
        devices, callees = {}, {}
        for node in topological_nodes(list(nodes)):
            used = [resource_device[split_input(t)[0]] for t in node.input
                    if not t.startswith("^") and split_input(t)[0] in resource_device]
            device = known.get(node.name) or (used[0] if used else node.device or home)
            if node.name in known or node.op == "VarHandleOp" or (
                    used and node.op in IDENTITY_OPS):
                resource_device[node.name] = device
            devices[node.name] = device
            target = callee(node, self.functions)
            if target is not None:
                args = [resource_device.get(split_input(t)[0]) for t in node.input
                        if not t.startswith("^")]
                callees[node.name] = {target: self.place_by_rule(target, args)}
            elif node.op in CONTROL_FLOW_OPS:
                callees[node.name] = {b: self.place_uniform(b, device)
                                      for b in body_functions(node)}
        if write:
            for node in nodes:
                node.device = devices[node.name]
                _retarget(node, callees.get(node.name, {}))
            _drop_split_colocation(nodes, devices)
        return devices, callees


def _retarget(node, renames):
    """Point a node's function references (call target, bodies) at renamed copies."""
    if not renames:
        return
    if node.op in renames:
        node.op = renames[node.op]
    for value in node.attr.values():
        if value.HasField("func") and value.func.name in renames:
            value.func.name = renames[value.func.name]
        elif value.HasField("list"):
            for func in value.list.func:
                func.name = renames.get(func.name, func.name)


def _drop_split_colocation(nodes, devices):
    """Keep ``_class: loc:@x`` only where x is on the node's own device."""
    for node in nodes:
        if "_class" not in node.attr:
            continue
        kept = [v for v in node.attr["_class"].list.s
                if devices.get(v.decode()[5:]) == devices[node.name]]
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
        if not kept:
            del node.attr["_class"]
