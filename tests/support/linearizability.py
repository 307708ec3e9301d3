"""A history of key-value operations and the check that no read was stale.

Each operation is stamped with a logical clock when the caller starts it and
again when it returns (one event loop, so the stamps order every start and
end the caller saw; no wall-clock time is involved). Stamps taken just before
the call and just after its return make every window at least as wide as the
operation really was, so the check can only under-report, never invent, a
violation.

The rule: every get reported OK returns a value not superseded by
a write that returned OK before the get started. Precisely, for an OK read of
key K that returned the bytes of version v, written by put P:

- the bytes are exactly one version ever put for K (never torn, never
  another key's, never a version whose put started after the get ended);
- no write W of K has W.start > P.end and W.end < G.start, where a write is
  a put of K that returned OK for every key of its request, or a delete of K
  that returned OK or NOT_FOUND. P.end is when P returned to its caller,
  whatever it returned: a put that failed or timed out may land, but not
  after its caller saw it end.

A miss (any non-OK status) is always allowed: losing entries is fine.
"""

import bisect
import itertools
import struct
from dataclasses import dataclass, field

from aibrix_kvcache.status import Status, StatusCodes

# One record, repeated over the whole block: a torn or foreign block does not match.
RECORD = struct.Struct("<4sIQ")
MAGIC = b"LinZ"
FOREIGN = -1  # the version of a read whose bytes are no whole version of the key


def payload(key_id: int, version: int, nbytes: int) -> bytes:
    assert nbytes % RECORD.size == 0, f"blocks of {RECORD.size}-byte records, not {nbytes}"
    return RECORD.pack(MAGIC, key_id, version) * (nbytes // RECORD.size)


def decode(key_id: int, data: bytes) -> int:
    """The version `data` holds for key_id, or FOREIGN."""
    magic, found_key, version = RECORD.unpack_from(data)
    if magic != MAGIC or found_key != key_id or data != payload(key_id, version, len(data)):
        return FOREIGN
    return version


@dataclass
class Op:
    kind: str  # "put", "get", "delete", "exists"
    keys: tuple[int, ...]
    start: int
    versions: tuple[int, ...] = ()  # put: the version written per key
    end: int = -1
    codes: tuple[StatusCodes, ...] = ()  # per key
    read: tuple[int | None, ...] = ()  # get: per key the version read (FOREIGN), None where not OK

    @property
    def all_ok(self) -> bool:
        return bool(self.codes) and all(code == StatusCodes.OK for code in self.codes)


@dataclass
class Finding:
    kind: str  # "stale", "foreign", "future", "answer"
    text: str
    key: int | None = None
    window: tuple[int, int] = (0, 0)  # the clock span of the ops involved, for explain()


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    answers: list[Finding] = field(default_factory=list)  # malformed answers seen while recording
    _clock: itertools.count = field(default_factory=itertools.count)
    _version: itertools.count = field(default_factory=lambda: itertools.count(1))

    def new_version(self) -> int:
        return next(self._version)

    def begin(self, kind: str, keys: tuple[int, ...], versions: tuple[int, ...] = ()) -> Op:
        op = Op(kind, keys, next(self._clock), versions)
        self.ops.append(op)
        return op

    def end(self, op: Op, result, allowed: frozenset[StatusCodes]) -> None:
        """Stamp the end and keep per-key codes; an answer that is not a
        Status (or a list of one per key) or has a code outside `allowed` is
        a finding, and counts as no answer."""
        op.end = next(self._clock)
        nkeys = len(op.keys)
        if isinstance(result, Status):
            statuses = [result] * nkeys
        elif isinstance(result, list | tuple) and len(result) == nkeys and all(isinstance(s, Status) for s in result):
            statuses = list(result)
        else:
            self.answers.append(Finding("answer", f"{op.kind} {op.keys} answered {result!r}"))
            statuses = [Status(StatusCodes.ERROR, "malformed")] * nkeys
        for status in statuses:
            if status.error_code not in allowed:
                self.answers.append(Finding("answer", f"{op.kind} {op.keys} answered {status!r}"))
        op.codes = tuple(status.error_code for status in statuses)

    def completed(self) -> list[Op]:
        return [op for op in self.ops if op.end >= 0]


class _Writes:
    """The writes of one key, sorted by start, with the earliest end among
    every write starting at or after each position."""

    def __init__(self, writes: list[Op]) -> None:
        self.writes = sorted(writes, key=lambda op: op.start)
        self.starts = [op.start for op in self.writes]
        self.min_end_from = [0] * len(self.writes)
        soonest = None
        for i in range(len(self.writes) - 1, -1, -1):
            end = self.writes[i].end
            soonest = end if soonest is None else min(soonest, end)
            self.min_end_from[i] = soonest

    def superseding(self, after: int, before: int) -> Op | None:
        """A write that started after `after` and ended before `before`."""
        first = bisect.bisect_right(self.starts, after)
        if first == len(self.writes) or self.min_end_from[first] >= before:
            return None
        return next(op for op in self.writes[first:] if op.end < before)


def check(history: History) -> list[Finding]:
    """Every violation of the rule in the module docstring."""
    ops = history.completed()
    puts: dict[tuple[int, int], Op] = {}
    writes: dict[int, list[Op]] = {}
    for op in ops:
        if op.kind == "put":
            for key, version in zip(op.keys, op.versions):
                puts[(key, version)] = op
                if op.all_ok:
                    writes.setdefault(key, []).append(op)
        elif op.kind == "delete" and op.codes[0] in (StatusCodes.OK, StatusCodes.NOT_FOUND):
            writes.setdefault(op.keys[0], []).append(op)
    by_key = {key: _Writes(key_writes) for key, key_writes in writes.items()}
    findings = list(history.answers)
    for get in ops:
        if get.kind != "get":
            continue
        for key, version in zip(get.keys, get.read):
            if version is None:
                continue
            where = f"get of key {key} [{get.start}, {get.end}]"
            put = puts.get((key, version))
            if version == FOREIGN or put is None:
                findings.append(Finding("foreign", f"{where} returned bytes that are no version of key {key}"))
                continue
            if put.start > get.end:
                findings.append(Finding("future", f"{where} returned v{version}, put only at {put.start}"))
                continue
            newer = by_key[key].superseding(put.end, get.start) if key in by_key else None
            if newer is not None:
                findings.append(
                    Finding(
                        "stale",
                        f"{where} returned v{version} (put [{put.start}, {put.end}] {_codes(put)}), superseded "
                        f"by {newer.kind} {_versions(newer)}[{newer.start}, {newer.end}] {_codes(newer)}",
                        key,
                        (put.start, get.end),
                    )
                )
    return findings


def explain(history: History, finding: Finding) -> list[str]:
    """The operations on the finding's key within its window, in start order."""
    low, high = finding.window
    lines = []
    for op in history.ops:
        if finding.key in op.keys and op.start <= high and op.end >= low:
            i = op.keys.index(finding.key)
            what = f"v{op.versions[i]}" if op.kind == "put" else f"read v{op.read[i]}" if op.read else ""
            lines.append(f"{op.kind} [{op.start}, {op.end}] {what} {op.codes[i].name}")
    return lines


def _codes(op: Op) -> str:
    return "/".join(code.name for code in op.codes)


def _versions(op: Op) -> str:
    return "".join(f"v{version} " for version in op.versions)
