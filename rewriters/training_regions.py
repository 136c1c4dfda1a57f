"""The regions of a training step: what runs per micro-batch and what runs once.

A training-step signature computes a loss from a batch (the *forward* region), the
gradients of the loss (the *backward* region) and the optimizer's update of the
variables from the gradients (the *update* region). To pipeline it over M
micro-batches, the forward and backward regions run once per micro-batch, every
tensor that leaves them for the update region (a gradient, the loss) is accumulated
over the micro-batches, and the update region runs once per step.

The regions come from the graph alone. TensorFlow's shape inference at two batch
sizes (:func:`rewriters.flatten.tensor_shapes`) tells which tensors carry the batch. An op is
*per-sample* when it reads or writes such a tensor; the per-micro-batch ops are the
per-sample ops and every op they depend on; an op that only computes an output from
per-micro-batch results (a loss written as a sum over a count) joins them too. The
rest is the update region, run once: the optimizer's arithmetic on the accumulated
gradients, the variable writes, the step counter. The forward region is the
per-micro-batch ops the signature's outputs are computed from; the backward region
is the other per-micro-batch ops.

Accumulation weights each micro-batch's tensor by its share of the batch (b_m / B),
which is exact when the loss is a mean over the batch: TensorFlow's gradient of a mean
divides by the (micro-)batch size before the weight-gradient reductions sum over the
rows. An op that reduces over the batch and whose result flows back into per-sample
ops (batch-normalisation statistics in training mode) makes every later sample depend
on the whole batch: :attr:`StepRegions.nonlinear` names them and micro-batching is
refused.

Examples
--------
A linear model trained by SGD, as ops ``(name, type, data inputs, control inputs,
outputs)`` with the batched tensors (those whose shape changes with the batch):

>>> ops = [("x", "Placeholder", [], [], ["x:0"]),
...        ("w", "VarHandleOp", [], [], ["w:0"]),
...        ("read", "ReadVariableOp", ["w:0"], [], ["read:0"]),
...        ("y", "MatMul", ["x:0", "read:0"], [], ["y:0"]),
...        ("loss", "Mean", ["y:0"], [], ["loss:0"]),
...        ("dy", "Fill", [], [], ["dy:0"]),
...        ("dw", "MatMul", ["x:0", "dy:0"], [], ["dw:0"]),
...        ("update", "AssignSubVariableOp", ["w:0", "dw:0"], ["read"], []),
...        ("out", "Identity", ["loss:0"], ["update"], ["out:0"])]
>>> regions = classify(ops, {"x:0", "y:0", "dy:0"}, ["out:0"])
>>> regions.phase["y"], regions.phase["dw"], regions.phase["update"]
('forward', 'backward', 'update')
>>> sorted(regions.boundary)
['dw:0', 'loss:0']
"""
from __future__ import annotations

from dataclasses import dataclass, field
from graphlib import TopologicalSorter

from rewriters.flatten import tensor_shapes
from tfpart.core.ops import RESOURCE_WRITE_OPS, SHAPE_ONLY_OPS, STATE_OPS

FORWARD, BACKWARD, UPDATE = "forward", "backward", "update"
#: Ops whose outputs depend on their inputs' shapes only (a gradient's seed of ones).
VALUE_FREE_OPS = SHAPE_ONLY_OPS | {"OnesLike", "ZerosLike"}


@dataclass
class StepRegions:
    """Each op's phase and what crosses from the per-micro-batch ops to the update."""

    phase: dict  # op name -> FORWARD | BACKWARD | UPDATE
    boundary: set  # tensors computed per micro-batch and read by the update region
    data_dependent: set  # ops computed from the batch (boundary tensors to accumulate)
    batched: set  # tensors that carry the batch
    nonlinear: list = field(default_factory=list)  # ops making samples depend on the batch
    misplaced_writes: list = field(default_factory=list)  # writes the forward pass reads
    writes_from_batch: list = field(default_factory=list)  # writes of computed values

    @property
    def is_training(self):
        """Whether the update region writes a variable from what the batch computed."""
        return any(self.phase[w] == UPDATE for w in self.writes_from_batch)


def step_regions(proto, path, batch_size, signature=None, like=None):
    """The :class:`StepRegions` of a SavedModel signature (flattened from ``like``, an
    earlier flattening of it, :func:`rewriters.flatten.flat_at`)."""
    shapes, ops, flat = tensor_shapes(proto, path, batch_size, signature, like)
    placeholders = {f"{p}:0" for p, _, _ in flat.inputs.values()}
    batched = batched_tensors(shapes, ops, placeholders)
    return classify(ops, batched, flat.outputs)


def batched_tensors(shapes, ops, placeholders):
    """Tensors that carry the batch: their shape differs between the two batch sizes,
    or it is not fully known (or a handle) and their op reads a tensor that carries it."""
    batched = set(placeholders)
    for name, op_type, inputs, _, outputs in _topological(ops):
        reads = any(t in batched for t in inputs)
        for tensor in outputs:
            first, second = shapes[tensor]
            if first is None or second is None or None in first or None in second:
                if reads and op_type not in VALUE_FREE_OPS:
                    batched.add(tensor)
            elif first != second:
                batched.add(tensor)
    return batched


def classify(ops, batched, outputs):
    """The regions of ops ``(name, type, data inputs, control inputs, output tensors)``
    given the set of ``batched`` tensors and the signature's output tensors."""
    ops = _topological(ops)
    by_name = {op[0]: op for op in ops}
    producer = {t: op[0] for op in ops for t in op[4]}
    preds = {name: {producer[t] for t in inputs if t in producer} | set(control)
             for name, _, inputs, control, _ in ops}
    succs = _reverse(preds)

    roots = {producer[t] for t in batched if t in producer
             and by_name[producer[t]][1] == "Placeholder"}
    from_batch = _closure(roots, succs)
    per_sample = {name for name, op_type, inputs, _, outs in ops
                  if name in from_batch and op_type != "Placeholder"
                  and any(t in batched for t in (*inputs, *outs))}
    per_micro = _closure(per_sample, preds)
    # An op computing only from per-micro-batch results, and not on the way to a write,
    # joins them (a loss written as a sum over a count stays a mean of micro-batches).
    toward_write = _closure({n for n, t, *_ in ops if t in RESOURCE_WRITE_OPS}, preds)
    for name, *_ in ops:
        if name not in per_micro and name not in toward_write and name in from_batch \
                and preds[name] and preds[name] <= per_micro:
            per_micro.add(name)

    output_ops = {producer[t] for t in outputs if t in producer}
    data_preds = {name: {producer[t] for t in inputs if t in producer}
                  for name, _, inputs, _, _ in ops}
    forward = _closure(output_ops, data_preds) & per_micro
    phase = {name: (FORWARD if name in forward else BACKWARD) if name in per_micro
             else UPDATE for name in by_name}
    # Variable handles are captured by every region alike; they are not accumulated.
    computed = per_micro - {n for n, t, *_ in ops if t in STATE_OPS}
    boundary = {t for name, _, inputs, _, _ in ops if phase[name] == UPDATE
                for t in inputs if producer.get(t) in computed}
    boundary |= {t for t in outputs if producer.get(t) in computed}
    writes = [n for n, t, *_ in ops if t in RESOURCE_WRITE_OPS]
    return StepRegions(
        phase=phase, boundary=boundary, data_dependent=from_batch, batched=set(batched),
        nonlinear=_feeding_back(ops, batched, _reverse(data_preds), per_sample),
        misplaced_writes=[w for w in writes if phase[w] != UPDATE],
        writes_from_batch=[w for w in writes if w in from_batch])


def _feeding_back(ops, batched, succs, per_sample):
    """Ops that reduce over the batch (read a batched tensor, output none) whose result
    reaches a per-sample op again by data edges (``succs``): every sample then depends
    on the whole batch."""
    found = []
    for name, op_type, inputs, _, outs in ops:
        if op_type in VALUE_FREE_OPS or not outs or any(t in batched for t in outs):
            continue
        if any(t in batched for t in inputs) and (_closure({name}, succs) - {name}) & per_sample:
            found.append(name)
    return found


def _reverse(preds):
    succs = {name: set() for name in preds}
    for name, sources in preds.items():
        for source in sources:
            succs[source].add(name)
    return succs


def _closure(start, edges):
    seen, stack = set(start), list(start)
    while stack:
        for other in edges.get(stack.pop(), ()):
            if other not in seen:
                seen.add(other)
                stack.append(other)
    return seen


def _topological(ops):
    by_name = {op[0]: op for op in ops}
    producer = {t: op[0] for op in ops for t in op[4]}
    sorter = TopologicalSorter({name: {producer[t] for t in inputs if t in producer}
                                | {c for c in control if c in by_name}
                                for name, _, inputs, control, _ in ops})
    return [by_name[name] for name in sorter.static_order()]
