"""Plan: the result of partitioning, and its JSON form (plan.json).

A plan maps every op to a device name (``assignment``), optionally to a pipeline stage
(:class:`Stages`), and records the algorithm and options that made it and the
cost-model figures it was based on, so a reader sees what was predicted and how far
from optimal it can be.

Plans are validated against a graph and cluster by :func:`partitioner.validate.check_plan`.

Examples
--------
>>> plan = Plan(assignment={"a": "/device:CPU:0"}, lower_bound=1.6,
...             predicted=Predicted(step_time=2.0, devices={}))
>>> Plan.from_dict(plan.to_dict()) == plan, round(plan.gap, 2)
(True, 0.25)
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tfpart.core.errors import OutputError, PlacementError
from tfpart.core.input_files import json_text, read_json
from tfpart.core.splits import part_of

PLAN_FORMAT_VERSION = 3  # 3: one stages object; 2 (still read): stages, microbatches, schedule
MAX_PLAN_BYTES = 512 * 2**20  # a million ops' assignments, stages and replicas' placements
SCHEMA_FILE = Path(__file__).with_name("plan_schema.json")


@dataclass
class DeviceFigures:
    """What the cost model predicts for one device (every algorithm fills these)."""

    kind: str
    busy_s: float  # compute time in the step (in a pipelined batch)
    memory_bytes: float  # the device's capacity
    peak_memory_bytes: float  # simulated live-range peak, variables included: check_plan's
    ops: int = 0
    param_bytes: int = 0
    idle_s: float = 0.0

    @classmethod
    def from_dict(cls, data):
        """Also reads plans written before live ranges (an all-alive
        ``memory_bound_bytes``, which stands in for a missing peak)."""
        data = dict(data)
        bound = data.pop("memory_bound_bytes", None)
        if data.get("peak_memory_bytes") is None:
            data["peak_memory_bytes"] = bound if bound is not None else 0.0
        return cls(**data)


@dataclass
class StageFigures:
    device: str
    units: int  # coarse units in the stage
    load: float  # seconds: compute plus the transfers into and out of it


@dataclass
class PipelineFigures:
    """Pipelined plans: throughput, latency and how the stages were found."""

    throughput: float  # samples per second
    first_result: float  # seconds until the first micro-batch's outputs
    interval: float  # seconds between micro-batches at the steady state
    bubble_fraction: float
    stage_max_load: float
    exact: bool  # the stage search was exact (not the chain fallback)
    ideals: int
    units: int
    stages: list = field(default_factory=list)  # StageFigures per stage
    microbatch_choices: dict = field(default_factory=dict)  # "M" -> simulated figures


@dataclass
class Predicted:
    """The cost model's figures behind a plan, the same fields for every algorithm."""

    step_time: float  # seconds per step (per batch for pipelines)
    devices: dict  # device name -> DeviceFigures
    bytes_moved: float = 0.0
    links: dict = field(default_factory=dict)  # "src -> dst" -> bytes
    transfers: int | None = None  # tensor copies between devices in a step
    cross_host_transfers: int | None = None  # of which between hosts
    pipeline: PipelineFigures | None = None
    solver: dict | None = None  # the ILP's status, objective, bound and times

    @classmethod
    def from_dict(cls, data):
        data = dict(data)
        data["devices"] = {name: DeviceFigures.from_dict(d)
                           for name, d in data["devices"].items()}
        if data.get("pipeline") is not None:
            pipeline = dict(data["pipeline"])
            pipeline["stages"] = [StageFigures(**s) for s in pipeline.get("stages", [])]
            data["pipeline"] = PipelineFigures(**pipeline)
        return cls(**data)


@dataclass
class Plan:
    assignment: dict
    algorithm: str = ""
    options: dict = field(default_factory=dict)
    stages: Stages | None = None  # pipelines, and data parallel's one stage (a dict is made one)
    replicas: Replicas | None = None  # data parallel, hybrid (a dict is made one)
    splits: dict | None = None  # filter splits: op -> Split (a dict is made one)
    row_shards: dict | None = None  # tables cut by rows: variable op -> RowShards
    predicted: Predicted | None = None
    lower_bound: float | None = None
    context: dict = field(default_factory=dict)  # model, cluster, batch size, signature

    def __post_init__(self):
        if self.stages is not None and not isinstance(self.stages, Stages):
            self.stages = Stages(self.stages)
        if isinstance(self.replicas, dict):
            self.replicas = Replicas.from_dict(self.replicas)
        if self.splits:
            self.splits = {op: split if isinstance(split, Split) else Split(**split)
                           for op, split in self.splits.items()}
        if self.row_shards:
            self.row_shards = {table: shards if isinstance(shards, RowShards)
                               else RowShards(**shards)
                               for table, shards in self.row_shards.items()}

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self):
        data = asdict(self)
        if self.stages is not None:
            data["stages"] = self.stages.to_dict()
        if self.replicas is not None:
            data["replicas"] = self.replicas.to_dict()
        if self.splits is not None:
            data["splits"] = {op: split.to_dict() for op, split in self.splits.items()}
        if self.row_shards is not None:
            data["row_shards"] = {table: shards.to_dict()
                                  for table, shards in self.row_shards.items()}
        return {"format_version": PLAN_FORMAT_VERSION, **data}

    @classmethod
    def from_dict(cls, data):
        """A plan from plan.json's form, of format 3 or 2 (stages, ``microbatches`` and
        ``schedule`` at the top level).

        >>> Plan.from_dict({"format_version": 2, "assignment": {"a": "A"}, "stages": {"a": 0},
        ...                 "microbatches": 4, "schedule": None}).stages
        Stages(of={'a': 0}, microbatches=4, schedule=None)
        """
        if data.get("format_version") == 2 and data.get("stages"):
            data = {**data, "stages": Stages(data["stages"], data.get("microbatches", 1),
                                             data.get("schedule"))}
        elif data.get("format_version") != 2 and data.get("stages"):
            data = {**data, "stages": Stages.from_dict(data["stages"])}
        data = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        if data.get("predicted") is not None:
            data["predicted"] = Predicted.from_dict(data["predicted"])
        return cls(**data)

    def to_json(self, path="plan.json"):
        """The text of plan.json; OutputError naming ``path`` and the field if a figure
        is NaN or infinite (which JSON cannot hold).

        >>> Plan(assignment={}, lower_bound=float("inf")).to_json()
        Traceback (most recent call last):
        ...
        tfpart.core.errors.OutputError: plan.json: lower_bound is inf, not a finite number
        """
        return json_text(self.to_dict(), path, OutputError, indent=1, sort_keys=True)

    def save(self, path):
        Path(path).write_text(self.to_json(path))

    @classmethod
    def load(cls, path):
        """Read and validate a plan.json (its JSON Schema: ``tfpart/core/plan_schema.json``):
        a regular file of at most :data:`MAX_PLAN_BYTES`, strict JSON
        (:mod:`tfpart.core.input_files`)."""
        import jsonschema

        data = read_json(path, PlacementError, max_bytes=MAX_PLAN_BYTES)
        schema = json.loads(SCHEMA_FILE.read_text())
        error = next(iter(sorted(jsonschema.Draft202012Validator(schema).iter_errors(data),
                                 key=lambda e: list(e.absolute_path))), None)
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
            raise PlacementError(path, f"not a tfpart plan.json (format {PLAN_FORMAT_VERSION}"
                                 f" or 2): {where}: {error.message}")
        return cls.from_dict(data)

    # -- figures -------------------------------------------------------------------------
    @property
    def microbatches(self):
        """The micro-batches each step's batch is cut into: the stages', else 1."""
        return self.stages.microbatches if self.stages is not None else 1

    @property
    def schedule(self):
        """A pipelined training step's order of micro-batches ("gpipe" or "1f1b"), else
        None."""
        return self.stages.schedule if self.stages is not None else None

    @property
    def op_libraries(self):
        """What registers the model's custom ops (``context.op_libraries``: modules to
        import, shared objects to load), for whoever loads the model; plans written
        before it have none.

        >>> Plan(assignment={}, context={"op_libraries": ["tensorflow_text"]}).op_libraries
        ['tensorflow_text']
        """
        return list(self.context.get("op_libraries", ()))

    @property
    def figures(self):
        """What each device's predicted figures came from (``context.figures``, as
        :func:`costmodel.figures_basis.figures_basis` records it: a measured profile, a
        calibrated kind or a datasheet), or None for plans written before it.

        >>> Plan(assignment={}).figures is None
        True
        """
        return self.context.get("figures")

    @property
    def step_time(self):
        return self.predicted.step_time if self.predicted is not None else None

    @property
    def gap(self):
        """Relative distance of the predicted step time above the lower bound."""
        if not self.lower_bound or self.step_time is None:
            return None
        return self.step_time / self.lower_bound - 1.0

    @property
    def reimported(self):
        """Whether the compiled model is the signature flattened and imported anew (the
        pipeline pass: stages, replicas, filter splits, row shards) rather than the
        original proto with devices written in."""
        return bool(self.stages or self.splits or self.row_shards)

    def devices_used(self):
        """Every device the plan names, sorted: its assignment's, its replicas', its
        filter splits' and its row shards'.

        >>> Plan(assignment={"a": "A"}, splits={"a": {"devices": ["A", "B"],
        ...                                            "sizes": [1, 1]}}).devices_used()
        ['A', 'B']
        """
        named = set(self.assignment.values())
        if self.replicas is not None:
            named.update(self.replicas.devices)
            for placement in self.replicas.placements or ():
                named.update(placement.values())
        for parts in (*(self.splits or {}).values(), *(self.row_shards or {}).values()):
            named.update(parts.devices)
        return sorted(named)

    def placed_ops(self):
        """Each of the plan's fields that names ops (its assignment, stages, splits and
        replicas' placements), by its plan.json path, with the ops it names.

        >>> sorted(Plan(assignment={"a": "A"}, stages={"a": 0}).placed_ops())
        ['assignment', 'splits', 'stages']
        """
        placements = self.replicas.placements or () if self.replicas else ()
        return {"assignment": self.assignment, "stages": self.stages or {},
                "splits": self.splits or {},
                **{f"replicas.placements[{r}]": placement
                   for r, placement in enumerate(placements)}}


@dataclass(frozen=True)
class Stages(Mapping):
    """A pipeline: the stage ``of[op]`` each op runs in, for each of ``microbatches``
    consecutive slices of the batch, in the ``schedule`` order of a training step
    (a name of ``costmodel.schedules``: "gpipe", every forward, then every backward;
    "1f1b"; "interleaved", whose stage k runs on the device of stage k mod D, several
    per device; None for inference). A device may hold several stages. Data
    parallel and hybrid plans are one stage whose micro-batch ``r`` runs on replica
    ``r``. Reads as the mapping op -> stage. Its JSON form (plan.json's ``stages``) is
    :meth:`to_dict`.

    >>> stages = Stages({"x": 0, "y": 1}, microbatches=4, schedule="1f1b")
    >>> stages["y"], sorted(set(stages.values())), Stages.from_dict(stages.to_dict()) == stages
    (1, [0, 1], True)
    """

    of: Mapping
    microbatches: int = 1
    schedule: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "of", dict(self.of))

    def __getitem__(self, op):
        return self.of[op]

    def __iter__(self):
        return iter(self.of)

    def __len__(self):
        return len(self.of)

    __hash__ = None  # a mapping, and its stages are a dict

    @classmethod
    def from_dict(cls, data):
        return cls(**data)

    def to_dict(self):
        return {"of": dict(self.of), "microbatches": self.microbatches,
                "schedule": self.schedule}


REDUCTIONS = ("one_device", "all_reduce")  # how replicas' gradients may be reduced


@dataclass(frozen=True)
class Replicas:
    """Replicas of the step, each over its share of every batch.

    Replica ``r`` (micro-batch ``r``, or with ``microbatches`` the ``r``-th run of that
    many consecutive micro-batches) runs the plan's ops on ``devices[r]`` over the
    largest-remainder share ``fractions[r]`` of the batch, except the ``pinned`` ops
    (variable reads, run once on the first replica's devices); with ``placements``
    (replicas of a placement or of a pipeline) it runs each op on ``placements[r][op]``
    instead, ``devices[r]`` leading it. ``reduce`` ``"all_reduce"`` gives every replica
    a copy of the variables on its devices and all-reduces the gradients (no pinned
    ops); ``"one_device"`` or None (hybrid plans, plans written before the choice) keeps
    one copy and reduces the gradients there. ``why_one_replica`` says why a
    data-parallel plan has only one replica. Its JSON form (plan.json's ``replicas``)
    is :meth:`to_dict`.

    >>> replicas = Replicas(devices=["a", "b"], fractions=[0.75, 0.25])
    >>> Replicas.from_dict(replicas.to_dict()) == replicas, replicas.to_dict()
    (True, {'devices': ['a', 'b'], 'fractions': [0.75, 0.25], 'pinned': []})
    """

    devices: tuple
    fractions: tuple
    pinned: tuple = ()
    reduce: str | None = None
    microbatches: int | None = None
    placements: tuple | None = None
    why_one_replica: str | None = None

    def __post_init__(self):
        for name in ("devices", "fractions", "pinned"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.placements is not None:
            object.__setattr__(self, "placements", tuple(self.placements))

    @classmethod
    def from_dict(cls, data):
        return cls(**data)

    def to_dict(self):
        """plan.json's form: lists, and only the fields that are set."""
        data = {"devices": list(self.devices), "fractions": list(self.fractions),
                "pinned": list(self.pinned)}
        if self.reduce is not None:
            data["reduce"] = self.reduce
        if self.microbatches is not None:
            data["microbatches"] = self.microbatches
        if self.placements is not None:
            data["placements"] = [dict(placement) for placement in self.placements]
        if self.why_one_replica is not None:
            data["why_one_replica"] = self.why_one_replica
        return data


@dataclass(frozen=True)
class Split:
    """An op's output channels cut across devices (:mod:`tfpart.core.splits`): slice ``i``,
    ``sizes[i]`` channels, runs on ``devices[i]``. Its JSON form (an entry of
    plan.json's ``splits``) is :meth:`to_dict`.

    >>> Split(["A", "B"], [96, 32]).to_dict()
    {'devices': ['A', 'B'], 'sizes': [96, 32]}
    """

    devices: tuple
    sizes: tuple

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "sizes", tuple(int(size) for size in self.sizes))

    def to_dict(self):
        return {"devices": list(self.devices), "sizes": list(self.sizes)}


@dataclass(frozen=True)
class RowShards:
    """A table cut along its first axis (:mod:`tfpart.core.row_shards`): shard ``i``
    holds the next ``sizes[i]`` rows, on ``devices[i]``. Its JSON form (an entry of
    plan.json's ``row_shards``) is :meth:`to_dict`.

    >>> RowShards([600, 400], ["A", "B"]).to_dict()
    {'sizes': [600, 400], 'devices': ['A', 'B']}
    """

    sizes: tuple
    devices: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "sizes", tuple(int(size) for size in self.sizes))
        object.__setattr__(self, "devices", tuple(self.devices))

    def to_dict(self):
        return {"sizes": list(self.sizes), "devices": list(self.devices)}


def all_reduces(replicas):
    """Whether a plan's ``replicas`` (or None) keep a copy of the variables per replica
    and all-reduce their gradients.

    >>> all_reduces(Replicas(["a", "b"], [0.5, 0.5], reduce="all_reduce"))
    True
    >>> all_reduces(None), all_reduces(Replicas(["a"], [1.0]))
    (False, False)
    """
    return replicas is not None and replicas.reduce == "all_reduce"


def replica_of(replicas, microbatch):
    """The replica that runs micro-batch ``microbatch`` of a plan with ``replicas``:
    each replica of a pipeline runs ``replicas.microbatches`` consecutive ones, other
    replicas one each.

    >>> replica_of(Replicas(["a", "b"], [0.5, 0.5], microbatches=4), 5)
    1
    >>> replica_of(Replicas(["a", "b"], [0.5, 0.5]), 1)
    1
    """
    return microbatch // (replicas.microbatches or 1)


def device_stand_ins(replicas, assignment):
    """For replicas of a pipeline: per replica, its device for each device of the first
    replica (the ``assignment``'s), from the replicas' placements; None for other
    plans.

    >>> device_stand_ins(Replicas(["A", "C"], [0.5, 0.5], microbatches=2, placements=[
    ...     {"x": "A", "y": "B"}, {"x": "C", "y": "D"}]), {"x": "A", "y": "B", "w": "B"})[1]
    {'A': 'C', 'B': 'D'}
    """
    if replicas is None or not replicas.microbatches:
        return None
    return [{assignment[op]: device for op, device in placement.items()}
            for placement in replicas.placements]


def copy_devices(plan):
    """Where ``plan`` runs each copy of an op: a function of the source op (or a split
    op's slice, ``<op>/tfpart_split/part<k>``) and the replica the copy computes (None:
    not a replica's copy) that gives the planned device, or None for an op the plan
    does not place. A replica's copy runs on the replica's device unless the op is
    pinned (it reads a variable); a slice on its slice's device.

    >>> plan = Plan(assignment={"x": "A", "w": "A"}, replicas=Replicas(
    ...     ["A", "B"], [0.5, 0.5], pinned=["w"]))
    >>> device = copy_devices(plan)
    >>> device("x", 1), device("w", 1), device("x", None), device("y", 0)
    ('B', 'A', 'A', None)
    """
    replicas, assignment = plan.replicas, plan.assignment
    pinned = set(replicas.pinned) if replicas else set()
    splits = plan.splits or {}
    stand_ins = device_stand_ins(replicas, assignment)

    def device(origin, replica=None):
        part = part_of(origin)
        if part is not None and part[0] in splits:
            return splits[part[0]].devices[part[1]]
        if origin not in assignment:
            return None
        if replicas and replica is not None and origin not in pinned:
            return replica_device(replicas, stand_ins, replica, origin, assignment[origin])
        return assignment[origin]
    return device


def replica_device(replicas, stand_ins, replica, op, first):
    """The device replica ``replica`` runs ``op`` on, given ``first``, the device of
    ``op`` in the first replica (the plan's assignment), and the plan's
    :func:`device_stand_ins`: the replica's placement's, else its device standing for
    ``first``, else the replica's one device.

    >>> replicas = Replicas(["A", "C"], [0.5, 0.5], microbatches=2,
    ...                     placements=[{"x": "A", "y": "B"}, {"x": "C", "y": "D"}])
    >>> stand_ins = device_stand_ins(replicas, {"x": "A", "y": "B"})
    >>> replica_device(replicas, stand_ins, 1, "y", "B"), replica_device(
    ...     replicas, stand_ins, 1, "update_y", "B")
    ('D', 'D')
    """
    placements = replicas.placements
    if placements and op in placements[replica]:
        return placements[replica][op]
    if stand_ins:
        return stand_ins[replica].get(first, first)
    return replicas.devices[replica]
