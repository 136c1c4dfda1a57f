"""Shared fixtures of the tests (TensorFlow's logical CPUs: the root conftest.py)."""
import fcntl
import json
import shutil
from contextlib import contextmanager

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


@contextmanager
def _locked(path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_folder(tmp_path_factory, config):
    """A folder of this test run that every xdist worker process of the run sees (the
    parent of the workers' own temporary folders), or this process's own folder
    without xdist."""
    base = tmp_path_factory.getbasetemp()
    worker = hasattr(config, "workerinput")  # an xdist worker process
    root = (base.parent if worker else base) / "shared-models"
    root.mkdir(exist_ok=True)
    return root


class SharedExports:
    """Models exported once per test run, whichever xdist worker asks first; the others
    wait on a lock for that model and load the same folder. (TensorFlow 2.21 loads
    models exported by separate processes into one process: their functions are
    renamed as they are loaded, so names reused across processes do not clash.)"""

    def __init__(self, root):
        self.root, self.paths = root, {}

    def get(self, key, export):
        """The path ``export(folder)`` returned for ``key``, exporting only if no
        process of this run has."""
        if key not in self.paths:
            folder, done = self.root / key, self.root / f"{key}.done"
            with _locked(self.root / f"{key}.lock"):
                if not done.exists():
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir()
                    done.write_text(str(export(folder / "m")))
                self.paths[key] = type(folder)(done.read_text())
        return self.paths[key]


@pytest.fixture(scope="session")
def shared_exports(tmp_path_factory, pytestconfig):
    return SharedExports(shared_folder(tmp_path_factory, pytestconfig))


@pytest.fixture(scope="session")
def exported(shared_exports):
    """Real models exported by TensorFlow/Keras (``examples.models.export_<name>``),
    once per test run (shared by xdist's processes)."""
    from examples import models

    return lambda name: shared_exports.get(name, getattr(models, f"export_{name}"))


@pytest.fixture(scope="session")
def training_step(shared_exports):
    """``examples.models.export_training_step(model, optimizer)``, once per test run."""
    from examples.models import export_training_step

    return lambda model, optimizer: shared_exports.get(
        f"train_step-{model}-{optimizer}",
        lambda path: export_training_step(path, model, optimizer))
