"""Fixtures of every test and doctest. TensorFlow gets four logical CPU devices before
any test or doctest starts it, so compiled models can run their multi-device plans in
this process."""
import importlib.util
import os

import pytest

try:  # pytest 9's structured test ids
    from _pytest.nodeid import NodeId
except ImportError:  # earlier pytest: xdist adds the group to the id itself
    NodeId = None

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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """End-to-end tests first: xdist hands tests out in this order, so the run ends on
    short ones and neither process waits long for the other's last test.

    ``--dist loadgroup`` sends the tests of one ``xdist_group`` to one xdist worker,
    which builds their module fixtures once, by the group's name after an ``@`` in
    each test's id. pytest-xdist 3.8 writes it to ``item._nodeid``, which pytest 9 no
    longer reads (its ids are ``NodeId``s in ``item._id``): every group was dealt out
    test by test, and each worker built the group's fixtures. Here the suffix is added
    where pytest 9 reads it, if xdist has not (``tests/test_xdist_groups.py``)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not getattr(config.option, "loadgroup", False) or NodeId is None:
        return
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and isinstance(
                getattr(item, "_id", None), NodeId):
            item._id = NodeId.parse(item.nodeid + suffix)
