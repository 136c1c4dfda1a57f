"""Fixtures of every test and doctest. TensorFlow gets four logical CPU devices before
any test or doctest starts it, so compiled models can run their multi-device plans in
this process."""
import importlib.util
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
LOGICAL_CPUS = 4


def tensorflow_installed():
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except ValueError:  # blocked (tests/block_tensorflow.py)
        return False


@pytest.fixture(scope="session", autouse=True)
def local_cpus():
    """Logical CPU devices exist only if made before TensorFlow starts its devices, so
    every session makes them first, whichever test or doctest runs first (before the
    module fixtures that export models). Where TensorFlow is not installed, the tests
    that run (the algorithms' and the cost model's, tests/test_tiers.py) need none."""
    if not tensorflow_installed():
        return None
    from tfpart.runtime import ensure_local_cpus

    ensure_local_cpus(LOGICAL_CPUS)
    return LOGICAL_CPUS


def pytest_collection_modifyitems(items):
    """End-to-end tests first: xdist hands tests out in this order, so the run ends on
    short ones and neither process waits long for the other's last test."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
