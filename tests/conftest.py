"""Shared fixtures of the tests (TensorFlow's logical CPUs: the root conftest.py)."""
import json

import pytest


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


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Real models exported by TensorFlow/Keras (examples/models.py), once per test
    process. (Not shared between xdist's processes: models exported by separate
    processes reuse function names, and one process may load several models.)"""
    from examples import models

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = getattr(models, f"export_{name}")(tmp_path_factory.mktemp(name) / "m")
        return cache[name]
    return get
