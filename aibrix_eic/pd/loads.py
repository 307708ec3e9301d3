"""What a PD decoder's load from the L2 left unwritten, and which requests
must not try that load again. No vLLM import: the connector (connector.py)
feeds these from vLLM's objects."""

import threading
from collections.abc import Iterable, Sequence


def unloaded_block_ids(slot_mapping: Sequence[int], loaded_until: int, prompt_len: int, block_ntokens: int) -> set[int]:
    """The engine blocks holding prompt tokens [loaded_until, prompt_len):
    what vLLM must recompute. `slot_mapping[t]` is token t's slot, and a
    slot's block is slot // block_ntokens; a block only partly loaded is
    in the set (vLLM recomputes from its first token)."""
    if loaded_until >= prompt_len:
        return set()
    return {int(slot) // block_ntokens for slot in slot_mapping[max(loaded_until, 0) : prompt_len]}


class HandOffs:
    """The scheduler's record of the decoder loads it started: a request
    whose load failed (any of its blocks reported invalid by the workers)
    is answered 0 external tokens when vLLM asks again, so vLLM recomputes
    it instead of loading the same missing prompt forever."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[str, frozenset[int]] = {}  # request id -> its blocks the load writes
        self._failed: set[str] = set()

    def started(self, request_id: str, block_ids: Iterable[int]) -> None:
        with self._lock:
            self._blocks[request_id] = frozenset(block_ids)
            self._failed.discard(request_id)

    def invalid(self, block_ids: set[int]) -> set[str]:
        """Note the blocks the workers could not load; the requests hit."""
        if not block_ids:
            return set()
        with self._lock:
            hit = {rid for rid, blocks in self._blocks.items() if not blocks.isdisjoint(block_ids)}
            self._failed |= hit
            for rid in hit:
                del self._blocks[rid]
        return hit

    def received(self, request_ids: Iterable[str]) -> None:
        """Loads vLLM heard were done: their blocks are the running
        requests' now (and free to others after a preemption), so a failure
        reported on them later is no longer these requests'."""
        with self._lock:
            for rid in request_ids:
                self._blocks.pop(rid, None)

    def failed(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._failed

    def finished(self, request_id: str) -> None:
        with self._lock:
            self._blocks.pop(request_id, None)
            self._failed.discard(request_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks) + len(self._failed)
