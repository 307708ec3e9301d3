"""Where the vendor's EIC Python SDK comes from, and whether this host has
it, without importing it (the config check runs where it is absent)."""

import importlib.util

SDK_MODULE = "eic"
SDK_WHEEL_URL = "https://eic-sdk-release.tos-cn-beijing.volces.com/python/eic-1.5.2-py3-none-any.whl"


def sdk_installed() -> bool:
    """Whether `import eic` can find the module (a module named eic planted
    by a test or by aibrix_eic.engine's users counts too)."""
    try:
        return importlib.util.find_spec(SDK_MODULE) is not None
    except (ImportError, ValueError):  # a broken or half-registered module of that name
        return False
