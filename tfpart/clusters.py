"""The cluster files tfpart ships (``profiles/clusters``), by name.

Examples
--------
>>> from tfpart import clusters
>>> "a100_l4_one_host" in clusters.names()
True
>>> [device.kind.name for device in clusters.load("a100_l4_one_host").devices]
['A100-40GB', 'L4', 'L4', 'cpu']
>>> clusters.load("a100")
Traceback (most recent call last):
...
tfpart.core.errors.ClusterError: no shipped cluster named 'a100'; the shipped ones: 4xT4_one_host, a100_l4_one_host, h100_a100_l4_one_host, hetero_2v100_2t4, local_3cpu
"""
from profiles import CLUSTERS_DIR
from tfpart.core.cluster import load_cluster
from tfpart.core.errors import ClusterError


def names():
    """The names of the shipped clusters, sorted: their files' names without ``.json``."""
    return sorted(path.stem for path in CLUSTERS_DIR.glob("*.json"))


def path(name):
    """The file of the shipped cluster ``name`` (for ``compile_model`` or the CLI's
    ``--cluster``).

    Raises
    ------
    ClusterError
        If tfpart ships no cluster of that name; it lists those it ships.
    """
    if name not in names():
        raise ClusterError("", f"no shipped cluster named {name!r}; the shipped ones: "
                           f"{', '.join(names())}")
    return CLUSTERS_DIR / f"{name}.json"


def load(name):
    """The shipped cluster ``name`` (a :class:`~tfpart.core.cluster.Cluster`), as
    :func:`~tfpart.core.cluster.load_cluster` reads its file (:func:`path`)."""
    return load_cluster(path(name))
