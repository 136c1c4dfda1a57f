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

import json
from pathlib import Path

from tfpart.cluster import cluster_from_dict
from tfpart.errors import ModelError
from tfpart.graph import OpGraph


def _read(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(path, f"cannot read benchmark graph: {exc}") from None


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
        graph.nx_graph.edges[f"n{edge['src']}", f"n{edge['dst']}"]["comm"] = [
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
        graph.nx_graph.edges[u, v]["comm"] = [[0.0 if a == b else float(edge["cost"])
                                               for b in range(n)] for a in range(n)]
    return graph, cluster
