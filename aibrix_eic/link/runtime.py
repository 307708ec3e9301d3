"""What every request path and the flusher share: built once per connector
(lifecycle.py) and handed to each part, instead of the same four arguments."""

from dataclasses import dataclass

from ..config import EICConfig
from ..observability.counters import Counters
from ..util.rate_limited_log import RateLimitedLogger
from .link import Link


@dataclass(frozen=True)
class Runtime:
    config: EICConfig
    link: Link  # the breaker is rebuilt on every open: always read it through the link
    counters: Counters
    rate_log: RateLimitedLogger
