"""The embedded engine's shared mode: a store that many processes open at once,
kept in an LMDB environment under a directory (`local://NAME?dir=DIR`).

Why LMDB (docs/engine.md has the measured comparison): a write is one
transaction, so a reader sees a whole value or a miss, and a writer killed
mid-transaction leaves nothing that is ever read (its pages were never
committed; LMDB's robust writer mutex lets the next writer go on). Readers
never wait for writers, and a read copies straight out of the shared mapping.

What LMDB lacks is added here, inside the same write transactions, so it is
as atomic as the data: a byte budget with least-recently-used eviction, TTL,
and namespaces. Five named databases hold it:

    values  db key -> value bytes
    meta    db key -> (seq, expires_at, nbytes) [+ ns/key text for digest keys]
    order   seq -> db key, oldest first: the eviction order
    expiry  (expires_at, seq) -> db key, soonest first
    info    capacity, live bytes, the last seq

Recency: a write takes the next seq. A read cannot write (readers hold no
lock), so a hit is remembered in this process and applied by its next write
transaction (mset, mdel, set_capacity): a process that only reads does not
refresh what it reads.

Per process, as with the in-process store: `faults`, `stats`,
`max_value_bytes`, `namespaces` and `clock`. Shared: the data and `capacity`.
"""

import ctypes
import hashlib
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import quote

import lmdb
import numpy as np

from . import device
from .enums import StatusCode
from .faults import Faults
from .store import StoreStats

_memmove = ctypes.memmove  # a module global so tests can slow a copy down

_META = struct.Struct("<QdQ")  # seq, expires_at (inf: never), nbytes
_SEQ = struct.Struct(">Q")  # big-endian: LMDB's byte order is the seq order
_EXPIRY = struct.Struct(">dQ")  # positive doubles sort bytewise in big-endian
_COUNT = struct.Struct("<Q")
_MAX_DB_KEY = 480  # LMDB's default key limit is 511 bytes
_DIGEST_MARK = b"\xff\xff"  # never a namespace length: those stay below _MAX_DB_KEY
_MAX_REMEMBERED_HITS = 65536
_MAP_SLACK = 64 << 20
DEFAULT_CAPACITY = 4 * 1024**3


def store_dir(directory: str, name: str) -> str:
    """Where the store `name` lives under `directory` (names may hold ':' or '/')."""
    return os.path.join(os.path.abspath(directory), quote(name, safe="") or "default")


def _raw_key(ns: str, key: str) -> bytes:
    """Namespace and key as one byte string: (ns length, ns, key)."""
    ns_bytes = ns.encode("utf-8", "surrogatepass")
    return struct.pack("<H", len(ns_bytes)) + ns_bytes + key.encode("utf-8", "surrogatepass")


def _db_key(raw: bytes) -> bytes:
    """The raw key, or its digest when LMDB's key limit is too small for it
    (a raw key that fits has a namespace length below 0xffff, so the two
    never collide)."""
    return raw if len(raw) <= _MAX_DB_KEY else _DIGEST_MARK + hashlib.sha256(raw).digest()


def _names(raw: bytes) -> tuple[str, str]:
    (ns_len,) = struct.unpack_from("<H", raw)
    return (
        raw[2 : 2 + ns_len].decode("utf-8", "surrogatepass"),
        raw[2 + ns_len :].decode("utf-8", "surrogatepass"),
    )


def _address(buffer: memoryview) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


def _caller_memory(addr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def _source_bytes(addr: int, nbytes: int, on_device: bool):
    """What put_many stores from a caller buffer: device memory is first
    copied to the host (never read by a host memmove)."""
    if not on_device:
        return _caller_memory(addr, nbytes)
    host = np.empty(nbytes, dtype=np.uint8)
    device.copy_from_device(host, addr)
    return host


class _Writer:
    """One write transaction's view of the bookkeeping; save() writes it back."""

    def __init__(self, txn: lmdb.Transaction, store: "SharedStore") -> None:
        self.txn = txn
        self.dbs = store._dbs
        self.stats = store.stats
        info = self.dbs["info"]
        self.capacity = self._count(txn.get(b"capacity", db=info), store._initial_capacity)
        self.live = self._count(txn.get(b"live", db=info), 0)
        self.seq = self._count(txn.get(b"seq", db=info), 0)

    @staticmethod
    def _count(raw, default: int) -> int:
        return default if raw is None else _COUNT.unpack(raw)[0]

    def save(self) -> None:
        info = self.dbs["info"]
        self.txn.put(b"capacity", _COUNT.pack(self.capacity), db=info)
        self.txn.put(b"live", _COUNT.pack(max(self.live, 0)), db=info)
        self.txn.put(b"seq", _COUNT.pack(self.seq), db=info)

    def remove(self, db_key: bytes) -> int:
        """Drop a value and its bookkeeping; its size, or 0 if absent."""
        meta = self.txn.get(db_key, db=self.dbs["meta"])
        if meta is None:
            return 0
        seq, expires_at, nbytes = _META.unpack_from(meta)
        self.txn.delete(db_key, db=self.dbs["values"])
        self.txn.delete(db_key, db=self.dbs["meta"])
        self._unorder(seq, expires_at)
        self.live -= nbytes
        return nbytes

    def publish(self, db_key: bytes, nbytes: int, expires_at: float, names: bytes) -> None:
        """Count a value just stored under db_key and give it the newest place."""
        self._order(db_key, nbytes, expires_at, names)
        self.live += nbytes

    def touch(self, db_key: bytes) -> None:
        """Move a value to the most-recent end (a hit some read remembered)."""
        meta = self.txn.get(db_key, db=self.dbs["meta"])
        if meta is None:
            return  # deleted or evicted since
        seq, expires_at, nbytes = _META.unpack_from(meta)
        self._unorder(seq, expires_at)
        self._order(db_key, nbytes, expires_at, bytes(meta[_META.size :]))

    def _order(self, db_key: bytes, nbytes: int, expires_at: float, names: bytes) -> None:
        self.seq += 1
        txn, dbs = self.txn, self.dbs
        txn.put(db_key, _META.pack(self.seq, expires_at, nbytes) + names, db=dbs["meta"])
        txn.put(_SEQ.pack(self.seq), db_key, db=dbs["order"])
        if math.isfinite(expires_at):
            txn.put(_EXPIRY.pack(expires_at, self.seq), db_key, db=dbs["expiry"])

    def _unorder(self, seq: int, expires_at: float) -> None:
        self.txn.delete(_SEQ.pack(seq), db=self.dbs["order"])
        if math.isfinite(expires_at):
            self.txn.delete(_EXPIRY.pack(expires_at, seq), db=self.dbs["expiry"])

    def expire_due(self, now: float) -> None:
        cursor = self.txn.cursor(db=self.dbs["expiry"])
        while cursor.first():
            expires_at, seq = _EXPIRY.unpack(cursor.key())
            if expires_at > now:
                break
            db_key = bytes(cursor.value())
            meta = self.txn.get(db_key, db=self.dbs["meta"])
            if meta is not None and _META.unpack_from(meta)[0] == seq:
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


class SharedStore:
    """A capacity-bounded byte store in DIR, shared by every process that opens it."""

    def __init__(
        self,
        name: str,
        directory: str,
        capacity: int = DEFAULT_CAPACITY,
        max_value_bytes: int = 4 * 1024**2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.path = store_dir(directory, name)
        self.max_value_bytes = max_value_bytes
        self.namespaces: frozenset[str] | None = None
        # Wall-clock seconds: expiry times are compared across processes.
        self.clock = clock
        self.faults = Faults()
        self.mexist_miss = "success"  # like the fault knobs, this process's reading only
        self.stats = StoreStats()
        self._initial_capacity = capacity
        self._hits: dict[bytes, None] = {}
        self._hits_lock = threading.Lock()
        self._abandoned: list[lmdb.Environment] = []
        self._open()

    def _open(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        # The map bounds the file: twice the capacity leaves room for pages
        # that older read snapshots still hold. A store that exists keeps
        # the map size it was created with (LMDB takes the larger one).
        self._env = lmdb.open(
            self.path,
            map_size=2 * self._initial_capacity + _MAP_SLACK,
            writemap=True,
            sync=False,  # the data lives as long as DIR does; no fsync on tmpfs
            metasync=False,
            max_dbs=5,
            max_readers=1024,
            meminit=False,
        )
        self._pid = os.getpid()
        self._env.reader_check()  # slots of readers that were killed
        self._dbs = {db: self._env.open_db(db.encode()) for db in ("values", "meta", "order", "expiry", "info")}
        with self._env.begin(write=True) as txn:
            if txn.get(b"capacity", db=self._dbs["info"]) is None:
                txn.put(b"capacity", _COUNT.pack(self._initial_capacity), db=self._dbs["info"])

    @property
    def env(self) -> lmdb.Environment:
        if os.getpid() != self._pid:
            # A forked child must not use (or close) its parent's handle:
            # closing it would drop the parent's reader slots.
            self._abandoned.append(self._env)
            self._open()
        return self._env

    # ------------------------------------------------------------------ info
    def _info(self, name: bytes, default: int) -> int:
        with self.env.begin() as txn:
            raw = txn.get(name, db=self._dbs["info"])
        return default if raw is None else _COUNT.unpack(raw)[0]

    @property
    def capacity(self) -> int:
        return self._info(b"capacity", self._initial_capacity)

    @property
    def live_bytes(self) -> int:
        """Bytes of published values."""
        return self._info(b"live", 0)

    @property
    def held_bytes(self) -> int:
        """Bytes counted against the capacity (LMDB's free pages are not)."""
        return self.live_bytes

    def __len__(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self._dbs["meta"])["entries"])

    def has_namespace(self, ns: str) -> bool:
        return self.namespaces is None or ns in self.namespaces

    def keys(self) -> list[tuple[str, str]]:
        found = []
        with self.env.begin() as txn:
            for db_key, meta in txn.cursor(db=self._dbs["meta"]):
                raw = meta[_META.size :] if db_key.startswith(_DIGEST_MARK) else db_key
                found.append(_names(bytes(raw)))
        return found

    def value_size(self, ns: str, key: str) -> int | None:
        """Size of the unexpired value under (ns, key), or None."""
        with self.env.begin() as txn:
            meta = txn.get(_db_key(_raw_key(ns, key)), db=self._dbs["meta"])
        if meta is None:
            return None
        _, expires_at, nbytes = _META.unpack_from(meta)
        return None if expires_at <= self.clock() else nbytes

    # --------------------------------------------------------------- writes
    def _write(self, work: Callable[[_Writer], None]) -> None:
        """Run `work` in one write transaction, after the hits remembered
        since the last one and the due expiries."""
        with self._hits_lock:
            hits, self._hits = self._hits, {}
        with self.env.begin(write=True) as txn:
            writer = _Writer(txn, self)
            for db_key in hits:
                writer.touch(db_key)
            writer.expire_due(self.clock())
            work(writer)
            writer.save()

    def clear(self) -> None:
        """Drop every value (the capacity stays)."""

        def drop(writer: _Writer) -> None:
            for db in ("values", "meta", "order", "expiry"):
                writer.txn.drop(self._dbs[db], delete=False)
            writer.live = 0

        self._write(drop)

    def set_capacity(self, capacity: int) -> None:
        def resize(writer: _Writer) -> None:
            writer.capacity = capacity
            writer.make_room(0)

        self._write(resize)

    def put_many(
        self,
        ns: str,
        keys: Sequence[str],
        sources: Sequence[tuple[int, int]],
        ttl_second: int,
        on_device: Sequence[bool] | None = None,
    ) -> list[StatusCode]:
        """Store each (addr, nbytes) source under its key; one code per key
        (`on_device[i]`: source i is device memory). All of the call's
        values are published together, or none are."""
        codes = [StatusCode.SUCCESS] * len(keys)

        def store(writer: _Writer) -> None:
            values = self._dbs["values"]
            for i, key in enumerate(keys):
                addr, nbytes = sources[i]
                if nbytes > writer.capacity:
                    codes[i] = StatusCode.OUT_OF_CAPACITY
                    continue
                raw = _raw_key(ns, key)
                db_key = _db_key(raw)
                writer.remove(db_key)  # an overwrite frees the old value first
                writer.make_room(nbytes)
                writer.txn.put(db_key, _source_bytes(addr, nbytes, bool(on_device and on_device[i])), db=values)
                expires_at = self.clock() + ttl_second if ttl_second > 0 else math.inf
                names = b"" if db_key is raw else raw  # keys() reads digest keys' names here
                writer.publish(db_key, nbytes, expires_at, names)
                self.stats.bytes_in += nbytes

        try:
            self._write(store)
        except lmdb.MapFullError:
            # The file is full of pages older read snapshots still hold:
            # free the slots of dead readers, and fail this call's keys.
            self.env.reader_check()
            codes = [StatusCode.OUT_OF_CAPACITY] * len(keys)
        self.stats.puts += len(keys)
        return codes

    def delete_many(self, ns: str, keys: Sequence[str]) -> list[bool]:
        """Remove each key; True where an unexpired value was there to remove."""
        removed = [False] * len(keys)

        def delete(writer: _Writer) -> None:
            for i, key in enumerate(keys):
                removed[i] = writer.remove(_db_key(_raw_key(ns, key))) > 0

        self._write(delete)
        self.stats.deletes += len(keys)
        return removed

    # ---------------------------------------------------------------- reads
    def get_many(
        self,
        ns: str,
        keys: Sequence[str],
        destinations: Sequence[tuple[int, int]],
        on_device: Sequence[bool] | None = None,
    ) -> list[StatusCode]:
        """Copy each stored value into its (addr, nbytes) destination
        (`on_device[i]`: destination i is device memory).

        A destination whose size differs from the stored value is left
        untouched and gets BUFFER_SIZE_MISMATCH: never a partial fill.
        """
        codes = [StatusCode.KEY_NOT_EXIST] * len(keys)
        hits: list[bytes] = []
        copied = 0
        meta_db, values_db = self._dbs["meta"], self._dbs["values"]
        # One read snapshot: what it copies stays whole while writers go on.
        with self.env.begin(buffers=True) as txn:
            now = self.clock()
            for i, key in enumerate(keys):
                db_key = _db_key(_raw_key(ns, key))
                meta = txn.get(db_key, db=meta_db)
                if meta is None:
                    continue
                _, expires_at, nbytes = _META.unpack_from(meta)
                if expires_at <= now:
                    continue  # the next write transaction removes it
                addr, length = destinations[i]
                if length != nbytes:
                    codes[i] = StatusCode.BUFFER_SIZE_MISMATCH
                    continue
                value = txn.get(db_key, db=values_db)
                if value is None:  # meta and value are written in one transaction; a miss if they ever are not
                    continue
                if on_device and on_device[i]:
                    device.copy_to_device(addr, np.frombuffer(value, dtype=np.uint8))
                else:
                    _memmove(addr, _address(value), nbytes)
                codes[i] = StatusCode.SUCCESS
                hits.append(db_key)
                copied += nbytes
        if hits:
            with self._hits_lock:
                if len(self._hits) < _MAX_REMEMBERED_HITS:
                    self._hits.update(dict.fromkeys(hits))
        stats = self.stats
        stats.gets += len(keys)
        stats.hits += len(hits)
        stats.misses += len(keys) - len(hits)
        stats.bytes_out += copied
        return codes

    def exist_many(self, ns: str, keys: Sequence[str]) -> list[bool]:
        """Whether each key holds an unexpired value. Does not touch recency."""
        meta_db = self._dbs["meta"]
        found = []
        with self.env.begin(buffers=True) as txn:
            now = self.clock()
            for key in keys:
                meta = txn.get(_db_key(_raw_key(ns, key)), db=meta_db)
                found.append(meta is not None and _META.unpack_from(meta)[1] > now)
        self.stats.exists += len(keys)
        return found


_shared: dict[str, SharedStore] = {}
_shared_lock = threading.Lock()


def open_shared_store(name: str, directory: str, capacity: int | None) -> SharedStore:
    """This process's one handle on the store `name` in `directory` (LMDB
    allows one per process), opened on first use."""
    path = store_dir(directory, name)
    with _shared_lock:
        store = _shared.get(path)
        if store is None:
            store = _shared[path] = SharedStore(name, directory, capacity or DEFAULT_CAPACITY)
    return store


def forget_shared_stores() -> None:
    """Drop this process's handles. They are not closed: a client of the
    last test may still hold one, and LMDB closes it with the last reference."""
    with _shared_lock:
        _shared.clear()
