"""Variables over parameter servers by size (partitioner.ps_shards)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partitioner.ps_shards import shard_variables

sizes = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4),
                        st.integers(1, 10**8), min_size=1, max_size=40)


@given(sizes=sizes, servers=st.integers(1, 5),
       capacities=st.lists(st.floats(0.2, 5), min_size=5, max_size=5),
       rows=st.lists(st.integers(0, 50), min_size=40, max_size=40),
       min_shard_bytes=st.sampled_from([0, 10**5, 10**7]))
def test_pieces_cover_the_rows_on_distinct_servers_within_a_share_plus_the_largest(
        sizes, servers, capacities, rows, min_shard_bytes):
    names = [f"/job:ps/task:{k}" for k in range(servers)]
    capacities = capacities[:servers]
    first_axis = dict(zip(sorted(sizes), rows))
    placement = shard_variables(sizes, names, capacities, first_axis, min_shard_bytes)
    assert set(placement) == set(sizes)
    largest = 0.0
    held = dict.fromkeys(names, 0.0)
    for name, shards in placement.items():
        servers_of = [shard.server for shard in shards]
        assert set(servers_of) <= set(names) and len(set(servers_of)) == len(shards)
        if len(shards) == 1:
            assert shards[0].rows is None
            pieces = [sizes[name]]
        else:
            counts = [shard.rows for shard in shards]
            assert sum(counts) == first_axis[name] and max(counts) - min(counts) <= 1
            assert sizes[name] >= len(shards) * min_shard_bytes
            pieces = [sizes[name] * c / first_axis[name] for c in counts]
        for shard, piece in zip(shards, pieces):
            held[shard.server] += piece
        largest = max(largest, *pieces)
    total = sum(sizes.values())
    for name, capacity in zip(names, capacities):
        # LPT: a server gets a piece only while its load is the least relative one
        assert held[name] <= total * capacity / sum(capacities) + largest * max(capacities) / \
            min(capacities) + 1e-6
    assert shard_variables(sizes, names, capacities, first_axis, min_shard_bytes) == placement


def test_equal_servers_get_about_equal_bytes():
    placement = shard_variables({f"v{i}": 100 for i in range(10)}, ["a", "b"])
    assert [shards[0].server for shards in placement.values()].count("a") == 5


def test_a_large_variable_is_cut_like_min_size_partitioner():
    """1 MB of 512 rows over three servers, at least 256 KiB a piece: three pieces;
    at least 400 KiB a piece: two; a small one stays whole."""
    sizes, rows = {"kernel": 2**20, "bias": 2048}, {"kernel": 512, "bias": 512}
    servers = ["a", "b", "c"]
    assert [s.rows for s in shard_variables(sizes, servers, rows=rows)["kernel"]] == \
        [171, 171, 170]
    assert [s.rows for s in shard_variables(sizes, servers, rows=rows,
                                            min_shard_bytes=400 * 1024)["kernel"]] == [256, 256]
    assert shard_variables(sizes, servers, rows=rows)["bias"][0].rows is None


def test_no_server_is_an_error():
    with pytest.raises(ValueError, match="no parameter-server task"):
        shard_variables({"v": 1}, [])
