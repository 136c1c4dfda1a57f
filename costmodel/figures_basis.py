"""What a cost model's figures came from, device by device, so that users know when to
profile: plan.json records it (``context.figures``), ``tfpart compile`` prints it in one
line (:func:`figures_line`) and the report shows it per device.

An op-time basis is one of :data:`BASES`:

``measured``
    a measured profile of the device's kind (``tfpart profile``, or a kernel table)
    times ``measured_ops`` of the graph's ``priced_ops``; the others are priced with the
    efficiencies fitted to that profile (``kind_basis`` says what the kind alone gives).
``calibrated``
    the kind's efficiency table was fitted to measured kernels: its ``source`` holds
    ``calibrated:`` (what ``tfpart calibrate`` writes, with the number of kernels).
``datasheet``
    peaks and guessed efficiencies only, or (``efficiency_from``) the efficiency table
    of a calibrated kind borrowed by a kind that has only its datasheet.

The host's per-op cost is ``measured`` where a profile of TensorFlow's steps gives it
(the device's own kind's: :func:`dispatch_basis`), else
the kind's figure, from the source the kinds file gives (``op_overhead_source``) where
it gives one. Links are counted by device pairs:
``probed`` (``tfpart cluster probe`` wrote them, with the rounds it measured),
``written`` (given in cluster.json by hand) or ``default`` (neither: the kinds' host
links on one host, 10 Gbit/s between hosts).

Examples
--------
>>> from costmodel import CostModel
>>> from tfpart.core.cluster import cluster_from_dict
>>> from tfpart.core.graph import OpGraph
>>> graph = OpGraph()
>>> graph.add_op("mm", op_type="MatMul", flops=2e6, bytes_accessed=1e5,
...              input_shapes=((10, 100), (100, 100)))
>>> cluster = cluster_from_dict({"devices": [{"name": "/device:GPU:0", "kind": "H100"},
...                                          {"name": "/device:CPU:0", "kind": "cpu"}]})
>>> figures = figures_basis(CostModel(graph, cluster), links={})
>>> [d["basis"] for d in figures["devices"].values()], figures["links"]
(['calibrated', 'datasheet'], {'probed': 0, 'written': 0, 'default': 1})
>>> print(*figures_line(figures).split("; "), sep="\\n")  # doctest: +ELLIPSIS
Figures: GPU:0 calibrated H100 (fit to ... kernels)
CPU:0 datasheet cpu
links default
host dispatch from the kinds file. To measure them: time cpu (`tfpart profile` on a CPU, ...
"""
from __future__ import annotations

import re
from collections import Counter

from costmodel.roofline import compute_precision, op_dtype
from tfpart.core.cluster import normalize_device_name
from tfpart.core.errors import TfpartError
from tfpart.core.input_files import read_json
from tfpart.core.ops import FREE_OPS

BASES = ("measured", "calibrated", "datasheet")
CALIBRATED_MARK = "calibrated:"  # kept in a kind's source by tfpart calibrate
_KERNEL_COUNT = re.compile(r"\((\d[\d,]*) kernels\)")
MOST_NAMES_SHOWN = 4  # a group of more devices is shown by its first and last


def figures_basis(cost, links=None):
    """What the figures of ``cost`` (a :class:`~costmodel.roofline.CostModel`) came
    from: ``{"devices": {device name: record}, "links": counts or None}``.

    Each device's record holds its ``kind``, its op-time ``basis`` with the details
    of :func:`kind_basis` and, where it is ``measured``, ``measured_ops`` of
    ``priced_ops`` and ``kind_basis``; then its host ``dispatch`` basis and
    ``dispatch_source``. ``links`` is cluster.json's ``links`` block
    (:func:`cluster_links`); None leaves the links' basis unknown (None).

    Examples
    --------
    >>> from costmodel import CostModel
    >>> from tfpart.core.cluster import cluster_of_devices
    >>> from tfpart.core.graph import OpGraph
    >>> figures = figures_basis(CostModel(OpGraph(), cluster_of_devices(["A100"])))
    >>> figures["devices"]["/job:localhost/replica:0/task:0/device:CPU:0"]["efficiency_from"]
    'H100'
    >>> figures["links"] is None
    True
    """
    cluster = cost.cluster
    profiles = {profile.device_kind: profile for profile in cost.measured}
    kinds = cluster.kinds()
    accelerator = getattr(cost, "accelerator", None)  # where the cost model has two lanes
    per_kind = {}
    for d, device in enumerate(cluster.devices):
        if device.kind.name not in per_kind:
            per_kind[device.kind.name] = {
                **_op_time_record(cost, device.kind, kinds, profiles.get(device.kind.name)),
                **dispatch_basis(device.kind, profiles, None if accelerator is None
                                 else bool(accelerator[d]))}
    return {"devices": {device.name: dict(per_kind[device.kind.name])
                        for device in cluster.devices},
            "links": None if links is None else links_basis(cluster, links)}


def _op_time_record(cost, kind, kinds, profile):
    record = {"kind": kind.name, **kind_basis(kind, kinds)}
    if profile is None:
        return record
    measured, priced = coverage(cost.graph, kind, profile, cost.tf32)
    return {"kind": kind.name, "basis": "measured", "measured_ops": measured,
            "priced_ops": priced, "kind_basis": record["basis"]}


def kind_basis(kind, kinds=None):
    """The op-time basis of a device kind alone: ``{"basis": "calibrated", "kernels":
    n}`` (n None where its source does not say) if its source holds
    :data:`CALIBRATED_MARK`, else ``{"basis": "datasheet"}``, with ``efficiency_from``
    the calibrated kind of ``kinds`` (name -> DeviceKind) whose efficiency table it
    has, if one does.

    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> kinds = load_device_kinds()
    >>> kind_basis(kinds["H100"])["basis"], kind_basis(kinds["cpu"], kinds)
    ('calibrated', {'basis': 'datasheet'})
    >>> kind_basis(kinds["H100-PCIe"], kinds)
    {'basis': 'datasheet', 'efficiency_from': 'H100'}
    """
    if CALIBRATED_MARK in kind.source:
        return {"basis": "calibrated", "kernels": calibration_kernels(kind.source)}
    lender = next((name for name, other in sorted((kinds or {}).items())
                   if other is not kind and other.name == name  # not an alias
                   and CALIBRATED_MARK in other.source
                   and other.efficiency == kind.efficiency), None)
    return {"basis": "datasheet", **({"efficiency_from": lender} if lender else {})}


def calibration_kernels(source):
    """How many kernels a calibrated kind's efficiencies were fitted to, as its
    ``source`` says after :data:`CALIBRATED_MARK` (None if it does not).

    >>> calibration_kernels("datasheet; calibrated: efficiency fitted to k.json "
    ...                     "(1,461 kernels) by tfpart calibrate")
    1461
    >>> calibration_kernels("datasheet; calibrated: by hand") is None
    True
    """
    found = _KERNEL_COUNT.search(source.partition(CALIBRATED_MARK)[2])
    return int(found.group(1).replace(",", "")) if found else None


def coverage(graph, kind, profile, tf32=True):
    """``(measured, priced)``: of the ops of ``graph`` the kind prices (those it has a
    kernel for, that cost something and carry no cost table of their own), how many
    ``profile`` (a :class:`~costmodel.measured.MeasuredProfile` of ``kind``) holds a
    measured time for, at the precision they run at.

    >>> from costmodel.measured import MeasuredProfile
    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> from tfpart.core.graph import OpGraph
    >>> cpu = load_device_kinds()["cpu"]
    >>> graph = OpGraph()
    >>> for name, rows in (("a", 8), ("b", 16)):
    ...     graph.add_op(name, op_type="MatMul", input_shapes=((rows, 4), (4, 4)))
    >>> graph.add_op("w", op_type="Const")
    >>> timed = [{"op_type": "MatMul", "input_shapes": [[8, 4], [4, 4]], "time_s": 1e-5,
    ...           "count": 1, "flops": 256.0, "bytes_accessed": 256.0}]
    >>> coverage(graph, cpu, MeasuredProfile.from_measurements("cpu", timed, cpu))
    (1, 2)
    """
    measured = priced = 0
    for attrs in graph.ops.values():
        allowed = attrs["allowed_kinds"]
        if attrs["op_type"] in FREE_OPS or attrs.get("cost") is not None or (
                allowed is not None and kind.name not in allowed):
            continue
        priced += 1
        precision = compute_precision(attrs["op_type"], op_dtype(attrs), kind, tf32)
        measured += profile.measured_time(attrs, precision) is not None
    return measured, priced


def dispatch_basis(kind, profiles, accelerator=None):
    """Where the host's per-op cost on a device of ``kind`` comes from, as the cost
    model takes it: ``measured`` by a profile (``profiles``: kind name -> profile) that
    timed TensorFlow's steps on a host (``tfpart profile`` does; a kernel table, timed
    outside TensorFlow, does not), else ``kind``, with the kinds file's
    ``op_overhead_source`` for it where there is one.

    ``accelerator``: whether the device runs its kernels apart from the host
    (:mod:`costmodel.lanes`), whose issuing cost its kind's profile measures where it
    has one (:func:`costmodel.lanes.host_dispatch`); a CPU's cost is its own profile's
    where that profile timed steps. None where the cost model does not say.

    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> dispatch_basis(load_device_kinds()["cpu"], {})["dispatch"]
    'kind'
    """
    own = profiles.get(kind.name)
    if accelerator:
        host = own if getattr(own, "host_dispatch", None) is not None else None
    else:
        host = own if own is not None and own.meta.get("step_time_s") else None
    if host is not None:
        return {"dispatch": "measured",
                "dispatch_source": f"tfpart profile of {host.device_kind}"}
    return {"dispatch": "kind", "dispatch_source": getattr(kind, "op_overhead_source", None)}


def links_basis(cluster, links):
    """How many of the device pairs of ``cluster`` have their link ``probed``,
    ``written`` or ``default``, by cluster.json's ``links`` block ``links`` (see the
    module docstring); counted without visiting every pair.

    >>> from tfpart.core.cluster import cluster_from_dict
    >>> cluster = cluster_from_dict({"devices": [
    ...     {"name": f"/job:w/task:{t}/device:CPU:{i}", "kind": "cpu"}
    ...     for t in (0, 1) for i in (0, 1)]})
    >>> links_basis(cluster, {"same_host": {"latency": "5us"}, "pairs": [
    ...     {"between": ["/job:w/task:0/device:CPU:0", "/job:w/task:1/device:CPU:0"],
    ...      "bandwidth": "1GB/s", "measured": {"bandwidth": [1e9]}}]})
    {'probed': 1, 'written': 2, 'default': 3}
    """
    host = {device.name: device.host for device in cluster.devices}
    n = len(cluster.devices)
    same = sum(k * (k - 1) // 2 for k in Counter(host.values()).values())
    left = {"same": same, "cross": n * (n - 1) // 2 - same}
    named = {}
    for pair in links.get("pairs", ()):
        ends = frozenset(normalize_device_name(name) or name for name in pair["between"])
        if len(ends) == 2 and ends <= host.keys():
            named[ends] = "probed" if "measured" in pair else "written"
    counts = Counter(named.values())
    for ends in named:
        left["same" if len({host[end] for end in ends}) == 1 else "cross"] -= 1
    for where, entry in (("same", "same_host"), ("cross", "cross_host")):
        counts["written" if links.get(entry) else "default"] += left[where]
    return {basis: counts[basis] for basis in ("probed", "written", "default")}


def cluster_links(cluster):
    """The ``links`` block of the cluster file ``cluster`` was read from (``{}`` if it
    has none), or None where it was not read from a file or cannot be read now."""
    if not cluster.source:
        return None
    try:
        data = read_json(cluster.source)
    except TfpartError:
        return None
    return data.get("links", {}) if isinstance(data, dict) else None


# -- for people ---------------------------------------------------------------------------
def figures_line(figures):
    """One line saying what a plan's figures came from (:func:`figures_basis`'s record,
    as plan.json keeps it), devices of the same basis together, then what to measure
    where they are guesses: a profile per kind (of the kinds whose profile times none of
    the graph's ops too), the links.

    >>> device = {"kind": "cpu", "basis": "measured", "measured_ops": 40, "priced_ops": 52,
    ...           "kind_basis": "datasheet", "dispatch": "measured"}
    >>> print(*figures_line({"devices": {"/device:CPU:0": device}, "links": None}).split("; "),
    ...       sep="\\n")
    Figures: CPU:0 measured cpu (40 of 52 ops timed by its profile, the others priced by its fit)
    host dispatch measured
    """
    devices = figures["devices"]
    names = dict(zip(devices, short_names(list(devices))))
    groups = {}
    for name, record in devices.items():
        groups.setdefault(op_time_text(record), []).append(names[name])
    parts = [f"{_listed(members)} {text}" for text, members in groups.items()]
    links = figures.get("links")
    if links is not None and sum(links.values()):
        parts.append(links_text(links))
    parts.append(_dispatch_summary(devices, names))
    return "Figures: " + "; ".join(parts) + _advice(devices.values(), links)


def _advice(records, links):
    """What to measure where the figures are guesses: the kinds to profile, the links.

    >>> text = _advice([{"kind": "L4", "basis": "datasheet"}, {"kind": "cpu",
    ...                 "basis": "datasheet"}, {"kind": "H100", "basis": "calibrated"}],
    ...                {"default": 1})
    >>> print(*text.split(", "), sep="\\n")
    . To measure them: time L4 and cpu (`tfpart profile` on a CPU
    `tfpart calibrate` from a GPU's kernel times)
    probe the links (`tfpart cluster probe`)
    """
    guessed = list(dict.fromkeys(r["kind"] for r in records if r["basis"] == "datasheet"
                                 or r["basis"] == "measured" and not r["measured_ops"]))
    steps = [f"time {_and(guessed)} (`tfpart profile` on a CPU, `tfpart calibrate` from a "
             "GPU's kernel times)"] if guessed else []
    if links and links.get("default"):
        steps.append("probe the links (`tfpart cluster probe`)")
    return ". To measure them: " + ", ".join(steps) if steps else ""


def _and(words):
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def op_time_text(record):
    """What one device's op times came from, in a few words (a record of
    :func:`figures_basis`).

    >>> op_time_text({"kind": "A100-40GB", "basis": "datasheet", "efficiency_from": "H100"})
    'datasheet A100-40GB (efficiencies of calibrated H100)'
    """
    kind = record["kind"]
    if record["basis"] == "measured":
        timed, priced = record["measured_ops"], record["priced_ops"]
        if timed == priced:
            return f"measured {kind} (all {priced} ops timed by its profile)"
        return (f"measured {kind} ({timed} of {priced} ops timed by its profile, the others "
                "priced by its fit)")
    if record["basis"] == "calibrated":
        kernels = record.get("kernels")
        return f"calibrated {kind} (fit to " + (
            f"{kernels} kernels)" if kernels else "measured kernels)")
    lender = record.get("efficiency_from")
    return f"datasheet {kind}" + (f" (efficiencies of calibrated {lender})" if lender else "")


def links_text(links):
    """What the links' figures came from (:func:`links_basis`'s counts), in a few words.

    >>> links_text({"probed": 3, "written": 0, "default": 0})
    'links probed'
    >>> links_text({"probed": 1, "written": 0, "default": 2})
    'links: 1 pair probed, 2 default'
    """
    given = {basis: n for basis, n in links.items() if n}
    if len(given) == 1:
        return {"probed": "links probed", "written": "links written in the cluster file",
                "default": "links default"}[next(iter(given))]
    (first, n), *rest = given.items()
    counts = [f"{n} pair{'' if n == 1 else 's'} {first}"]
    counts += [f"{m} {basis}" for basis, m in rest]
    return "links: " + ", ".join(counts)


def dispatch_text(record):
    """Where one device's host dispatch cost came from (a record of :func:`figures_basis`).

    >>> dispatch_text({"dispatch": "kind", "dispatch_source": None})
    'the kinds file'
    """
    where = "measured" if record["dispatch"] == "measured" else "the kinds file"
    source = record.get("dispatch_source")
    return f"{where} ({source})" if source else where


def _dispatch_summary(devices, names):
    measured = [names[name] for name, record in devices.items()
                if record["dispatch"] == "measured"]
    if len(measured) == len(devices):
        return "host dispatch measured"
    if measured:
        return f"host dispatch measured on {_listed(measured)}, from the kinds file elsewhere"
    return "host dispatch from the kinds file"


def _listed(names):
    """
    >>> _listed(["a", "b"]), _listed([f"GPU:{i}" for i in range(8)])
    ('a, b', 'GPU:0 … GPU:7 (8 devices)')
    """
    if len(names) <= MOST_NAMES_SHOWN:
        return ", ".join(names)
    return f"{names[0]} … {names[-1]} ({len(names)} devices)"


def short_names(names):
    """Device names without what they all share, nor ``/replica:0`` and ``/device:``.

    >>> short_names(["/job:localhost/replica:0/task:0/device:CPU:0",
    ...              "/job:localhost/replica:0/task:0/device:GPU:0"])
    ['CPU:0', 'GPU:0']
    >>> short_names(["/job:worker/replica:0/task:0/device:GPU:0",
    ...              "/job:worker/replica:0/task:1/device:GPU:0"])
    ['task:0/GPU:0', 'task:1/GPU:0']
    """
    plain = [name.replace("/replica:0", "").replace("/device:", "/") for name in names]
    if len(plain) < 2:
        return [name.rsplit("/", 1)[-1] for name in plain]
    shared = plain[0][:len(_common_prefix(plain))]
    cut = shared.rfind("/") + 1
    return [name[cut:] for name in plain]


def _common_prefix(texts):
    first, last = min(texts), max(texts)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size]
