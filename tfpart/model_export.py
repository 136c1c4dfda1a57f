"""A Keras model or a ``tf.Module`` as the SavedModel folder tfpart reads.

:func:`tfpart.compile.plan_model` and :func:`tfpart.compile.compile_model` take a
SavedModel folder, a Keras model or a ``tf.Module``; an object is exported into a
temporary folder that lives as long as the call (:func:`saved_model_folder`).

Examples
--------
>>> import tensorflow as tf
>>> class Double(tf.Module):
...     @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
...     def __call__(self, x):
...         return {"y": 2 * x}
>>> with saved_model_folder(Double()) as folder:
...     print((folder / "saved_model.pb").is_file())
True
>>> folder.exists()
False
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tfpart.core.errors import ModelError, model_errors


def is_folder(model):
    """Whether ``model`` names a folder (a ``str`` or a path), not a model object.

    >>> is_folder("model/"), is_folder(Path("model")), is_folder(object())
    (True, True, False)
    """
    return isinstance(model, (str, os.PathLike))


@contextmanager
def saved_model_folder(model):
    """The SavedModel folder of ``model``: the folder itself if it names one, else a
    temporary folder that ``model`` (a Keras model or a ``tf.Module``) is exported into
    and that is removed when the block ends.

    A Keras model is exported as ``model.export`` does (signatures ``serve`` and
    ``serving_default``); a ``tf.Module`` as ``tf.saved_model.save`` does without
    ``signatures=``: its only ``tf.function`` with an ``input_signature`` becomes
    ``serving_default``.

    Raises
    ------
    ModelError
        If ``model`` is neither, is a Keras model not built yet, or is a module with no
        signature to export.
    """
    if is_folder(model):
        yield Path(model)
        return
    folder = Path(tempfile.mkdtemp(prefix="tfpart-model-"))
    try:
        saved = folder / "saved_model"
        _export(model, saved)
        yield saved
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _export(model, folder):
    """Write ``model`` (a Keras model or a ``tf.Module``) as a SavedModel at ``folder``."""
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(model, keras.Model):
        _export_keras(model, folder)
        return
    from rewriters.tf_import import tensorflow

    tf = tensorflow()
    if not isinstance(model, tf.__internal__.tracking.AutoTrackable):
        raise ModelError("", f"cannot read a model from an object of type "
                         f"{type(model).__name__}: give a SavedModel folder, a Keras model "
                         "or a tf.Module")
    with model_errors("", "export the tf.Module (tf.saved_model.save)"):
        tf.saved_model.save(model, str(folder))
    _check_has_signature(model, folder)


def _export_keras(model, folder):
    """``model.export``, refusing a model without inputs in one line."""
    if not model.built:
        raise ModelError("", f"the Keras model {model.name!r} has no inputs yet, so no "
                         "signature to export: build it (model.build(input_shape)) or call "
                         "it on a batch first")
    with model_errors("", f"export the Keras model {model.name!r} (model.export)"):
        model.export(str(folder), verbose=False)


def _check_has_signature(module, folder):
    """ModelError unless the SavedModel at ``folder`` has a signature to plan."""
    from rewriters.savedmodel_io import read_saved_model

    signatures = [key for key in read_saved_model(folder).meta_graphs[0].signature_def
                  if not key.startswith("__")]
    if not signatures:
        raise ModelError("", f"the {type(module).__name__} has no signature to export: give "
                         "it one tf.function with an input_signature (its __call__), or "
                         "save it with tf.saved_model.save(module, folder, signatures=...) "
                         "and give tfpart the folder")
