"""How a boolean written as text is read, in one place: environment flags
(AIBRIX_EIC_DISABLE_*) and engine URL parameters (`?unreachable=1`) accept
the same spellings."""

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_flag(text: str) -> bool:
    """True or False for one of the words above (any case, spaces around);
    ValueError for anything else."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"expected true or false ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}), got {text!r}")


def env_flag(name: str, default: bool = False, environ: "Mapping[str, str] | None" = None) -> bool:
    """The environment variable `name` read as a flag: `default` when it is
    unset or empty, and, with a warning naming it, when it is not a flag (so
    a typo never stops a worker)."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return parse_flag(raw)
    except ValueError as e:
        import logging  # only here: the .pth hook reads a flag in every interpreter, and must stay cheap

        logging.getLogger(__name__).warning("%s: %s; using %s", name, e, "true" if default else "false")
        return default
