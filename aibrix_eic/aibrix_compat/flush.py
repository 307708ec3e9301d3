"""AIBrix's flush() waits for the writes our connector accepted.

`KVCacheManager.flush()` is AIBrix's promise that what was put is in the
L2: its PD connector's prefiller calls it after writing a prompt, and the
response that sends a decoder to read that prompt from the L2 follows. In
aibrix-kvcache 0.8.0 `BaseKVCacheManager.flush` waits for the manager's own
asynchronous puts and L2Cache's queue, not for the backend's: with our
default `put_mode: write_behind` a put returns once its blocks are accepted,
so a decoder in another process could read before the write landed. For
managers whose backend is one of our connectors, flush() then also waits,
up to `write_behind_close_timeout_ms`, until every accepted write is stored
or dropped (a dropped write is a miss for the reader, never wrong KV);
past that it returns TIMEOUT. Other managers are left stock.
"""

import logging
import weakref
from collections.abc import Callable
from typing import Any

from aibrix_kvcache.status import Status, StatusCodes

from ..util.rate_limited_log import RateLimitedLogger
from .backends import backend_of

logger = logging.getLogger(__name__)
_rate_log = RateLimitedLogger(logger)

_OURS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def flush_waits_for_writes(connector: object) -> bool:
    """Make flush() of the managers whose L2 backend is `connector` wait for
    its accepted writes; True. Idempotent: the class is patched once per
    process (registry.install_all calls this under its lock)."""
    from aibrix_kvcache.cache_manager import BaseKVCacheManager

    if not getattr(BaseKVCacheManager.flush, "_aibrix_eic_waits", False):
        BaseKVCacheManager.flush = _waiting_flush(BaseKVCacheManager.flush)
    _OURS.add(connector)
    return True


def _waiting_flush(original: Callable[[Any], Status]) -> Callable[[Any], Status]:
    def flush(manager: Any) -> Status:
        status = original(manager)
        backend: Any = backend_of(manager, _OURS)
        if backend is None:
            return status
        timeout_ms = backend.config.write_behind_close_timeout_ms
        if backend.write_behind.wait_idle(timeout_ms / 1000):
            return status
        _rate_log.log(
            "flush",
            logging.WARNING,
            "EIC: flush() waited write_behind_close_timeout_ms=%d and writes are still pending; "
            "a reader in another process (a PD decoder) may miss them",
            timeout_ms,
        )
        return status if not status.is_ok() else Status(StatusCodes.TIMEOUT, "EIC writes still pending after flush")

    flush._aibrix_eic_waits = True  # type: ignore[attr-defined]
    flush.__wrapped__ = original  # type: ignore[attr-defined]
    return flush
