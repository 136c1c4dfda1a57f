"""Read a SavedModel proto from disk and write a rewritten one atomically.

The output is assembled in a temporary folder beside the target (variables and assets
copied, the new ``saved_model.pb``, a fresh fingerprint, extra files such as plan.json)
and renamed into place only when complete, so a failure leaves nothing half-written
(:mod:`tfpart.core.output_folders`).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from tfpart.core.errors import ModelError, first_line
from tfpart.core.output_folders import (move_into_place, new_staging_folder, os_errors,
                                        removed_on_failure)


@dataclass(frozen=True)
class SavedModelParts:
    """A SavedModel as the rewriters pass it along: the proto, and the folder whose
    ``variables/`` and ``assets/`` go with it (the input model's, or a folder a
    rewriter wrote new ones into)."""

    proto: object  # saved_model_pb2.SavedModel
    directory: Path
    # the reader's flattening of the compiled signature (rewriters.flatten), which a pass
    # that rebuilds the signature starts from; None: it flattens anew
    flat: object = None


def check_model_dir(path):
    """``path/saved_model.pb`` if ``path`` looks like a SavedModel folder, else a
    ModelError (without starting TensorFlow)."""
    path = Path(path)
    if not path.exists():
        raise ModelError(path, "no such directory")
    if not path.is_dir():
        raise ModelError(path, "not a directory (a SavedModel is a folder)")
    pb = path / "saved_model.pb"
    if not pb.is_file():
        raise ModelError(path, "not a SavedModel: saved_model.pb is missing")
    return pb


def read_saved_model(path):
    """The ``SavedModel`` proto of the folder ``path``; ModelError if it is not one."""
    pb = check_model_dir(path)
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(pb.read_bytes())
    except (DecodeError, RuntimeError) as exc:
        raise ModelError(pb, f"corrupt or truncated saved_model.pb ({exc})") from None
    if not proto.meta_graphs:
        raise ModelError(pb, "corrupt or truncated saved_model.pb (no meta graph)")
    meta = proto.meta_graphs[0]
    tf2 = meta.HasField("object_graph_def") and meta.object_graph_def.nodes
    if not tf2 and not [k for k in meta.signature_def if not k.startswith("__")]:
        raise ModelError(pb, "neither a TensorFlow 2 SavedModel (no object graph) nor a "
                         "TensorFlow 1 one (no signatures)")
    return proto


def check_variables(path):
    """Read the variables index of the SavedModel at ``path`` (not the values), so a
    corrupt or truncated index is a ModelError naming it before anything is written."""
    index = Path(path) / "variables" / "variables.index"
    if not index.exists():
        return
    from tensorflow.python.training import py_checkpoint_reader

    try:
        py_checkpoint_reader.NewCheckpointReader(str(index.parent / "variables"))
    except Exception as exc:  # noqa: BLE001 - TensorFlow raises several kinds here
        raise ModelError(index, f"corrupt or unreadable variables index ({first_line(exc)})") \
            from None


def save(model, out, force=False, extra_files=None, check=None, staging=None):
    """Write the :class:`SavedModelParts` ``model`` to ``out`` (see
    :func:`write_saved_model`)."""
    return write_saved_model(model.proto, model.directory, out, force, extra_files, check,
                             staging)


def write_saved_model(proto, source_dir, out, force=False, extra_files=None, check=None,
                      staging=None):
    """Write ``proto`` with ``source_dir``'s variables and assets to ``out``.

    ``extra_files`` maps a file name to the text written beside ``saved_model.pb``;
    ``check`` and ``staging`` are passed to :func:`write_output`.
    """
    def fill(staging):
        for item in Path(source_dir).iterdir():
            if item.name in ("saved_model.pb", "fingerprint.pb"):
                continue
            target = staging / item.name
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, target)
        (staging / "saved_model.pb").write_bytes(proto.SerializeToString(deterministic=True))

    return write_output(fill, out, force, extra_files, check, staging)


def write_output(fill, out, force=False, extra_files=None, check=None, staging=None):
    """Call ``fill(staging)`` to write a SavedModel into a fresh folder beside ``out``
    (or into ``staging``, one :func:`tfpart.core.output_folders.new_staging_folder` made),
    add a fingerprint and ``extra_files``, call ``check(staging)`` if given (it may
    raise), then move it into place (:func:`tfpart.core.output_folders.move_into_place`:
    an existing ``out`` is replaced only with ``force`` and only if tfpart wrote it;
    nothing is left behind if anything fails)."""
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    out = Path(out)
    staging = new_staging_folder(out, force) if staging is None else Path(staging)
    with removed_on_failure(staging):
        with os_errors(out):
            fill(staging)
            (staging / "fingerprint.pb").write_bytes(
                fingerprinting.CreateFingerprintDef(str(staging)))
            for name, text in (extra_files or {}).items():
                (staging / name).write_text(text)
        if check is not None:
            check(staging)
    move_into_place(staging, out, "compile", force)
    return out
