"""The tests of one ``xdist_group`` run on one xdist worker under ``--dist loadgroup``
(pyproject's options), so the group's module fixtures (local workers, compiled models)
are built once: the root conftest.py puts the group into the test ids where pytest 9
reads them."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = f'''
import importlib.util
spec = importlib.util.spec_from_file_location("project_conftest", {str(ROOT / "conftest.py")!r})
project = importlib.util.module_from_spec(spec)
spec.loader.exec_module(project)
pytest_collection_modifyitems = project.pytest_collection_modifyitems
'''

TESTS = '''
import os, time, pytest
pytestmark = {mark}
@pytest.mark.parametrize("i", range(4))
def test_{name}(i):
    time.sleep(0.2)
    with open({log!r}, "a") as log:
        log.write(f"{name} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
'''


def test_a_group_runs_on_one_worker_and_other_tests_on_both(tmp_path):
    log = tmp_path / "workers.log"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(TESTS.format(
        mark='pytest.mark.xdist_group("together")', name="grouped", log=str(log)))
    (tmp_path / "test_spread.py").write_text(TESTS.format(mark="[]", name="spread",
                                                          log=str(log)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "--dist", "loadgroup", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line.split() for line in log.read_text().splitlines()]
    grouped = [worker for name, worker in ran if name == "grouped"]
    assert len(grouped) == 4 and len(set(grouped)) == 1, ran
    assert len(ran) == 8
