"""The one registry of algorithms: name -> partition function and options dataclass.

The CLI (``--algorithm NAME --option key=value``) and the API
(``compile_model(..., algorithm=NAME, options={...})``) both read it; every plan echoes
its options into plan.json.

Examples
--------
>>> sorted(REGISTRY)[:4]
['data_parallel', 'filter_split', 'greedy', 'hybrid']
>>> parse_options("ilp", ["time_limit=5", "coarsen.target_units=20"])
ILPOptions(time_limit=5.0, mip_gap=0.0001, solver='highs', max_units=40, link_queues=True, coarsen=CoarsenOptions(chains=True, name_scope_depth=None, target_units=20, weights_with_reader=False))
>>> parse_options("greedy", ["insertion=maybe"])
Traceback (most recent call last):
...
tfpart.core.errors.PlacementError: --option insertion=maybe: not a bool (true or false)
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass

from partitioner import (data_parallel, filter_split, greedy, hybrid, ilp, m_etf, m_topo, min_cut, pipeline,
                         random_placement, round_robin, single_device, topo_split)
from tfpart.core.errors import PlacementError


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: ``partition(cost, options) -> Plan``."""

    name: str
    partition: typing.Callable
    options: type  # its options dataclass
    summary: str
    stages: bool = False  # makes pipeline stages rather than a placement
    replicates: bool = False  # splits every batch into replicas
    splits: bool = False  # splits ops' output channels across devices
    making: str = ""  # what it makes, for the progress line ("pipeline stages")

    @property
    def rebuilt(self):
        """Whether its plans are built anew by the pipeline pass (stages, replicas,
        splits) rather than written into the original graph."""
        return self.stages or self.splits


def _entry(name, module, options, stages=False, replicates=False, splits=False,
           making=None):
    return Algorithm(name=name, partition=module.partition, options=options,
                     summary=module.__doc__.strip().splitlines()[0], stages=stages,
                     replicates=replicates, splits=splits,
                     making=making or f"a placement with {name}")


REGISTRY = {algorithm.name: algorithm for algorithm in [
    _entry("greedy", greedy, greedy.GreedyOptions),
    _entry("ilp", ilp, ilp.ILPOptions),
    _entry("single", single_device, single_device.SingleDeviceOptions),
    _entry("random", random_placement, random_placement.RandomOptions),
    _entry("round_robin", round_robin, round_robin.RoundRobinOptions),
    _entry("m_topo", m_topo, m_topo.MTopoOptions),
    _entry("m_etf", m_etf, m_etf.METFOptions),
    _entry("min_cut", min_cut, min_cut.MinCutOptions),
    _entry("topo_split", topo_split, topo_split.TopoSplitOptions),
    _entry("pipeline", pipeline, pipeline.PipelineOptions, stages=True,
           making="pipeline stages"),
    _entry("data_parallel", data_parallel, data_parallel.DataParallelOptions, stages=True,
           replicates=True, making="data-parallel replicas"),
    _entry("filter_split", filter_split, filter_split.FilterSplitOptions, splits=True,
           making="a placement with filter splits"),
    _entry("hybrid", hybrid, hybrid.HybridOptions, stages=True, replicates=True,
           making="replicas of a placement or of a pipeline"),
]}


PLUGIN_GROUP = "tfpart.algorithms"


def plugin(module, options, stages=False, replicates=False, splits=False):
    """An :class:`Algorithm` from a module outside tfpart: ``module.partition(cost,
    options) -> Plan``, its options dataclass, its docstring's first line as summary.
    An installed package offers it under the ``tfpart.algorithms`` entry-point group
    (``name = package.module:ALGORITHM`` with ``ALGORITHM = plugin(...)`` in that
    module), and ``--algorithm name`` finds it: no file of tfpart changes.

    >>> from partitioner import single_device
    >>> plugin(single_device, single_device.SingleDeviceOptions).name
    'single_device'
    """
    return _entry(module.__name__.rsplit(".", 1)[-1], module, options, stages, replicates,
                  splits)


@functools.cache  # read once per process: every lookup of a plug-in comes here
def _installed_plugins():
    """The algorithms installed packages offer (:func:`plugin`), by entry-point name."""
    from importlib.metadata import entry_points

    found = {}
    for point in entry_points(group=PLUGIN_GROUP):
        algorithm = point.load()
        found[point.name] = dataclasses.replace(algorithm, name=point.name)
    return found


def get(name):
    """The registered algorithm ``name``, tfpart's own or an installed plug-in's
    (:func:`plugin`); PlacementError naming the choices if none."""
    if name in REGISTRY:
        return REGISTRY[name]
    plugins = _installed_plugins()
    if name not in plugins:
        raise PlacementError("", f"no algorithm {name!r} (choose from "
                             f"{', '.join(sorted({*REGISTRY, *plugins}))})")
    return plugins[name]


def parse_options(name, pairs=(), base=None):
    """The options dataclass of algorithm ``name`` with ``key=value`` strings applied
    (``a.b=v`` sets field ``b`` of the nested options ``a``), each converted to its
    field's type; PlacementError names an unknown key or a bad value."""
    options = base if base is not None else get(name).options()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PlacementError("", f"--option {pair}: expected key=value")
        options = _set(options, key.split("."), value, pair)
    return options


def _set(options, path, text, pair):
    fields = {f.name: f for f in dataclasses.fields(options)}
    if path[0] not in fields:
        raise PlacementError("", f"--option {pair}: {type(options).__name__} has no "
                             f"{path[0]!r} (has: {', '.join(fields)})")
    current = getattr(options, path[0])
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise PlacementError("", f"--option {pair}: {path[0]!r} has no fields")
        value = _set(current, path[1:], text, pair)
    else:
        hints = typing.get_type_hints(type(options))
        value = _convert(text, hints[path[0]], pair)
    return dataclasses.replace(options, **{path[0]: value})


MAX_OPTION_INT = 2**31 - 1  # every count, limit and seed of the options fits int32
SIGNED_OPTIONS = ("min_gain",)  # filter_split's: below 0 keeps every split


def _bounded(value, pair):
    """``value`` if it is a number within its option's range: an int from 0 to
    :data:`MAX_OPTION_INT` (every int option is a count, a limit or a seed), a float
    finite and, but for :data:`SIGNED_OPTIONS`, not negative (times, fractions, gaps);
    else PlacementError naming the option.

    >>> _bounded(float("nan"), "time_limit=nan")
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: --option time_limit=nan: must be a finite number
    >>> _bounded(10**400, "seed=1" + "0" * 400)
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: --option seed=1000...: must be from 0 to 2147483647
    >>> _bounded(-1.0, "min_gain=-1")
    -1.0
    """
    if isinstance(value, int):
        if not 0 <= value <= MAX_OPTION_INT:
            raise PlacementError("", f"--option {_short(pair)}: must be from 0 to "
                                 f"{MAX_OPTION_INT}")
        return value
    if not math.isfinite(value):
        raise PlacementError("", f"--option {_short(pair)}: must be a finite number")
    if value < 0 and pair.split("=")[0].split(".")[-1] not in SIGNED_OPTIONS:
        raise PlacementError("", f"--option {_short(pair)}: must not be negative")
    return value


def _short(pair, most=40):
    """``pair`` cut to ``most`` characters (a number of 400 digits, say)."""
    return pair if len(pair) <= most else pair[:most - 3] + "..."


def _convert(text, hint, pair):
    """``text`` as a value of type ``hint`` (bool, int, float, str, or X | None)."""
    allowed = typing.get_args(hint) or (hint,)
    if type(None) in allowed and text.lower() == "none":
        return None
    for kind in (bool, int, float, str):
        if kind not in allowed:
            continue
        if kind is bool:
            if text.lower() in ("true", "1", "yes", "false", "0", "no"):
                return text.lower() in ("true", "1", "yes")
            raise PlacementError("", f"--option {pair}: not a bool (true or false)")
        try:
            value = kind(text)
        except ValueError:
            article = "an" if kind is int else "a"
            raise PlacementError("", f"--option {pair}: not {article} {kind.__name__}") \
                from None
        return _bounded(value, pair) if kind in (int, float) else value
    raise PlacementError("", f"--option {pair}: cannot set a field of type {hint}")
