"""The never-raise wrapper of the connector's async operations: whatever
happens inside, AIBrix gets a Status (bad input INVALID, a bug ERROR), and
each request is counted once in the metrics.

It reads the connector's `_counters`, `_rate_log` and `_metrics`.
"""

import asyncio
import functools
import logging
import time

from aibrix_kvcache.status import Status, StatusCodes

from .checks import InvalidRequest
from .metrics import FAST_MISS

# The requests the metrics count, by their name there; get() and put() go
# through mget() and mput(), so each request is counted once.
METRIC_OPS = {"mget": "get", "mput": "put", "exists": "exists", "delete": "delete"}


def never_raises(op: str):
    """Turn any exception of an async op into an ERROR Status, and count
    the request in the metrics."""
    metric_op = METRIC_OPS.get(op)

    def decorate(method):
        @functools.wraps(method)
        async def wrapper(self, *args, **kwargs):
            counted_by_batcher = metric_op == "exists"  # in bulk, per mexist round
            # exists is timed per mexist round too: no clock read per key.
            started = time.perf_counter() if metric_op is not None and not counted_by_batcher else 0.0
            try:
                result = await method(self, *args, **kwargs)
            except asyncio.CancelledError:
                raise
            except InvalidRequest as e:
                self._counters.add(invalid=1)
                result = Status(StatusCodes.INVALID, f"{op}: {e}")
                counted_by_batcher = False
            except BaseException as e:  # AssertionError too: nothing escapes
                self._rate_log.log(f"{op}-internal", logging.ERROR, "EIC %s failed internally: %r", op, e)
                result = Status(StatusCodes.ERROR, f"{op} failed internally: {e!r}")
                counted_by_batcher = False
            if counted_by_batcher and (result is FAST_MISS or result.error_code is StatusCodes.INVALID):
                counted_by_batcher = False  # answered before the batcher: fast failure, refusal
            if metric_op is not None and not counted_by_batcher:
                try:
                    self._metrics.record_request(metric_op, result, args, time.perf_counter() - started)
                except Exception as e:  # metrics never cost a request its answer
                    self._rate_log.log("metrics", logging.WARNING, "EIC metrics failed: %r", e)
            return result

        return wrapper

    return decorate
