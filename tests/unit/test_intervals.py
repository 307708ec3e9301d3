"""Merged address ranges answer "is this buffer inside registered memory"
exactly like a brute-force check of every byte."""

from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.util import address_ranges as intervals

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)), max_size=8)


@given(ranges=spans, addr=st.integers(0, 260), nbytes=st.integers(1, 60))
def test_covers_matches_a_byte_by_byte_check(ranges, addr, nbytes):
    index = intervals.merge((start, start + length) for start, length in ranges)
    inside = all(any(start <= x < start + length for start, length in ranges) for x in range(addr, addr + nbytes))
    assert intervals.covers(index, addr, nbytes) == inside


@given(ranges=spans)
def test_merged_ranges_are_sorted_and_disjoint(ranges):
    starts, ends = intervals.merge((start, start + length) for start, length in ranges)
    assert starts == sorted(starts)
    assert all(ends[i] < starts[i + 1] for i in range(len(starts) - 1))
