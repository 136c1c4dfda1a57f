"""Cluster files for the end-to-end tests and the benchmarks: a device made slower than
its twins, so that work shared by speed is shared unevenly."""
import json


def with_slower_cpu(cluster, device, ratio, kind):
    """A copy of ``cluster`` (a cluster.json dict) whose ``device`` (an index) is of a
    new CPU kind named ``kind``, ``ratio`` times slower than the shipped ``cpu`` in
    arithmetic, memory bandwidth and per-op overhead. It stays a CPU kind, so it still
    runs host-only ops.

    >>> slowed = with_slower_cpu({"devices": [{"name": "a", "kind": "cpu"},
    ...                                       {"name": "b", "kind": "cpu"}]}, 1, 2.0, "half")
    >>> slowed["devices"][1]["kind"], slowed["kinds"]["half"]["memory_bandwidth"]
    ('half', 10000000000.0)
    """
    from profiles import DEVICE_KINDS_FILE

    slow = dict(json.loads(DEVICE_KINDS_FILE.read_text())["kinds"]["cpu"])
    slow["peak_flops"] = {k: v / ratio for k, v in slow["peak_flops"].items()}
    slow["memory_bandwidth"] /= ratio
    slow["op_overhead_s"] *= ratio
    devices = [dict(d) for d in cluster["devices"]]
    devices[device]["kind"] = kind
    return dict(cluster, devices=devices, kinds={**cluster.get("kinds", {}), kind: slow})
