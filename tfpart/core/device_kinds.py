"""Device kinds: the datasheet figures of each kind of device and how close each class
of kernel comes to them (its efficiency table), read from ``profiles/device_kinds.json``
or a cluster's own ``kinds`` block.

A kinds file maps a kind's name to its datasheet (``peak_flops`` per precision,
``memory_bandwidth``, ``memory``, host and peer link bandwidths, ``multiprocessors``
on a GPU, ``source``), the host's cost of issuing one op (``op_overhead_s``, with
``op_overhead_source`` saying where that figure comes from) and an ``efficiency``
table (kernel class -> a fraction, or ``{"compute": {precision: fraction}, "memory":
m, "launch_s": t, "tile_elements": n}``, as :class:`KernelEfficiency` reads it).
``"efficiency_from": "H100"`` inherits a calibrated kind's table (and, unless given,
its ``multiprocessors`` and ``op_overhead_s``); ``{"alias_of": name}`` names another
kind.

Examples
--------
>>> kinds = load_device_kinds()
>>> kinds["H100"].peak("bf16") > kinds["H100"].peak("fp32")
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from profiles import DEVICE_KINDS_FILE
from tfpart.core.errors import ProfileError
from tfpart.core.input_files import read_json
from tfpart.core.ops import class_lineage, kernel_class


@dataclass(frozen=True)
class KernelEfficiency:
    """How close one kernel class comes to a kind's datasheet, as a few numbers a fit
    can set and a reader can check.

    ``compute`` maps a precision (``fp32``, ``tf32``, ``bf16``, ...) to the fraction of
    that peak a large kernel reaches (``any`` applies to every precision not listed),
    ``memory`` the fraction of the memory bandwidth: together, the plateau roofline
    ``max(flops / (peak * compute), bytes / (bandwidth * memory))``. ``tile_elements``
    says how the efficiency falls below the plateau for small kernels: the kernel's
    elements are cut into tiles of that many, run in waves over the device's
    multiprocessors, and a kernel of ``w`` waves keeps the device busy ``w / (1 + w)``
    of its time (:func:`wave_occupancy`; 0: no such fall, the plateau at every size).
    ``launch_s`` is the floor: the GPU's own time for the smallest kernel. The kernel
    formula is :func:`costmodel.roofline.kernel_seconds`.

    >>> e = KernelEfficiency(compute={"tf32": 0.5, "any": 0.4}, memory=0.8, launch_s=1e-5)
    >>> e.compute_at("tf32"), e.compute_at("bf16")
    (0.5, 0.4)
    """

    compute: dict
    memory: float
    launch_s: float = 0.0
    tile_elements: float = 0.0

    def compute_at(self, precision):
        for key in (precision, *PRECISION_FALLBACK.get(precision, ()), "any", "fp32"):
            if key in self.compute:
                return self.compute[key]
        return min(self.compute.values())

    @classmethod
    def parse(cls, value):
        """From a kinds-file entry: a number (one fraction for compute and memory, no
        floor, no waves: the datasheet guesses) or ``{"compute": {...}, "memory": m,
        "launch_s": t, "tile_elements": n}`` (the last two optional: 0). ValueError
        for a negative ``launch_s`` or ``tile_elements``.

        >>> KernelEfficiency.parse({"compute": {"any": 1}, "memory": 0.5}).tile_elements
        0.0
        """
        if isinstance(value, (int, float)):
            return cls(compute={"any": float(value)}, memory=float(value))
        launch, tile = float(value.get("launch_s", 0.0)), float(value.get("tile_elements", 0.0))
        if not (launch >= 0 and tile >= 0):
            raise ValueError("launch_s and tile_elements must not be negative")
        return cls(compute={k: float(v) for k, v in value["compute"].items()},
                   memory=float(value["memory"]), launch_s=launch, tile_elements=tile)

    def to_json(self):
        """The kinds-file entry (:meth:`parse` reads it back); ``tile_elements`` only
        where the class has one, so an old table's entry is written as it was."""
        entry = {"compute": dict(sorted(self.compute.items())), "memory": self.memory,
                 "launch_s": self.launch_s}
        return dict(entry, tile_elements=self.tile_elements) if self.tile_elements \
            else entry


def wave_occupancy(elements, tile_elements, multiprocessors):
    """The share of its time a kernel touching ``elements`` keeps a device of
    ``multiprocessors`` busy: ``w / (1 + w)`` for ``w = elements / (tile_elements *
    multiprocessors)`` waves of tiles, as if the kernel ran one wave more than its
    work fills (the last, partial wave and the first one's ramp); 1 where there is no
    tile size, no count of multiprocessors, or no elements. Works on numbers and numpy
    arrays of ``elements`` alike.

    >>> wave_occupancy(13_200, 1000, 132), wave_occupancy(10**9, 1000, 132) > 0.999
    (0.09090909090909091, True)
    >>> wave_occupancy(10, 1000, None), wave_occupancy(10, 0.0, 132)
    (1.0, 1.0)
    """
    if not tile_elements or not multiprocessors:
        return 1.0
    per_wave = tile_elements * multiprocessors
    if isinstance(elements, (int, float, np.number)):  # the cost model's: one op at a time
        return elements / (per_wave + elements) if elements > 0 else 1.0
    waves = np.asarray(elements, dtype=float) / per_wave
    return np.where(waves > 0, waves / (1.0 + waves), 1.0)


# An efficiency fitted at one precision stands in for another of the same units.
PRECISION_FALLBACK = {"fp16": ("bf16",), "bf16": ("fp16",)}
UNIT_EFFICIENCY = KernelEfficiency(compute={"any": 1.0}, memory=1.0)


@dataclass(frozen=True)
class DeviceKind:
    """Datasheet figures of one kind of device (units: FLOP/s, bytes/s, bytes, s).

    ``peaks`` maps a precision to its peak (``peak_flops`` is the fp32 one);
    ``efficiency`` maps a kernel class (:func:`tfpart.core.ops.kernel_class`) or a coarse
    class to its :class:`KernelEfficiency`; ``multiprocessors`` is a GPU's count of
    streaming multiprocessors (None where the kinds file gives none: no waves).
    ``op_overhead_s`` is the host's cost of issuing one op (on a CPU, the executor's
    whole cost per op), ``op_overhead_source`` where that figure comes from (None in
    a kinds file that does not say)."""

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory: float
    host_link_bandwidth: float
    peer_link_bandwidth: float
    efficiency: dict
    op_overhead_s: float
    source: str
    peaks: dict = field(default_factory=dict)
    host_link_latency: float = 0.0
    multiprocessors: int | None = None
    op_overhead_source: str | None = None

    def peak(self, precision):
        """Peak FLOP/s at ``precision`` (the fp32 peak if the kind lacks it)."""
        return self.peaks.get(precision, self.peak_flops)

    def kernel_efficiency(self, op_type, table=None):
        """The :class:`KernelEfficiency` of ``op_type`` from ``table`` (class ->
        KernelEfficiency; default: the kind's own): its kernel class, else its coarse
        class, else 1."""
        table = self.efficiency if table is None else table
        for name in class_lineage(kernel_class(op_type)):
            if name in table:
                return table[name]
        return UNIT_EFFICIENCY


_KIND_FIELDS = ("peak_flops", "memory_bandwidth", "memory", "host_link_bandwidth",
                "peer_link_bandwidth", "efficiency", "op_overhead_s", "source")


@lru_cache(maxsize=None)
def load_device_kinds(path=DEVICE_KINDS_FILE):
    """Read the device-kind profiles; raise ProfileError naming the bad entry."""
    return kinds_from_dict(kinds_entries(path), path)


def kinds_entries(path):
    """The ``"kinds"`` mapping of a kinds file; ProfileError naming it if unreadable."""
    data = read_json(path, ProfileError)
    if not isinstance(data, dict) or not isinstance(data.get("kinds"), dict):
        raise ProfileError(path, "cannot read device kinds: no \"kinds\" object")
    return data["kinds"]


def kinds_from_dict(raw, source, known=None):
    """Device kinds from a ``"kinds"`` mapping (a kinds file's, or a cluster.json's
    own), on top of ``known`` ones. An entry may take its efficiency table from a
    calibrated kind (``"efficiency_from": "H100"``, defined before or after it)
    instead of giving one, and may be ``{"alias_of": name}``; ProfileError names the
    entry and the problem.

    >>> entry = {"peak_flops": {"fp32": 1e13}, "memory_bandwidth": 1e12, "memory": 1e10,
    ...          "host_link_bandwidth": 1e10, "peer_link_bandwidth": 1e10, "source": "x"}
    >>> raw = {"A": dict(entry, efficiency_from="B"), "B": dict(entry, efficiency_from="H100"),
    ...        "C": {"alias_of": "A"}}
    >>> kinds = kinds_from_dict(raw, "kinds.json", known=load_device_kinds())
    >>> kinds["C"] is kinds["A"], kinds["A"].efficiency == kinds["H100"].efficiency
    (True, True)
    """
    kinds = dict(known or {})
    own = {name: entry for name, entry in raw.items()
           if not (isinstance(entry, dict) and "alias_of" in entry)}
    names = list(own)
    rounds = _inheritance_rounds([_base_of(own[n]) for n in names], names, kinds)
    for k in sorted((k for k in range(len(names)) if rounds[k] is not None),
                    key=lambda k: (rounds[k], k)):
        entry = own[names[k]]
        kinds[names[k]] = _kind(names[k], entry, kinds.get(_base_of(entry)), source)
    stuck = [names[k] for k in range(len(names)) if rounds[k] is None]
    if stuck:
        base = own[stuck[0]]["efficiency_from"]
        problem = f"inherits, through {base!r}, from itself" if base in own else \
            f"names unknown kind {base!r}"
        raise ProfileError(source, f"kind {stuck[0]!r}: efficiency_from {problem}")
    for name, entry in raw.items():
        if name not in own:
            if entry["alias_of"] not in kinds:
                raise ProfileError(source, f"kind {name!r} aliases unknown "
                                   f"{entry['alias_of']!r}")
            kinds[name] = kinds[entry["alias_of"]]
    return kinds


def _base_of(entry):
    return entry.get("efficiency_from") if isinstance(entry, dict) else None


def _inheritance_rounds(bases, names, known):
    """For entries ``names`` inheriting from ``bases`` (None: from nothing): the round
    in which each can be made when each round makes, in order, every entry whose base
    is known or made before it (an entry after its base in the same round, a round
    later if before it); None if never (an unknown base, or a cycle). Made in order
    of (round, position), each entry sees the same bases as when rounds repeat until
    nothing changes, in time linear in the entries rather than quadratic.

    >>> _inheritance_rounds([None, "z", "a", "b", "x"], ["a", "b", "c", "d", "e"], {"x"})
    [1, None, 1, None, 1]
    >>> _inheritance_rounds(["c", None, "b"], ["a", "b", "c"], set())
    [2, 1, 1]
    >>> _inheritance_rounds(["b", "a", "a"], ["a", "b", "c"], set())
    [None, None, None]
    """
    position = {name: k for k, name in enumerate(names)}
    rounds = [0] * len(names)  # 0: not yet known
    for start in range(len(names)):
        path, on_path, k = [], set(), start
        while rounds[k] == 0:
            base = bases[k]
            if base is None or base in known:
                rounds[k] = 1
            elif base not in position or k in on_path:
                rounds[k] = None  # unknown, or a cycle: so is every entry leading here
            else:
                path.append(k)
                on_path.add(k)
                k = position[base]
        for j in reversed(path):
            b = position[bases[j]]
            rounds[j] = None if rounds[b] is None else rounds[b] + (b > j)
    return rounds


def _kind(name, entry, base, source):
    if not isinstance(entry, dict):
        raise ProfileError(source, f"kind {name!r} must be an object")
    inherited = {"efficiency": base.efficiency, "op_overhead_s": base.op_overhead_s,
                 "multiprocessors": base.multiprocessors} if base is not None else {}
    missing = [f for f in _KIND_FIELDS if f not in entry and f not in inherited]
    if missing:
        raise ProfileError(source, f"kind {name!r} lacks {', '.join(missing)}")
    peaks = entry["peak_flops"]
    if not isinstance(peaks, dict) or not all(_positive(v) for v in peaks.values()):
        raise ProfileError(source, f"kind {name!r}: peak_flops must map precisions to "
                           "positive numbers")
    numbers = {f: entry.get(f, inherited.get(f)) for f in _KIND_FIELDS
               if f not in ("efficiency", "source", "peak_flops")}
    numbers["peak_flops"] = peaks.get("fp32", 0)
    bad = [f for f, v in numbers.items() if not _positive(v)]
    if bad:
        raise ProfileError(source, f"kind {name!r}: {', '.join(bad)} must be positive numbers")
    try:
        efficiency = {cls: KernelEfficiency.parse(value) for cls, value in
                      entry["efficiency"].items()} if "efficiency" in entry \
            else dict(inherited["efficiency"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(source, f"kind {name!r}: efficiency: {exc!r} (each class takes a "
                           "number or {compute: {precision: fraction}, memory, launch_s, "
                           "tile_elements})") from None
    latency = entry.get("host_link_latency", 0.0)
    return DeviceKind(name=name, efficiency=efficiency, source=entry["source"],
                      peaks={k: float(v) for k, v in peaks.items()},
                      host_link_latency=float(latency),
                      multiprocessors=_multiprocessors(name, entry, inherited, source),
                      op_overhead_source=_overhead_source(name, entry, base, source),
                      **numbers)


def _multiprocessors(name, entry, inherited, source):
    """A kind's ``multiprocessors``: its own (a positive whole number), else the one of
    the kind it takes its efficiencies from, else None."""
    count = entry.get("multiprocessors", inherited.get("multiprocessors"))
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise ProfileError(source, f"kind {name!r}: multiprocessors must be a positive "
                           "whole number")
    return count


def _overhead_source(name, entry, base, source):
    """Where a kind's ``op_overhead_s`` comes from: its ``op_overhead_source``, else,
    when the figure itself is inherited, the source of the kind it comes from."""
    said = entry.get("op_overhead_source")
    if said is None and "op_overhead_s" not in entry and base is not None:
        return base.op_overhead_source
    if said is not None and (not isinstance(said, str) or not said.strip()):
        raise ProfileError(source, f"kind {name!r}: op_overhead_source must be a "
                           "non-empty string")
    return said


def _positive(value):
    """A positive, finite number (not a bool).

    >>> _positive(2.5), _positive(float("nan")), _positive(float("inf")), _positive(True)
    (True, False, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value > 0
