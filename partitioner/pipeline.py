"""Pipeline partitioner: convex stages on (heterogeneous) devices, and a micro-batch
count (:mod:`partitioner.pipeline_stages`), as a checked Plan.

Examples
--------
A chain of eight equal ops on two devices: two stages of four, and as many
micro-batches as the batch of 8 allows.

>>> g = OpGraph()
>>> for i in range(8):
...     g.add_op(f"op{i}", op_type="Relu", bytes_accessed=4e9,
...              input_shapes=[(8, 1000)], outputs=[((8, 1000), "float32")])
>>> for i in range(7): g.add_edge(f"op{i}", f"op{i + 1}", bytes=32000)
>>> plan = partition(CostModel(g, cluster_of_devices(["cpu", "cpu"])),
...                  PipelineOptions(batch_size=8))
>>> sorted(set(plan.stages.values())), plan.microbatches
([0, 1], 8)
"""
from __future__ import annotations

from partitioner.pipeline_stages import PipelineOptions, pipeline_plan

__all__ = ["PipelineOptions", "partition"]


def partition(cost, options=PipelineOptions()):
    """A pipelined plan: ``plan.stages`` (op -> stage), ``plan.microbatches`` and, for a
    training step, ``plan.schedule`` (:func:`partitioner.pipeline_stages.pipeline_plan`).
    """
    return pipeline_plan(cost, options)
