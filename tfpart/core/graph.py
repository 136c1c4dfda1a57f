"""OpGraph: the intermediate representation every package speaks.

A thin wrapper over :class:`networkx.DiGraph` with a documented attribute schema.

Node key: the op's unique name; ops of nested functions are prefixed by their call
site (``StatefulPartitionedCall/model/dense/MatMul``).

Node attributes
    ``op_type`` (str), ``outputs`` (list of ``(shape, dtype)``, shape a tuple of ints),
    ``input_shapes`` (tuple of shapes of the data inputs, in order),
    ``flops`` (float), ``bytes_accessed`` (float), ``param_bytes`` (int, persistent
    bytes of the variables the op owns), ``colocation`` (str, group id), ``allowed_kinds``
    (frozenset of device-kind names, or ``None`` for "every kind"), ``stateful`` (bool),
    ``cost`` (optional dict device-name -> seconds: an explicit cost table that
    overrides the roofline, used by imported benchmark graphs), ``sliced`` (optional,
    on ops whose output channels can be split across devices: ``{"input": index,
    "axis": axis, "producer": op}``, the operand the slices cut; :mod:`tfpart.core.splits`),
    ``body_bytes`` (int, on a control-flow op or a call kept whole: the bytes of the
    tensors one trip of its bodies makes, held while it runs).

Edge attributes
    ``bytes`` (float, size of the tensors that flow), ``control`` (bool), ``comm``
    (optional list of lists, seconds from device i to device j: an explicit transfer
    table that overrides the links, used by imported benchmark graphs).

Code outside this module reads the graph through OpGraph's methods, never through
networkx, so the IR can change underneath them.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import networkx as nx

NODE_DEFAULTS = {
    "op_type": "NoOp",
    "outputs": (),
    "input_shapes": (),
    "flops": 0.0,
    "bytes_accessed": 0.0,
    "param_bytes": 0,
    "allowed_kinds": None,
    "stateful": False,
    "phase": None,  # in a training step: "forward", "backward" or "update"
    "body_bytes": 0,
}


def _forget_conversions(graph):
    """What networkx's own ``add_node``/``add_edge`` do besides storing: drop the
    converted copies of ``graph`` it may cache (networkx 3.3 and later)."""
    cache = getattr(graph, "__networkx_cache__", None)
    if cache:
        cache.clear()


def op_attributes(name, attrs):
    """The attributes :meth:`OpGraph.add_op` gives op ``name``: ``attrs`` over the
    schema defaults, its own colocation group unless ``attrs`` names one."""
    node = dict(NODE_DEFAULTS)
    node.update(attrs)
    node.setdefault("colocation", name)
    return node


@dataclass
class OpGraph:
    """A DAG of ops with the tfpart attribute schema.

    Examples
    --------
    >>> g = OpGraph()
    >>> g.add_op("a", op_type="MatMul", flops=2e6)
    >>> g.add_op("b", op_type="Relu")
    >>> g.add_edge("a", "b", bytes=4096)
    >>> list(g.successors("a")), g.edge("a", "b")["bytes"]
    (['b'], 4096.0)
    >>> g.topological_order()
    ['a', 'b']
    >>> g.colocation_groups()
    {'a': ['a'], 'b': ['b']}
    """

    nx_graph: nx.DiGraph = None

    def __post_init__(self):
        if self.nx_graph is None:
            self.nx_graph = nx.DiGraph()

    # -- building -------------------------------------------------------------------
    def add_op(self, name, **attrs):
        """Add an op; missing attributes take the schema defaults."""
        graph, node = self.nx_graph, op_attributes(name, attrs)
        if name in graph._node:  # networkx's add_node, without copying the attributes
            graph._node[name].update(node)
        else:
            graph._succ[name], graph._pred[name], graph._node[name] = {}, {}, node
        _forget_conversions(graph)

    @classmethod
    def from_tables(cls, ops, edges):
        """A graph of ``ops`` (name -> attributes as :func:`op_attributes` makes them)
        and ``edges`` (``(src, dst) -> attributes``, one entry per pair, as
        :meth:`add_edge` leaves them), kept in their order and taken as they are: the
        graph that adding them one by one gives, built without the per-call checks.

        >>> g = OpGraph.from_tables({n: op_attributes(n, {}) for n in "ab"},
        ...                         {("a", "b"): {"bytes": 4.0, "control": False}})
        >>> g.edge("a", "b")["bytes"], list(g.predecessors("b")), g.ops["a"]["colocation"]
        (4.0, ['a'], 'a')
        """
        graph = nx.DiGraph()
        node, succ, pred = graph._node, graph._succ, graph._pred
        for name, attrs in ops.items():
            node[name], succ[name], pred[name] = attrs, {}, {}
        for (src, dst), attrs in edges.items():
            succ[src][dst] = pred[dst][src] = attrs
        return cls(graph)

    def add_edge(self, src, dst, bytes=0.0, control=False, comm=None):
        """Add (or widen) a dependency; parallel tensors between two ops add up.
        ``comm`` sets the edge's explicit transfer table (see the module docstring)."""
        graph = self.nx_graph
        succ, pred = graph._succ, graph._pred
        edge = succ[src].get(dst) if src in succ else None
        if edge is not None:
            edge["bytes"] += bytes
            edge["control"] = edge["control"] and control
        elif src in succ and dst in succ:  # networkx's add_edge, both ops already there
            edge = {"bytes": float(bytes), "control": control}
            succ[src][dst] = pred[dst][src] = edge
            _forget_conversions(graph)
        else:
            graph.add_edge(src, dst, bytes=float(bytes), control=control)
            edge = succ[src][dst]
        if comm is not None:
            edge["comm"] = comm

    def relabeled(self, names):
        """A copy whose ops are renamed by the mapping ``names`` (others kept)."""
        return OpGraph(nx.relabel_nodes(self.nx_graph, names, copy=True))

    # -- reading --------------------------------------------------------------------
    @property
    def ops(self):
        """Op name -> attribute dict (a read-only mapping; iterating gives the names)."""
        return MappingProxyType(self.nx_graph._node)  # networkx's views: a call per lookup

    def __len__(self):
        return self.nx_graph.number_of_nodes()

    def __contains__(self, name):
        return name in self.nx_graph

    def number_of_edges(self):
        return self.nx_graph.number_of_edges()

    def edges(self):
        """Every dependency as ``(src, dst, attributes)``."""
        return self.nx_graph.edges(data=True)

    def edge(self, src, dst):
        """The attributes of the dependency ``src -> dst`` (KeyError if none)."""
        return self.nx_graph.edges[src, dst]

    def has_edge(self, src, dst):
        return self.nx_graph.has_edge(src, dst)

    def in_edges(self, name):
        """``{producer: edge attributes}`` of the ops ``name`` depends on."""
        return MappingProxyType(self.nx_graph._pred[name])

    def out_edges(self, name):
        """``{consumer: edge attributes}`` of the ops that depend on ``name``."""
        return MappingProxyType(self.nx_graph._succ[name])

    def predecessors(self, name):
        return self.nx_graph.predecessors(name)

    def successors(self, name):
        return self.nx_graph.successors(name)

    def in_degree(self, name):
        return self.nx_graph.in_degree(name)

    def out_degree(self, name):
        return self.nx_graph.out_degree(name)

    def is_acyclic(self):
        return nx.is_directed_acyclic_graph(self.nx_graph)

    def descendants(self):
        """``{op: set of the ops reachable from it}`` (the transitive closure)."""
        closure = nx.transitive_closure_dag(self.nx_graph)
        return {name: set(closure.succ[name]) for name in closure}

    def topological_order(self):
        """Ops in a deterministic topological order; ties are broken by what the ops
        are (:meth:`structural_key`), so the order does not depend on their names
        unless two ops are alike in every respect."""
        return list(nx.lexicographical_topological_sort(self.nx_graph,
                                                        key=self.structural_key))

    def structural_key(self, name):
        """A sort key from an op's attributes and degree, its name only last."""
        attrs = self.nx_graph.nodes[name]
        cost = attrs.get("cost")
        return (attrs["op_type"], attrs["flops"], attrs["bytes_accessed"],
                attrs["param_bytes"], sorted(cost.values()) if cost else [],
                self.nx_graph.in_degree(name), self.nx_graph.out_degree(name), name)

    def colocation_groups(self):
        """Map group id -> sorted list of its ops."""
        groups = {}
        for name, group in self.nx_graph.nodes(data="colocation"):
            groups.setdefault(group, []).append(name)
        return {g: sorted(members) for g, members in sorted(groups.items())}

    def total_param_bytes(self):
        return sum(b for _, b in self.nx_graph.nodes(data="param_bytes"))


class UnionFind(dict):
    """Disjoint sets over hashable items, created on first sight (path halving).

    >>> groups = UnionFind()
    >>> groups.union("a", "b"); groups.union("c", "b")
    >>> groups.find("a") == groups.find("c") != groups.find("d")
    True
    >>> sorted(sorted(members) for members in groups.sets())
    [['a', 'b', 'c'], ['d']]
    """

    def find(self, x):
        self.setdefault(x, x)
        while self[x] != x:
            self[x] = self[self[x]]
            x = self[x]
        return x

    def union(self, a, b):
        self[self.find(a)] = self.find(b)

    def sets(self):
        """The disjoint sets, each a list of the items seen, in first-seen order."""
        members = {}
        for item in list(self):
            members.setdefault(self.find(item), []).append(item)
        return list(members.values())
