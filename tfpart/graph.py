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
    overrides the roofline, used by imported benchmark graphs).

Edge attributes
    ``bytes`` (float, size of the tensors that flow), ``control`` (bool).
"""
from __future__ import annotations

from dataclasses import dataclass

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
}


@dataclass
class OpGraph:
    """A DAG of ops with the tfpart attribute schema.

    Examples
    --------
    >>> g = OpGraph()
    >>> g.add_op("a", op_type="MatMul", flops=2e6)
    >>> g.add_op("b", op_type="Relu")
    >>> g.add_edge("a", "b", bytes=4096)
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
        node = dict(NODE_DEFAULTS)
        node.update(attrs)
        node.setdefault("colocation", name)
        self.nx_graph.add_node(name, **node)

    def add_edge(self, src, dst, bytes=0.0, control=False):
        """Add (or widen) a dependency; parallel tensors between two ops add up."""
        if self.nx_graph.has_edge(src, dst):
            edge = self.nx_graph.edges[src, dst]
            edge["bytes"] += bytes
            edge["control"] = edge["control"] and control
        else:
            self.nx_graph.add_edge(src, dst, bytes=float(bytes), control=control)

    # -- reading --------------------------------------------------------------------
    @property
    def ops(self):
        return self.nx_graph.nodes

    def __len__(self):
        return self.nx_graph.number_of_nodes()

    def __contains__(self, name):
        return name in self.nx_graph

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
