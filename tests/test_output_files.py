"""One output rule for every command that writes a file (issue 54, item 3;
``tfpart/core/output_files.py``): an existing file is replaced only when tfpart wrote it,
unchanged since, or with ``--force`` when it is the same kind of file; anything else is
refused in one line, exit code 2, the file left byte for byte; a picture's format is its
suffix's. The refusals come before any TensorFlow work, so most tests here are fast; the
ones that replace a file run the command (``slow``), on one pipelined compile of the
shipped example model."""
import io
import json
import os
import shutil
import stat
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from profiles import DEFAULT_CLUSTER_FILE, DEFAULT_MODEL_DIR, DEVICE_KINDS_FILE
from tests.test_cli_errors import assert_clean_failure, run_cli
from tfpart.cli import main
from tfpart.core.errors import OutputError
from tfpart.core.output_files import (CLUSTER_FILE, MARK_KEY, PICTURES, check_output_file,
                                      with_picture_mark, write_json_output, write_output_file,
                                      written_by_tfpart)
from tfpart.core.output_folders import TEMPORARY_TAG, remove_dead_temporary_files

NOTES = b'{"my": "notes", "on": ["a JSON file of mine"]}\n'


def refused(capsys, path, *argv, words=(), named=None):
    """Run the command; assert it is refused in one line naming ``named`` (default
    ``path``), exit code 2, and that ``path`` is left byte for byte."""
    before = path.read_bytes()
    code, err = run_cli(capsys, *argv)
    assert_clean_failure(code, err, str(named or path), *words)
    assert path.read_bytes() == before
    return err


def photo(path):
    """A real PNG picture that tfpart did not write."""
    from PIL import Image

    Image.new("RGB", (8, 8), "red").save(path)
    return path


def hand_written_cluster(path):
    path.write_text(json.dumps({"name": "mine", "devices": [
        {"name": "/device:CPU:0", "kind": "cpu", "memory": "1GB"}]}))
    return path


def no_temporaries(folder):
    return not [p for p in folder.iterdir() if TEMPORARY_TAG in p.name]


# -- the rule ----------------------------------------------------------------------------

def test_links_folders_and_fifos_are_refused_even_with_force(capsys, tmp_path):
    target = hand_written_cluster(tmp_path / "mine.json")
    (tmp_path / "link.json").symlink_to(target)
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    for name, problem in (("link.json", "symbolic link"), ("folder.json", "is a folder"),
                          ("fifo.json", "not a regular file")):
        code, err = run_cli(capsys, "cluster", "detect", "-o", str(tmp_path / name),
                            "--force")
        assert_clean_failure(code, err, name, problem)
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "folder.json").is_dir()
    assert stat.S_ISFIFO((tmp_path / "fifo.json").lstat().st_mode)


def test_a_nan_is_one_line_and_a_new_file_gets_the_umasks_permissions(tmp_path):
    with pytest.raises(OutputError, match=r"devices\.0 is nan"):
        write_json_output(tmp_path / "c.json", {"devices": [float("nan")]}, CLUSTER_FILE, "t")
    assert not (tmp_path / "c.json").exists()
    old = os.umask(0o022)
    try:
        path = write_output_file(tmp_path / "p.dot", "digraph {}", PICTURES[".dot"])
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not the temporary file's 0600


HOLD_A_LOCK = ("import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)")


def test_a_killed_writers_temporary_file_is_removed_and_a_live_ones_kept(tmp_path):
    """A writer's temporary file is alive while its writer holds its flock (whatever
    the writer's process id means here); a new unlocked one gets a grace period."""
    names = {who: tmp_path / f".c.json{TEMPORARY_TAG}1-{who}" for who in
             ("dead", "alive", "young")}  # process id 1: alive here, as a foreign id may be
    holders = {who: subprocess.Popen([sys.executable, "-c", HOLD_A_LOCK, names[who]],
                                     stdout=subprocess.PIPE, text=True)
               for who in ("dead", "alive")}
    try:
        for holder in holders.values():
            assert holder.stdout.readline().strip() == "locked"
        holders["dead"].kill()
        holders["dead"].wait()
        names["young"].write_text("half")
        write_json_output(tmp_path / "c.json", {"devices": []}, CLUSTER_FILE, "t")
        assert all(path.exists() for path in names.values())  # all within the grace
        remove_dead_temporary_files(tmp_path / "c.json", grace_s=0)
        assert not names["dead"].exists() and names["alive"].exists()
    finally:
        holders["alive"].kill()
        holders["alive"].wait()


def test_an_xml_file_named_svg_is_not_a_picture_to_replace(tmp_path):
    notes = tmp_path / "notes.svg"
    notes.write_text('<?xml version="1.0"?><notes>mine</notes>')
    with pytest.raises(OutputError, match="is not a SVG picture"):
        check_output_file(notes, PICTURES[".svg"], force=True)


def test_marked_pictures_stay_valid_pictures():
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(png, format="png")
    marked = with_picture_mark(png.getvalue(), ".png", "test")
    picture = Image.open(io.BytesIO(marked))
    picture.load()  # checks every chunk's CRC
    assert picture.info["Software"] == "written by tfpart test"
    assert PICTURES[".png"].ours(marked) and not PICTURES[".png"].ours(png.getvalue())
    pdf = b"%PDF-1.5\n1 0 obj\n<<>>\nendobj\nxref\n0 1\ntrailer\n<<>>\nstartxref\n31\n%%EOF\n"
    marked = with_picture_mark(pdf, ".pdf", "test")
    assert marked.startswith(pdf.rstrip()) and PICTURES[".pdf"].ours(marked)
    assert marked.endswith(b"% written by tfpart test\nstartxref\n31\n%%EOF\n")
    svg = with_picture_mark(b'<?xml version="1.0"?>\n<svg/>', ".svg", "test")
    assert svg == b'<?xml version="1.0"?>\n<!-- written by tfpart test -->\n<svg/>'
    drawn = with_picture_mark(b'<?xml version="1.0"?>\n<svg/>', ".svg", "compile --draw")
    assert ElementTree.fromstring(drawn).tag == "svg"  # no "--" in an XML comment


# -- each command's refusals (before any work) --------------------------------------------

def test_cluster_detect_never_replaces_another_kind_or_a_users_cluster_file(capsys,
                                                                            tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_bytes(NOTES)
    refused(capsys, notes, "cluster", "detect", "-o", str(notes), "--force",
            words=["is not a cluster file"])
    mine = hand_written_cluster(tmp_path / "cluster.json")
    refused(capsys, mine, "cluster", "detect", "-o", str(mine),
            words=["tfpart did not write it: give --force"])


def test_cluster_probe_checks_its_output_before_connecting(capsys, tmp_path):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                   "devices": [{"name": f"/job:worker/task:{k}/device:CPU:0",
                                                "kind": "cpu"} for k in range(2)]}))
    notes = tmp_path / "notes.txt"
    notes.write_bytes(NOTES)
    refused(capsys, notes, "cluster", "probe", str(cluster), "-o", str(notes), "--force",
            words=["is not a cluster file"])
    mine = hand_written_cluster(tmp_path / "mine.json")
    refused(capsys, mine, "cluster", "probe", str(cluster), "-o", str(mine),
            words=["give --force"])


def test_cluster_probe_in_place_keeps_the_file_its_owners(tmp_path):
    from tfpart.commands import update_cluster_file

    mine = hand_written_cluster(tmp_path / "mine.json")
    (tmp_path / "link.json").symlink_to(mine)
    before = json.loads(mine.read_text())
    update_cluster_file(tmp_path / "link.json", dict(before, step_overhead=1e-4), before)
    assert (tmp_path / "link.json").is_symlink()  # the file it names is updated
    assert json.loads(mine.read_text()) == dict(before, step_overhead=1e-4)  # unmarked
    ours = write_json_output(tmp_path / "ours.json", before, CLUSTER_FILE, "cluster detect")
    data = json.loads(ours.read_text())
    update_cluster_file(ours, dict(data, step_overhead=1e-4), data)
    updated = json.loads(ours.read_text())
    assert written_by_tfpart(updated) and updated[MARK_KEY]["command"] == "cluster probe"


def test_simulate_gantt_refuses_other_formats_and_files_in_one_line(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")  # never read: the picture is refused first
    model = str(DEFAULT_MODEL_DIR)
    code, err = run_cli(capsys, "simulate", model, str(plan), "--gantt",
                        str(tmp_path / "x.json"))
    assert_clean_failure(code, err, "x.json", "give a file ending in .png, .svg or .pdf")
    assert not (tmp_path / "x.json").exists()
    picture = photo(tmp_path / "photo.png")
    refused(capsys, picture, "simulate", model, str(plan), "--gantt", str(picture),
            words=["tfpart did not write it: give --force"])
    notes = tmp_path / "notes.png"
    notes.write_bytes(NOTES)
    refused(capsys, notes, "simulate", model, str(plan), "--gantt", str(notes), "--force",
            words=["is not a PNG picture"])


def test_profile_refuses_another_kind_and_a_users_profile(capsys, tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_bytes(b'{"my": "notes"}')
    refused(capsys, notes, "profile", str(DEFAULT_MODEL_DIR), "-o", str(notes), "--force",
            words=["is not a profile"])
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"format": "tfpart-measured-profile/1", "device_kind": "cpu",
                                "ops": []}))
    refused(capsys, mine, "profile", str(DEFAULT_MODEL_DIR), "-o", str(mine),
            words=["give --force"])


def kernel_table(path):
    ops = [{"op_type": "Relu", "input_shapes": [[1000, 1000]], "output_shapes": [[1000, 1000]],
            "flops": 1e6, "bytes_accessed": n, "time_s": max(1e-5, n / 2e12), "count": 2}
           for n in (1e4, 1e6, 1e8, 1e9, 4e9)]
    path.write_text(json.dumps({"format": "tfpart-measured-profile/1", "device_kind": "H100",
                                "model": "t", "ops": ops}))
    return path


def test_calibrate_merges_into_a_kinds_file_keeping_every_value_and_no_other_kind(
        capsys, tmp_path):
    kernels = kernel_table(tmp_path / "kernels.json")
    notes = tmp_path / "notes.json"
    notes.write_bytes(b'{"my": "notes"}')
    refused(capsys, notes, "calibrate", str(kernels), "-o", str(notes),
            words=["is not a kinds file"])
    mine = tmp_path / "mine.json"
    shipped = json.loads(DEVICE_KINDS_FILE.read_text())
    shipped["kinds"]["cpu"]["memory_bandwidth"] = 12345678901.234567  # more than 6 digits
    mine.write_text(json.dumps(shipped))
    (tmp_path / "link.json").symlink_to(mine)
    refused(capsys, mine, "calibrate", str(kernels), "-o", str(tmp_path / "link.json"),
            words=["symbolic link"], named=tmp_path / "link.json")
    assert (tmp_path / "link.json").is_symlink()
    assert main(["calibrate", str(kernels), "-o", str(mine)]) == 0, capsys.readouterr().err
    merged = json.loads(mine.read_text())
    assert {name: kind for name, kind in merged["kinds"].items() if name != "H100"} == {
        name: kind for name, kind in shipped["kinds"].items() if name != "H100"}
    assert "calibrated" in merged["kinds"]["H100"]["source"] and MARK_KEY not in merged
    new = tmp_path / "new.json"
    for _ in range(2):  # created marked, then merged into again
        assert main(["calibrate", str(kernels), "-o", str(new)]) == 0
        assert written_by_tfpart(json.loads(new.read_text()))
    assert no_temporaries(tmp_path)


def copied_model_with_plan(tmp_path):
    """A folder that passes ``checkpoint``'s input checks (a SavedModel with a
    plan.json), for refusals that come before anything reads it."""
    compiled = tmp_path / "compiled"
    shutil.copytree(DEFAULT_MODEL_DIR, compiled)
    (compiled / "plan.json").write_text("{}")
    return compiled


def test_checkpoint_refuses_what_is_not_a_checkpoint_and_one_without_force(capsys,
                                                                         tmp_path):
    compiled = copied_model_with_plan(tmp_path)
    args = ["checkpoint", "to-original", str(compiled), str(compiled / "variables" /
                                                            "variables"),
            "--original", str(DEFAULT_MODEL_DIR), "-o"]
    index = tmp_path / "mine.index"
    index.write_bytes(b"my index of things")
    refused(capsys, index, *args, str(tmp_path / "mine"), "--force",
            words=["mine.index is not a checkpoint's index"], named=tmp_path / "mine")
    shutil.copy(DEFAULT_MODEL_DIR / "variables" / "variables.index", tmp_path / "ckpt.index")
    refused(capsys, tmp_path / "ckpt.index", *args, str(tmp_path / "ckpt"),
            words=["a checkpoint exists there", "give --force"], named=tmp_path / "ckpt")
    shard = tmp_path / "alone.data-00000-of-00001"
    shard.write_bytes(b"data")
    refused(capsys, shard, *args, str(tmp_path / "alone"), "--force",
            words=["without alone.index"], named=tmp_path / "alone")


def test_compile_draw_refuses_other_formats_and_files_before_compiling(capsys, tmp_path):
    out = tmp_path / "out"
    code, err = run_cli(capsys, "compile", "-o", str(out), "--draw", str(tmp_path / "p.txt"))
    assert_clean_failure(code, err, "p.txt", ".svg, .png, .pdf, .dot or .gv", out=out)
    notes = tmp_path / "notes.dot"
    notes.write_bytes(b"my notes on graphs")
    refused(capsys, notes, "compile", "-o", str(out), "--draw", str(notes), "--force",
            words=["is not a DOT graph"])
    mine = tmp_path / "mine.dot"
    mine.write_bytes(b"digraph mine { a -> b }")
    refused(capsys, mine, "compile", "-o", str(out), "--draw", str(mine),
            words=["give --force"])
    assert not out.exists()


def test_worker_memory_stats_refuses_a_users_file_before_serving(tmp_path):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "devices": [
        {"name": "/job:worker/task:0/device:CPU:0", "kind": "cpu"}]}))
    notes = tmp_path / "notes.json"
    notes.write_bytes(NOTES)
    done = subprocess.run([sys.executable, "-m", "tfpart.cli", "worker", "--cluster",
                           str(cluster), "--task", "0", "--memory-stats", str(notes)],
                          capture_output=True, text=True, timeout=60)
    assert_clean_failure(done.returncode, done.stderr.strip(), str(notes),
                         "remove it yourself")
    assert notes.read_bytes() == NOTES


# -- re-running a command replaces what it wrote; --force only the same kind ---------------

@pytest.fixture(scope="module")
def pipelined(tmp_path_factory):
    """The shipped example model compiled into a pipeline (a rebuilt model, whose
    checkpoints move), once for the module."""
    from tfpart.compile import compile_model

    out = tmp_path_factory.mktemp("compiled") / "out"
    result = compile_model(DEFAULT_MODEL_DIR, DEFAULT_CLUSTER_FILE, out, batch_size=4,
                           microbatches=2)
    return out, result


@pytest.mark.slow
@pytest.mark.any_onednn
# one xdist worker compiles the example once for the three tests that use it
@pytest.mark.xdist_group("pipelined_example")
def test_simulate_gantt_writes_each_format_marked_and_replaces_its_own(pipelined, capsys,
                                                                       tmp_path):
    out, _ = pipelined
    simulate = ["simulate", str(DEFAULT_MODEL_DIR), str(out / "plan.json"), "--gantt"]
    for suffix in (".png", ".svg", ".pdf"):
        path = tmp_path / f"schedule{suffix}"
        for _ in range(2):  # the second run replaces the first's picture
            assert main([*simulate, str(path)]) == 0, capsys.readouterr().err
        data = path.read_bytes()
        assert PICTURES[suffix].ours(data[:2**16] + data[-2**16:]), suffix
    picture = photo(tmp_path / "photo.png")
    assert main([*simulate, str(picture), "--force"]) == 0
    assert PICTURES[".png"].ours(picture.read_bytes()) and no_temporaries(tmp_path)


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("pipelined_example")
def test_compile_draw_replaces_its_own_picture_and_with_force_a_users(pipelined, tmp_path):
    from tfpart.picture import draw

    _, result = pipelined
    path = tmp_path / "placement.dot"
    for _ in range(2):
        written, _, _ = draw(result.plan, result.graph, path)
    assert written.read_bytes().startswith(b"// written by tfpart compile --draw\n")
    mine = tmp_path / "mine.gv"
    mine.write_text("digraph mine { a -> b }")
    with pytest.raises(OutputError, match="give --force"):
        draw(result.plan, result.graph, mine)
    draw(result.plan, result.graph, mine, force=True)
    assert PICTURES[".gv"].ours(mine.read_bytes())
    if shutil.which("dot"):  # rendered: the mark is in the picture
        picture = photo(tmp_path / "photo.png")
        draw(result.plan, result.graph, picture, force=True)
        assert PICTURES[".png"].ours(picture.read_bytes())
        draw(result.plan, result.graph, picture)


@pytest.mark.slow
@pytest.mark.any_onednn
@pytest.mark.xdist_group("pipelined_example")
def test_checkpoint_with_force_replaces_a_checkpoint(pipelined, capsys, tmp_path):
    out, _ = pipelined
    args = ["checkpoint", "to-original", str(out), str(out / "variables" / "variables"),
            "-o", str(tmp_path / "ckpt")]
    assert main(args) == 0, capsys.readouterr().err
    refused(capsys, tmp_path / "ckpt.index", *args, words=["give --force"],
            named=tmp_path / "ckpt")
    stale = tmp_path / "ckpt.data-00000-of-00002"  # a shard of an older checkpoint
    stale.write_bytes(b"old")
    assert main([*args, "--force"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.data-00000-of-00001",
                                                          "ckpt.index"]


@pytest.mark.slow
@pytest.mark.any_onednn
def test_profile_with_force_replaces_an_edited_profile_and_marks_it_again(capsys, tmp_path):
    from tfpart.core.output_files import PROFILE

    path = tmp_path / "profile.json"
    command = ["profile", str(DEFAULT_MODEL_DIR), "-o", str(path), "--repeats", "1",
               "--warmup", "1"]

    def profile(*extra):  # in a fresh process: profiling sets TensorFlow's threads
        done = subprocess.run([sys.executable, "-m", "tfpart.cli", *command, *extra],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    profile()
    data = json.loads(path.read_text())
    assert written_by_tfpart(data)
    path.write_text(json.dumps(dict(data, model="renamed by hand")))
    refused(capsys, path, *command, words=["give --force"])
    profile("--force")
    assert written_by_tfpart(json.loads(path.read_text()))
    check_output_file(path, PROFILE)  # so running it again replaces it


@pytest.mark.slow
@pytest.mark.any_onednn
def test_cluster_detect_replaces_its_own_file_and_with_force_a_users(capsys, tmp_path):
    path = tmp_path / "cluster.json"
    for _ in range(2):
        assert main(["cluster", "detect", "-o", str(path)]) == 0, capsys.readouterr().err
    assert written_by_tfpart(json.loads(path.read_text()))
    hand_written_cluster(path)
    assert main(["cluster", "detect", "-o", str(path), "--force"]) == 0
    assert json.loads(path.read_text())["name"].endswith("detected by tfpart cluster detect")
