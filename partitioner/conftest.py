"""What every algorithm's doctest starts from: a graph, a cluster of device kinds and the
cost model over them (``OpGraph``, ``cluster_of_devices``, ``CostModel``), so that each
example shows its algorithm, not the same three imports."""
import pytest

from costmodel import CostModel
from tfpart.core.cluster import cluster_of_devices
from tfpart.core.graph import OpGraph


@pytest.fixture(autouse=True)
def algorithm_doctest_names(doctest_namespace):
    doctest_namespace.update(OpGraph=OpGraph, cluster_of_devices=cluster_of_devices,
                             CostModel=CostModel)
