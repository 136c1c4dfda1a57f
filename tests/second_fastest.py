"""A strategy written outside tfpart, as a user would write one: every op on the
second fastest device (by the sum of its op times), for
tests/test_plugin_strategy.py, which offers it through the ``tfpart.algorithms``
entry-point group of a package installed in a temporary folder."""
import sys
from dataclasses import dataclass

import numpy as np

from partitioner.finish import make_plan
from partitioner.registry import plugin


@dataclass(frozen=True)
class SecondFastestOptions:
    pass


def partition(cost, options=SecondFastestOptions()):
    """Every op on the second fastest device."""
    second = int(np.argsort(cost.compute.sum(axis=0), kind="stable")[1])
    return make_plan(cost, np.full(len(cost.ops), second), "second_fastest", options)


ALGORITHM = plugin(sys.modules[__name__], SecondFastestOptions)
