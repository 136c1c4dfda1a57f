"""A strategy written outside tfpart that runs a batch as micro-batches, as a user would
write one: every op on the fastest device that holds the model, one pipeline stage,
the batch cut into ``microbatches`` slices run one after another (a batch's
activations alive one slice at a time). It declares what it takes (micro-batches, the
fill-drain schedule, a place among ``--strategy auto``'s candidates) and the line it
gives on its plans; tests/test_plugin_strategy.py offers it through the
``tfpart.algorithms`` entry-point group of a package installed in a temporary folder.
"""
import sys
from dataclasses import dataclass

from costmodel.execution import expand
from partitioner.finish import make_plan
from partitioner.list_schedules import fastest_single_device
from partitioner.registry import plugin
from tfpart.core.errors import PlacementError
from tfpart.core.plan import Plan, Stages

NAME = "microbatched"  # its entry point's name, which its plans record


@dataclass(frozen=True)
class MicrobatchedOptions:
    batch_size: int = 1  # the model's, set by the compile
    microbatches: int = 2  # --microbatches sets it
    schedule: str | None = None  # --schedule sets it (gpipe, the only one it takes)


def partition(cost, options=MicrobatchedOptions()):
    """Every op on the fastest device, the batch in micro-batches one after another."""
    fastest = fastest_single_device(cost)
    if fastest is None:
        raise PlacementError("", "no device holds the whole model")
    device = cost.cluster.device_names[fastest[0]]
    plan = Plan(assignment=dict.fromkeys(cost.graph.ops, device), algorithm=NAME,
                stages=Stages(dict.fromkeys(cost.graph.ops, 0), options.microbatches,
                              options.schedule))
    run = expand(plan, cost)  # each micro-batch's copy of every op, as the rewriter builds it
    priced = make_plan(run.cost, run.device_of, NAME, options, run.priority)
    plan.options, plan.predicted, plan.lower_bound = \
        priced.options, priced.predicted, priced.lower_bound
    return plan


def describe(plan):
    """The plan's line in ``tfpart compile``'s summary, the report and the picture.

    >>> describe(Plan(assignment={"x": "/device:CPU:0"}, stages=Stages({"x": 0}, 2)))
    'Micro-batched: every op on /device:CPU:0, the batch in 2 micro-batches one after another'
    """
    device = next(iter(plan.assignment.values()))
    return (f"Micro-batched: every op on {device}, the batch in {plan.microbatches} "
            "micro-batches one after another")


ALGORITHM = plugin(sys.modules[__name__], MicrobatchedOptions, microbatches=True,
                   schedules=("gpipe",), auto=True, describe=describe)
