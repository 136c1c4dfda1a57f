"""Every benchmark script imports: a name it reads from tfpart that was renamed or moved
breaks it here, not in the next session that runs it."""
import importlib
import pkgutil

import pytest

import benchmarks

MODULES = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__))


def test_the_benchmarks_are_found():
    assert {"auto_regret", "costmodel_accuracy", "strategies"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_a_benchmark_imports(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__doc__, f"benchmarks/{name}.py says nothing of what it measures"
