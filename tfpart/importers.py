"""Import published cost-annotated DNN graphs into OpGraph + Cluster, so every
algorithm runs on them unchanged.

Both formats are described in ``../shared/benchmarks/README.md``. Op times become each
node's ``cost`` table (device name -> time) and transfer times each edge's ``comm``
table (``comm[a][b]``: from device a to device b), in the files' own time units.

Examples
--------
>>> import json, tempfile, os
>>> data = {"devices": [{"name": "d0", "memory": 10}, {"name": "d1", "memory": 10}],
...         "nodes": [{"id": 0, "time": [1, 2], "memory": 3},
...                   {"id": 1, "time": [2, 1], "memory": 3}],
...         "edges": [{"src": 0, "dst": 1, "comm": [[0, 0.5], [0.5, 0]]}]}
>>> path = os.path.join(tempfile.mkdtemp(), "g.json")
>>> _ = open(path, "w").write(json.dumps(data))
>>> graph, cluster = load_moirai(path)
>>> len(graph), len(cluster), graph.ops["n1"]["cost"][cluster.device_names[1]]
(2, 2, 1.0)
"""
from __future__ import annotations

from pathlib import Path

from tfpart.core.cluster import cluster_from_dict
from tfpart.core.errors import ModelError
from tfpart.core.graph import OpGraph, UnionFind
from tfpart.core.input_files import read_json


def _read(path):
    return read_json(path, ModelError, what="a readable benchmark graph")


def load_moirai(path):
    """A Moirai heterogeneous latency graph: per-device op times and per-pair transfers."""
    data = _read(path)
    devices = [{"name": f"/device:GPU:{k}", "kind": "cpu", "memory": max(d["memory"], 1)}
               for k, d in enumerate(data["devices"])]
    cluster = cluster_from_dict({"name": Path(path).stem, "devices": devices}, source=str(path))
    names = cluster.device_names
    graph = OpGraph()
    for node in data["nodes"]:
        graph.add_op(f"n{node['id']}", op_type="Op", param_bytes=int(node.get("memory", 0)),
                     cost={names[k]: float(t) for k, t in enumerate(node["time"])})
    for edge in data["edges"]:
        graph.add_edge(f"n{edge['src']}", f"n{edge['dst']}")
        graph.edge(f"n{edge['src']}", f"n{edge['dst']}")["comm"] = [
            [float(t) for t in row] for row in edge["comm"]]
    return graph, cluster


def load_tarnawski(path, accelerators=None, cpus=None):
    """A Tarnawski et al. graph on ``maxFPGAs`` identical accelerators and ``maxCPUs``
    CPUs (or the counts given): ops not supported on accelerators run on CPUs only,
    a ``colorClass`` is a colocation group, an edge's ``cost`` is its transfer time
    between any two devices."""
    data = _read(path)
    accelerators = int(data["maxFPGAs"] if accelerators is None else accelerators)
    cpus = int(data.get("maxCPUs", 1) if cpus is None else cpus)
    devices = [{"name": f"/device:GPU:{k}", "kind": "V100", "memory": data["maxSizePerFPGA"]}
               for k in range(accelerators)]
    devices += [{"name": f"/device:CPU:{k}", "kind": "cpu", "memory": "1TB"}
                for k in range(cpus)]
    cluster = cluster_from_dict({"name": Path(path).stem, "devices": devices}, source=str(path))
    graph = OpGraph()
    for node in data["nodes"]:
        cost = {d.name: float(node["fpgaLatency"] if d.kind.name == "V100" else
                              node["cpuLatency"]) for d in cluster.devices}
        graph.add_op(f"n{node['id']}", op_type="Op", cost=cost,
                     param_bytes=int(node.get("size", 0)),
                     colocation=f"class{node.get('colorClass', node['id'])}",
                     allowed_kinds=None if node.get("supportedOnFpga", 1) else
                     frozenset({"cpu"}))
    n = len(cluster)
    for edge in data["edges"]:
        u, v = f"n{edge['sourceId']}", f"n{edge['destId']}"
        graph.add_edge(u, v)
        graph.edge(u, v)["comm"] = [[0.0 if a == b else float(edge["cost"])
                                               for b in range(n)] for a in range(n)]
    return graph, cluster


def load_tarnawski_stages(path):
    """A Tarnawski et al. graph as a pipeline-stage problem with their max-load objective.

    Returns ``(problem, members)``: a :class:`partitioner.stage_dp.StageProblem` over
    two device kinds (0: the ``maxFPGAs`` accelerators, 1: the ``maxCPUs`` CPUs, which
    pay no transfer costs) and, per unit, the file's node ids it holds. The graph is
    reduced as their DP reduces it: a colour class's forward nodes form one unit and its
    backward nodes travel with it; a backward-only class gets an empty forward unit
    mirroring its backward edges; forward cycles between classes are merged; and an
    empty forward unit with a single forward neighbour and no backward one joins it.
    """
    import networkx as nx
    import numpy as np

    from partitioner.stage_dp import StageProblem

    data = _read(path)
    nodes = {n["id"]: n for n in data["nodes"]}
    cls = {i: n.get("colorClass", ("own", i)) for i, n in nodes.items()}
    backward = {i for i, n in nodes.items() if n["isBackwardNode"]}
    edges = [(e["sourceId"], e["destId"]) for e in data["edges"]]
    out_cost = {e["sourceId"]: float(e["cost"]) for e in data["edges"]}
    forward_classes = {cls[i] for i in nodes if i not in backward}
    artificial = set()
    for u, v in edges:  # mirror backward edges that touch a backward-only class
        if u in backward and v in backward and not (
                cls[u] in forward_classes and cls[v] in forward_classes):
            artificial.add((cls[v], cls[u]))
    unit_of = UnionFind()

    def forward_graph():
        graph = nx.DiGraph()
        for c in set(cls.values()):
            graph.add_node(unit_of.find(c))
        for u, v in edges:
            if u not in backward and v not in backward:
                graph.add_edge(unit_of.find(cls[u]), unit_of.find(cls[v]))
        for a, b in artificial:
            graph.add_edge(unit_of.find(a), unit_of.find(b))
        graph.remove_edges_from(nx.selfloop_edges(graph))
        return graph

    for component in nx.strongly_connected_components(forward_graph()):
        for c in component:
            unit_of.union(c, next(iter(component)))
    _merge_empty_forward_units(nodes, cls, backward, edges, unit_of, forward_graph)

    units = sorted({unit_of.find(c) for c in cls.values()}, key=str)
    index = {u: k for k, u in enumerate(units)}
    unit = {i: index[unit_of.find(cls[i])] for i in nodes}
    graph = forward_graph()
    preds = [sorted({index[p] for p in graph.predecessors(u)}) for u in units]
    members = [[] for _ in units]
    for i in sorted(nodes):
        members[unit[i]].append(i)
    fpga = [sum(nodes[i]["fpgaLatency"] for i in m) if all(
        nodes[i]["supportedOnFpga"] for i in m) else np.inf for m in members]
    cpu = [sum(nodes[i]["cpuLatency"] for i in m) for m in members]
    consumers = {}
    for u, v in edges:
        consumers.setdefault(u, set()).add(unit[v])
    groups = [(unit[u], *sorted(c - {unit[u]})) for u, c in sorted(consumers.items())
              if c - {unit[u]}]
    costs = [out_cost[u] for u, c in sorted(consumers.items()) if c - {unit[u]}]
    problem = StageProblem(
        preds=preds, time=np.array([fpga, cpu], dtype=float),
        size=np.array([sum(nodes[i].get("size", 0.0) for i in m) for m in members]),
        groups=groups, comm=np.array([costs, [0.0] * len(costs)]).reshape(2, len(costs)),
        capacity=np.array([float(data["maxSizePerFPGA"]), np.inf]),
        count=(int(data["maxFPGAs"]), int(data["maxCPUs"])))
    return problem, members


def _merge_empty_forward_units(nodes, cls, backward, edges, unit_of, forward_graph):
    """Join each zero-latency forward unit with one forward neighbour and no backward
    neighbour (and no backward work) to that neighbour, until none is left."""
    while True:
        forward_latency, backward_latency = {}, {}
        for i, n in nodes.items():
            table = backward_latency if i in backward else forward_latency
            c = unit_of.find(cls[i])
            table[c] = table.get(c, 0.0) + n["cpuLatency"] + n["fpgaLatency"]
        touches_backward = set()
        for u, v in edges:
            if (u in backward) != (v in backward):
                touches_backward.update(unit_of.find(cls[w]) for w in (u, v)
                                        if w not in backward)
        graph = forward_graph()
        for c in sorted(graph, key=str):
            neighbours = set(graph.predecessors(c)) | set(graph.successors(c))
            if (c in forward_latency and forward_latency[c] < 1e-6
                    and backward_latency.get(c, 0.0) < 1e-6 and len(neighbours) == 1
                    and c not in touches_backward):
                unit_of.union(c, neighbours.pop())
                break
        else:
            return
