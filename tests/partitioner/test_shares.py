"""Largest-remainder shares: they sum to the total, stay within one of the exact
proportion, and never give a faster device less than a slower one."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partitioner.shares import proportional_shares

speeds = st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=8)


@given(st.integers(min_value=0, max_value=10_000), speeds)
def test_shares_sum_to_the_total_and_stay_within_one_of_the_proportion(total, speeds):
    shares = proportional_shares(total, speeds)
    assert sum(shares) == total and all(s >= 0 for s in shares)
    for share, speed in zip(shares, speeds):
        assert abs(share - total * speed / sum(speeds)) < 1


@given(st.integers(min_value=0, max_value=10_000), speeds)
def test_a_faster_device_never_gets_less(total, speeds):
    shares = proportional_shares(total, speeds)
    for i, j in [(i, j) for i in range(len(speeds)) for j in range(len(speeds))]:
        if speeds[i] > speeds[j]:
            assert shares[i] >= shares[j]


@given(st.integers(min_value=0, max_value=10_000), speeds,
       st.lists(st.integers(0, 7), min_size=1, max_size=8))
def test_a_device_of_speed_zero_gets_no_share(total, speeds, stopped):
    speeds = [0.0 if i in stopped else s for i, s in enumerate(speeds)]
    if not any(speeds):
        return
    shares = proportional_shares(total, speeds)
    assert sum(shares) == total
    assert all(share == 0 for share, speed in zip(shares, speeds) if speed == 0)


@pytest.mark.parametrize("total, speeds", [(-1, [1.0]), (3, []), (3, [0.0, 0.0]),
                                           (3, [1.0, -1.0]), (3, [float("inf")]),
                                           (3, [float("nan"), 1.0])])
def test_impossible_requests_are_refused(total, speeds):
    with pytest.raises(ValueError):
        proportional_shares(total, speeds)
