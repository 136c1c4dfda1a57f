"""Custom ops (``--op-library``): a tensorflow-text model compiles under each strategy
that applies and verifies, plan.json names the library and ``verify`` of the output
loads it; without it, and with a library that is not there, one line says what to pass."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from profiles import DEFAULT_MODEL_DIR
from tfpart.cli import main
from tfpart.core.errors import PlacementError
from tfpart.core.plan import Plan

STRATEGIES = {"placement": ["--strategy", "placement"],
              "pipeline": ["--strategy", "pipeline", "--microbatches", "2"],
              "data_parallel": ["--strategy", "data_parallel"]}


def export_tokenizer_model(path):
    """Strings in: tensorflow-text's whitespace tokenizer (its op
    ``TFText>WhitespaceTokenizeWithOffsetsV2``), each word hashed to a row of an
    embedding table, the rows of each string summed (ragged, per sample), a dense layer."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_text

    class Tokens(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            self.table = tf.Variable(rng.normal(size=(64, 8)).astype(np.float32))
            self.dense = tf.Variable(rng.normal(size=(8, 3)).astype(np.float32))
            self.tokenizer = tensorflow_text.WhitespaceTokenizer()

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def __call__(self, text):
            words = self.tokenizer.tokenize(text)
            rows = tf.strings.to_hash_bucket_fast(words.flat_values, 64)
            vectors = words.with_flat_values(tf.gather(self.table, rows))
            return {"scores": tf.matmul(tf.reduce_sum(vectors, axis=1), self.dense)}

    module = Tokens()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return path


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    pytest.importorskip("tensorflow_text")
    return export_tokenizer_model(tmp_path_factory.mktemp("tokens") / "m")


@pytest.fixture(scope="module")
def compiled(text_model, tmp_path_factory):
    """The model compiled (and verified) with --op-library tensorflow_text under a
    strategy, once per module and strategy: (exit code, output folder)."""
    done = {}

    def get(strategy):
        if strategy not in done:
            out = tmp_path_factory.mktemp(strategy) / "out"
            code = main(["compile", str(text_model), "-o", str(out), "--batch-size", "4",
                         "--op-library", "tensorflow_text", "--verify",
                         *STRATEGIES[strategy]])
            done[strategy] = code, out
        return done[strategy]
    return get


# one xdist worker exports the model and compiles it once per strategy, for both tests
@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("tensorflow_text")
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_tensorflow_text_model_compiles_and_verifies(compiled, strategy):
    code, out = compiled(strategy)
    assert code == 0  # --verify: outputs equal at batch sizes 4, 1 and 5
    plan = Plan.load(out / "plan.json")
    assert plan.op_libraries == ["tensorflow_text"]
    assert plan.algorithm == {"placement": "greedy"}.get(strategy, strategy)
    if strategy == "pipeline":
        assert plan.microbatches == 2


FRESH_PROCESS = textwrap.dedent("""
    import sys
    from tfpart.runtime import ensure_local_cpus
    from tfpart.cli import main

    ensure_local_cpus(4)
    print("imported before", "tensorflow_text" in sys.modules)
    print("compile", main(["compile", sys.argv[1], "-o", sys.argv[2]]), flush=True)
    print("verify", main(["verify", sys.argv[1], sys.argv[3]]), flush=True)
    print("imported after", "tensorflow_text" in sys.modules)
    """)


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("tensorflow_text")
def test_without_the_library_one_line_names_it_and_verify_loads_the_plans(
        compiled, text_model, tmp_path):
    """In a process that never imported tensorflow_text (TensorFlow's registry is the
    process's): compiling without --op-library fails in one line that names the library;
    ``verify`` of a compiled model loads the library its plan.json names."""
    code, out = compiled("placement")
    assert code == 0
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(text_model),
                           str(tmp_path / "out"), str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    said = [line for line in done.stdout.splitlines()
            if line.startswith(("imported ", "compile ", "verify "))]
    errors = [line for line in done.stderr.splitlines() if line.startswith("tfpart:")]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert said == ["imported before False", "compile 2", "verify 0", "imported after True"]
    assert errors == [f"tfpart: error: {text_model}: cannot read it: op type "
                      "TFText>WhitespaceTokenizeWithOffsetsV2 is not registered: pass "
                      "--op-library tensorflow_text"]
    assert not (tmp_path / "out").exists()


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("library, line", [
    ("tensorflow_textt", "op library tensorflow_textt: no Python module of that name is "
                         "installed"),
    ("ops/missing.so", "ops/missing.so: op library: no such file")])
def test_a_library_that_is_not_there_is_one_line_before_any_work(capsys, tmp_path, library,
                                                                  line):
    code, err = run_cli(capsys, "compile", str(DEFAULT_MODEL_DIR), "-o", str(tmp_path / "o"),
                        "--op-library", library)
    assert code == 2
    assert err == "tfpart: error: " + line
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.any_onednn
def test_a_shared_object_that_does_not_load_is_one_line_naming_it(capsys, tmp_path):
    broken = tmp_path / "ops.so"
    broken.write_bytes(b"not an ELF file")
    code, err = run_cli(capsys, "compile", str(DEFAULT_MODEL_DIR), "-o", str(tmp_path / "o"),
                        "--op-library", str(broken))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"tfpart: error: {broken}: op library: loading it failed: "), err
    assert not (tmp_path / "o").exists()


def test_plan_json_keeps_the_libraries_as_a_list_of_names(tmp_path):
    plan = Plan(assignment={"a": "/device:CPU:0"},
                context={"op_libraries": ["tensorflow_text", "/opt/ops.so"]})
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json").op_libraries == ["tensorflow_text", "/opt/ops.so"]
    data = json.loads((tmp_path / "plan.json").read_text())
    data["context"]["op_libraries"] = "tensorflow_text"
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(PlacementError, match="context.op_libraries"):
        Plan.load(tmp_path / "plan.json")


def test_local_workers_refuse_a_library_that_is_not_there_before_starting_any(tmp_path):
    """``LocalWorkers(op_libraries=...)`` passes them to every ``tfpart worker``; one
    that is not there is one line before any task starts (not a task that never
    answers)."""
    from tfpart.core.errors import TfpartError
    from tfpart.local_workers import LocalWorkers

    with pytest.raises(TfpartError, match="op library tensorflow_textt: no Python module"):
        LocalWorkers(1, tmp_path, op_libraries=["tensorflow_textt"])
    assert not (tmp_path / "workers.json").exists()
