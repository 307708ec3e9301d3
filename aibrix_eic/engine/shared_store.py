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
import math
import os
import threading
import time
from collections.abc import Callable, Sequence

import lmdb
import numpy as np

from . import device
from .enums import StatusCode
from .faults import Faults
from .shared_records import (
    COUNT,
    DIGEST_MARK,
    META,
    Writer,
    address_of,
    db_key_of,
    names_of,
    raw_key,
    source_bytes,
    store_dir,
)
from .store import StoreStats

_memmove = ctypes.memmove  # a module global so tests can slow a copy down

_MAX_REMEMBERED_HITS = 65536
_MAP_SLACK = 64 << 20
DEFAULT_CAPACITY = 4 * 1024**3


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
                txn.put(b"capacity", COUNT.pack(self._initial_capacity), db=self._dbs["info"])

    @property
    def env(self) -> lmdb.Environment:
        if os.getpid() != self._pid:
            # A forked child must not use (or close) its parent's handle:
            # closing it would drop the parent's reader slots. And py-lmdb
            # refuses a second handle on the same files in one process.
            self._abandoned.append(self._env)
            try:
                self._open()
            except lmdb.Error as e:
                raise lmdb.Error(
                    f"shared store {self.path}: this process was forked from one that had opened it, and LMDB "
                    "cannot open it again here; open the store only in processes that were not forked from "
                    f"one that used it ({e})"
                ) from e
        return self._env

    # ------------------------------------------------------------------ info
    def _info(self, name: bytes, default: int) -> int:
        with self.env.begin() as txn:
            raw = txn.get(name, db=self._dbs["info"])
        return default if raw is None else COUNT.unpack(raw)[0]

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
                raw = meta[META.size :] if db_key.startswith(DIGEST_MARK) else db_key
                found.append(names_of(bytes(raw)))
        return found

    def value_size(self, ns: str, key: str) -> int | None:
        """Size of the unexpired value under (ns, key), or None."""
        with self.env.begin() as txn:
            meta = txn.get(db_key_of(raw_key(ns, key)), db=self._dbs["meta"])
        if meta is None:
            return None
        _, expires_at, nbytes = META.unpack_from(meta)
        return None if expires_at <= self.clock() else nbytes

    # --------------------------------------------------------------- writes
    def _write(self, work: Callable[[Writer], None]) -> None:
        """Run `work` in one write transaction, after the hits remembered
        since the last one and the due expiries."""
        with self._hits_lock:
            hits, self._hits = self._hits, {}
        with self.env.begin(write=True) as txn:
            writer = Writer(txn, self)
            for db_key in hits:
                writer.touch(db_key)
            writer.expire_due(self.clock())
            work(writer)
            writer.save()

    def clear(self) -> None:
        """Drop every value (the capacity stays)."""

        def drop(writer: Writer) -> None:
            for db in ("values", "meta", "order", "expiry"):
                writer.txn.drop(self._dbs[db], delete=False)
            writer.live = 0

        self._write(drop)

    def set_capacity(self, capacity: int) -> None:
        def resize(writer: Writer) -> None:
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

        def store(writer: Writer) -> None:
            values = self._dbs["values"]
            for i, key in enumerate(keys):
                addr, nbytes = sources[i]
                if nbytes > writer.capacity:
                    codes[i] = StatusCode.OUT_OF_CAPACITY
                    continue
                raw = raw_key(ns, key)
                db_key = db_key_of(raw)
                writer.remove(db_key)  # an overwrite frees the old value first
                writer.make_room(nbytes)
                writer.txn.put(db_key, source_bytes(addr, nbytes, bool(on_device and on_device[i])), db=values)
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

        def delete(writer: Writer) -> None:
            for i, key in enumerate(keys):
                removed[i] = writer.remove(db_key_of(raw_key(ns, key))) > 0

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
                db_key = db_key_of(raw_key(ns, key))
                meta = txn.get(db_key, db=meta_db)
                if meta is None:
                    continue
                _, expires_at, nbytes = META.unpack_from(meta)
                if expires_at <= now:
                    continue  # the next write transaction removes it
                addr, length = destinations[i]
                if length != nbytes:
                    codes[i] = StatusCode.BUFFER_SIZE_MISMATCH
                    continue
                value = txn.get(db_key, db=values_db)
                if value is None:  # never within one snapshot: meta and value are written together
                    continue
                if on_device and on_device[i]:
                    device.copy_to_device(addr, np.frombuffer(value, dtype=np.uint8))
                else:
                    _memmove(addr, address_of(value), nbytes)
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
                meta = txn.get(db_key_of(raw_key(ns, key)), db=meta_db)
                found.append(meta is not None and META.unpack_from(meta)[1] > now)
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
