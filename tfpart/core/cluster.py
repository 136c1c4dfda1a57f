"""Cluster, Device and Link: reading and validating cluster.json (device kinds are
:mod:`tfpart.core.device_kinds`).

cluster.json (see ``profiles/clusters/`` for examples)::

    {
      "name": "2xV100 + 2xT4 on two hosts",
      "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
      "devices": [
        {"name": "/job:worker/task:0/device:GPU:0", "kind": "V100", "memory": "16GB"},
        {"name": "/job:worker/task:1/device:GPU:0", "kind": "T4"}
      ],
      "links": {
        "same_host": {"bandwidth": "16GB/s", "latency": "10us"},
        "cross_host": {"bandwidth": "10Gbit/s", "latency": "50us", "cpu_copy": false},
        "pairs": [{"between": ["/job:worker/task:0/device:GPU:0",
                               "/job:worker/task:0/device:GPU:1"],
                   "bandwidth": "150GB/s", "latency": "5us"}]
      }
    }

A link with ``"cpu_copy": true`` is a copy made by its endpoints' own cores (gRPC
between CPU worker processes): neither device computes while it runs. Every copy is
a Send/Recv pair that also costs each end ``message_cost`` of executor time (default
5 µs, a kernel launch at each end), so a copy is never free even off the critical path.
``"tf32": false`` says float32 matmuls and convolutions run in full fp32 (TensorFlow
uses TF32 units by default where a GPU has them; turn them off in the program with
``tf.config.experimental.enable_tensor_float_32_execution(False)``). A ``kinds`` block
(or a ``kinds_file`` beside it) describes device kinds tfpart does not ship, in the
format of ``profiles/device_kinds.json``; ``"efficiency_from": "H100"`` lets a kind
inherit a calibrated kind's efficiency table, so only its datasheet is needed.
``step_overhead`` (optional) is a fixed cost of every step, such as a client launching
the step on remote workers. ``memory`` defaults to the kind's datasheet figure. Devices
given the same optional
``core_group`` share one executor (logical CPU devices of one process do: they run on
the same cores, one op at a time when TensorFlow has one inter-op thread). Devices without a job are local
(``/job:localhost/replica:0/task:0``). The optional ``cluster`` block maps each job to
its task addresses, as in TF_CONFIG / ``tf.train.ClusterSpec``.

Examples
--------
>>> c = cluster_from_dict({"devices": [{"name": "/device:CPU:0", "kind": "cpu"},
...                                    {"name": "/device:CPU:1", "kind": "cpu"}]})
>>> [d.name for d in c.devices]
['/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1']
>>> c.link(0, 1).latency
1e-05
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import numpy as np

from tfpart.core.errors import ClusterError, ProfileError
from tfpart.core.input_files import read_json
from tfpart.core.device_kinds import DeviceKind, kinds_entries, kinds_from_dict, load_device_kinds
from tfpart.core.units import parse_duration, parse_rate, parse_size

DEFAULT_SAME_HOST_LATENCY = 10e-6
DEFAULT_MESSAGE_COST = 5e-6  # executor seconds a Send or a Recv takes at its end
DEFAULT_CROSS_HOST = {"bandwidth": "10Gbit/s", "latency": "50us"}


@dataclass(frozen=True)
class Device:
    name: str
    kind: DeviceKind
    memory: float
    host: str
    core_group: str = ""  # devices with the same group share one executor


def alpha_beta(nbytes, latency, inverse_bandwidth):
    """The one transfer-time formula: ``latency + nbytes / bandwidth``, and nothing for
    nothing to move.

    >>> alpha_beta(1e6, 1e-5, 1 / 1e9), alpha_beta(0, 1e-5, 1 / 1e9)
    (0.00101, 0.0)
    """
    return latency + nbytes * inverse_bandwidth if nbytes > 0 else 0.0


@dataclass(frozen=True)
class Link:
    bandwidth: float
    latency: float
    cpu_copy: bool = False  # the endpoints' cores do the copy (TCP between CPU processes)
    message_cost: float = DEFAULT_MESSAGE_COST  # executor seconds per copy at each end

    def transfer_time(self, nbytes):
        """Alpha-beta time of moving ``nbytes`` over this link."""
        return alpha_beta(nbytes, self.latency, 1.0 / self.bandwidth)


@dataclass(frozen=True)
class LinkTable:
    """The link between every pair of devices, held without a table of pairs: a
    cluster of n devices has n(n-1)/2 links, but they take few values. Devices on
    different hosts share one ``cross`` link. Two devices on one host take the
    same-host link of their kinds' host links (the slower bandwidth, the sum of the
    latencies, at least 10 µs) with the fields cluster.json's ``same_host`` gives
    (``same_host``, applied to that default); ``link_class`` indexes each device's
    (host-link bandwidth, latency) in ``class_figures``. ``pairs`` holds the links
    cluster.json names explicitly, ``host`` each device's host index. A link is
    made when asked for (:meth:`link`); :meth:`arrays` builds dense tables for the
    solvers.

    >>> table = LinkTable(cross=Link(1e9, 5e-5), same_host={"latency": 1e-6}, pairs={},
    ...                   host=(0, 0, 1), link_class=(0, 0, 0), class_figures=((1e11, 0.0),))
    >>> table.link(0, 1), table.link(1, 2).bandwidth
    (Link(bandwidth=100000000000.0, latency=1e-06, cpu_copy=False, message_cost=5e-06), 1000000000.0)
    >>> table.arrays()["latency"][0]
    array([0.e+00, 1.e-06, 5.e-05])
    """

    cross: Link
    same_host: dict  # Link fields that cluster.json's same_host sets (parsed)
    pairs: dict  # (i, j) with i < j -> Link (links.pairs of cluster.json)
    host: tuple  # host index of each device
    link_class: tuple  # index into class_figures of each device
    class_figures: tuple  # (host-link bandwidth, host-link latency) of each class

    def link(self, i, j):
        """The link between devices ``i`` and ``j``, i != j."""
        i, j = min(i, j), max(i, j)
        named = self.pairs.get((i, j))
        if named is not None:
            return named
        if self.host[i] != self.host[j]:
            return self.cross
        return self.same_host_link(self.link_class[i], self.link_class[j])

    def same_host_link(self, a, b):
        """The link between two devices of link classes ``a`` and ``b`` on one host:
        through the host, at the slower of the two host links, with cluster.json's
        ``same_host`` fields applied."""
        (bandwidth_a, latency_a), (bandwidth_b, latency_b) = \
            self.class_figures[a], self.class_figures[b]
        through_host = Link(min(bandwidth_a, bandwidth_b),
                            max(DEFAULT_SAME_HOST_LATENCY, latency_a + latency_b))
        return dataclasses.replace(through_host, **self.same_host)

    def subset(self, indices):
        """The table of the devices at ``indices`` only, in that order."""
        position = {old: new for new, old in enumerate(indices)}
        pairs = {tuple(sorted((position[i], position[j]))): link
                 for (i, j), link in self.pairs.items() if i in position and j in position}
        return dataclasses.replace(self, pairs=pairs,
                                   host=tuple(self.host[i] for i in indices),
                                   link_class=tuple(self.link_class[i] for i in indices))

    def arrays(self):
        """Dense ``latency``, ``inverse_bandwidth``, ``message_cost`` (float) and
        ``cpu_copy`` (bool) tables, device by device (zero on the diagonal): n**2
        entries each, so only for clusters the solvers can take
        (:data:`tfpart.core.limits.MAX_PLANNED_DEVICES`)."""
        host = np.asarray(self.host)
        classes = sorted(set(self.link_class))
        index = np.searchsorted(classes, self.link_class)
        same = [[self.same_host_link(a, b) for b in classes] for a in classes]
        apart = host[:, None] != host[None, :]
        n = len(host)
        tables = {}
        for name, value in _LINK_FIELDS.items():
            by_class = np.array([[value(link) for link in row] for row in same],
                                dtype=type(value(self.cross)))
            table = np.where(apart, value(self.cross), by_class[index[:, None], index[None, :]])
            for (i, j), link in self.pairs.items():
                table[i, j] = table[j, i] = value(link)
            table[np.arange(n), np.arange(n)] = 0
            tables[name] = table
        return tables


_LINK_FIELDS = {"latency": lambda link: link.latency,
                "inverse_bandwidth": lambda link: 1.0 / link.bandwidth,
                "cpu_copy": lambda link: link.cpu_copy,
                "message_cost": lambda link: link.message_cost}


class AllLinks(Mapping):
    """Every pair's link, ``(i, j)`` with i < j -> Link, found on demand from a
    :class:`LinkTable` (iterating visits n(n-1)/2 pairs: fine for small clusters)."""

    def __init__(self, table):
        self._table = table
        self._n = len(table.host)

    def __getitem__(self, pair):
        i, j = pair
        if not (0 <= i < j < self._n):
            raise KeyError(pair)
        return self._table.link(i, j)

    def __iter__(self):
        return ((i, j) for i in range(self._n) for j in range(i + 1, self._n))

    def __len__(self):
        return self._n * (self._n - 1) // 2


@dataclass
class Cluster:
    """Devices, the links between them, and the optional TensorFlow job addresses."""

    name: str
    devices: tuple
    link_table: LinkTable = field(repr=False)
    tf_cluster: dict = field(default_factory=dict)
    source: str = ""
    step_overhead: float = 0.0  # seconds added once to every step
    tf32: bool = True  # float32 matmuls and convolutions on TF32 units where kinds have them

    def __len__(self):
        return len(self.devices)

    @property
    def device_names(self):
        return [d.name for d in self.devices]

    @property
    def links(self):
        """Every pair's link, ``(i, j)`` with i < j -> Link (computed when read)."""
        return AllLinks(self.link_table)

    def kinds(self):
        """The shipped device kinds and those of this cluster's devices (which its file
        may declare), by name."""
        return {**load_device_kinds(), **{d.kind.name: d.kind for d in self.devices}}

    def link(self, i, j):
        """The link between devices ``i`` and ``j`` (indices); ``None`` when i == j."""
        if i == j:
            return None
        return self.link_table.link(i, j)

    def total_memory(self):
        return sum(d.memory for d in self.devices)

    @property
    def executor_of(self):
        """Executor index of each device: devices in one ``core_group`` (logical devices
        of one process, say) share an executor and run one op at a time between them."""
        groups = {}
        return [groups.setdefault(d.core_group or d.name, len(groups)) for d in self.devices]


# -- cluster.json -------------------------------------------------------------------------
_QUANTITY = {"type": ["number", "string"]}
_LINK_PROPS = {"bandwidth": _QUANTITY, "latency": _QUANTITY, "cpu_copy": {"type": "boolean"},
               "message_cost": _QUANTITY,
               "measured": {"type": "object"}}  # how tfpart cluster probe measured it
CLUSTER_SCHEMA = {
    "type": "object",
    "required": ["devices"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "written_by": {"type": "object"},  # tfpart's mark (tfpart.core.output_files)
        "step_overhead": _QUANTITY,
        "tf32": {"type": "boolean"},
        "kinds": {"type": "object", "additionalProperties": {"type": "object"}},
        "kinds_file": {"type": "string"},
        "cluster": {"type": "object", "additionalProperties": {
            "type": "array", "minItems": 1, "items": {"type": "string"}}},
        "devices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "kind"], "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                           "memory": _QUANTITY, "core_group": {"type": "string"}}}},
        "links": {"type": "object", "additionalProperties": False, "properties": {
            "same_host": {"type": "object", "properties": _LINK_PROPS,
                          "additionalProperties": False},
            "cross_host": {"type": "object", "properties": _LINK_PROPS,
                           "additionalProperties": False},
            "pairs": {"type": "array", "items": {
                "type": "object", "required": ["between", "bandwidth"],
                "additionalProperties": False,
                "properties": dict(_LINK_PROPS, between={
                    "type": "array", "minItems": 2, "maxItems": 2,
                    "items": {"type": "string"}})}}}}},
}

_DEVICE_NAME = re.compile(
    r"^(?:/job:(?P<job>[A-Za-z0-9_]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"/device:(?P<type>[A-Za-z_]+):(?P<index>\d+)$")


def normalize_device_name(name):
    """Full TensorFlow device name; ``None`` if ``name`` is not one.

    >>> normalize_device_name("/job:worker/task:1/device:GPU:0")
    '/job:worker/replica:0/task:1/device:GPU:0'
    >>> normalize_device_name("GPU0") is None
    True
    """
    match = _DEVICE_NAME.match(name.strip())
    if not match:
        return None
    job = match["job"] or "localhost"
    return (f"/job:{job}/replica:{match['replica'] or 0}/task:{match['task'] or 0}"
            f"/device:{match['type'].upper()}:{match['index']}")


def host_of(device_name):
    """The host (job/task) a full device name lives on."""
    return device_name.split("/device:")[0]


def _field_path(path_items):
    text = ""
    for item in path_items:
        text += f"[{item}]" if isinstance(item, int) else (f".{item}" if text else item)
    return text or "(top level)"


def _quantity(parse, value, where, source):
    try:
        number = parse(value)
    except ValueError as exc:
        raise ClusterError(source, f"{where}: {exc}") from None
    if not number > 0 or not math.isfinite(number):
        raise ClusterError(source, f"{where}: must be a positive finite number, got {value!r}")
    return number


def cluster_from_dict(data, source="", kinds=None):
    """Validate a parsed cluster.json and build a :class:`Cluster`."""
    kinds = load_device_kinds() if kinds is None else kinds
    errors = sorted(jsonschema.Draft202012Validator(CLUSTER_SCHEMA).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        raise ClusterError(source, f"{_field_path(err.absolute_path)}: {err.message}")
    kinds = _own_kinds(data, source, kinds)
    tf_cluster = {job: list(addrs) for job, addrs in data.get("cluster", {}).items()}
    devices, names = [], set()
    for i, entry in enumerate(data["devices"]):
        where = f"devices[{i}]"
        name = normalize_device_name(entry["name"])
        if name is None:
            raise ClusterError(source, f"{where}.name: {entry['name']!r} is not a TensorFlow "
                               "device name like /job:worker/task:0/device:GPU:0")
        if name in names:
            raise ClusterError(source, f"{where}.name: duplicate device {name}")
        names.add(name)
        kind = kinds.get(entry["kind"])
        if kind is None:
            raise ClusterError(source, f"{where}.kind: unknown device kind {entry['kind']!r} "
                               f"(known: {', '.join(sorted(kinds))})")
        memory = _quantity(parse_size, entry.get("memory", kind.memory), f"{where}.memory",
                           source)
        job, task = re.match(r"/job:([^/]+)/replica:\d+/task:(\d+)", name).groups()
        if tf_cluster and job != "localhost":
            if job not in tf_cluster or int(task) >= len(tf_cluster[job]):
                raise ClusterError(source, f"{where}.name: {name} names a task missing from "
                                   "the 'cluster' block")
        devices.append(Device(name=name, kind=kind, memory=memory, host=host_of(name),
                              core_group=entry.get("core_group", "")))
    links = _build_links(devices, data.get("links", {}), source)
    overhead = data.get("step_overhead", 0)
    overhead = 0.0 if overhead == 0 else _quantity(parse_duration, overhead, "step_overhead",
                                                   source)
    return Cluster(name=data.get("name", Path(source).stem if source else "cluster"),
                   devices=tuple(devices), link_table=links, tf_cluster=tf_cluster,
                   source=str(source), step_overhead=overhead, tf32=data.get("tf32", True))


def _own_kinds(data, source, kinds):
    """The known kinds plus those the cluster file describes: a kinds file it names
    (relative to it; errors name that file) and its own ``kinds`` block (errors name
    the cluster file)."""
    if "kinds_file" in data:
        path = Path(source).parent / data["kinds_file"] if source else Path(data["kinds_file"])
        kinds = kinds_from_dict(kinds_entries(path), path, known=kinds)
    if "kinds" in data:
        try:
            kinds = kinds_from_dict(data["kinds"], source, known=kinds)
        except ProfileError as exc:
            raise ClusterError(source, f"kinds: {exc.problem}") from None
    return kinds


def _build_links(devices, spec, source):
    """The :class:`LinkTable` of ``devices`` from cluster.json's ``links`` block; each
    entry of it is read (and its fields checked) once, not once per pair."""
    cross = dataclasses.replace(
        Link(parse_rate(DEFAULT_CROSS_HOST["bandwidth"]),
             parse_duration(DEFAULT_CROSS_HOST["latency"])),
        **_link_fields(spec.get("cross_host", {}), "links.cross_host", source))
    hosts, classes = {}, {}
    host = tuple(hosts.setdefault(d.host, len(hosts)) for d in devices)
    link_class = tuple(classes.setdefault(
        (d.kind.host_link_bandwidth, d.kind.host_link_latency), len(classes))
        for d in devices)
    shared = len(hosts) < len(devices)  # some pair of devices shares a host
    table = LinkTable(cross=cross, pairs={}, host=host, link_class=link_class,
                      class_figures=tuple(classes), same_host=_link_fields(
                          spec.get("same_host", {}), "links.same_host", source)
                      if shared else {})
    index = {d.name: i for i, d in enumerate(devices)}
    for k, pair in enumerate(spec.get("pairs", [])):
        where = f"links.pairs[{k}]"
        ends = [normalize_device_name(n) for n in pair["between"]]
        for n, end in zip(pair["between"], ends):
            if end not in index:
                raise ClusterError(source, f"{where}.between: unknown device {n!r}")
        i, j = sorted(index[e] for e in ends)
        if i == j:
            raise ClusterError(source, f"{where}.between: a link needs two different devices")
        table.pairs[(i, j)] = dataclasses.replace(table.link(i, j),
                                                  **_link_fields(pair, where, source))
    return table


def _link_fields(entry, where, source):
    """The :class:`Link` fields a cluster.json link entry sets, parsed and checked.

    >>> _link_fields({"bandwidth": "10GB/s", "latency": 0, "cpu_copy": True}, "x", "c")
    {'bandwidth': 10000000000.0, 'latency': 0.0, 'cpu_copy': True}
    """
    fields = {}
    if "bandwidth" in entry:
        fields["bandwidth"] = _quantity(parse_rate, entry["bandwidth"], f"{where}.bandwidth",
                                        source)
    for name in ("latency", "message_cost"):
        if name in entry:
            fields[name] = 0.0 if entry[name] == 0 else _quantity(
                parse_duration, entry[name], f"{where}.{name}", source)
    if "cpu_copy" in entry:
        fields["cpu_copy"] = entry["cpu_copy"]
    return fields


def load_cluster(path):
    """Read and validate a cluster.json file (a regular file of bounded size, strict
    JSON: :mod:`tfpart.core.input_files`); raise ClusterError on any problem."""
    return cluster_from_dict(read_json(path, ClusterError), source=str(path))


def cluster_of_devices(kind_names, memory=None, name="uniform"):
    """A local cluster of the given kinds, named /device:CPU:i (handy in tests).

    >>> len(cluster_of_devices(["cpu", "cpu"]))
    2
    """
    devices = [{"name": f"/device:CPU:{i}", "kind": k} for i, k in enumerate(kind_names)]
    if memory is not None:
        for d in devices:
            d["memory"] = memory
    return cluster_from_dict({"name": name, "devices": devices})


def with_memory(cluster, memory):
    """The cluster with each device's memory set to the bytes of ``memory`` (one per
    device, in order).

    >>> [d.memory for d in with_memory(cluster_of_devices(["cpu", "T4"]), [2e9, 1e9]).devices]
    [2000000000.0, 1000000000.0]
    """
    return dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(device, memory=float(nbytes))
        for device, nbytes in zip(cluster.devices, memory, strict=True)))


def sub_cluster(cluster, indices):
    """The cluster of only the devices at ``indices`` (in that order), with their links.

    >>> small = sub_cluster(cluster_of_devices(["cpu", "T4", "V100"]), [2, 0])
    >>> [d.kind.name for d in small.devices], small.link(0, 1) is not None
    (['V100', 'cpu'], True)
    """
    return dataclasses.replace(cluster, name=f"{cluster.name}[{len(indices)}]",
                               devices=tuple(cluster.devices[i] for i in indices),
                               link_table=cluster.link_table.subset(indices))
