"""Process set-up shared by the CLI commands: AIBrix on this host, quiet logs,
and environment changes that are undone when a command returns.

aibrix_kvcache reads some variables when it is imported, so `prepare_aibrix`
must run before anything imports it.
"""

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping

# Read by aibrix_kvcache (and tqdm) at import time.
IMPORT_TIME_ENV = {
    # Compact block layout, what vLLM deployments use; AIBrix's default too.
    "AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED": "0",
    # AIBrix's allocator draws a tqdm bar per slab; ours is the only bar.
    "TQDM_DISABLE": "1",
}

_QUIET_LOGGERS = ("aibrix_eic", "aibrix_kvcache")


def prepare_aibrix() -> None:
    """Import AIBrix set up for this host and route backend EIC to us."""
    for name, value in IMPORT_TIME_ENV.items():
        os.environ.setdefault(name, value)
    import aibrix_kvcache.cache_manager as cache_manager
    import torch

    import aibrix_eic

    if not torch.cuda.is_available():
        # CPU-only torch cannot pin memory; AIBrix pins when device is cpu.
        cache_manager.TESTING_DISABLE_PIN_MEMORY = True
    aibrix_eic.install()


@contextlib.contextmanager
def library_logs(verbose: bool) -> Iterator[None]:
    """The commands print their own findings; library logs show only with
    -v. Levels are restored on exit, so calling main() in-process leaves the
    caller's logging as it was."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    saved = [logger.level for logger in loggers]
    handler = None
    if verbose:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
    for logger in loggers:
        logger.setLevel(logging.INFO if verbose else logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, saved):
            logger.setLevel(level)
        if handler is not None:
            logging.getLogger().removeHandler(handler)


@contextlib.contextmanager
def scoped_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) variables, and restore them on exit."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
