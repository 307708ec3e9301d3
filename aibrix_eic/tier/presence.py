"""Which keys EIC holds: one batched mexist round for the tier's lookups.

It runs on vLLM's lookup thread (https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/kv_offload/tiering/async_lookup.py
calls it with one step's keys of one request), never on the scheduler's,
and answers within `exists_timeout_ms`: the mexist calls go to the link's
metadata pool through `Link.call` (counted, observed by the breaker), and a
call still running at the deadline answers "absent" for its keys. Anything
but HIT is absent, so a failure is a miss, never a wrong hit.
"""

from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from ..config import EICConfig
from ..link.link import Link, Session
from ..link.resilience import Deadline
from ..link.sdk import HIT, CallResult
from ..observability.counters import Counters


def present(link: Link, config: EICConfig, counters: Counters, eic_keys: Sequence[str]) -> list[bool]:
    """One bool per key: True where EIC answered HIT before the deadline."""
    answer = [False] * len(eic_keys)
    usable = link.usable("meta") if eic_keys else None
    if usable is None:
        return answer
    session, pool = usable
    deadline = Deadline(config.exists_timeout_ms / 1000)
    step = config.batch_keys
    spans = [(start, min(start + step, len(eic_keys))) for start in range(0, len(eic_keys), step)]
    futures: list[Future[CallResult]] = []
    for start, end in spans:
        try:
            futures.append(pool.submit(_mexist, link, session, list(eic_keys[start:end])))
        except RuntimeError:  # the link was closed
            break
    counters.add(exists=len(eic_keys), exists_calls=len(futures))
    late = False
    for (start, _end), future in zip(spans, futures):
        try:
            result = future.result(timeout=deadline.remaining())
        except FutureTimeout:
            future.cancel()
            late = True
            continue
        except Exception:  # cancelled by close(), or a bug in the call: absent
            continue
        for i, outcome in enumerate(result.outcomes):
            answer[start + i] = outcome == HIT
    if late:
        link.deadline_passed("exists", config.exists_timeout_ms, "tier exists")
    return answer


def _mexist(link: Link, session: Session, eic_keys: list[str]) -> CallResult:
    return link.call("exists", session.client.mexist, eic_keys)
