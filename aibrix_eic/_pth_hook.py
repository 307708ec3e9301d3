"""Imported by aibrix_eic.pth at interpreter start; installs the lazy shim.

It must never break interpreter start-up, so every failure is swallowed.
"""

try:
    from aibrix_eic.plugin import autoload_disabled, install

    if not autoload_disabled():
        install()
except Exception:  # pragma: no cover - defensive
    pass
