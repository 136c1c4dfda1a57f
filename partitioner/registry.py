"""The one registry of algorithms: name -> partition function, options dataclass, and
what each declares it takes (micro-batches, schedules, replicas, whether ``--strategy
auto`` plans it) and the line it gives on its plans (:class:`Algorithm`).

The CLI (``--algorithm NAME --option key=value``) and the API
(``compile_model(..., algorithm=NAME, options={...})``) both read it; every plan echoes
its options into plan.json. A request is checked against the declaration
(:mod:`tfpart.strategy_request`), auto's candidates come from it
(:func:`auto_candidates`), and the summary, report and picture print its
:func:`describe_plan`: an installed plug-in (:func:`plugin`) is one of these like
tfpart's own.

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

from costmodel.schedules import SCHEDULES
from partitioner import (data_parallel, filter_split, greedy, hybrid, ilp, m_etf, m_topo, min_cut, pipeline,
                         random_placement, round_robin, single_device, topo_split)
from tfpart.core.errors import PlacementError
from tfpart.core.plan_lines import pipeline_line, replicas_line, splits_line

PLUGIN_ORDER = 100  # a plug-in's default place in auto's order: after tfpart's own


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm, ``partition(cost, options) -> Plan``, and what it
    declares it takes, which the compile reads instead of its name.

    Attributes
    ----------
    name, partition, options, summary
        Its name (``--algorithm``), its function, its options dataclass (``--option``)
        and a line of help.
    stages : bool
        It makes pipeline stages (run by the pipeline pass) rather than a placement.
    replicates : bool
        It splits every batch into replicas.
    splits : bool
        It splits ops' output channels across devices.
    microbatches : bool
        It takes ``--microbatches``, given to its options' ``microbatches`` field (and
        makes stages).
    schedules : tuple of str
        The ``--schedule`` names it takes, given to its options' ``schedule`` field.
    auto : bool
        ``--strategy auto`` plans it, in ``auto_order`` (lower first; on equal predicted
        steps the first wins).
    describe : callable or None
        ``describe(plan) -> str``: one line on what it made, printed by ``tfpart
        compile``'s summary, the report and the placement picture
        (:func:`describe_plan`); None for a placement of whole ops, which the table of
        devices says all of.
    making : str
        What it makes, for the progress line ("pipeline stages").
    """

    name: str
    partition: typing.Callable
    options: type
    summary: str
    stages: bool = False
    replicates: bool = False
    splits: bool = False
    making: str = ""
    microbatches: bool = False
    schedules: tuple[str, ...] = ()
    auto: bool = False
    auto_order: int = PLUGIN_ORDER
    describe: typing.Callable | None = None

    @property
    def rebuilt(self):
        """Whether its plans are built anew by the pipeline pass (stages, replicas,
        splits) rather than written into the original graph."""
        return self.stages or self.splits

    @property
    def takes(self):
        """One line on what a compile may ask of it beyond ``--option``.

        >>> REGISTRY["greedy"].takes
        'greedy takes its options (GreedyOptions); no micro-batches or schedule'
        >>> REGISTRY["data_parallel"].takes
        'data_parallel takes its options (DataParallelOptions) and makes replicas; no micro-batches or schedule'
        """
        taken = [f"its options ({self.options.__name__})"]
        if self.microbatches:
            taken.append("micro-batches (--microbatches)")
        if self.schedules:
            taken.append(f"the schedule{'s' * (len(self.schedules) > 1)} "
                         f"{', '.join(self.schedules)} (--schedule)")
        missing = [what for what, declared in (("micro-batches", self.microbatches),
                                               ("schedule", self.schedules)) if not declared]
        listed = taken[0] if len(taken) == 1 else f"{', '.join(taken[:-1])} and {taken[-1]}"
        replicas = " and makes replicas" if self.replicates else ""
        lacking = f"; no {' or '.join(missing)}" if missing else ""
        return f"{self.name} takes {listed}{replicas}{lacking}"


def _entry(name, module, options, auto_order=None, making=None, **declared):
    return Algorithm(name=name, partition=module.partition, options=options,
                     summary=module.__doc__.strip().splitlines()[0],
                     making=making or f"a placement with {name}",
                     auto=auto_order is not None,
                     auto_order=PLUGIN_ORDER if auto_order is None else auto_order, **declared)


REGISTRY = {algorithm.name: algorithm for algorithm in [
    _entry("greedy", greedy, greedy.GreedyOptions, auto_order=0),
    _entry("ilp", ilp, ilp.ILPOptions),
    _entry("single", single_device, single_device.SingleDeviceOptions),
    _entry("random", random_placement, random_placement.RandomOptions),
    _entry("round_robin", round_robin, round_robin.RoundRobinOptions),
    _entry("m_topo", m_topo, m_topo.MTopoOptions),
    _entry("m_etf", m_etf, m_etf.METFOptions),
    _entry("min_cut", min_cut, min_cut.MinCutOptions),
    _entry("topo_split", topo_split, topo_split.TopoSplitOptions),
    _entry("pipeline", pipeline, pipeline.PipelineOptions, auto_order=1, stages=True,
           microbatches=True, schedules=SCHEDULES, describe=pipeline_line,
           making="pipeline stages"),
    _entry("data_parallel", data_parallel, data_parallel.DataParallelOptions, auto_order=2,
           stages=True, replicates=True, describe=replicas_line,
           making="data-parallel replicas"),
    _entry("filter_split", filter_split, filter_split.FilterSplitOptions, auto_order=3,
           splits=True, describe=splits_line, making="a placement with filter splits"),
    _entry("hybrid", hybrid, hybrid.HybridOptions, auto_order=4, stages=True,
           replicates=True, describe=replicas_line,
           making="replicas of a placement or of a pipeline"),
]}


PLUGIN_GROUP = "tfpart.algorithms"


def plugin(module, options, stages=False, replicates=False, splits=False, *,
           microbatches=False, schedules=(), auto=False, auto_order=PLUGIN_ORDER,
           describe=None, making=None):
    """An :class:`Algorithm` from a module outside tfpart, with what it declares it
    takes: ``module.partition(cost, options) -> Plan``, its options dataclass, its
    docstring's first line as summary. An installed package offers it under the
    ``tfpart.algorithms`` entry-point group (``name = package.module:ALGORITHM`` with
    ``ALGORITHM = plugin(...)`` in that module), and ``--algorithm name`` finds it: no
    file of tfpart changes.

    ``microbatches=True`` (it makes stages over micro-batches) has ``--microbatches``
    set its options' ``microbatches`` field, and ``schedules`` the ``--schedule`` names
    it takes, its ``schedule`` field; the compile also sets a ``batch_size`` field to the
    model's batch. ``auto=True`` has ``--strategy auto`` plan it too, in ``auto_order``
    (after tfpart's own by default). ``describe(plan) -> str`` (default: the module's
    own ``describe``, if any) is its plan's line in the summary, report and picture.

    >>> from partitioner import single_device
    >>> plugin(single_device, single_device.SingleDeviceOptions).name
    'single_device'
    >>> plugin(single_device, single_device.SingleDeviceOptions, microbatches=True)
    Traceback (most recent call last):
    ...
    TypeError: plug-in single_device takes micro-batches: its options SingleDeviceOptions need a 'microbatches' field
    """
    fields = {f.name for f in dataclasses.fields(options)}
    name = module.__name__.rsplit(".", 1)[-1]
    for declared, taken, field in ((microbatches, "micro-batches", "microbatches"),
                                   (schedules, "schedules", "schedule")):
        if declared and field not in fields:
            raise TypeError(f"plug-in {name} takes {taken}: its options "
                            f"{options.__name__} need a {field!r} field")
    return _entry(name, module, options, auto_order=auto_order if auto else None,
                  making=making or (f"{name}'s stages" if stages or microbatches else None),
                  stages=stages or microbatches, replicates=replicates, splits=splits,
                  microbatches=microbatches, schedules=tuple(schedules),
                  describe=describe or getattr(module, "describe", None))


@functools.cache  # read once per process: every lookup of a plug-in comes here
def _installed_plugins():
    """The algorithms installed packages offer (:func:`plugin`), by entry-point name,
    and why each one that cannot be loaded cannot (a PlacementError)."""
    from importlib.metadata import entry_points

    found, broken = {}, {}
    for point in entry_points(group=PLUGIN_GROUP):
        try:
            algorithm = point.load()
        except Exception as exc:  # noqa: BLE001 (someone else's module: any error is theirs)
            broken[point.name] = PlacementError("", f"plug-in algorithm {point.name} "
                                                f"({point.value}) cannot be loaded: "
                                                f"{type(exc).__name__}: {exc}")
            continue
        if not isinstance(algorithm, Algorithm):
            broken[point.name] = PlacementError("", f"plug-in algorithm {point.name} "
                                                f"({point.value}) is not an Algorithm "
                                                "(make it with partitioner.registry.plugin)")
            continue
        found[point.name] = dataclasses.replace(algorithm, name=point.name)
    return found, broken


def auto_candidates():
    """The algorithms ``--strategy auto`` plans: tfpart's own and installed plug-ins'
    that declare ``auto``, in their ``auto_order`` (on equal predicted steps the first
    wins).

    >>> auto_candidates()[:5]
    ('greedy', 'pipeline', 'data_parallel', 'filter_split', 'hybrid')
    """
    algorithms = [*REGISTRY.values(), *_installed_plugins()[0].values()]
    return tuple(a.name for a in sorted(algorithms, key=lambda a: (a.auto_order, a.name))
                 if a.auto)


def broken_plugins():
    """Why each installed plug-in that cannot be loaded cannot, by entry-point name (a
    PlacementError): ``--strategy auto`` lists them among the strategies it refused,
    since whether they declare ``auto`` is unknown.

    >>> broken_plugins()
    {}
    """
    return dict(_installed_plugins()[1])


def describe_plan(plan):
    """The line ``plan``'s algorithm gives on it (its ``describe``); None for a
    placement of whole ops, or when that algorithm is not installed here.

    >>> from tfpart.core.plan import Plan
    >>> describe_plan(Plan(assignment={}, algorithm="filter_split", splits={}))
    'Filter split: no split shortens the predicted step; a placement of whole ops'
    >>> describe_plan(Plan(assignment={"x": "A"}, algorithm="greedy")) is None
    True
    """
    algorithm = REGISTRY.get(plan.algorithm) or _installed_plugins()[0].get(plan.algorithm)
    if algorithm is None or algorithm.describe is None:
        return None
    return algorithm.describe(plan)


def get(name):
    """The registered algorithm ``name``, tfpart's own or an installed plug-in's
    (:func:`plugin`); PlacementError naming the choices if none."""
    if name in REGISTRY:
        return REGISTRY[name]
    plugins, broken = _installed_plugins()
    if name in broken:
        raise broken[name]
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
