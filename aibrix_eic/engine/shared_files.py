"""Where a shared store lives and whether it is safe to open: DIR, the store's
directory DIR/NAME, its files (`format`, `store.lock`, `data.mdb`), and the
`format` header that fixes the map size at creation.

Nothing here follows a symlink or trusts another user's file: the KV (and
token ids) in a store is as private as the user's own memory unless `mode=`
shares it with a group. Once DIR/NAME is known to be writable only by this
user (or the shared group), nothing can be planted in it later, so the file
checks made here still hold when LMDB opens the files by name.

Every refusal is a StoreUnavailable naming the path, the cause and the fix.
"""

import errno
import os
import stat
import struct
import uuid
from urllib.parse import quote

from .errors import StoreUnavailable

DEFAULT_MODE = 0o700
# 2: each value's meta holds an xxh3_64 of all its bytes. Format 1 (a CRC-32
# of 8 bytes a page) is refused whole at open, never read value by value.
FORMAT_VERSION = 2
_MAGIC = b"AIBXEIC\0"
HEADER = struct.Struct("<8sIIQ")  # magic, format version, reserved, map size
HEADER_FILE, LOCK_FILE, DATA_FILE = "format", "store.lock", "data.mdb"


def parse_mode(text: str) -> int:
    """An octal `mode=` (0770, 770 or 0o770) that keeps the owner's rwx."""
    try:
        mode = int(text.strip().removeprefix("0o"), 8)
    except ValueError:
        raise ValueError(f"expected an octal mode such as 0700 or 0770, got {text!r}") from None
    if mode & ~0o777 or mode & 0o700 != 0o700:
        raise ValueError(f"expected a mode within 0777 that keeps the owner's rwx (0700), got {text!r}")
    if mode & 0o002:
        raise ValueError(f"a store is never world-writable; got {text!r} (use a group: 0770)")
    return mode


def file_mode(mode: int) -> int:
    return mode & 0o666


def _refuse(path: str, cause: str, fix: str) -> StoreUnavailable:
    return StoreUnavailable(path, cause, fix)


OTHER_DIR = "or point dir= at a directory of this user's (for example /dev/shm/aibrix-eic-$USER)"


def os_error_words(where: str, e: OSError) -> tuple[str, str]:
    """The cause and the fix of an OSError met at `where`: the one errno
    table of the store, for opening it and for every call."""
    reason = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM):
        uid = os.geteuid()
        return (
            f"permission denied on {where} ({reason}; this process runs as uid {uid})",
            f"run as the user that owns it, give uid {uid} access (chmod/chown, or mode= for a group), {OTHER_DIR}",
        )
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        blocking = _first_non_directory(where)
        return f"{blocking} is not a directory", f"move {blocking} away (dir= must name a directory), {OTHER_DIR}"
    if e.errno == errno.ENOENT:
        return f"{where} does not exist", "create the directory, or correct dir= in remote_url"
    if e.errno == errno.ELOOP:
        return f"{where} is a symlink, which a store never follows", "name the real path in dir="
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left on the filesystem of {where} ({reason})",
            "free space there (or raise the quota), lower capacity= in remote_url, or point dir= at a larger filesystem",
        )
    if e.errno == errno.EROFS:
        return (
            f"{where} is on a read-only filesystem",
            f"point dir= at a writable filesystem (tmpfs such as /dev/shm), {OTHER_DIR}",
        )
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return (
            f"too many open files ({reason}) while opening {where}",
            "raise the open-file limit (ulimit -n, or LimitNOFILE= / the container's nofile ulimit), "
            "or run fewer threads that use the store",
        )
    return f"{reason} ({where})", f"check that {where} is a local directory this user can read and write, {OTHER_DIR}"


def _first_non_directory(path: str) -> str:
    """The part of `path` that exists and is not a directory (what made
    creating it fail), or `path` itself."""
    parts = os.path.abspath(path).split(os.sep)
    for end in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:end])
        if os.path.lexists(prefix) and not os.path.isdir(prefix):
            return prefix
    return path


def from_os_error(path: str, e: OSError) -> StoreUnavailable:
    """An OSError met at `path` (or the file it names), in an operator's words."""
    where = e.filename or path
    return _refuse(where, *os_error_words(where, e))


def replace_store_fix(store: str) -> str:
    """How to get rid of the store directory `store` without hurting the
    processes that still have it open (removing it under them would split
    its locks from their mapping)."""
    return (
        f"point new processes at another store (another NAME or dir=) now, and remove the directory {store} "
        f"once `fuser -v {store}/data.mdb` lists no process (it holds only cached KV, which is recomputed)"
    )


def _mine(st: os.stat_result, mode: int) -> bool:
    """Owned by this user, or by the group a group-shared `mode` names."""
    if st.st_uid == os.geteuid():
        return True
    return bool(mode & 0o070) and (st.st_gid == os.getegid() or st.st_gid in os.getgroups())


def _check(path: str, st: os.stat_result, mode: int, kind: str) -> None:
    """Refuse an entry of the store (its directory or a file) that another
    user could change, or that is not the kind expected."""
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symlink, which a store never follows", "remove it; the store recreates its files")
    if kind == "dir" and not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "not a directory", "remove it or choose another store name or dir=")
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "not a regular file", "remove it; the store recreates its files")
    if not _mine(st, mode):
        raise _refuse(
            path,
            f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})",
            "another user's store is never opened: choose a dir= of your own, or share it deliberately "
            "with mode=0770 and a common group",
        )
    if st.st_mode & stat.S_IWOTH:
        raise _refuse(path, "writable by every user", f"chmod o-w {path}, or remove it")
    if st.st_mode & stat.S_IWGRP and not mode & 0o020:
        raise _refuse(
            path, "writable by its group, but mode= does not share the store", f"chmod g-w {path}, or add mode=0770"
        )


def check_parent(directory: str, create: bool, mode: int) -> str:
    """DIR as an absolute path: it exists (or `create` makes it), is not a
    symlink, and no other user can rename or replace what is in it."""
    path = os.path.abspath(directory)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise _refuse(
                path,
                "the directory does not exist",
                f"check dir= for a typo, create it (mkdir -m 700 {path}), or add &create=1 to the URL",
            ) from None
        try:
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode, follow_symlinks=False)
            st = os.lstat(path)
        except OSError as e:
            raise from_os_error(path, e) from e
    except OSError as e:
        raise from_os_error(path, e) from e
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symlink, which a store never follows", "name the real path in dir=")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "not a directory", "dir= must name a directory")
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if st.st_uid not in (os.geteuid(), 0) and not _mine(st, mode):
        raise _refuse(
            path,
            f"owned by uid {st.st_uid}, who could replace the store in it",
            "use a dir= owned by this user (or root, as /dev/shm is)",
        )
    if st.st_mode & stat.S_IWOTH and not sticky:
        raise _refuse(
            path,
            "writable by every user without the sticky bit, so anyone could replace the store in it",
            f"chmod o-w (or +t) {path}, or use a private dir= under it",
        )
    if st.st_mode & stat.S_IWGRP and not sticky and not mode & 0o020:
        raise _refuse(
            path,
            "writable by its group without the sticky bit, so the group could replace the store in it",
            f"chmod g-w (or +t) {path}, add mode=0770 to share the store with that group, or use a private dir=",
        )
    return path


def store_path(directory: str, name: str) -> str:
    """DIR/NAME, where the store `name` lives (names may hold ':' or '/')."""
    return os.path.join(os.path.abspath(directory), quote(name, safe="") or "default")


def store_entry(path: str, mode: int) -> None:
    """DIR/NAME: created with `mode` if missing, then checked."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode, follow_symlinks=False)  # mkdir's mode is masked by the umask
    except FileExistsError:
        pass
    except OSError as e:
        raise from_os_error(path, e) from e
    try:
        _check(path, os.lstat(path), mode, "dir")
    except OSError as e:
        raise from_os_error(path, e) from e


def open_file(path: str, mode: int) -> int:
    """A descriptor on the store file `path`, created 0600 (or per `mode`)
    if missing; never through a symlink."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, file_mode(mode))
            os.fchmod(fd, file_mode(mode))  # the umask masked open's mode
        except FileExistsError:
            fd = os.open(path, flags)
    except OSError as e:
        raise from_os_error(path, e) from e
    try:
        _check(path, os.fstat(fd), mode, "file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def existing_file(path: str, mode: int) -> bool:
    """Whether `path` exists (checked as a store file if it does)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise from_os_error(path, e) from e
    _check(path, st, mode, "file")
    return True


def damaged(path: str, cause: str) -> StoreUnavailable:
    return _refuse(path, f"damaged store: {cause}", replace_store_fix(os.path.dirname(path)))


# LMDB's two meta pages (lmdb.h / mdb.c, 64-bit): a 16-byte page header,
# then magic, version, address, map size, the free and main DB records (48
# bytes each, the free DB's first field holding the page size), the last
# page number and the transaction id.
_META = struct.Struct("<IIQQI44x48xQQ")
_META_AT = 16
_LMDB_MAGIC = 0xBEEFC0DE


def committed_length(path: str) -> tuple[int, int]:
    """The bytes data.mdb must hold for its newest commit and the map size
    that commit recorded ((0, 0) for a new, empty file), read from its meta
    pages before LMDB opens it: LMDB would extend a truncated file with
    zeros and serve them."""
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
        first = f.read(_META_AT + _META.size)
        if not first:
            return 0, 0
        if len(first) < _META_AT + _META.size:
            raise damaged(path, f"it is {os.fstat(f.fileno()).st_size} bytes, shorter than LMDB's header")
        magic, _, _, _, page_size, _, _ = _META.unpack_from(first, _META_AT)
        if magic != _LMDB_MAGIC or page_size < 512 or page_size & (page_size - 1):
            raise damaged(path, "it is not an LMDB file")
        f.seek(page_size + _META_AT)
        second = f.read(_META.size)
    metas = [_META.unpack_from(first, _META_AT)]
    if len(second) == _META.size and _META.unpack(second)[0] == _LMDB_MAGIC:
        metas.append(_META.unpack(second))
    newest = max(metas, key=lambda meta: meta[6])
    return (newest[5] + 1) * page_size, newest[3]


def read_or_create_header(path: str, map_size: int, mode: int) -> int:
    """The store's map size: the recorded one, or `map_size`, recorded now
    (written whole under a temporary name and linked into place, so a crash
    never leaves a partial header)."""
    if not existing_file(path, mode):
        temporary = f"{path}.{uuid.uuid4().hex}"
        fd = open_file(temporary, mode)
        try:
            os.write(fd, HEADER.pack(_MAGIC, FORMAT_VERSION, 0, map_size))
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process recorded it first: adopt theirs
        except OSError as e:
            raise from_os_error(path, e) from e
        finally:
            os.close(fd)
            os.unlink(temporary)
    fd = open_file(path, mode)
    try:
        raw = os.read(fd, HEADER.size + 1)
    finally:
        os.close(fd)
    if len(raw) != HEADER.size:
        raise damaged(path, f"the header is {len(raw)} bytes, not {HEADER.size}")
    magic, version, _, recorded = HEADER.unpack(raw)
    if magic != _MAGIC:
        raise damaged(path, "the header is not an aibrix-eic store header")
    if version != FORMAT_VERSION:
        raise _refuse(
            path,
            f"store format {version} (written by {'an older' if version < FORMAT_VERSION else 'a newer'} "
            f"aibrix-eic), this aibrix-eic reads format {FORMAT_VERSION}",
            "use one aibrix-eic version for every process sharing a store: " + replace_store_fix(os.path.dirname(path)),
        )
    return int(recorded)
