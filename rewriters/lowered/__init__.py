"""The pipeline rewriter's passes over a step's lowering (:mod:`costmodel.lowering`).

:mod:`rewriters.pipeline` emits a pipelined or replicated signature by running these
in turn, each one concern, none importing another:

- :mod:`~rewriters.lowered.slicing`: the micro-batches' rows of the batch;
- :mod:`~rewriters.lowered.gates`: every task of the lowering imported in its order,
  each waiting, by a gate, for the task before it on its lane (the ordering edges);
- :mod:`~rewriters.lowered.imports`: one piece imported as one task's copy;
- :mod:`~rewriters.lowered.accumulation`: what a training step's update reads, summed
  over the micro-batches;
- :mod:`~rewriters.lowered.collectives`: the same, all-reduced among replicas that
  keep their own variables.
"""

GATE = "tfpart_gate"  # the input by which a piece's first ops wait for the schedule
