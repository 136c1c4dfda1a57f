"""Roofline op times and alpha-beta transfer times, as dense arrays for the solvers.

The time of an op on a device kind is its kernel's time plus the executor's fixed
cost per op (``op_overhead_s``). The kernel takes ``max(launch_s, flops /
(peak[precision] * compute), bytes_accessed / (memory_bandwidth * memory))`` with the
:class:`~tfpart.core.device_kinds.KernelEfficiency` of its kernel class on that kind (datasheet
guesses, or fitted to measured kernels by :mod:`costmodel.calibration`). The
precision is TensorFlow's (:func:`compute_precision`): TF32 units for float32
matmuls and convolutions where the kind has them and the cluster allows them, the
half-precision tensor peak for bfloat16 and float16, fp32 otherwise. Ops that only
touch metadata (shapes, handles, constants) cost nothing. A measured profile of the
kind gives the measured time instead, for the op types and input shapes it holds.
Transfers cost ``latency + bytes / bandwidth`` on the link between the two devices
and nothing on one device.
"""
from __future__ import annotations

import numpy as np

from tfpart.core.cluster import alpha_beta
from tfpart.core.limits import check_planned_devices
from tfpart.core.ops import FREE_OPS, MATMUL_OPS

DTYPE_PRECISIONS = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                   "float64": "fp64", "double": "fp64"}


def compute_precision(op_type, dtype, kind, tf32=True):
    """The precision ``op_type`` runs at on ``kind``: its dtype's, with float32
    matmuls and convolutions on TF32 units where ``kind`` has them (TensorFlow's
    default) unless ``tf32`` is False. It picks the peak of matmuls and convolutions
    (other ops are priced at the fp32 vector peak: they are memory-bound in practice)
    and the column of a measured kernel table.

    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> kinds = load_device_kinds()
    >>> [compute_precision("MatMul", "float32", kinds[k]) for k in ("H100", "V100", "cpu")]
    ['tf32', 'fp32', 'fp32']
    >>> compute_precision("MatMul", "float32", kinds["H100"], tf32=False)
    'fp32'
    >>> compute_precision("Conv2D", "bfloat16", kinds["H100"]), compute_precision(
    ...     "Relu", "float32", kinds["H100"])
    ('bf16', 'fp32')
    """
    precision = DTYPE_PRECISIONS.get(dtype, "fp32")
    if precision == "fp32" and tf32 and "tf32" in kind.peaks and op_type in MATMUL_OPS:
        return "tf32"
    return precision


def op_dtype(attrs):
    """The dtype an op computes in: its first output's (float32 if it has none)."""
    outputs = attrs.get("outputs") or ()
    return outputs[0][1] if outputs else "float32"


def roofline_time(op_type, flops, bytes_accessed, kind, efficiency=None, overhead=None,
                  precision="fp32"):
    """Seconds for one op on a device kind.

    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> v100 = load_device_kinds()["V100"]
    >>> t = roofline_time("MatMul", 2 * 4096**3, 3 * 4 * 4096**2, v100)
    >>> round(t * 1e3, 2)  # ms: compute bound at 70% of 15.7 TFLOP/s
    12.51
    >>> roofline_time("Relu", 1e6, 8e6, v100) < roofline_time("Relu", 1e6, 16e6, v100)
    True
    >>> roofline_time("Identity", 0, 1e9, v100)
    0.0
    """
    if op_type in FREE_OPS:
        return 0.0
    fraction = kind.kernel_efficiency(op_type, efficiency)
    overhead = kind.op_overhead_s if overhead is None else overhead
    peak = kind.peak(precision) if op_type in MATMUL_OPS else kind.peak_flops
    kernel = max(fraction.launch_s, flops / (peak * fraction.compute_at(precision)),
                 bytes_accessed / (kind.memory_bandwidth * fraction.memory))
    return kernel + overhead


def _dense_link_table(name):
    """A :class:`CostModel` attribute: the table ``name`` of
    :meth:`tfpart.core.cluster.LinkTable.arrays` of its cluster, built on first use."""
    return property(lambda cost: cost._link_arrays()[name],
                    doc=f"``{name}[src, dst]`` of the link between two devices (0 on one).")


class CostModel:
    """Op times and transfer times of one graph on one cluster, as numpy arrays.

    ``compute[i, d]`` is the time of op ``ops[i]`` on device ``d`` (``inf`` where the
    device's kind has no kernel for it). A node attribute ``cost`` (device name ->
    seconds) overrides the roofline, for graphs imported with measured cost tables.

    Examples
    --------
    >>> from tfpart.core.graph import OpGraph
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> g = OpGraph()
    >>> g.add_op("a", op_type="MatMul", flops=1e9, bytes_accessed=1e6)
    >>> g.add_op("b", op_type="AsString", allowed_kinds=frozenset({"cpu"}))
    >>> g.add_edge("a", "b", bytes=4e6)
    >>> cost = CostModel(g, cluster_of_devices(["cpu", "T4"]))
    >>> bool(np.isinf(cost.compute[cost.index["b"], 1]))
    True
    >>> cost.transfer_time(4e6, 0, 1) > 0 == cost.transfer_time(4e6, 1, 1)
    True
    >>> cost.edge_time({"bytes": 0, "comm": [[0, 2.5], [3.0, 0]]}, 1, 0)
    3.0
    """

    def __init__(self, graph, cluster, measured=(), tf32=None):
        self.graph = graph
        self.cluster = cluster
        self.tf32 = cluster.tf32 if tf32 is None else tf32
        self.measured = tuple(measured)
        self.ops = list(graph.ops)
        self.index = {name: i for i, name in enumerate(self.ops)}
        self._mean_link = None  # (mean latency, mean 1/bandwidth) over device pairs
        self._links = None  # the dense link tables, built when first read
        self.compute = _compute_times(graph, self.ops, cluster.devices, self.measured,
                                      self.tf32)

    # Dense tables over device pairs (n_dev x n_dev), for the solvers and the simulator;
    # built on first use, and only for clusters they can take.
    latency = _dense_link_table("latency")
    inverse_bandwidth = _dense_link_table("inverse_bandwidth")
    cpu_copy = _dense_link_table("cpu_copy")
    message_cost = _dense_link_table("message_cost")

    def _link_arrays(self):
        if self._links is None:
            check_planned_devices(self.cluster)
            self._links = self.cluster.link_table.arrays()
        return self._links

    def derived(self, name, build):
        """``build()``, computed on first use and kept: tables derived from this cost
        model (its graph as arrays, its placement units) never change."""
        cache = self.__dict__.setdefault("_derived", {})
        if name not in cache:
            cache[name] = build()
        return cache[name]

    def of(self, graph):
        """The cost model of another graph (a micro-batch's, a coarsened one) on the
        same cluster, with the same measured profiles and precision policy."""
        return CostModel(graph, self.cluster, measured=self.measured, tf32=self.tf32)

    def transfer_time(self, nbytes, src, dst):
        """Alpha-beta time to move ``nbytes`` from device ``src`` to ``dst``."""
        if src == dst:
            return 0.0
        return alpha_beta(nbytes, self.latency[src, dst], self.inverse_bandwidth[src, dst])

    def edge_time(self, edge, src, dst):
        """Time for an edge's tensors to go from device ``src`` to ``dst``: its own
        ``comm`` table (imported graphs) if it has one, else alpha-beta on its bytes."""
        if src == dst:
            return 0.0
        comm = edge.get("comm")
        return comm[src][dst] if comm is not None else self.transfer_time(edge["bytes"], src,
                                                                            dst)

    def edge_link_time(self, edge, src, dst):
        """The part of :meth:`edge_time` that occupies the link (the rest is latency)."""
        if src == dst:
            return 0.0
        comm = edge.get("comm")
        return comm[src][dst] if comm is not None else edge["bytes"] * \
            self.inverse_bandwidth[src, dst]

    def mean_edge_time(self, edge):
        """:meth:`edge_time` averaged over ordered pairs of distinct devices (0 on one)."""
        n = len(self.cluster)
        if n < 2:
            return 0.0
        mask = ~np.eye(n, dtype=bool)
        comm = edge.get("comm")
        if comm is not None:
            return float(np.mean(np.asarray(comm)[mask]))
        if edge["bytes"] <= 0:
            return 0.0
        if self._mean_link is None:
            self._mean_link = (float(np.mean(self.latency[mask])),
                               float(np.mean(self.inverse_bandwidth[mask])))
        return self._mean_link[0] + edge["bytes"] * self._mean_link[1]

    def mean_time(self):
        """Each op's time averaged over the devices that can run it (0 if none can)."""
        runnable = np.isfinite(self.compute)
        total = np.where(runnable, self.compute, 0.0).sum(axis=1)
        return total / np.maximum(runnable.sum(axis=1), 1)


def _compute_times(graph, ops, devices, measured, tf32):
    """``compute[i, d]``: the time of ``ops[i]`` on ``devices[d]`` (see
    :class:`CostModel`). Devices of one kind share a column, computed once per kind
    (a cluster of 10,000 devices of two kinds costs two columns), except for ops with
    their own per-device ``cost`` table."""
    profiles = {p.device_kind: p for p in measured}
    kinds, column = {}, []
    for device in devices:
        column.append(kinds.setdefault(id(device.kind), (len(kinds), device.kind))[0])
    kinds = [kind for _, kind in sorted(kinds.values(), key=lambda pair: pair[0])]
    column = np.asarray(column, dtype=np.int64)
    compute = np.empty((len(ops), len(devices)))
    per_kind = np.empty(len(kinds))
    for i, name in enumerate(ops):
        attrs = graph.ops[name]
        table = attrs.get("cost")
        if table is not None:
            allowed = attrs["allowed_kinds"]
            compute[i] = [np.inf if allowed is not None and d.kind.name not in allowed
                          else table.get(d.name, np.inf) for d in devices]
            continue
        for k, kind in enumerate(kinds):
            per_kind[k] = _kind_time(attrs, kind, profiles.get(kind.name), tf32)
        compute[i] = per_kind[column]
    return compute


def _kind_time(attrs, kind, profile, tf32):
    """One op's time on a device of ``kind`` (inf where the kind has no kernel)."""
    allowed = attrs["allowed_kinds"]
    if allowed is not None and kind.name not in allowed:
        return np.inf
    precision = compute_precision(attrs["op_type"], op_dtype(attrs), kind, tf32)
    if profile is not None:
        return profile.op_time(attrs, kind, precision)
    return roofline_time(attrs["op_type"], attrs["flops"], attrs["bytes_accessed"], kind,
                         precision=precision)
