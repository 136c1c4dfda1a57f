"""Baseline: every colocation group on a random device that can run and hold it (what
TensorFlow's placement amounts to when it ignores speed; the baseline of the Applied
Intelligence 2022 paper). Seeded, so the same seed gives the same plan.

Examples
--------
>>> g = OpGraph()
>>> for i in range(8): g.add_op(f"op{i}", op_type="Relu", bytes_accessed=1e6)
>>> cluster = cluster_of_devices(["cpu"] * 4)
>>> a = partition(CostModel(g, cluster), options=RandomOptions(seed=1))
>>> b = partition(CostModel(g, cluster), options=RandomOptions(seed=1))
>>> a.assignment == b.assignment
True
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioner.finish import make_plan
from partitioner.units import MemoryLedger, expand, no_device_error, placement_units


@dataclass(frozen=True)
class RandomOptions:
    seed: int = 0


def partition(cost, options=RandomOptions()):
    cluster = cost.cluster
    rng = np.random.default_rng(options.seed)
    units = placement_units(cost)
    ledger = MemoryLedger(cost)
    chosen = []
    for unit in units:
        candidates = [d for d in range(len(cluster)) if ledger.fits(unit, d)]
        if not candidates:
            raise no_device_error(unit, cost)
        d = int(rng.choice(candidates))
        ledger.take(unit, d)
        chosen.append(d)
    return make_plan(cost, expand(units, chosen, len(cost.ops)), "random",
                     options)
