"""Route AIBrix's EIC backend to aibrix_eic without changing AIBrix or vLLM.

AIBrix 0.8's `Connector.create` does `from .eic import EICConnector` when the
backend is "EIC" (aibrix_kvcache/l2/connectors/connector.py in
https://github.com/vllm-project/aibrix), so we answer that import with a
module whose EICConnector is ours. Three triggers install it: the
`vllm.general_plugins` entry point (`register`), the .pth hook that runs at
interpreter start (opt out with AIBRIX_EIC_DISABLE_AUTOLOAD=1), and an
explicit `aibrix_eic.install()`. Inside vLLM, the entry point and the shim's
import also send our log lines to vLLM's handler (logs.route_to_vllm).

This module must stay cheap to import: the .pth hook runs in every process.
"""

import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, cast

from .util.flags import env_flag

if TYPE_CHECKING:  # importlib.abc is not imported at run time: the .pth hook must stay cheap
    from collections.abc import Mapping, MutableMapping
    from importlib.abc import Loader

SHIM_MODULE = "aibrix_kvcache.l2.connectors.eic"
BACKEND_ENV = "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"
BACKEND_ALIAS_ENV = "AIBRIX_KV_CACHE_OL_L2_BACKEND"
DISABLE_AUTOLOAD_ENV = "AIBRIX_EIC_DISABLE_AUTOLOAD"
SHIM_MARKER = "__aibrix_eic_shim__"


class _ShimLoader:
    """Builds the shim module: our EICConnector under AIBrix's module name."""

    def create_module(self, spec):
        return None  # default module creation

    def exec_module(self, module: ModuleType) -> None:
        # AIBrix imports this module when it builds the cache manager, in the
        # worker, after vLLM configured its logging.
        from aibrix_eic.observability.logs import route_to_vllm

        route_to_vllm()
        from aibrix_eic.connector import EICConnector

        vars(module).update(EICConnector=EICConnector, __all__=["EICConnector"])
        setattr(module, SHIM_MARKER, True)


class _ShimFinder:
    """A sys.meta_path finder that answers only for SHIM_MODULE."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != SHIM_MODULE:
            return None
        return ModuleSpec(fullname, cast("Loader", _ShimLoader()), origin="aibrix_eic")

    def invalidate_caches(self) -> None:
        pass


_finder = _ShimFinder()


def apply_backend_alias(environ: "MutableMapping[str, str]" = os.environ) -> None:
    """Copy our short AIBRIX_KV_CACHE_OL_L2_BACKEND into AIBrix's name, which
    AIBrix reads lazily; an explicitly set AIBrix name wins."""
    alias = environ.get(BACKEND_ALIAS_ENV)
    if alias and not environ.get(BACKEND_ENV):
        environ[BACKEND_ENV] = alias


def install() -> None:
    """Make `Connector.create(backend_name="EIC")` return our connector.

    Safe to call many times, before or after aibrix_kvcache is imported.
    """
    apply_backend_alias()
    if not any(finder is _finder for finder in sys.meta_path):
        sys.meta_path.insert(0, _finder)
    existing = sys.modules.get(SHIM_MODULE)
    if existing is not None and not getattr(existing, SHIM_MARKER, False):
        # The upstream module was imported first; the next import gets ours.
        del sys.modules[SHIM_MODULE]
        parent = sys.modules.get(SHIM_MODULE.rpartition(".")[0])
        if parent is not None and getattr(parent, "eic", None) is existing:
            delattr(parent, "eic")


def is_installed() -> bool:
    return any(finder is _finder for finder in sys.meta_path)


def register() -> None:
    """vLLM general plugin entry point: runs in every vLLM process."""
    from aibrix_eic.observability.logs import route_to_vllm

    install()
    route_to_vllm()


def autoload_disabled(environ: "Mapping[str, str]" = os.environ) -> bool:
    return env_flag(DISABLE_AUTOLOAD_ENV, False, environ)
