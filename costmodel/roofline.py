"""Roofline op times and alpha-beta transfer times, as dense arrays for the solvers.

The time of an op on a device kind is its kernel's time plus the executor's fixed
cost per op (``op_overhead_s``; on an accelerator, the host's cost of issuing it, which
a measured profile of the host gives where there is one: :mod:`costmodel.lanes`). The
kernel takes its plateau roofline, stretched by the waves a small kernel leaves partly
idle, never less than a launch floor (:func:`kernel_seconds`), with the
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

from costmodel.lanes import device_lanes
from tfpart.core.cluster import alpha_beta
from tfpart.core.device_kinds import wave_occupancy
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


ELEMENT_BYTES = {"fp64": 8, "bf16": 2, "fp16": 2}  # every other precision: 4 bytes


def roofline_time(op_type, flops, bytes_accessed, kind, efficiency=None, overhead=None,
                  precision="fp32"):
    """Seconds for one op on a device kind: its kernel (:func:`kernel_seconds`) plus
    ``overhead`` (default: the kind's ``op_overhead_s``).

    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> h100 = load_device_kinds()["H100"]
    >>> fit = h100.kernel_efficiency("MatMul").compute_at("tf32")
    >>> t = roofline_time("MatMul", 2 * 8192**3, 3 * 4 * 8192**2, h100, overhead=0,
    ...                   precision="tf32")
    >>> 1 < t / (2 * 8192**3 / (h100.peak("tf32") * fit)) < 1.05  # a large kernel: the plateau
    True
    >>> roofline_time("Relu", 1e6, 8e6, h100) < roofline_time("Relu", 1e6, 16e6, h100)
    True
    >>> roofline_time("Identity", 0, 1e9, h100)
    0.0
    """
    if op_type in FREE_OPS:
        return 0.0
    fraction = kind.kernel_efficiency(op_type, efficiency)
    overhead = kind.op_overhead_s if overhead is None else overhead
    peak = kind.peak(precision) if op_type in MATMUL_OPS else kind.peak_flops
    return kernel_seconds(flops, bytes_accessed, precision, peak, kind, fraction) + overhead


def kernel_seconds(flops, bytes_accessed, precision, peak, kind, fraction):
    """The GPU's own time for one kernel (no host dispatch), with the
    :class:`~tfpart.core.device_kinds.KernelEfficiency` ``fraction`` of its class.

    The plateau is the roofline at the class's fractions of the peaks,
    ``max(flops / (peak * compute), bytes / (bandwidth * memory))``: what a kernel
    large enough to fill the device reaches. A smaller one does not fill it: its
    elements (``bytes / ELEMENT_BYTES[precision]``) are cut into tiles of
    ``tile_elements``, run in waves over the kind's ``multiprocessors``, and with
    ``w`` waves of work the kernel takes about ``w + 1`` waves' time (the last
    wave part-empty, the first one ramping up): the plateau divided by the occupancy
    ``w / (1 + w)`` (:func:`~tfpart.core.device_kinds.wave_occupancy`).
    Counting tiles in elements, not bytes, keeps a bfloat16 kernel's tiles those of
    its float32 twin. ``launch_s`` bounds it below. A device with fewer
    multiprocessors fills with fewer tiles: the wave term is where a kind's
    ``multiprocessors`` enter its times. Without ``tile_elements`` (datasheet
    guesses, older calibrations) this is the plain roofline with its floor.

    >>> from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds
    >>> h100 = load_device_kinds()["H100"]  # 132 multiprocessors
    >>> e = KernelEfficiency({"any": 0.5}, memory=0.8, launch_s=1.3e-6, tile_elements=1e4)
    >>> def stretch(elements):  # kernel time / plateau time, for a memory-bound kernel
    ...     plateau = 4 * elements / (h100.memory_bandwidth * e.memory)
    ...     return round(kernel_seconds(0, 4 * elements, "fp32", 1e14, h100, e) / plateau, 2)
    >>> stretch(1.32e6), stretch(100 * 1.32e6)  # one wave of tiles, then a hundred
    (2.0, 1.01)
    >>> round(kernel_seconds(0, 40, "fp32", 1e14, h100, e) * 1e6, 2)  # far under a wave: a tile
    1.97
    >>> plain = KernelEfficiency({"any": 0.5}, memory=0.8, launch_s=1.3e-6)
    >>> kernel_seconds(0, 40, "fp32", 1e14, h100, plain)  # no tile size: the floor
    1.3e-06
    """
    return float(waved_roofline(
        flops, bytes_accessed, bytes_accessed / ELEMENT_BYTES.get(precision, 4),
        flop_rate=peak * fraction.compute_at(precision),
        byte_rate=kind.memory_bandwidth * fraction.memory, launch_s=fraction.launch_s,
        tile_elements=fraction.tile_elements, multiprocessors=kind.multiprocessors))


def waved_roofline(flops, nbytes, elements, *, flop_rate, byte_rate, launch_s,
                   tile_elements, multiprocessors):
    """The kernel-time formula of :func:`kernel_seconds` on numbers or numpy arrays
    (the calibration fits it to many kernels at once): the plateau ``max(flops /
    flop_rate, nbytes / byte_rate)`` over the waves' occupancy
    (:func:`~tfpart.core.device_kinds.wave_occupancy`), at least ``launch_s``.

    >>> float(waved_roofline(1e9, 0, 0, flop_rate=1e12, byte_rate=1e12, launch_s=2e-6,
    ...                      tile_elements=0, multiprocessors=None))
    0.001
    >>> waved_roofline(np.array([0, 4e6]), np.array([4, 4e6]), np.array([1, 1e6]),
    ...                flop_rate=1e12, byte_rate=1e12, launch_s=2e-6, tile_elements=1e3,
    ...                multiprocessors=100).round(7).tolist()  # the second: 10 waves
    [2e-06, 4.4e-06]
    """
    plateau = np.maximum(flops / flop_rate, nbytes / byte_rate)
    return np.maximum(launch_s, plateau / wave_occupancy(elements, tile_elements,
                                                         multiprocessors))


def _dense_link_table(name):
    """A :class:`CostModel` attribute: the table ``name`` of
    :meth:`tfpart.core.cluster.LinkTable.arrays` of its cluster, built on first use."""
    return property(lambda cost: cost._link_arrays()[name],
                    doc=f"``{name}[src, dst]`` of the link between two devices (0 on one).")


class CostModel:
    """Op times and transfer times of one graph on one cluster, as numpy arrays.

    ``compute[i, d]`` is the time of op ``ops[i]`` on device ``d`` (``inf`` where the
    device's kind has no kernel for it): its kernel and the host's cost of running it.
    A node attribute ``cost`` (device name -> seconds) overrides the roofline, for
    graphs imported with measured cost tables and for coarsened units; ``dispatch``
    beside it (device name -> seconds, default none) is the part of that cost the
    host spends issuing the unit's ops to an accelerator.

    ``accelerator[d]`` says whether device ``d`` runs its kernels apart from the host
    (a GPU: :mod:`costmodel.lanes`), and ``host_dispatch[d]`` what issuing an op to it
    costs the host (0 on a CPU). On an accelerator an op's time is split in two:
    :meth:`dispatch_time` on the host's timeline, :meth:`device_time` on the device's.

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
    >>> a = cost.index["a"]  # on the T4, the host issues it while the device is busy
    >>> bool(cost.device_time()[a, 1] + cost.dispatch_time()[a, 1] == cost.compute[a, 1])
    True
    >>> float(cost.dispatch_time()[a, 0]), bool(cost.device_time()[a, 0] == cost.compute[a, 0])
    (0.0, True)
    """

    def __init__(self, graph, cluster, measured=(), tf32=None, known=None):
        self.graph = graph
        self.cluster = cluster
        self.tf32 = cluster.tf32 if tf32 is None else tf32
        self.measured = tuple(measured)
        self.ops = list(graph.ops)
        self.index = {name: i for i, name in enumerate(self.ops)}
        self._mean_link = None  # (mean latency, mean 1/bandwidth) over device pairs
        self._links = None  # the dense link tables, built when first read
        self.accelerator, self.host_dispatch = device_lanes(
            cluster.devices, {p.device_kind: p for p in self.measured})
        self.compute = _compute_times(graph, self.ops, cluster.devices, self.measured,
                                      self.tf32, self.host_dispatch, self.accelerator,
                                      known)

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

    def of(self, graph, unchanged=()):
        """The cost model of another graph (a micro-batch's, a coarsened one) on the
        same cluster, with the same measured profiles and precision policy.
        ``unchanged``: ops of ``graph`` whose attributes are those they have in this
        model's graph; their times are copied rather than computed again (an op's time
        depends on its attributes alone)."""
        known = None
        rows = [(i, self.index[op]) for i, op in enumerate(graph.ops) if op in unchanged]
        if rows:
            mine, theirs = np.array(rows, dtype=np.int64).T
            known = mine, self.compute[theirs]
        return CostModel(graph, self.cluster, measured=self.measured, tf32=self.tf32,
                         known=known)

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

    def dispatch_time(self):
        """``[i, d]``: the part of ``compute`` the host spends issuing op ``i`` to an
        accelerator ``d`` (its ``host_dispatch``, never more than the op's time; 0 on
        CPUs; for an op with its own cost table, its ``dispatch`` table, else 0).

        >>> from tfpart.core.graph import OpGraph
        >>> from tfpart.core.cluster import cluster_of_devices
        >>> cluster = cluster_of_devices(["cpu", "H100"])
        >>> g = OpGraph()
        >>> g.add_op("unit", op_type="Unit", cost={n: 3e-5 for n in cluster.device_names},
        ...          dispatch={n: 1e-5 for n in cluster.device_names})
        >>> CostModel(g, cluster).dispatch_time()[0].tolist()  # the CPU's holds it all
        [0.0, 1e-05]
        """
        def build():
            share = np.where(self.accelerator, np.minimum(self.host_dispatch, self.compute),
                             0.0)
            names = self.cluster.device_names
            for i, op in enumerate(self.ops):
                attrs = self.graph.ops[op]
                if attrs.get("cost") is not None:
                    tabled = attrs.get("dispatch") or {}
                    share[i] = np.where(self.accelerator, np.minimum(
                        [tabled.get(name, 0.0) for name in names], self.compute[i]), 0.0)
            return share
        return self.derived("dispatch_time", build)

    def device_time(self):
        """``[i, d]``: the part of ``compute`` that holds device ``d``'s own timeline:
        the kernel on an accelerator (the host issues the next ops meanwhile), the whole
        op on a CPU (its executor's thread dispatches and computes)."""
        return self.compute - self.dispatch_time()

    @property
    def lane_of(self):
        """Each device's timeline of kernels, as an index of its own: an accelerator's
        stream, or a CPU's executor (devices in one ``core_group`` share it)."""
        executor_of = self.cluster.executor_of
        lanes = {}
        return [lanes.setdefault(d if accelerator else ("executor", executor_of[d]),
                                 len(lanes))
                for d, accelerator in enumerate(self.accelerator)]

    def mean_time(self):
        """Each op's time averaged over the devices that can run it (0 if none can)."""
        runnable = np.isfinite(self.compute)
        total = np.where(runnable, self.compute, 0.0).sum(axis=1)
        return total / np.maximum(runnable.sum(axis=1), 1)


def _compute_times(graph, ops, devices, measured, tf32, host_dispatch, accelerator,
                   known=None):
    """``compute[i, d]``: the time of ``ops[i]`` on ``devices[d]`` (see
    :class:`CostModel`; ``host_dispatch`` and ``accelerator``: per device, from
    :func:`~costmodel.lanes.device_lanes`). Devices of one kind share a column,
    computed once per kind (a cluster of 10,000 devices of two kinds costs two
    columns), except for ops with their own per-device ``cost`` table. ``known``:
    ``(op indices, their rows)`` already computed, or None."""
    profiles = {p.device_kind: p for p in measured}
    kinds, column = {}, []
    for d, device in enumerate(devices):
        column.append(kinds.setdefault(id(device.kind), (len(kinds), device.kind, d))[0])
    kinds = sorted(kinds.values(), key=lambda entry: entry[0])
    # a CPU's own per-op cost is in its profile or kind (None); an accelerator's is the host's
    dispatch = [float(host_dispatch[d]) if accelerator[d] else None for _, _, d in kinds]
    kinds = [kind for _, kind, _ in kinds]
    column = np.asarray(column, dtype=np.int64)
    compute = np.empty((len(ops), len(devices)))
    per_kind = np.empty(len(kinds))
    # without profiles an op's times are the roofline's of a few attributes: ops alike
    # in those (a micro-batch's copies, repeated layers) share one computation
    roofline_only = not any(kind.name in profiles for kind in kinds)
    alike = {}
    done = np.zeros(len(ops), dtype=bool)
    if known is not None:
        compute[known[0]] = known[1]
        done[known[0]] = True
    for i, (name, skip) in enumerate(zip(ops, done.tolist())):
        if skip:
            continue
        attrs = graph.ops[name]
        table = attrs.get("cost")
        if table is not None:
            allowed = attrs["allowed_kinds"]
            compute[i] = [np.inf if allowed is not None and d.kind.name not in allowed
                          else table.get(d.name, np.inf) for d in devices]
            continue
        key = _roofline_key(attrs) if roofline_only else None
        row = alike.get(key) if key is not None else None
        if row is None:
            for k, kind in enumerate(kinds):
                per_kind[k] = _kind_time(attrs, kind, profiles.get(kind.name), tf32,
                                         dispatch[k])
            row = per_kind[column]
            if key is not None:
                alike[key] = row
        compute[i] = row
    return compute


def _roofline_key(attrs):
    """What an op's roofline times depend on (:func:`_kind_time` without a profile),
    or None if that cannot key a dict."""
    key = (attrs["op_type"], attrs["flops"], attrs["bytes_accessed"],
           attrs["allowed_kinds"], op_dtype(attrs))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _kind_time(attrs, kind, profile, tf32, dispatch=None):
    """One op's time on a device of ``kind`` (inf where the kind has no kernel): its
    kernel plus ``dispatch``, the host's cost of issuing it to an accelerator (None: a
    CPU's, the kind's or profile's per-op cost)."""
    allowed = attrs["allowed_kinds"]
    if allowed is not None and kind.name not in allowed:
        return np.inf
    precision = compute_precision(attrs["op_type"], op_dtype(attrs), kind, tf32)
    if profile is not None:
        return profile.op_time(attrs, kind, precision, dispatch=dispatch)
    return roofline_time(attrs["op_type"], attrs["flops"], attrs["bytes_accessed"], kind,
                         overhead=dispatch, precision=precision)
