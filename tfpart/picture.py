"""A picture of a placement: the graph coarsened to name scopes a person can read,
one box per device (or per pipeline stage), coloured by device, the edges that cross
devices drawn heavier with the bytes they carry. Written as Graphviz DOT with the
``graphviz`` package and rendered by Graphviz's ``dot`` where it is installed, in the
format the file's suffix names (:data:`DRAWN`), with tfpart's mark, under the output rule
of :mod:`tfpart.core.output_files`.

Coarsening: one node per device (and stage) to start with; then the node with the most
ops is split by its next name-scope level (ops without inputs, such as variables and
constants, stay in one node per device), as long as there are at most ``max_nodes``
nodes (the scopes every op shares are dropped first). When a node has more scopes than
room is left (ResNet50 has a scope per layer), it is cut instead into runs of
consecutive scopes in topological order, labelled by their first and last scope.
At most ``max_edges`` edges between boxes are drawn, the heaviest, crossing ones first
(the title says how many lighter ones are left out): beyond that Graphviz's layout
takes seconds to minutes and the picture is a tangle anyway.

Examples
--------
>>> from tfpart.core.graph import OpGraph
>>> from tfpart.core.plan import Plan
>>> g = OpGraph()
>>> for n in ("net/x", "net/a/MatMul", "net/a/Relu", "net/b/MatMul"): g.add_op(n)
>>> g.add_edge("net/x", "net/a/MatMul", bytes=4e6)
>>> g.add_edge("net/a/MatMul", "net/a/Relu", bytes=4e6)
>>> g.add_edge("net/a/Relu", "net/b/MatMul", bytes=4e6)
>>> plan = Plan(assignment={"net/x": "gpu:0", "net/a/MatMul": "gpu:0",
...                         "net/a/Relu": "gpu:0", "net/b/MatMul": "gpu:1"})
>>> picture = placement_picture(plan, g)  # x (an input), scope a, scope b
>>> picture.nodes, picture.crossing
(3, 1)
>>> 'label="4.0 MB"' in picture.dot.source
True
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tfpart.core.output_files import (PICTURES, check_output_file, picture_kind,
                                      with_picture_mark, write_output_file)

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
RENDERED = {".svg", ".png", ".pdf"}
DRAWN = {suffix: PICTURES[suffix] for suffix in (".svg", ".png", ".pdf", ".dot", ".gv")}
SOURCES = "variables, constants, inputs"


@dataclass
class Picture:
    """The DOT graph and what it shows: node count, crossing edges, devices drawn, edges
    left out."""

    dot: object  # graphviz.Digraph
    nodes: int
    crossing: int  # edges drawn between boxes on different devices
    devices: list
    left_out: int = 0  # the lightest edges between boxes, not drawn


def placement_picture(plan, graph, max_nodes=60, max_edges=150):
    """The picture of ``plan`` (a :class:`~tfpart.core.plan.Plan`) on ``graph`` (the OpGraph
    it places), with at most ``max_nodes`` boxes of ops and ``max_edges`` edges between
    them (:func:`_heaviest`)."""
    import graphviz

    order = graph.topological_order()
    position = {op: k for k, op in enumerate(order)}
    devices = sorted(set(plan.assignment.values()), key=_device_order(plan))
    stages = plan.stages or {}
    group_of = _groups(graph, plan, order, max_nodes)
    members, label = {}, {}
    for op in order:
        text, key = group_of[op]
        members.setdefault(key, []).append(op)
        label[key] = text
    group_of = {op: key for op, (_, key) in group_of.items()}
    node_id = {g: f"n{k}" for k, g in enumerate(members)}
    crossing, inside = {}, {}
    for u, v, edge in graph.edges():
        a, b = group_of[u], group_of[v]
        if a != b and not edge["control"]:
            table = crossing if plan.assignment[u] != plan.assignment[v] else inside
            table[(a, b)] = table.get((a, b), 0.0) + edge["bytes"]
    crossing, inside, left_out = _heaviest(crossing, inside, max_edges)
    title = _title(plan, graph, devices) + (
        f"; the {left_out} lightest edges between boxes are not drawn" if left_out else "")
    dot = graphviz.Digraph("placement", graph_attr={
        "rankdir": "TB", "newrank": "true", "fontname": "Helvetica", "labelloc": "t",
        "label": title},
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica",
                   "fontsize": "10"}, edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    for k, device in enumerate(devices):
        colour = PALETTE[k % len(PALETTE)]
        boxes = sorted({(stages.get(members[g][0]), g) for g in members
                        if plan.assignment[members[g][0]] == device},
                       key=lambda item: (item[0] is not None, item[0] or 0,
                                         position[members[item[1]][0]]))
        for stage in sorted({s for s, _ in boxes}, key=lambda s: (s is not None, s or 0)):
            ops = sum(len(members[g]) for s, g in boxes if s == stage)
            title = f"{_short_device(device)}\\n{ops} ops" + (
                f", stage {stage}" if stage is not None else "")
            with dot.subgraph(name=f"cluster_{k}_{stage}") as box:
                box.attr(label=title, color=colour, penwidth="2", style="rounded")
                for _, g in (item for item in boxes if item[0] == stage):
                    box.node(node_id[g], f"{label[g]}\\n{len(members[g])} ops",
                             fillcolor=colour + "55", color=colour)
    heaviest = max(crossing.values(), default=0.0) or 1.0
    by_id = lambda pair: (node_id[pair[0]], node_id[pair[1]])  # noqa: E731 (keys mix None)
    for (a, b), nbytes in sorted(crossing.items(), key=lambda item: by_id(item[0])):
        dot.edge(node_id[a], node_id[b], label=_bytes(nbytes), color="#d62728",
                 fontcolor="#d62728",
                 penwidth=f"{1.5 + 4.5 * nbytes / heaviest:.2f}")
    for (a, b) in sorted(inside, key=by_id):
        dot.edge(node_id[a], node_id[b], color="#999999", penwidth="0.8", arrowsize="0.5")
    return Picture(dot=dot, nodes=len(members), crossing=len(crossing), devices=devices,
                   left_out=left_out)


def _heaviest(crossing, inside, max_edges):
    """The ``max_edges`` heaviest edges between boxes, those that cross devices first,
    and how many are left out. Graphviz's layout time grows steeply with the edges:
    NASNetMobile's 616 took 20 s, its 150 heaviest 0.1 s.

    >>> _heaviest({("a", "b"): 5.0, ("a", "c"): 1.0}, {("b", "c"): 9.0}, 2)
    ({('a', 'b'): 5.0, ('a', 'c'): 1.0}, {}, 1)
    """
    kept = dict(sorted(crossing.items(), key=lambda item: -item[1])[:max_edges])
    room = max_edges - len(kept)
    kept_inside = dict(sorted(inside.items(), key=lambda item: -item[1])[:room])
    return kept, kept_inside, len(crossing) + len(inside) - len(kept) - len(kept_inside)


def drawing_path(path):
    """The file :func:`draw` writes for ``path``: ``path`` itself, or where Graphviz's
    ``dot`` is not installed, a rendered picture's DOT source beside it.

    >>> str(drawing_path("placement.dot"))
    'placement.dot'
    """
    path = Path(path)
    if path.suffix.lower() in RENDERED and shutil.which("dot") is None:
        return path.with_suffix(".dot")
    return path


def check_drawing(path, force=False):
    """OutputError unless :func:`draw` may write its picture for ``path``: the suffix
    names a format it draws (:data:`DRAWN`) and the file it writes
    (:func:`drawing_path`) may be replaced (:func:`tfpart.core.output_files.check_output_file`;
    ``force``: a picture of the same format tfpart did not write). Checked before any
    work.

    >>> check_drawing("placement.txt")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.OutputError: placement.txt: cannot draw a picture in the format of its suffix ('.txt'): give a file ending in .svg, .png, .pdf, .dot or .gv
    """
    picture_kind(path, DRAWN)
    written = drawing_path(path)
    check_output_file(written, picture_kind(written, DRAWN), force)


def draw(plan, graph, path, max_nodes=60, force=False):
    """Write the picture of ``plan`` to ``path`` (``.svg``, ``.png``, ``.pdf``, or DOT:
    ``.dot``, ``.gv``), marked as tfpart's, atomically and under the output rule
    (:func:`check_drawing`). Without Graphviz's ``dot`` program the DOT file is written
    beside it instead. Returns (the file written, a one-line note for the user, the
    Picture)."""
    check_drawing(path, force)  # before the layout, which can take seconds
    picture = placement_picture(plan, graph, max_nodes)
    path, written = Path(path), drawing_path(path)
    suffix = written.suffix.lower()
    # piped, not rendered: render() also writes the DOT source over a file beside it
    data = picture.dot.pipe(format=suffix[1:]) if suffix in RENDERED \
        else picture.dot.source.encode()
    write_output_file(written, with_picture_mark(data, suffix, "compile --draw"),
                      DRAWN[suffix], force)
    if written != path:
        return written, (f"Graphviz's dot is not installed: wrote {written}; render it "
                         f"with `dot -T{path.suffix[1:].lower()} {written} -o {path}`"), picture
    if suffix not in RENDERED:
        return path, f"placement picture: {path} (DOT; render with dot -Tsvg)", picture
    return path, f"placement picture: {path}", picture


def _device_order(plan):
    names = list((plan.context or {}).get("devices") or [])
    return lambda device: (names.index(device) if device in names else len(names), device)


def _title(plan, graph, devices):
    """What the picture shows, and below it the line the plan's algorithm gives on what
    it made (:func:`partitioner.registry.describe_plan`)."""
    from partitioner.registry import describe_plan  # the algorithms: slow to import

    described = describe_plan(plan)
    return _drawn(plan, graph, devices) + (f"\\n{described}" if described else "")


def _drawn(plan, graph, devices):
    """What the picture draws: the plan's assignment, which for replicas is one of them."""
    replicas = plan.replicas
    if replicas and len(replicas.devices) > 1:
        return (f"data parallel: all {len(graph)} ops on each of "
                f"{len(replicas.devices)} replicas; drawn once, with the variables on "
                f"{_short_device(replicas.devices[0])}")
    if len(devices) == 1:
        return f"all {len(graph)} ops on {devices[0]}: one device, nothing crosses"
    step = plan.predicted.step_time if plan.predicted else None
    return (f"{len(graph)} ops on {len(devices)} devices" +
            (f", predicted step {step * 1e3:.3g} ms" if step else "") +
            "; red edges cross devices (bytes per step)")


def _groups(graph, plan, order, max_nodes):
    """Op -> node label, at most ``max_nodes`` distinct. Starting from one node per
    device (and stage), the node with the most ops is split by its next name scope
    while the count allows; when its scopes are too many (a scope per layer), into
    runs of consecutive scopes (in topological order) instead, which are final."""
    parts = _scoped_names(order)
    stages = plan.stages or {}
    nodes = {}  # (device, stage, scope tuple) -> ops in topological order
    final = {}  # key -> label of a node never split again
    for op in order:
        source = graph.in_degree(op) == 0  # variables, constants, inputs: one node each
        key = (plan.assignment[op], stages.get(op), (SOURCES,) if source else ())
        nodes.setdefault(key, []).append(op)
        if source:
            final[key] = SOURCES
    while True:
        splittable = [key for key in nodes if key not in final and
                      any(len(parts[op]) > len(key[2]) + 1 for op in nodes[key])]
        if not splittable:
            break
        key = max(splittable, key=lambda k: len(nodes[k]))
        device, stage, scope = key
        children = {}
        for op in nodes.pop(key):
            deeper = parts[op][:len(scope) + 1] if len(parts[op]) > len(scope) + 1 else scope
            children.setdefault((device, stage, tuple(deeper)), []).append(op)
        room = max_nodes - len(nodes)
        if len(children) <= room:
            nodes.update(children)
            continue
        total = sum(len(ops) for k, ops in nodes.items() if k not in final) + \
            sum(len(ops) for ops in children.values())
        share = len([op for ops in children.values() for op in ops]) / max(total, 1)
        runs = max(2, int(room * share)) if room >= 2 else 1
        keys = list(children)  # first seen first: topological order
        size = -(-len(keys) // runs)
        for start in range(0, len(keys), size):
            run = keys[start:start + size]
            label = _scope_label(run[0][2]) + (f" … {_scope_label(run[-1][2])}"
                                               if len(run) > 1 else "")
            merged = (device, stage, run[0][2] + (f"#{start}",))
            nodes[merged] = [op for k in run for op in children[k]]
            final[merged] = label
    return {op: (final.get(key) or _scope_label(key[2]), key) for key, ops in nodes.items()
            for op in ops}


def _scope_label(scope):
    return scope[-1] if scope else "(top level)"


def _scoped_names(order):
    """Each op's name split at '/', without the scopes every op shares."""
    split = {op: op.split("/") for op in order}
    common = 0
    first = next(iter(split.values()), [])
    while common < len(first) - 1 and all(len(p) > common + 1 and p[common] == first[common]
                                          for p in split.values()):
        common += 1
    return {op: p[common:] for op, p in split.items()}


def _short_device(device):
    return device.replace("/replica:0", "").replace("device:", "").lstrip("/")


def _bytes(nbytes):
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes:.0f} B"
