"""Stages of a training step: the forward ops are staged, every other op follows.

A pipelined training step runs each micro-batch's forward pass through the stages and
its backward pass back through them, then updates the weights once. Stages are cut in
the forward graph (:func:`forward_view`): each forward op carries the cost of its
backward ops, the memory of the variables (and optimizer slots) it reads, and every
activation crossing a stage boundary is paid twice, since its gradient comes back the
same size. Then each backward op joins its forward op's stage
(:func:`forward_partners`), as in the published training graphs, and each update op
runs with the variable it updates (:func:`place_followers`).

Examples
--------
>>> g = OpGraph()
>>> for name, phase in [("dense/MatMul", "forward"), ("gradient_tape/dense/MatMul/MatMul_1",
...                      "backward"), ("gradient_tape/Shape", "backward")]:
...     g.add_op(name, op_type="MatMul", phase=phase)
>>> g.add_edge("dense/MatMul", "gradient_tape/Shape")
>>> forward_partners(g)
{'gradient_tape/dense/MatMul/MatMul_1': 'dense/MatMul', 'gradient_tape/Shape': 'dense/MatMul'}
"""
from __future__ import annotations

import re

from costmodel.memory import new_output_bytes
from tfpart.core.graph import OpGraph
from tfpart.core.ops import WEIGHT_OPS

FORWARD, BACKWARD, UPDATE = "forward", "backward", "update"
GRADIENT_SCOPE = re.compile(r"(^|/)(gradient_tape|gradients(_\d+)?)/")


def is_training_graph(graph):
    """Whether the reader marked the ops' phases of a training step."""
    return any(attrs.get("phase") for attrs in graph.ops.values())


def forward_partners(graph):
    """The forward op each backward op belongs to.

    TensorFlow names a gradient op after its forward op under a ``gradient_tape/`` (or
    ``gradients/``) scope, so the longest forward op name that prefixes the backward
    op's name without that scope is its partner. A backward op named otherwise
    (shapes, broadcasting, a gradient seed) joins the deepest partner among its data
    producers, else among its consumers; a backward op with neither relation is left
    out (the caller places it with its stage's neighbours).
    """
    forward = {op for op, attrs in graph.ops.items() if attrs["phase"] == FORWARD}
    order = graph.topological_order()
    depth = {op: i for i, op in enumerate(order)}
    partner = {}
    backward = [op for op in order if graph.ops[op]["phase"] == BACKWARD]
    for op in backward:
        name = GRADIENT_SCOPE.sub(r"\1", op, count=1)
        while name and name != op:
            if name in forward:
                partner[op] = name
                break
            name = name.rpartition("/")[0]

    def deepest(neighbours):
        found = [partner.get(n, n) for n in neighbours if n in forward or n in partner]
        return max(found, key=depth.__getitem__, default=None)

    for op in backward:
        if op not in partner:
            data = [p for p, edge in graph.in_edges(op).items() if not edge["control"]]
            found = deepest(data)
            if found is not None:
                partner[op] = found
    for op in reversed(backward):
        if op not in partner:
            found = deepest(graph.successors(op))
            if found is not None:
                partner[op] = found
    return partner


def forward_view(graph, cost, partners):
    """The forward ops as an OpGraph to cut into stages.

    Each op's cost table (seconds per device name) is its own time plus its backward
    ops'; its variable bytes include the variables of its colocation group that are
    not forward ops (optimizer slots); its outputs include its backward ops' (a
    stage holds the activations and the gradients of the whole batch at most). Edges
    between forward ops carry twice their bytes unless they come from a weight: the
    activation goes forward, its gradient comes back.
    """
    names = cost.cluster.device_names
    attached = {op: [op] for op, attrs in graph.ops.items() if attrs["phase"] == FORWARD}
    for op, owner in partners.items():
        attached[owner].append(op)
    group_owner = {}
    for op in attached:
        group_owner.setdefault(graph.ops[op]["colocation"], op)
    for op, attrs in graph.ops.items():
        owner = group_owner.get(attrs["colocation"])
        if attrs["phase"] == UPDATE and attrs["param_bytes"] and owner is not None:
            attached[owner].append(op)
    view, dispatch = OpGraph(), cost.dispatch_time()
    for op, members in attached.items():
        attrs = dict(graph.ops[op])
        priced = [cost.index[m] for m in members if graph.ops[m]["phase"] != UPDATE]
        attrs["cost"] = {name: float(sum(cost.compute[i, d] for i in priced))
                         for d, name in enumerate(names)}
        attrs["dispatch"] = {name: float(sum(dispatch[i, d] for i in priced))
                             for d, name in enumerate(names)}
        attrs["param_bytes"] = sum(graph.ops[m]["param_bytes"] for m in members)
        attrs["outputs"] = [out for m in members if graph.ops[m]["phase"] != UPDATE
                            and new_output_bytes(graph.ops[m])
                            for out in graph.ops[m]["outputs"]]
        view.add_op(op, **attrs)
    for src, dst, edge in graph.edges():
        if src in attached and dst in attached:
            both_ways = 1.0 if graph.ops[src]["op_type"] in WEIGHT_OPS else 2.0
            view.add_edge(src, dst, bytes=edge["bytes"] * both_ways, control=edge["control"])
    return view


def place_followers(graph, partners, device_of, stage_of):
    """Give backward and update ops a device and a stage, in place.

    A backward op takes its partner's, or the latest stage of the backward ops it
    feeds if later (so the backward pass only ever goes back a stage); an update op takes its colocation group's (a
    variable's writes and slots stay with it), else the device of the first op it
    feeds that has one, else of its first producer that has one, else the first
    stage's; ops of no phase (none in a training graph) are left alone.
    """
    first_stage = min(stage_of.values())
    first_device = next(d for op, d in device_of.items() if stage_of[op] == first_stage)
    stage_of_device = {}
    for op, device in device_of.items():
        stage_of_device.setdefault(device, stage_of[op])
    for op, owner in partners.items():
        device_of[op], stage_of[op] = device_of[owner], stage_of[owner]
    device_of_stage = {stage_of[op]: device for op, device in device_of.items()}
    order = graph.topological_order()
    for op in reversed(order):
        # Gradients flow from the last stage to the first: a backward op feeding a
        # later stage's backward op (a shape, a broadcast) moves to that stage.
        if op in partners:
            later = max((stage_of[s] for s in graph.successors(op)
                         if s in partners), default=stage_of[op])
            if later > stage_of[op]:
                stage_of[op], device_of[op] = later, device_of_stage[later]
    group_device = {graph.ops[op]["colocation"]: d for op, d in device_of.items()}
    pending = [op for op in order if op not in device_of]
    for op in pending:
        device = group_device.get(graph.ops[op]["colocation"])
        if device is not None:
            device_of[op] = device
    for op in reversed(pending):
        if op not in device_of:
            device = next((device_of[s] for s in graph.successors(op) if s in device_of), None)
            if device is not None:
                device_of[op] = device
    for op in pending:
        if op not in device_of:
            device_of[op] = next((device_of[p] for p in graph.predecessors(op)
                                  if p in device_of), first_device)
        # A colocation group placed only now goes where its first op went.
        device_of[op] = group_device.setdefault(graph.ops[op]["colocation"], device_of[op])
        stage_of[op] = stage_of_device.get(device_of[op], first_stage)
