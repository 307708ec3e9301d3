"""What a store that cannot be opened means to an operator.

`Client.init` never raises: like the SDK it returns a code (-1: the store
cannot be reached or opened, as a cluster that cannot be reached; -22: the
endpoint itself is wrong), and it logs why once, with the store's path, the
cause and the fix. `explain` turns what opening a shared store raised into
that message (a `StoreUnavailable`); `aibrix-eic check` and the connector
show the same one. Anything it does not recognise is a bug in aibrix-eic,
and is reported as one.
"""

import errno
import logging
import os
import sys
import threading

from .errors import StoreUnavailable

logger = logging.getLogger(__name__)

UNAVAILABLE = -1  # what the SDK returns when the cluster cannot be reached
INVALID = -22  # EINVAL: an endpoint that cannot be parsed

_OTHER_DIR = "or point dir= at a directory of this user's (for example /dev/shm/aibrix-eic-$USER)"
_MOVE_ASIDE = "move {path} aside (or delete it) so that a new store is created there, " + _OTHER_DIR
_LMDB_UNREADABLE = ("InvalidError", "CorruptedError", "VersionMismatchError", "PanicError", "IncompatibleError")
_LMDB_LOCKED = ("LockError", "ReadersFullError")


def store_path(endpoint: str) -> str:
    """Where the shared store an endpoint names lives, as the store names it
    (DIR/NAME); the endpoint as given when it names none."""
    from .registry import parse_endpoint
    from .shared_files import store_path

    try:
        name, params = parse_endpoint(endpoint)
    except ValueError:
        return endpoint
    directory = params.get("dir")
    if directory is None:
        return endpoint
    return store_path(directory, name)


def explain(endpoint: str, error: BaseException) -> StoreUnavailable | None:
    """The path, cause and fix for `error`, raised while the store `endpoint`
    names was opened; None when it is none of the known store failures
    (a bug)."""
    if isinstance(error, StoreUnavailable):
        return error
    path = store_path(endpoint)
    if isinstance(error, ImportError):
        module = error.name or "lmdb"  # lmdb is the one the shared mode adds
        return StoreUnavailable(
            path,
            f"the shared mode needs the Python module {module}, and it cannot be imported ({error})",
            f"install it into this environment (`pip install {module}`; aibrix-eic declares it), "
            "or drop dir= from remote_url to use a store inside this process",
        )
    if isinstance(error, OSError):
        return _explain_os_error(path, error)
    lmdb = sys.modules.get("lmdb")
    if lmdb is not None and isinstance(error, lmdb.Error):
        return _explain_lmdb_error(path, error)
    return None


def _explain_os_error(path: str, error: OSError) -> StoreUnavailable:
    where = error.filename or path
    reason = error.strerror or str(error)
    if isinstance(error, PermissionError):
        uid = os.geteuid()
        cause = f"permission denied on {where} (this process runs as uid {uid})"
        fix = f"run as the user that owns it, give uid {uid} read and write access to it and the directory above it, {_OTHER_DIR}"
    elif isinstance(error, (NotADirectoryError, FileExistsError)):
        blocking = _first_non_directory(where)
        cause = f"{blocking} is not a directory"
        fix = f"move {blocking} away, {_OTHER_DIR}"
    elif isinstance(error, FileNotFoundError):
        cause = f"{where} does not exist"
        fix = "create the directory, or correct dir= in remote_url"
    elif error.errno == errno.ENOSPC:
        cause = f"no space left on the filesystem of {where}"
        fix = "free space there, lower capacity= in remote_url, or point dir= at a larger filesystem"
    elif error.errno == errno.EROFS:
        cause = f"{where} is on a read-only filesystem"
        fix = f"point dir= at a writable filesystem (tmpfs such as /dev/shm, or a local disk), {_OTHER_DIR}"
    else:
        cause = f"{reason} ({where})"
        fix = f"check that {where} is a local directory this user can read and write, {_OTHER_DIR}"
    return StoreUnavailable(path, cause, fix)


def _first_non_directory(path: str) -> str:
    """The part of `path` that exists and is not a directory (what made
    creating it fail), or `path` itself."""
    parts = os.path.abspath(path).split(os.sep)
    for end in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:end])
        if os.path.lexists(prefix) and not os.path.isdir(prefix):
            return prefix
    return path


def _explain_lmdb_error(path: str, error: Exception) -> StoreUnavailable:
    kind = type(error).__name__
    if kind in _LMDB_UNREADABLE:
        cause = f"its files are not a store this engine can read: damaged or written by something else ({error})"
        fix = _MOVE_ASIDE.format(path=path)
    elif kind in _LMDB_LOCKED:
        cause = f"its lock cannot be taken ({error})"
        fix = (
            "processes in other containers (other PID namespaces) cannot share one store: give each "
            f"container its own dir=, or stop the processes that hold {path}"
        )
    elif kind == "ReadonlyError":
        cause = f"it can only be opened read-only ({error})"
        fix = f"let this user write {path}, {_OTHER_DIR}"
    else:
        cause = f"LMDB cannot open it ({kind}: {error})"
        fix = _MOVE_ASIDE.format(path=path)
    return StoreUnavailable(path, cause, fix)


_MAX_REPORTED = 256  # distinct messages remembered; a process meets a handful
_reported: set[str] = set()
_reported_lock = threading.Lock()


def report(problem: StoreUnavailable | str, exc_info: BaseException | None = None) -> None:
    """Log a failed open: at WARNING the first time this process meets that
    message, at DEBUG after (a connector retries its open every probe
    interval, and says so itself, rate-limited). `exc_info`: a bug's
    traceback, logged at ERROR."""
    message = str(problem)
    with _reported_lock:
        first = message not in _reported
        if len(_reported) >= _MAX_REPORTED:
            _reported.clear()
        _reported.add(message)
    if exc_info is not None and first:
        logger.error("embedded EIC engine: %s", message, exc_info=exc_info)
    elif first:
        logger.warning("embedded EIC engine: %s", message)
    else:
        logger.debug("embedded EIC engine: %s", message)
