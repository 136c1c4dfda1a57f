"""Placement and stage algorithms, one module each, listed in :mod:`partitioner.registry`.

``ALGORITHMS`` is that registry (name -> :class:`~partitioner.registry.Algorithm`);
``HEURISTICS`` the placement algorithms other than the ILP.
"""
from partitioner.registry import REGISTRY as ALGORITHMS

HEURISTICS = {name: algorithm for name, algorithm in ALGORITHMS.items()
              if name != "ilp" and not algorithm.stages}

__all__ = ["ALGORITHMS", "HEURISTICS"]
