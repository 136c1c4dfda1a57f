"""Variables over parameter servers by size (partitioner.ps_shards)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partitioner.ps_shards import shard_by_size

sizes = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4),
                        st.integers(1, 10**8), min_size=1, max_size=40)


@given(sizes=sizes, servers=st.integers(1, 5),
       capacities=st.lists(st.floats(0.2, 5), min_size=5, max_size=5))
def test_every_variable_on_one_server_within_its_share_plus_the_largest(sizes, servers,
                                                                          capacities):
    names = [f"/job:ps/task:{k}" for k in range(servers)]
    capacities = capacities[:servers]
    placement = shard_by_size(sizes, names, capacities)
    assert set(placement) == set(sizes) and set(placement.values()) <= set(names)
    total, largest = sum(sizes.values()), max(sizes.values())
    for name, capacity in zip(names, capacities):
        held = sum(size for var, size in sizes.items() if placement[var] == name)
        # LPT: a server gets a variable only while its load is the least relative one
        assert held <= total * capacity / sum(capacities) + largest * max(capacities) / \
            min(capacities) + 1e-6
    assert shard_by_size(sizes, names, capacities) == placement


def test_equal_servers_get_about_equal_bytes():
    placement = shard_by_size({f"v{i}": 100 for i in range(10)}, ["a", "b"])
    assert sorted(placement.values()).count("a") == 5


def test_no_server_is_an_error():
    with pytest.raises(ValueError, match="no parameter-server task"):
        shard_by_size({"v": 1}, [])
