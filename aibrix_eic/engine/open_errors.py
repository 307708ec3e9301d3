"""What a store that cannot be opened means to an operator.

`Client.init` never raises: like the SDK it returns a code (-1: the store
cannot be reached or opened, as a cluster that cannot be reached; -22: the
endpoint itself is wrong), and it logs why once, with the store's path, the
cause and the fix. `explain` turns what opening a shared store raised into
that message (a `StoreUnavailable`); `aibrix-eic check` and the connector
show the same one. Anything it does not recognise is a bug in aibrix-eic,
and is reported as one.
"""

import logging
import sys
import threading

from .errors import StoreUnavailable

logger = logging.getLogger(__name__)

UNAVAILABLE = -1  # what the SDK returns when the cluster cannot be reached
INVALID = -22  # EINVAL: an endpoint that cannot be parsed

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
    from .shared_files import os_error_words

    return StoreUnavailable(path, *os_error_words(error.filename or path, error))


def _explain_lmdb_error(path: str, error: Exception) -> StoreUnavailable:
    from .shared_files import OTHER_DIR, replace_store_fix

    kind = type(error).__name__
    if kind in _LMDB_UNREADABLE:
        cause = f"its files are not a store this engine can read: damaged or written by something else ({error})"
        fix = replace_store_fix(path)
    elif kind in _LMDB_LOCKED:
        # The store takes its own OFD locks (shared_lock.py), which processes
        # in other PID namespaces share; LMDB's lock file is never used.
        cause = f"LMDB's lock cannot be taken ({error}); this store opens LMDB without it"
        fix = f"check that every process using {path} runs this aibrix-eic version, and that none opens it with LMDB itself"
    elif kind == "ReadonlyError":
        cause = f"it can only be opened read-only ({error})"
        fix = f"let this user write {path}, {OTHER_DIR}"
    else:
        cause = f"LMDB cannot open it ({kind}: {error})"
        fix = replace_store_fix(path)
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
