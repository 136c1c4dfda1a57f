"""The example models tfpart ships (SavedModel folders in ``profiles/models``), by name.

Examples
--------
>>> from tfpart import examples
>>> examples.names()
['residual_cnn']
>>> (examples.saved_model("residual_cnn") / "saved_model.pb").is_file()
True
>>> examples.saved_model("resnet")
Traceback (most recent call last):
...
tfpart.core.errors.ModelError: no shipped example model named 'resnet'; the shipped ones: residual_cnn
"""
from profiles import MODELS_DIR
from tfpart.core.errors import ModelError


def names():
    """The names of the shipped example models, sorted."""
    return sorted(folder.name for folder in MODELS_DIR.iterdir()
                  if (folder / "saved_model.pb").is_file())


def saved_model(name):
    """The SavedModel folder of the shipped example model ``name`` (a
    ``pathlib.Path``), for ``compile_model``, ``plan_model`` or the CLI.

    Raises
    ------
    ModelError
        If tfpart ships no example model of that name; it lists those it ships.
    """
    if name not in names():
        raise ModelError("", f"no shipped example model named {name!r}; the shipped ones: "
                         f"{', '.join(names())}")
    return MODELS_DIR / name
