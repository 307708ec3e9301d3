"""Requests sent straight to EIC: the request's own references on its
memory (checks.py's hold), its SDK calls (dispatch.py) and the Statuses AIBrix
sees (statuses.py). The connector sends gets here (with put_mode write_behind
or coalesce, only the keys no pending write answers), puts with put_mode
direct, and deletes with put_mode direct.
"""

from collections.abc import Sequence
from typing import Any

from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status

from ..aibrix_compat.tokens import restore_tokens
from ..keys.codec import KeyCodec
from ..link.calls import DELETE, GET, PUT
from ..link.link import Session
from ..link.runtime import Runtime
from .checks import BlockChecker, eic_keys, hold, release
from .dispatch import Chunk, Dispatcher, OutlivedCall
from .statuses import FAST_MISS, close_after, key_statuses, put_outcome, unloaded_reasons


class DirectRequests:
    def __init__(
        self, rt: Runtime, codec: KeyCodec, blocks: BlockChecker, dispatcher: Dispatcher, outlived: OutlivedCall
    ) -> None:
        self._config = rt.config
        self._link = rt.link
        self._codec = codec
        self._blocks = blocks
        self._dispatcher = dispatcher
        self._counters = rt.counters
        self._outlived = outlived  # a put's call still running at its deadline

    def _held_chunks(self, session: Session, keys: Sequence[Any], mrs: Sequence[Any], op: str) -> list[Chunk] | Status:
        """Check the request, then take the request's references on its
        regions (released by the caller) and split it into SDK calls; a
        Status when the regions may not be touched."""
        mark_registered = session.registration_ok and (self._config.put_registered or op != "mput")
        buffers = self._blocks.buffers(mrs, mark_registered)
        keys_in_eic = eic_keys(self._codec, keys)
        refused = hold(mrs, op)
        if refused is not None:
            return refused
        return self._dispatcher.chunks(keys_in_eic, buffers, mrs)

    async def mget(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        usable = self._link.usable("data")
        if usable is None:
            return [FAST_MISS] * len(keys)
        session = usable[0]
        chunks = self._held_chunks(session, keys, mrs, "mget")
        if isinstance(chunks, Status):
            return chunks
        try:
            timeout_ms = await self._dispatcher.run(GET, session.client, chunks)
            statuses, loaded = key_statuses(chunks, "get", timeout_ms)
            close_after(statuses, loaded)
            if loaded and not MemoryRegion.use_compact_layout():
                loaded = restore_tokens(keys, mrs, statuses, loaded)
                close_after(statuses, loaded)
        finally:
            release(mrs)
        self._counters.add(gets=1, get_blocks=len(keys), get_hits=loaded, **unloaded_reasons(chunks))
        return statuses

    async def mput(
        self, session: Session, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]
    ) -> Sequence[Status] | Status:
        chunks = self._held_chunks(session, keys, mrs, "mput")
        if isinstance(chunks, Status):
            return chunks
        try:
            timeout_ms = await self._dispatcher.run(PUT, session.client, chunks, self._outlived)
        finally:
            release(mrs)
        result, stored = put_outcome(*key_statuses(chunks, "put", timeout_ms))
        self._counters.add(puts=1, put_blocks=len(keys), put_failures=len(keys) - stored)
        return result

    async def delete(self, session: Session, eic_key: str) -> Status:
        chunks = self._dispatcher.chunks([eic_key], None, None)
        timeout_ms = await self._dispatcher.run(DELETE, session.client, chunks)
        self._counters.add(deletes=1)
        return key_statuses(chunks, "delete", timeout_ms)[0][0]
