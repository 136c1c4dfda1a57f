"""The notebooks run top to bottom on this machine, and say what they are for: a step
time printed, a picture produced. Each runs in a fresh kernel from its own folder."""
import os
import re
from pathlib import Path

import nbformat

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# notebook -> what its outputs must show (regular expressions over all its text output),
# and how many pictures (SVG or PNG displays) at least
EXPECTED = {
    "01_quickstart.ipynb": ([r"predicted step [\d.]+ ms, lower bound [\d.]+ ms",
                             r"verified: True",
                             r"largest difference between original and compiled outputs: "
                             r"0\.00e\+00"], 2),
    "02_what_if.ipynb": ([r"hetero_2v100_2t4\s+greedy\s+step\s+[\d.]+ ms",
                          r"a100_l4_one_host\s+ilp", r"ops placed differently with the "
                          r"measured profile"], 2),
    "03_pipelining.ipynb": ([r"M= 8:\s+\d+ samples/s", r"1f1b\s*: step",
                             r"predicted \d+ samples/s, measured \d+ samples/s"], 2),
    "04_published_graphs.ipynb": ([r"GoogLeNet \{", r"published optimum\s+17\.7899\s+"
                                   r"tfpart\s+17\.7899"], 2),
}


def test_every_notebook_has_its_expectations():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_top_to_bottom(name):
    from notebooks.make_notebooks import execute

    notebook = execute(NOTEBOOKS / name)
    if os.environ.get("TFPART_EXECUTED_NOTEBOOKS"):  # for the site's build (docs/conf.py)
        nbformat.write(notebook, Path(os.environ["TFPART_EXECUTED_NOTEBOOKS"]) / name)
    text, pictures = [], 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", "".join(output.get("traceback", []))
            text.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
            pictures += bool({"image/svg+xml", "image/png"} & set(output.get("data", {})))
    text = "\n".join(text)
    patterns, least_pictures = EXPECTED[name]
    for pattern in patterns:
        assert re.search(pattern, text), (pattern, text[-3000:])
    assert pictures >= least_pictures


PROJECT_PACKAGES = ("tfpart", "costmodel", "partitioner", "rewriters", "profiles")
# a notebook about an algorithm's internals may import its modules
INTERNALS = {"04_published_graphs.ipynb": ("partitioner",)}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebooks_use_the_public_api(name):
    """Of the project, a notebook imports ``tfpart`` (its public API) and nothing else
    unless it is about an algorithm's internals."""
    import json

    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    code = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    imported = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, flags=re.MULTILINE)
    project = [module for module in imported if module.split(".")[0] in PROJECT_PACKAGES]
    beyond = [module for module in project if module != "tfpart"
              and module.split(".")[0] not in INTERNALS.get(name, ())]
    assert "tfpart" in project and not beyond, beyond
