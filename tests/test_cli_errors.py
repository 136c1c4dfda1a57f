"""Bad input gives one line naming the file and the problem, exit code 2, no output."""
import hashlib
import shutil

import pytest

from profiles import DEFAULT_MODEL_DIR
from tests.conftest import local_cluster
from tfpart.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip()


def tree_digest(path):
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        if item.is_file():
            digest.update(str(item.relative_to(path)).encode() + item.read_bytes())
    return digest.hexdigest()


def assert_clean_failure(code, err, *words, out=None):
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("tfpart: error: ")
    for word in words:
        assert word in err, err
    if out is not None:
        assert not out.exists()
        assert not list(out.parent.glob(f".{out.name}*tfpart-tmp-*"))


def test_missing_model_directory(capsys, tmp_path):
    missing = tmp_path / "nope"
    code, err = run_cli(capsys, "compile", str(missing), "-o", str(tmp_path / "out"))
    assert_clean_failure(code, err, str(missing), "no such directory", out=tmp_path / "out")


def test_directory_that_is_not_a_saved_model(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, "compile", str(tmp_path / "empty"), "-o", str(tmp_path / "o"))
    assert_clean_failure(code, err, "empty", "saved_model.pb is missing", out=tmp_path / "o")


def test_truncated_saved_model_pb(capsys, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    pb = model / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[: pb.stat().st_size // 2])
    before = tree_digest(model)
    code, err = run_cli(capsys, "compile", str(model), "-o", str(tmp_path / "out"))
    assert_clean_failure(code, err, "saved_model.pb", "truncated", out=tmp_path / "out")
    assert tree_digest(model) == before


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_corrupt_variables_data_is_named(capsys, tmp_path, how):
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    data = model / "variables" / "variables.data-00000-of-00001"
    content = bytearray(data.read_bytes())
    if how == "truncate":
        content = content[: len(content) // 2]
    else:
        content[len(content) // 2] ^= 0xFF
    data.write_bytes(bytes(content))
    before = tree_digest(model)
    code, err = run_cli(capsys, "compile", str(model), "-o", str(tmp_path / "out"), "--pipeline")
    assert_clean_failure(code, err, str(model / "variables" / "variables"),
                         "cannot read the variables", out=tmp_path / "out")
    assert tree_digest(model) == before


@pytest.mark.parametrize("cluster,words", [
    ("{not json", ["not valid JSON"]),
    ({"devices": []}, ["devices", "non-empty"]),
    ({"devices": [{"name": "/device:GPU:0", "kind": "Z80"}]}, ["devices[0].kind", "Z80"]),
    ({"devices": [{"name": "/device:GPU:0", "kind": "T4", "memory": 0}]},
     ["devices[0].memory", "positive"]),
    ({"devices": [{"name": "/device:GPU:0", "kind": "T4", "memory": "-4GB"}]},
     ["devices[0].memory"]),
    ({"devices": [{"name": "/device:GPU:0", "kind": "T4"},
                  {"name": "/job:localhost/task:0/device:GPU:0", "kind": "T4"}]},
     ["devices[1].name", "duplicate"]),
    ({"devices": [{"name": "/device:GPU:0", "kind": "T4"}],
      "links": {"pairs": [{"between": ["/device:GPU:0", "/device:GPU:7"],
                           "bandwidth": "10GB/s"}]}},
     ["links.pairs[0].between", "GPU:7"]),
    ({"devices": [{"name": "GPU zero", "kind": "T4"}]}, ["devices[0].name"]),
    ({"devices": [{"name": "/job:worker/task:3/device:GPU:0", "kind": "T4"}],
      "cluster": {"worker": ["localhost:2222"]}}, ["devices[0].name", "cluster"]),
    ({"devices": [{"name": "/device:GPU:0", "kind": "T4", "colour": "red"}]},
     ["devices[0]", "colour"]),
])
def test_bad_cluster_files(capsys, tmp_path, write_cluster, cluster, words):
    path = write_cluster(cluster)
    code, err = run_cli(capsys, "compile", str(DEFAULT_MODEL_DIR), "--cluster", str(path),
                        "-o", str(tmp_path / "out"))
    assert_clean_failure(code, err, str(path), *words, out=tmp_path / "out")


def test_missing_cluster_file(capsys, tmp_path):
    code, err = run_cli(capsys, "compile", "--cluster", str(tmp_path / "c.json"),
                        "-o", str(tmp_path / "out"))
    assert_clean_failure(code, err, "c.json", "no such file", out=tmp_path / "out")


def test_model_larger_than_the_whole_cluster(capsys, tmp_path, write_cluster):
    path = write_cluster(local_cluster(2, memory="100KB"))
    code, err = run_cli(capsys, "compile", "--cluster", str(path), "-o", str(tmp_path / "out"))
    assert_clean_failure(code, err, str(path), "whole cluster", out=tmp_path / "out")


def test_pipeline_stages_that_fit_no_device(capsys, tmp_path, write_cluster):
    # The variables fit the cluster in total, but no split gives every stage room for
    # its variables and activations.
    path = write_cluster(local_cluster(2, memory="500KB"))
    out = tmp_path / "out"
    code, err = run_cli(capsys, "compile", str(DEFAULT_MODEL_DIR), "--cluster", str(path),
                        "--pipeline", "-o", str(out))
    assert_clean_failure(code, err, str(path), "no split into pipeline stages fits",
                         out=out)


def test_microbatches_must_be_positive(capsys, tmp_path):
    out = tmp_path / "out"
    code, err = run_cli(capsys, "compile", "--microbatches", "0", "-o", str(out))
    assert_clean_failure(code, err, "--microbatches must be positive", out=out)


def test_existing_output_needs_force(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = run_cli(capsys, "compile", "-o", str(out))
    assert code == 2 and "already exists" in err and str(out) in err
    assert (out / "keep.txt").read_text() == "mine"


def test_output_over_the_input_model_is_refused(capsys, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    before = tree_digest(model)
    code, err = run_cli(capsys, "compile", str(model), "-o", str(model), "--force")
    assert code == 2 and "holds the input" in err and str(model) in err
    assert tree_digest(model) == before


def test_bad_batch_size(capsys, tmp_path):
    code, err = run_cli(capsys, "compile", "--batch-size", "0", "-o", str(tmp_path / "o"))
    assert code == 2 and "batch-size" in err


def test_default_compile_prints_plan_and_names_default_cluster(capsys, tmp_path):
    code = main(["compile", "-o", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "local_3cpu.json" in printed and "Predicted step time" in printed
    assert (tmp_path / "out" / "plan.json").is_file()


def test_profile_never_replaces_a_file_it_did_not_write(capsys, tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    code, err = run_cli(capsys, "profile", str(DEFAULT_MODEL_DIR), "-o", str(notes))
    assert_clean_failure(code, err, str(notes), "is not a profile")
    assert notes.read_text() == '{"my": "notes"}'
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    before = tree_digest(model)
    code, err = run_cli(capsys, "profile", str(model), "-o", str(model / "saved_model.pb"))
    assert_clean_failure(code, err, "inside the input")
    assert tree_digest(model) == before


def test_calibrate_never_writes_over_its_measurements(capsys, tmp_path):
    kernels = tmp_path / "kernels.json"
    kernels.write_text("{}")
    code, err = run_cli(capsys, "calibrate", str(kernels), "-o", str(kernels))
    assert_clean_failure(code, err, "holds the input")
    assert kernels.read_text() == "{}"


def test_a_signal_wrapped_by_a_library_is_still_one_line(capsys, monkeypatch):
    """SIGTERM landing inside a C extension's callback (numba's unpickling) reaches the
    command as that extension's ``SystemError`` with tfpart's ``Terminated`` as cause."""
    import tfpart.cli as cli

    def command_hit_by_a_signal(args):
        try:
            cli._raise_terminated(15, None)
        except KeyboardInterrupt as interrupt:
            raise SystemError("<function _numba_unpickle> returned a result with an "
                              "exception set") from interrupt

    monkeypatch.setattr(cli, "cmd_diff", command_hit_by_a_signal)
    assert main(["diff", "a.json", "b.json"]) == 128 + 15
    assert capsys.readouterr().err.strip() == "tfpart: interrupted (SIGTERM)"


def test_a_signal_that_an_extension_turns_into_another_error_is_still_one_line(
        capsys, monkeypatch):
    """Ctrl-C landing in an extension's import (protobuf's, as ``tfpart worker`` starts
    TensorFlow) came back as ``TypeError: expected a message argument`` with no cause:
    after a stop signal, whatever error ends the command is the signal's line."""
    import signal

    import tfpart.cli as cli

    def command_hit_by_a_signal(args):
        try:
            cli._raise_interrupt(signal.SIGINT, None)
        except KeyboardInterrupt:
            pass  # swallowed by the extension, which raises its own error instead
        raise TypeError("expected a message argument")

    monkeypatch.setattr(cli, "cmd_diff", command_hit_by_a_signal)
    monkeypatch.setattr(cli, "_STOP_SIGNALS_RECEIVED", [])
    assert main(["diff", "a.json", "b.json"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err.strip() == "tfpart: interrupted (SIGINT)"

    def command_failing(args):
        raise TypeError("expected a message argument")

    cli._STOP_SIGNALS_RECEIVED.clear()  # no signal: the error is the command's own
    monkeypatch.setattr(cli, "cmd_diff", command_failing)
    with pytest.raises(TypeError):
        main(["diff", "a.json", "b.json"])


def test_a_signal_while_the_command_line_is_read_is_one_line(capsys, monkeypatch):
    """Ctrl-C landing as the parser is built (``--schedule``'s choices import the cost
    model, and numba with it: found by the signal-at-any-moment test) is the one line,
    not a traceback."""
    import signal

    import tfpart.cli as cli

    def parser_hit_by_a_signal():
        cli._raise_interrupt(signal.SIGINT, None)

    monkeypatch.setattr(cli, "build_parser", parser_hit_by_a_signal)
    monkeypatch.setattr(cli, "_STOP_SIGNALS_RECEIVED", [])
    assert main(["diff", "a.json", "b.json"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err.strip() == "tfpart: interrupted (SIGINT)"
