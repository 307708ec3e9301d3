"""The embedded engine's shared mode: a store that many processes open at once,
kept in an LMDB environment under a directory (`local://NAME?dir=DIR`).

Why LMDB (docs/engine.md has the measured comparison): a write is one
transaction, so a reader sees a whole value or a miss, and a writer killed
mid-transaction leaves nothing that is ever read (its pages were never
committed). A read copies straight out of the shared mapping.

How it is opened (docs/engine.md, "Shared mode", says why):
- without LMDB's lock file, whose reader slots are keyed by pid and collide
  across PID namespaces; shared_lock.StoreLock excludes instead;
- with one map size for every process, fixed when the store is created and
  recorded in its `format` header (shared_files.py): no opener resizes the
  file under another's mapping;
- with a writable map (one copy per value), and before each write the file
  space it may write is reserved (fallocate), so a full filesystem fails
  the write (OUT_OF_CAPACITY) instead of raising SIGBUS on a hole;
- after checking, before LMDB opens it, that the file holds every page its
  last commit names, so a truncated store is refused; and each value carries
  an xxh3_64 of its stored bytes, checked whole before a get copies it, so a
  damaged value (a flipped byte, a torn sector) is a miss, never served.

What LMDB lacks is added here, inside the same write transactions, so it is
as atomic as the data: a byte budget with least-recently-used eviction, TTL,
and namespaces. Five named databases hold it:

    values  db key -> value bytes
    meta    db key -> (seq, expires_at, nbytes, xxh3_64) [+ ns/key text for digest keys]
    order   seq -> db key, oldest first: the eviction order
    expiry  (expires_at, seq) -> db key, soonest first
    info    capacity, live bytes, the last seq

Recency: a write takes the next seq. A read cannot write, so a hit is
remembered in this process and applied by its next write transaction
(mset, mdel, set_capacity): a process that only reads does not refresh what
it reads.

Per process, as with the in-process store: `faults`, `stats`,
`max_value_bytes`, `namespaces` and `clock`. Shared: the data and `capacity`.
"""

import ctypes
import errno
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..util.docs import docs_url
from . import device
from .enums import StatusCode
from .errors import StoreFull, StoreUnavailable
from .faults import Faults
from .shared_files import (
    DATA_FILE,
    DEFAULT_MODE,
    HEADER_FILE,
    LOCK_FILE,
    check_parent,
    committed_length,
    damaged,
    existing_file,
    file_mode,
    from_os_error,
    open_file,
    read_or_create_header,
    replace_store_fix,
    store_entry,
    store_path,
)
from .shared_lock import StoreLock, os_failure, replaced
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
    value_checksum,
)
from .store import DEFAULT_MAX_VALUE_BYTES, StoreStats

try:
    import lmdb
except ImportError:  # reported when a shared store is opened, naming the fix
    lmdb = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_memmove = ctypes.memmove  # a module global so tests can slow a copy down

_MAX_REMEMBERED_HITS = 65536
_MAP_SLACK = 64 << 20
# The map is address space, not memory or disk (pages reach the file by
# pwrite): a generous floor lets a later, larger capacity= be adopted
# without ever resizing the map.
_MIN_MAP = 64 << 30
DEFAULT_CAPACITY = 4 * 1024**3
_FULL = (errno.ENOSPC, errno.EDQUOT)
# Reserved beyond what a write's values and the trees' pages need: the new
# pages of a deeper tree, LMDB's meta and free-list bookkeeping.
_RESERVE_SLACK = 4 << 20
# LMDB's free list: a transaction that frees many pages (a smaller capacity=
# evicting GiBs, a burst of expiries) records 8 bytes per freed page and
# copies the free list's own pages, each at most every page in use: 24
# bytes per page in use bounds both (half-full tree pages), 0.6 % of the file.
_FREE_LIST_PER_PAGE = 24
# What the transaction that creates a store writes (its meta pages and
# the named databases' records): allocated before LMDB first writes.
_CREATE_RESERVE = 256 << 10
_DBS = ("values", "meta", "order", "expiry", "info")
# How long a call (or opening) waits for a lock another process holds; the
# connector sets it from its own timeouts (lock_timeout=, docs/engine.md).
DEFAULT_LOCK_TIMEOUT_S = 1.0


def _identity(st: os.stat_result) -> tuple[int, int]:
    """What a file or directory is, whatever path reaches it."""
    return st.st_dev, st.st_ino


def map_size_for(capacity: int) -> int:
    """Twice the capacity (room for pages older snapshots still hold)."""
    return max(2 * capacity + _MAP_SLACK, _MIN_MAP)


def usable_capacity(map_size: int) -> int:
    return (map_size - _MAP_SLACK) // 2


class SharedStore:
    """A capacity-bounded byte store in DIR, shared by every process that opens it."""

    def __init__(
        self,
        name: str,
        directory: str,
        capacity: int = DEFAULT_CAPACITY,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        clock: Callable[[], float] = time.time,
        create: bool = False,
        mode: int = DEFAULT_MODE,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.lock_timeout_s = lock_timeout_s  # per process, like the fault knobs
        self.path = store_path(directory, name)
        self.max_value_bytes = max_value_bytes
        self.namespaces: frozenset[str] | None = None
        # Wall-clock seconds: expiry times are compared across processes.
        self.clock = clock
        self.faults = Faults()
        self.mexist_miss = "success"  # like the fault knobs, this process's reading only
        self.stats = StoreStats()  # stats.damaged: values whose checksum failed, read as misses
        self._damage_reported = False
        self._initial_capacity = capacity
        self._hits: dict[bytes, None] = {}
        self._hits_lock = threading.Lock()
        # This process's open transactions, counted so that a map another
        # process grew is adopted (set_mapsize) while none is open.
        self._active = 0
        self._remapping = False
        self._active_changed = threading.Condition()
        self._open(directory, create, mode)

    # ------------------------------------------------------------- opening
    def _open(self, directory: str, create: bool, mode: int) -> None:
        if lmdb is None:
            raise StoreUnavailable(
                self.path,
                "the Python module lmdb is not installed (the shared mode needs it)",
                "pip install 'lmdb>=1.4' in this environment, or drop dir= for an in-process store",
            )
        check_parent(directory, create, mode)
        store_entry(self.path, mode)
        deadline = time.monotonic() + self.lock_timeout_s
        lock_path = os.path.join(self.path, LOCK_FILE)
        data = os.path.join(self.path, DATA_FILE)
        header = os.path.join(self.path, HEADER_FILE)
        try:
            self.identity = _identity(os.lstat(self.path))
            lock_fd = open_file(lock_path, mode)
            try:
                self._lock = StoreLock(lock_path, _identity(os.fstat(lock_fd)))
            finally:
                os.close(lock_fd)
            made = existing_file(header, mode) and existing_file(data, mode) and os.stat(data).st_size > 0
            # Creating takes the writer mutex (creation is never raced); an
            # existing store only needs no commit to rewrite a meta page
            # while it is read, so a writer stuck behind a frozen reader
            # never keeps a new process from opening.
            with self._lock.picking(deadline) if made else self._lock.writing(deadline):
                if existing_file(data, mode) and not existing_file(header, mode):
                    raise damaged(data, f"it has no {HEADER_FILE} header (made by an older aibrix-eic?)")
                self.map_size = read_or_create_header(header, map_size_for(self._initial_capacity), mode)
                self._data_fd = open_file(data, mode)  # created here: never through a symlink, never 0644
                self._files = ((lock_path, self._lock.identity), (data, _identity(os.fstat(self._data_fd))))
                # A map another tool grew is kept: opening with less would
                # shrink the file under the processes that use it.
                self.map_size = max(self.map_size, self._check_length(data))
                env = self._open_env(data, mode)
            self._env = self._open_dbs(env, data, deadline)
        except OSError as e:
            raise from_os_error(self.path, e) from e
        self._pid = os.getpid()
        _open_stores.add(self)

    def _open_env(self, data: str, mode: int) -> Any:
        self._reserved = 0  # data.mdb is allocated up to here (it never shrinks)
        self._can_reserve = True
        new = os.fstat(self._data_fd).st_size == 0
        try:
            env = lmdb.open(
                self.path,
                map_size=self.map_size,
                lock=False,  # shared_lock.StoreLock excludes, across PID namespaces
                writemap=True,  # one copy per value; _reserve keeps a full filesystem from SIGBUS
                sync=False,  # the data lives as long as DIR does; no fsync on tmpfs
                metasync=False,
                max_dbs=len(_DBS),
                create=False,
                mode=file_mode(mode),
            )
        except lmdb.Error as e:
            if os.strerror(errno.ENOSPC) in str(e) or os.strerror(errno.EDQUOT) in str(e):
                if new:  # no half-written meta page left for the next opener to call damaged
                    os.ftruncate(self._data_fd, 0)  # safe: openers wait for the writer mutex this one holds
                raise self._full(f"no space left on its filesystem for a new store ({e})") from e
            raise damaged(data, f"LMDB cannot open it ({e})") from e
        self._page_size = env.stat()["psize"]
        if new:  # LMDB wrote its meta pages; the creating transaction writes through the map
            try:
                self._reserve_to(0, _CREATE_RESERVE)
            except BaseException:
                env.close()
                raise
        return env

    def _open_dbs(self, env: Any, data: str, deadline: float) -> Any:
        """Open the named databases: in a transaction that writes nothing
        and is guarded as a read, where the store has them; else create them
        in a write transaction."""
        try:
            if not self._existing_dbs(env, deadline):
                with self._lock.write(lambda: env.info()["last_txnid"] + 1, deadline) as commit:
                    txn = env.begin(write=True)
                    try:
                        self._dbs = {db: env.open_db(db.encode(), txn=txn) for db in _DBS}
                        if txn.get(b"capacity", db=self._dbs["info"]) is None:
                            capacity = self._capacity_within(self._initial_capacity)
                            txn.put(b"capacity", COUNT.pack(capacity), db=self._dbs["info"])
                    except BaseException:
                        txn.abort()
                        raise
                    commit(txn.commit)
        except lmdb.Error as e:
            env.close()
            raise damaged(data, f"LMDB cannot read it ({e})") from e
        except BaseException:
            env.close()
            raise
        return env

    def _existing_dbs(self, env: Any, deadline: float) -> bool:
        """Open the named databases of a store that has them all. LMDB opens
        a handle for later transactions only in one that commits; this one
        changes nothing, so its commit writes nothing (mdb_txn_commit skips
        a transaction with no dirty page), and it holds its snapshot as a
        reader does (its id is the snapshot's + 1)."""
        txn, release = self._lock.read(lambda: env.begin(write=True), lambda t: t.id() - 1, deadline)
        try:
            try:
                dbs = {db: env.open_db(db.encode(), txn=txn, create=False) for db in _DBS}
            except lmdb.NotFoundError:
                txn.abort()
                return False
            if txn.get(b"capacity", db=dbs["info"]) is None:
                txn.abort()
                return False
            txn.commit()
        except BaseException:
            txn.abort()
            raise
        finally:
            release()
        self._dbs = dbs
        return True

    @staticmethod
    def _check_length(data: str) -> int:
        """Check that the file holds every page its last commit names (LMDB
        would map a truncated file's missing pages as zeros); the map size
        that commit recorded."""
        needed, map_size = committed_length(data)
        length = os.stat(data).st_size
        if length < needed:
            raise damaged(data, f"it is {length} bytes but its last commit names pages up to byte {needed} (truncated)")
        return int(map_size)

    def _reserve(self, txn: Any, nbytes: int, nkeys: int) -> None:
        """Allocate the file space this write transaction may write: every
        page of the trees it may copy, its values and their new tree pages,
        and the free list of every page it may free.
        LMDB writes new pages only past the last committed one, through the
        map, where a page the filesystem has no room for is a SIGBUS."""
        if not self._can_reserve:
            return
        tree_pages = sum(stat["branch_pages"] + stat["leaf_pages"] for stat in self._tree_stats(txn))
        page = self._page_size
        in_use = self._env.info()["last_pgno"] + 1
        bookkeeping = (tree_pages + 4 * nkeys) * page + in_use * _FREE_LIST_PER_PAGE + _RESERVE_SLACK
        self._reserve_to(in_use * page, min(in_use * page + nbytes + bookkeeping, self.map_size))

    def _reserve_to(self, start: int, end: int) -> None:
        """Allocate data.mdb's bytes [start, end) not allocated yet; raises
        StoreFull when its filesystem has no room for them."""
        if end <= self._reserved or not self._can_reserve:
            return
        begin = max(start, self._reserved)
        try:
            os.posix_fallocate(self._data_fd, begin, end - begin)
        except OSError as e:
            if e.errno in _FULL:
                raise self._full(f"no space left on its filesystem for {end - begin} more bytes") from e
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise from_os_error(self.path, e) from e
            self._can_reserve = False
            log.warning(
                "shared store %s: its filesystem cannot reserve space (fallocate: %s); a full filesystem "
                "there would stop the process with SIGBUS: put DIR on tmpfs or a local filesystem",
                self.path,
                e.strerror,
            )
            return
        self._reserved = end

    def _full(self, cause: str) -> "StoreFull":
        return StoreFull(
            self.path,
            cause,
            f"free space there, or set capacity= to what the filesystem holds ({docs_url('operations.md', 'the-engines-shared-store')})",
        )

    def _tree_stats(self, txn: Any) -> list[dict[str, int]]:
        return [txn.stat(db) for db in self._dbs.values()] + [self._env.stat()]

    def _capacity_within(self, capacity: int) -> int:
        usable = usable_capacity(self.map_size)
        if capacity > usable:
            log.warning(
                "shared store %s: capacity %d is more than its map (fixed at creation) allows; using %d "
                "(recreate the store with the larger capacity= to use more)",
                self.path,
                capacity,
                usable,
            )
        return min(capacity, usable)

    @property
    def env(self) -> Any:
        if os.getpid() != self._pid:
            # LMDB's handle must not be used after fork (its state is the
            # parent's); the child closed it (_after_fork_in_child).
            raise StoreUnavailable(
                self.path,
                "this handle was opened by the parent of this forked process, and an LMDB handle cannot be "
                "used after fork",
                "call Client.init again in the child: it opens the store afresh",
            )
        return self._env

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the parent's LMDB handle and descriptor,
        so that the child can open the store afresh (LMDB refuses a second
        handle on one file in a process) and holds nothing of the parent's."""
        try:
            self._env.close()  # unmaps and closes; writes nothing (no lock file, no transaction commits)
        except Exception:
            pass
        try:
            os.close(self._data_fd)
        except OSError:
            pass

    # --------------------------------------------------------- transactions
    def _enter(self) -> None:
        """Count a transaction of this process; wait while a grown map is adopted."""
        with self._active_changed:
            while self._remapping:
                self._active_changed.wait()
            self._active += 1

    def _leave(self) -> None:
        with self._active_changed:
            self._active -= 1
            self._active_changed.notify_all()

    def _adopt_grown_map(self) -> None:
        """Another process grew the map: take its size (the one LMDB
        recorded), once no transaction of this process is open."""
        with self._active_changed:
            if self._remapping:  # another thread is adopting it
                self._active_changed.wait_for(lambda: not self._remapping)
                return
            self._remapping = True
            try:
                while self._active:
                    self._active_changed.wait()
                with self._lock.writing(self._deadline()):  # no commit rewrites the meta page while it is read
                    self.env.set_mapsize(0)
                self.map_size = self.env.info()["map_size"]
                log.warning("shared store %s: another process grew its map; adopted %d bytes", self.path, self.map_size)
            finally:
                self._remapping = False
                self._active_changed.notify_all()

    def _deadline(self) -> float:
        return time.monotonic() + self.lock_timeout_s

    def _check_files(self, writing: bool) -> None:
        """Refuse to go on once the lock file (and for a write, the data
        file) this process opened is no longer the one at its path (deleted,
        replaced, or its directory removed and made again): the processes
        that opened the new one would not exclude this one. One stat call
        per read (a few us; benchmarks/RESULTS.md), two per write."""
        for path, identity in self._files if writing else self._files[:1]:
            try:
                now = _identity(os.stat(path))
            except FileNotFoundError:
                raise replaced(path, "the file was deleted (or its directory removed)") from None
            except OSError as e:
                raise os_failure(path, e) from e
            if now != identity:
                raise replaced(path, "the file was replaced by another (or its directory made again)")

    def _begin_read(self, env: Any) -> Any:
        self._check_files(writing=False)
        return env.begin(buffers=True)

    @contextmanager
    def _reading(self) -> Iterator[Any]:
        """A read transaction at a snapshot no writer reuses the pages of."""
        env = self.env
        deadline = self._deadline()
        for attempt in (1, 2):
            self._enter()
            try:
                txn, release = self._lock.read(lambda: self._begin_read(env), lambda t: t.id(), deadline)
                break
            except lmdb.MapResizedError as e:
                self._leave()
                if attempt == 2:
                    raise self._failed(e) from e
                self._adopt_grown_map()
            except lmdb.Error as e:
                self._leave()
                raise self._failed(e) from e
            except BaseException:
                self._leave()
                raise
        try:
            yield txn
        finally:
            txn.abort()
            release()
            self._leave()

    def _write(self, work: Callable[[Writer], None], nbytes: int = 0, nkeys: int = 0) -> None:
        """Run `work` in one write transaction, after the hits remembered
        since the last one and the due expiries (`nbytes`, `nkeys`: the
        values it writes).
        Raises StoreFull when there is no room for it, StoreUnavailable for
        any other failure of LMDB."""
        with self._hits_lock:
            hits, self._hits = self._hits, {}
        env = self.env
        deadline = self._deadline()
        for attempt in (1, 2):
            try:
                self._enter()
                try:
                    self._write_once(env, hits, work, nbytes, nkeys, deadline)
                finally:
                    self._leave()
                return
            except lmdb.MapResizedError as e:
                if attempt == 2:
                    raise self._failed(e) from e
                self._adopt_grown_map()
            except lmdb.MapFullError as e:
                raise StoreFull(
                    self.path,
                    "its map is full of pages that older read snapshots still hold",
                    "lower capacity= (the map is twice the capacity at creation)",
                ) from e
            except lmdb.Error as e:
                raise self._failed(e) from e

    def _failed(self, e: Exception) -> StoreUnavailable:
        return StoreUnavailable(
            self.path,
            f"LMDB failed: {e}",
            f"if it persists, {replace_store_fix(self.path)}",
        )

    def _write_once(
        self,
        env: Any,
        hits: dict[bytes, None],
        work: Callable[[Writer], None],
        nbytes: int,
        nkeys: int,
        deadline: float,
    ) -> None:
        with self._lock.write(lambda: env.info()["last_txnid"] + 1, deadline) as commit:
            self._check_files(writing=True)  # under the writer mutex: the files are the ones every writer uses
            txn = env.begin(write=True, buffers=True)  # buffers: put_many hashes the stored bytes in place
            try:
                self._reserve(txn, nbytes, nkeys + len(hits))
                writer = Writer(txn, self)
                for db_key in hits:
                    writer.touch(db_key)
                writer.expire_due(self.clock())
                work(writer)
                writer.save()
            except BaseException:
                txn.abort()
                raise
            commit(txn.commit)

    # ------------------------------------------------------------------ info
    def _info(self, name: bytes, default: int) -> int:
        with self._reading() as txn:
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
        with self._reading() as txn:
            return int(txn.stat(self._dbs["meta"])["entries"])

    def has_namespace(self, ns: str) -> bool:
        return self.namespaces is None or ns in self.namespaces

    def keys(self) -> list[tuple[str, str]]:
        found = []
        with self._reading() as txn:
            for db_key, meta in txn.cursor(db=self._dbs["meta"]):
                raw = meta[META.size :] if db_key[:2] == DIGEST_MARK else db_key
                found.append(names_of(bytes(raw)))
        return found

    def value_size(self, ns: str, key: str) -> int | None:
        """Size of the unexpired value under (ns, key), or None."""
        with self._reading() as txn:
            meta = txn.get(db_key_of(raw_key(ns, key)), db=self._dbs["meta"])
            if meta is None:
                return None
            _, expires_at, nbytes, _ = META.unpack_from(meta)
        return None if expires_at <= self.clock() else nbytes

    # --------------------------------------------------------------- writes
    def clear(self) -> StatusCode:
        """Drop every value (the capacity stays); OUT_OF_CAPACITY when the
        filesystem has no room for the transaction."""

        def drop(writer: Writer) -> None:
            for db in ("values", "meta", "order", "expiry"):
                writer.txn.drop(self._dbs[db], delete=False)
            writer.live = 0

        try:
            self._write(drop)
        except StoreFull:
            return StatusCode.OUT_OF_CAPACITY
        return StatusCode.SUCCESS

    def set_capacity(self, capacity: int) -> None:
        capacity = self._capacity_within(capacity)

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
                value = source_bytes(addr, nbytes, bool(on_device and on_device[i]))
                writer.txn.put(db_key, value, db=values)
                # Hashed as stored (read back in this transaction), not the caller's buffer.
                checksum = value_checksum(writer.txn.get(db_key, db=values))
                expires_at = self.clock() + ttl_second if ttl_second > 0 else math.inf
                names = b"" if db_key is raw else raw  # keys() reads digest keys' names here
                writer.publish(db_key, nbytes, expires_at, checksum, names)
                self.stats.bytes_in += nbytes

        try:
            self._write(store, sum(nbytes for _, nbytes in sources), len(keys))
        except StoreFull:
            # Nothing of this call was committed, and the store serves on
            # (reads, and puts once space frees).
            codes = [StatusCode.OUT_OF_CAPACITY] * len(keys)
        self.stats.puts += len(keys)
        return codes

    def delete_many(self, ns: str, keys: Sequence[str]) -> list[StatusCode]:
        """Remove each key: SUCCESS where an unexpired value was there to
        remove, KEY_NOT_EXIST where none was, OUT_OF_CAPACITY for every key
        when the filesystem has no room for the transaction (nothing removed)."""
        codes = [StatusCode.KEY_NOT_EXIST] * len(keys)

        def delete(writer: Writer) -> None:
            for i, key in enumerate(keys):  # each assigned: a retried transaction starts over
                removed = writer.remove(db_key_of(raw_key(ns, key))) > 0
                codes[i] = StatusCode.SUCCESS if removed else StatusCode.KEY_NOT_EXIST

        try:
            self._write(delete)
        except StoreFull:
            codes = [StatusCode.OUT_OF_CAPACITY] * len(keys)
        self.stats.deletes += len(keys)
        return codes

    # ---------------------------------------------------------------- reads
    def _damaged(self, nbytes: int) -> None:
        self.stats.damaged += 1
        if not self._damage_reported:  # once per store: the store, not the key, is the news
            self._damage_reported = True
            log.warning(
                "shared store %s: a stored value (%d bytes) failed its checksum and is read as a miss "
                "(stats.damaged counts them); something wrote into the store's memory or file (a stray "
                "write of a process that maps it, a bit flip, a page not written back before a host crash). "
                "Damaged values are never served; if it recurs, %s",
                self.path,
                nbytes,
                replace_store_fix(self.path),
            )

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
        untouched and gets BUFFER_SIZE_MISMATCH: never a partial fill. A
        value that fails its checksum is a miss, its destination untouched.
        """
        codes = [StatusCode.KEY_NOT_EXIST] * len(keys)
        hits: list[bytes] = []
        copied = 0
        meta_db, values_db = self._dbs["meta"], self._dbs["values"]
        to_device: list[tuple[int, np.ndarray]] = []
        # One read snapshot: what it copies stays whole while writers go on.
        with self._reading() as txn:
            now = self.clock()
            for i, key in enumerate(keys):
                db_key = db_key_of(raw_key(ns, key))
                meta = txn.get(db_key, db=meta_db)
                if meta is None:
                    continue
                _, expires_at, nbytes, checksum = META.unpack_from(meta)
                if expires_at <= now:
                    continue  # the next write transaction removes it
                addr, length = destinations[i]
                if length != nbytes:
                    codes[i] = StatusCode.BUFFER_SIZE_MISMATCH
                    continue
                value = txn.get(db_key, db=values_db)
                if value is None:  # never within one snapshot: meta and value are written together
                    continue
                # Checked before the destination is touched: a damaged value never reaches it.
                if len(value) != nbytes or value_checksum(value) != checksum:
                    self._damaged(nbytes)
                    continue
                if on_device and on_device[i]:
                    # Staged on the host: a device copy waits for the caller's
                    # stream, and no snapshot is held while waiting on that.
                    staged = np.empty(nbytes, np.uint8)
                    _memmove(staged.ctypes.data, address_of(value), nbytes)
                    to_device.append((addr, staged))
                else:
                    _memmove(addr, address_of(value), nbytes)
                codes[i] = StatusCode.SUCCESS
                hits.append(db_key)
                copied += nbytes
        for addr, staged in to_device:
            device.copy_to_device(addr, staged)
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
        with self._reading() as txn:
            now = self.clock()
            for key in keys:
                meta = txn.get(db_key_of(raw_key(ns, key)), db=meta_db)
                found.append(meta is not None and META.unpack_from(meta)[1] > now)
        self.stats.exists += len(keys)
        return found


# This process's handles, by the (device, inode) of DIR/NAME: one store
# reached through two paths is one handle (LMDB refuses a second).
_shared: dict[tuple[int, int], SharedStore] = {}
_shared_lock = threading.Lock()
_open_stores: "weakref.WeakSet[SharedStore]" = weakref.WeakSet()  # every handle, for fork


def open_shared_store(
    name: str,
    directory: str,
    capacity: int | None,
    create: bool = False,
    mode: int = DEFAULT_MODE,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> SharedStore:
    """This process's one handle on the store `name` in `directory` (LMDB
    allows one per process), opened on first use, within `lock_timeout_s`.
    Raises StoreUnavailable naming the path, the cause and the fix when it
    cannot be opened."""
    path = store_path(directory, name)
    with _shared_lock:
        try:
            store = _shared.get(_identity(os.lstat(path)))
        except OSError:
            store = None  # not made yet: SharedStore says why if it cannot be
        if store is None:
            store = SharedStore(
                name, directory, capacity or DEFAULT_CAPACITY, create=create, mode=mode, lock_timeout_s=lock_timeout_s
            )
            _shared[store.identity] = store
    return store


def forget_shared_stores() -> None:
    """Drop this process's handles. They are not closed: a client of the
    last test may still hold one, and LMDB closes it with the last reference."""
    with _shared_lock:
        _shared.clear()


def _after_fork_in_child() -> None:
    """A forked child starts with no handle: the parent's are closed (the
    parent's clients fail in the child, naming the fix) and the next
    Client.init opens the store afresh. The lock is new: another thread of
    the parent may have held it at fork."""
    global _shared_lock
    _shared_lock = threading.Lock()
    _shared.clear()
    for store in list(_open_stores):
        store._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
