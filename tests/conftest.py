"""Shared fixtures. TensorFlow gets four logical CPU devices before any test starts it,
so compiled models can run their multi-device plans in this process."""
import json
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
LOGICAL_CPUS = 4


@pytest.fixture(scope="session", autouse=True)
def local_cpus():
    """Logical CPU devices exist only if made before TensorFlow starts its devices, so
    every session makes them first, whichever test runs first."""
    from tfpart.runtime import ensure_local_cpus

    ensure_local_cpus(LOGICAL_CPUS)
    return LOGICAL_CPUS


@pytest.fixture
def write_cluster(tmp_path):
    """Write a cluster dict to a file and return its path."""
    def write(data, name="cluster.json"):
        path = tmp_path / name
        path.write_text(json.dumps(data) if not isinstance(data, str) else data)
        return path
    return write


def local_cluster(n, memory="4GB"):
    return {"name": f"local-{n}cpu", "devices": [
        {"name": f"/device:CPU:{i}", "kind": "cpu", "memory": memory} for i in range(n)]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Real models exported by TensorFlow/Keras (examples/models.py), once per module."""
    from examples import models

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = getattr(models, f"export_{name}")(tmp_path_factory.mktemp(name) / "m")
        return cache[name]
    return get
