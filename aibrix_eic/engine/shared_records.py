"""The shared store's records in LMDB: how a (namespace, key) becomes a
database key, the packed meta, order and expiry records, and `Writer`, one
write transaction's view of the bookkeeping (live bytes, the LRU order,
expiry) that shared_store.SharedStore runs every change through."""

import ctypes
import hashlib
import math
import struct
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from . import device

if TYPE_CHECKING:
    from .shared_store import SharedStore

META = struct.Struct("<QdQQ")  # seq, expires_at (inf: never), nbytes, value_checksum of the stored bytes
SEQ = struct.Struct(">Q")  # big-endian: LMDB's byte order is the seq order
EXPIRY = struct.Struct(">dQ")  # positive doubles sort bytewise in big-endian
COUNT = struct.Struct("<Q")
MAX_DB_KEY = 480  # LMDB's default key limit is 511 bytes
DIGEST_MARK = b"\xff\xff"  # never a namespace length: those stay below MAX_DB_KEY


def value_checksum(value: Any) -> int:
    """xxh3_64 of every byte of `value`.

    A stray write into the shared map (any process maps the store writable)
    or a flipped bit is byte-sized, so every byte is hashed, not a sample.
    xxh3_64 is the cheapest full check measured (benchmarks/bench_shared_store.py):
    0.07x the copy a get makes at 64 KiB, 0.5x at 2 MiB, where hardware
    CRC-32C costs 0.11x and 1.0x (and needs a copy of the value: its binding
    takes no memoryview) and zlib's CRC-32 0.7x and 6x.
    """
    return xxhash.xxh3_64_intdigest(value)


def raw_key(ns: str, key: str) -> bytes:
    """Namespace and key as one byte string: (ns length, ns, key)."""
    ns_bytes = ns.encode("utf-8", "surrogatepass")
    return struct.pack("<H", len(ns_bytes)) + ns_bytes + key.encode("utf-8", "surrogatepass")


def db_key_of(raw: bytes) -> bytes:
    """The raw key, or its digest when LMDB's key limit is too small for it
    (a raw key that fits has a namespace length below 0xffff, so the two
    never collide)."""
    return raw if len(raw) <= MAX_DB_KEY else DIGEST_MARK + hashlib.sha256(raw).digest()


def names_of(raw: bytes) -> tuple[str, str]:
    (ns_len,) = struct.unpack_from("<H", raw)
    return (
        raw[2 : 2 + ns_len].decode("utf-8", "surrogatepass"),
        raw[2 + ns_len :].decode("utf-8", "surrogatepass"),
    )


def address_of(buffer: memoryview) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


def caller_memory(addr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def source_bytes(addr: int, nbytes: int, on_device: bool) -> Any:  # a buffer: memoryview or ndarray
    """What put_many stores from a caller buffer: device memory is first
    copied to the host (never read by a host memmove)."""
    if not on_device:
        return caller_memory(addr, nbytes)
    host = np.empty(nbytes, dtype=np.uint8)
    device.copy_from_device(host, addr)
    return host


class Writer:
    """One write transaction's view of the bookkeeping; save() writes it back."""

    def __init__(self, txn: Any, store: "SharedStore") -> None:  # an lmdb.Transaction
        self.txn = txn
        self.dbs = store._dbs
        self.stats = store.stats
        info = self.dbs["info"]
        self.capacity = self._count(txn.get(b"capacity", db=info), store._initial_capacity)
        self.live = self._count(txn.get(b"live", db=info), 0)
        self.seq = self._count(txn.get(b"seq", db=info), 0)

    @staticmethod
    def _count(raw: bytes | memoryview | None, default: int) -> int:
        return default if raw is None else COUNT.unpack(raw)[0]

    def save(self) -> None:
        info = self.dbs["info"]
        self.txn.put(b"capacity", COUNT.pack(self.capacity), db=info)
        self.txn.put(b"live", COUNT.pack(max(self.live, 0)), db=info)
        self.txn.put(b"seq", COUNT.pack(self.seq), db=info)

    def remove(self, db_key: bytes) -> int:
        """Drop a value and its bookkeeping; its size, or 0 if absent."""
        meta = self.txn.get(db_key, db=self.dbs["meta"])
        if meta is None:
            return 0
        seq, expires_at, nbytes, _ = META.unpack_from(meta)
        self.txn.delete(db_key, db=self.dbs["values"])
        self.txn.delete(db_key, db=self.dbs["meta"])
        self._unorder(seq, expires_at)
        self.live -= nbytes
        return nbytes

    def publish(self, db_key: bytes, nbytes: int, expires_at: float, checksum: int, names: bytes) -> None:
        """Count a value just stored under db_key and give it the newest place."""
        self._order(db_key, nbytes, expires_at, checksum, names)
        self.live += nbytes

    def touch(self, db_key: bytes) -> None:
        """Move a value to the most-recent end (a hit some read remembered)."""
        meta = self.txn.get(db_key, db=self.dbs["meta"])
        if meta is None:
            return  # deleted or evicted since
        seq, expires_at, nbytes, checksum = META.unpack_from(meta)
        self._unorder(seq, expires_at)
        self._order(db_key, nbytes, expires_at, checksum, bytes(meta[META.size :]))

    def _order(self, db_key: bytes, nbytes: int, expires_at: float, checksum: int, names: bytes) -> None:
        self.seq += 1
        txn, dbs = self.txn, self.dbs
        txn.put(db_key, META.pack(self.seq, expires_at, nbytes, checksum) + names, db=dbs["meta"])
        txn.put(SEQ.pack(self.seq), db_key, db=dbs["order"])
        if math.isfinite(expires_at):
            txn.put(EXPIRY.pack(expires_at, self.seq), db_key, db=dbs["expiry"])

    def _unorder(self, seq: int, expires_at: float) -> None:
        self.txn.delete(SEQ.pack(seq), db=self.dbs["order"])
        if math.isfinite(expires_at):
            self.txn.delete(EXPIRY.pack(expires_at, seq), db=self.dbs["expiry"])

    def expire_due(self, now: float) -> None:
        cursor = self.txn.cursor(db=self.dbs["expiry"])
        while cursor.first():
            expires_at, seq = EXPIRY.unpack(cursor.key())
            if expires_at > now:
                break
            db_key = bytes(cursor.value())
            meta = self.txn.get(db_key, db=self.dbs["meta"])
            if meta is not None and META.unpack_from(meta)[0] == seq:
                self.remove(db_key)  # drops this entry too
                self.stats.expirations += 1
            else:
                cursor.delete()  # an entry no value owns any more

    def make_room(self, nbytes: int) -> None:
        """Evict least-recently-used values until `nbytes` more fit."""
        cursor = self.txn.cursor(db=self.dbs["order"])
        while self.live + nbytes > self.capacity and cursor.first():
            victim = bytes(cursor.value())
            if self.remove(victim) == 0:
                cursor.delete()
            self.stats.evictions += 1
        if not cursor.first():
            self.live = 0  # nothing left: whatever the count said was drift
