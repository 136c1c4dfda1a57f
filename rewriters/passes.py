"""The rewriters, as one ordered list of passes run by one function.

Each pass takes a :class:`~rewriters.savedmodel_io.SavedModelParts` and a Plan and
returns new parts; it runs when its ``applies(plan)`` says so. Saving is separate
(:func:`rewriters.savedmodel_io.save`). The passes never import each other (an
import-linter contract in ``pyproject.toml``); this module is the one place that knows
them all and their order, the way tf2onnx's ``run_rewriters`` holds its list.

=================  ==========================  ========================================
pass               runs for                    does
=================  ==========================  ========================================
pipeline stages    plans with stages or        one SavedModel running the stages over
                   filter splits               micro-batches, with the split ops in
                                               slices (:mod:`rewriters.pipeline`); of a
                                               TF1 SavedModel, its graph with the
                                               pipelined ops added
device placement   the other plans of TF2      the plan's device on every op and
                   SavedModels                 variable (:mod:`rewriters.placement`)
device placement   every plan of a TF1         the plan's device on every node of the
(TF1)              SavedModel                  graph the pipeline did not place
                                               (:mod:`rewriters.tf1_placement`)
=================  ==========================  ========================================

Examples
--------
>>> [rewriter.name for rewriter in REWRITERS]
['pipeline stages', 'device placement', 'device placement (TF1)']
>>> from tfpart.core.plan import Plan
>>> [r.name for r in REWRITERS if r.applies(Plan(assignment={"a": "/device:CPU:0"}))]
['device placement']
"""
from __future__ import annotations

import typing
from dataclasses import dataclass

from rewriters.pipeline import pipeline_pass
from rewriters.placement import placement_pass
from rewriters.tf1_placement import tf1_placement_pass


@dataclass(frozen=True)
class Rewriter:
    """One pass: ``rewrite(model, plan, workdir) -> model`` when ``applies(plan)``."""

    name: str
    applies: typing.Callable
    rewrite: typing.Callable


def _tf1(plan):
    return plan.context.get("format") == "tf1"


REWRITERS = (
    Rewriter("pipeline stages", lambda plan: plan.reimported, pipeline_pass),
    Rewriter("device placement", lambda plan: not plan.reimported and not _tf1(plan),
             placement_pass),
    Rewriter("device placement (TF1)", _tf1, tf1_placement_pass),
)


def run_rewriters(model, plan, workdir, rewriters=REWRITERS, progress=None):
    """Run every pass of ``rewriters`` that applies to ``plan``, in order.

    Parameters
    ----------
    model : rewriters.savedmodel_io.SavedModelParts
        The input model; never modified.
    plan : tfpart.core.plan.Plan
    workdir : pathlib.Path
        Scratch space for passes that write files; keep it until the result is saved.
    rewriters : sequence of Rewriter
    progress : callable, optional
        Called with each pass's name before it runs.

    Returns
    -------
    rewriters.savedmodel_io.SavedModelParts
    """
    for k, rewriter in enumerate(rewriters):
        if rewriter.applies(plan):
            if progress is not None:
                progress(rewriter.name)
            model = rewriter.rewrite(model, plan, workdir / f"{k}")
    return model
