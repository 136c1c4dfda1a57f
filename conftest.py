"""Fixtures of every test and doctest. TensorFlow gets four logical CPU devices before
any test or doctest starts it, so compiled models can run their multi-device plans in
this process."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
LOGICAL_CPUS = 4
# The algorithms and the cost model, and their tests, run on numpy alone (DESIGN.md's
# layers): they neither start TensorFlow nor need it installed (tests/test_tiers.py).
WITHOUT_TENSORFLOW = ("partitioner", "costmodel")


@pytest.fixture(autouse=True)
def local_cpus(request):
    """Logical CPU devices exist only if made before TensorFlow starts its devices, so
    every test or doctest that may start TensorFlow makes them first (the first one in
    a process does the work)."""
    if request.path.parent.name in WITHOUT_TENSORFLOW:
        return None
    from tfpart.runtime import ensure_local_cpus

    ensure_local_cpus(LOGICAL_CPUS)
    return LOGICAL_CPUS
