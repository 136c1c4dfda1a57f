"""Writing devices into function libraries: every node of a function on a device,
a function cloned when two call sites need different placements of it.

The mechanism the placement rewriters share (:mod:`rewriters.placement` for TF2
SavedModels, :mod:`rewriters.tf1_placement` for TF1 ones); which device each node
gets is theirs to say.
"""
from __future__ import annotations

from collections import Counter

from rewriters.functions import body_functions, callee, inlined_callee, library_index, \
    split_input, topological_nodes
from tfpart.core.ops import CONTROL_FLOW_OPS, IDENTITY_OPS


class FunctionWriter:
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
            retarget(node, callees.get(node.name, {}))
        drop_split_colocation(fdef.node_def, devices)
        self.written[target] = key
        return target

    # -- the compiled signature: devices from the plan -----------------------------------
    def place_planned(self, fname, prefix):
        devices, callees = {}, {}
        for node in self.functions[fname].node_def:
            name = prefix + node.name
            target = inlined_callee(node, self.functions)
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
                retarget(node, callees.get(node.name, {}))
            drop_split_colocation(nodes, devices)
        return devices, callees


def retarget(node, renames):
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


def drop_split_colocation(nodes, devices):
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


__all__ = ["FunctionWriter", "drop_split_colocation", "retarget"]
