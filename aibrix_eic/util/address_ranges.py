"""Merged address ranges and "is this buffer inside them" lookups.

Shared by the connector's registration bookkeeping and the embedded engine's
register_memory checks. An index is a (starts, ends) pair of sorted lists,
built once and swapped whole, so readers need no lock.
"""

import bisect
from collections.abc import Iterable

Index = tuple[list[int], list[int]]
EMPTY: Index = ([], [])


def merge(ranges: Iterable[tuple[int, int]]) -> Index:
    """Index of [start, end) ranges, overlapping or touching ones merged."""
    starts: list[int] = []
    ends: list[int] = []
    for start, end in sorted(ranges):
        if starts and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


def ranges(index: Index) -> list[tuple[int, int]]:
    return list(zip(*index))


def covers(index: Index, addr: int, nbytes: int) -> bool:
    """Whether [addr, addr + nbytes) lies inside one merged range."""
    starts, ends = index
    i = bisect.bisect_right(starts, addr) - 1
    return i >= 0 and addr + nbytes <= ends[i]
