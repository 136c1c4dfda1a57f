"""The layers contract (pyproject.toml, docs/architecture.md) holds, and it does fail on
a wrong import: one added to a temporary copy of the tree, never to the tree."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tfpart", "costmodel", "partitioner", "rewriters", "profiles")


def lint_imports(cwd):
    return subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); "
                           "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()"], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def copy_tree(target):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, target / package,
                        ignore=shutil.ignore_patterns("__pycache__", "models"))
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")


def test_the_layers_contract_holds():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 kept, 0 broken" in done.stdout  # the 5th: rewriters.lowered


def test_a_core_module_importing_an_algorithm_breaks_the_contract(tmp_path):
    copy_tree(tmp_path)
    graph = tmp_path / "tfpart" / "core" / "graph.py"
    graph.write_text(graph.read_text() + "\nfrom partitioner import greedy  # wrong way\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "BROKEN" in done.stdout and "tfpart.core.graph -> partitioner" in done.stdout


def test_costs_importing_rewriters_breaks_the_contract(tmp_path):
    copy_tree(tmp_path)
    roofline = tmp_path / "costmodel" / "roofline.py"
    roofline.write_text(roofline.read_text() + "\nimport rewriters.reader  # wrong way\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0 and "costmodel.roofline -> rewriters.reader" in done.stdout


def test_an_algorithm_importing_another_breaks_the_contract(tmp_path):
    copy_tree(tmp_path)
    greedy = tmp_path / "partitioner" / "greedy.py"
    greedy.write_text(greedy.read_text() + "\nfrom partitioner import m_etf  # wrong way\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "partitioner.greedy -> partitioner.m_etf" in done.stdout


def import_cycles(root):
    """The sets of modules (two or more) that import each other, directly or not, in
    the packages under ``root``."""
    code = ("import sys, grimp, networkx as nx; sys.path.insert(0, '.'); "
            f"g = grimp.build_graph(*{PACKAGES!r}); "
            "G = nx.DiGraph((m, i) for m in g.modules "
            "for i in g.find_modules_directly_imported_by(m)); "
            "print(sorted(sorted(c) for c in nx.strongly_connected_components(G) "
            "if len(c) > 1))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_no_module_is_in_an_import_cycle(tmp_path):
    assert import_cycles(ROOT) == "[]"
    copy_tree(tmp_path)
    flatten = tmp_path / "rewriters" / "flatten.py"
    flatten.write_text(flatten.read_text() + "\nfrom rewriters import reader  # a cycle\n")
    assert "'rewriters.flatten', 'rewriters.reader'" in import_cycles(tmp_path)
