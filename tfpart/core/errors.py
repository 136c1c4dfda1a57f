"""The one exception family of tfpart.

Every error a user can cause (bad model, bad cluster file, infeasible placement) is a
:class:`TfpartError`. The CLI prints it as one line, ``tfpart: <file>: <problem>``, and
exits with code 2; anything else escaping is a bug.

Examples
--------
>>> err = ClusterError("cluster.json", "devices[1].memory: must be positive")
>>> str(err)
'cluster.json: devices[1].memory: must be positive'
"""
import re
from contextlib import contextmanager


class TfpartError(Exception):
    """Base class; ``path`` names the file at fault (may be empty)."""

    def __init__(self, path, problem):
        self.path = str(path) if path else ""
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)


class ModelError(TfpartError):
    """The SavedModel is missing, unreadable, or uses something tfpart cannot place."""


class ClusterError(TfpartError):
    """cluster.json is missing, malformed or inconsistent."""


class ProfileError(TfpartError):
    """A device-kind profile is missing, malformed or inconsistent."""


class PlacementError(TfpartError):
    """No valid placement exists (memory, kernels) or a plan violates a constraint."""


class VerificationError(TfpartError):
    """A compiled model's outputs differ from the original's, or its ops ran elsewhere
    than planned."""


class OutputError(TfpartError):
    """The output location cannot be written (exists without --force, ...)."""


def first_line(exc):
    """The gist of an exception's message: its first line, without TensorFlow's
    ``{{function_node ...}}`` prefix, at most 200 characters.

    >>> first_line(ValueError("{{function_node f}} bad value\\nmore"))
    'bad value'
    """
    text = str(exc).strip()
    text = re.sub(r"^(\{\{[^}]*\}\}\s*)+", "", text).splitlines()[0] if text else ""
    return (text or type(exc).__name__)[:200]


@contextmanager
def model_errors(path, doing, passing=()):
    """Turn any error raised while loading or running the SavedModel at ``path`` (a
    corrupt file shows up as TensorFlow errors, IndexError, KeyError, ...) into a
    one-line ModelError; ``passing`` exception types go through unchanged."""
    try:
        yield
    except (TfpartError, KeyboardInterrupt, *passing):
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt model can raise anything
        raise ModelError(path, f"cannot {doing}: {first_line(exc)}") from None
