"""End-to-end fixtures: real models exported by TensorFlow/Keras, once per test module."""
import pytest

from examples import models


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = getattr(models, f"export_{name}")(tmp_path_factory.mktemp(name) / "m")
        return cache[name]
    return get
