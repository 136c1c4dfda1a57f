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


class OutputError(TfpartError):
    """The output location cannot be written (exists without --force, ...)."""
