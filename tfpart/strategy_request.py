"""What a compile plans, resolved once from the user's flags: the algorithms it
compares, and the options, micro-batches and schedule they get.

``--pipeline``, ``--strategy pipeline``, ``--algorithm pipeline``, ``--microbatches``
and ``--schedule`` all ask for one thing, pipeline stages; ``--microbatches`` and
``--schedule`` with a strategy or algorithm named go to it if it declares that it takes
them (:class:`partitioner.registry.Algorithm`: a plug-in may), else are refused naming
what it takes. ``--strategy auto`` (the default when nothing names an algorithm)
compares every strategy that declares it, with its default options. Flags that ask for
two different things are refused, not one of them dropped.

Examples
--------
>>> resolve_strategy().algorithms
('greedy', 'pipeline', 'data_parallel', 'filter_split', 'hybrid')
>>> resolve_strategy(microbatches=4).algorithms
('pipeline',)
>>> resolve_strategy(algorithm="ilp", options=["time_limit=5"]).options.time_limit
5.0
>>> resolve_strategy(strategy="hybrid", schedule="gpipe")
Traceback (most recent call last):
...
tfpart.core.errors.PlacementError: --strategy hybrid and a pipeline flag (--pipeline, --microbatches, --schedule, --algorithm pipeline) ask for two strategies: hybrid takes its options (HybridOptions) and makes replicas; no micro-batches or schedule
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tfpart.core.errors import PlacementError

PIPELINE = "pipeline"
# strategies that are one algorithm of the registry each (a placement has several)
WHOLE_STRATEGIES = ("data_parallel", "filter_split", "hybrid")
STRATEGY_CHOICES = ("auto", "placement", PIPELINE, *WHOLE_STRATEGIES)
PIPELINE_FLAGS = "a pipeline flag (--pipeline, --microbatches, --schedule, --algorithm pipeline)"


def auto_strategies():
    """What ``--strategy auto`` compares: the registry's algorithms that declare it,
    tfpart's own and installed plug-ins' (:func:`partitioner.registry.auto_candidates`);
    on equal steps the first (the simplest) wins.

    >>> auto_strategies()[0]
    'greedy'
    """
    from partitioner.registry import auto_candidates  # the algorithms: slow to import

    return auto_candidates()


@dataclass(frozen=True)
class StrategyRequest:
    """The algorithms a compile plans with (several: ``--strategy auto``, the least
    predicted step wins) and, for a single one, its options; the micro-batches and
    training schedule it is held to, when it declares that it takes them (None: its
    own, or chosen by simulation)."""

    algorithms: tuple[str, ...]
    options: object = None
    microbatches: int | None = None
    schedule: str | None = None

    @property
    def compares(self):
        """Whether several strategies are planned and the fastest kept."""
        return len(self.algorithms) > 1


def algorithm_options(name, options=None):
    """The options dataclass of algorithm ``name`` from ``options``: None (defaults),
    an instance, a dict of field -> value, or ``key=value`` strings (``--option``).

    >>> algorithm_options("random", {"seed": 3}).seed
    3
    """
    from partitioner.registry import parse_options  # the algorithms: slow to import

    if options is None or dataclasses.is_dataclass(options):
        return parse_options(name, (), base=options)
    if isinstance(options, dict):
        options = [f"{key}={value}" for key, value in options.items()]
    return parse_options(name, options)


def resolve_strategy(strategy=None, algorithm=None, *, pipeline=False, microbatches=None,
                     schedule=None, options=None, default="auto"):
    """The :class:`StrategyRequest` of a compile's flags (or of the same keywords of
    :func:`tfpart.compile.compile_model`).

    ``strategy``: one of :data:`STRATEGY_CHOICES` or None (``default``, the CLI's
    ``auto`` or the Python API's ``placement``, unless an algorithm, options or a
    pipeline flag is given); ``algorithm``: an entry of
    :mod:`partitioner.registry`; ``options``: its options (see
    :func:`algorithm_options`).

    Raises
    ------
    PlacementError
        If the flags ask for two strategies, or options for an algorithm that is not
        used, or micro-batches or a schedule for one that does not take them (as
        :mod:`partitioner.registry` declares), or the options are invalid.

    >>> resolve_strategy(default="placement").algorithms
    ('greedy',)
    >>> resolve_strategy(algorithm="pipeline", schedule="1f1b").schedule
    '1f1b'
    """
    if strategy is not None and strategy not in STRATEGY_CHOICES:
        raise PlacementError("", f"no strategy {strategy!r}; the strategies are "
                             f"{', '.join(STRATEGY_CHOICES)}")
    names_pipeline = pipeline or algorithm == PIPELINE or strategy == PIPELINE
    # for the strategy named (the pipeline if none is): checked against what it takes
    asks_microbatches = microbatches is not None or schedule is not None
    if (names_pipeline and strategy not in (None, PIPELINE)) or (
            asks_microbatches and strategy in ("auto", "placement")):
        raise PlacementError("", f"--strategy {strategy} and {PIPELINE_FLAGS} ask for two "
                             "strategies")
    if strategy is None and algorithm is None and not names_pipeline \
            and not asks_microbatches and not options:
        strategy = default
    if strategy == "auto":
        if algorithm is not None or options:
            raise PlacementError("", "--strategy auto plans every strategy with its default "
                                 "options; --algorithm and --option need --strategy "
                                 "placement or the strategy they are for")
        return StrategyRequest(auto_strategies())
    named = PIPELINE if names_pipeline else \
        strategy if strategy in WHOLE_STRATEGIES else None
    if named is not None and algorithm not in (None, named):
        raise PlacementError("", f"--algorithm {algorithm} and "
                             f"{'a pipeline' if named == PIPELINE else '--strategy ' + named} "
                             "ask for two strategies")
    chosen = named or algorithm or (PIPELINE if asks_microbatches else "greedy")
    if asks_microbatches:
        _check_takes(chosen, f"--strategy {strategy}" if strategy in WHOLE_STRATEGIES
                     else f"--algorithm {chosen}", microbatches, schedule)
    return StrategyRequest((chosen,), algorithm_options(chosen, options), microbatches,
                           schedule)


def _check_takes(name, asked_by, microbatches, schedule):
    """PlacementError if algorithm ``name`` (``asked_by``: the flag that named it)
    takes no micro-batches while ``microbatches`` or ``schedule`` asks for them, or not
    the ``schedule`` asked: one line naming it and what it takes (its declaration in
    :mod:`partitioner.registry`).

    >>> _check_takes("pipeline", "--algorithm pipeline", 4, "gpipe")
    >>> _check_takes("greedy", "--algorithm greedy", 4, None)
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: --algorithm greedy and a pipeline flag (--pipeline, --microbatches, --schedule, --algorithm pipeline) ask for two strategies: greedy takes its options (GreedyOptions); no micro-batches or schedule
    >>> _check_takes("pipeline", "--algorithm pipeline", None, "zigzag")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tfpart.core.errors.PlacementError: --schedule zigzag: pipeline takes its options (PipelineOptions), micro-batches (--microbatches) and the schedules gpipe, 1f1b, ... (--schedule)
    """
    from partitioner.registry import get  # the algorithms: slow to import

    algorithm = get(name)
    if not (algorithm.microbatches or algorithm.schedules):
        raise PlacementError("", f"{asked_by} and {PIPELINE_FLAGS} ask for two strategies: "
                             f"{algorithm.takes}")
    if microbatches is not None and not algorithm.microbatches:
        raise PlacementError("", f"--microbatches {microbatches}: {algorithm.takes}")
    if schedule is not None and schedule not in algorithm.schedules:
        raise PlacementError("", f"--schedule {schedule}: {algorithm.takes}")
