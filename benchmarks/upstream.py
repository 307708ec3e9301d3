"""aibrix-kvcache's own EICConnector, loaded beside ours for comparisons.

Our shim owns the module name `aibrix_kvcache.l2.connectors.eic`, so the
upstream class is loaded straight from its file, with an SDK module of our
choice (by default the embedded engine) bound as its `eic`. For the
comparisons in this folder (compare_connectors.py, bench_ingestion.py) and
tests/aibrix/test_upstream_compat.py; the package never uses it.
"""

import importlib.util
import os
import sys
from types import ModuleType


def load_upstream_connector_class(sdk_module: ModuleType | None = None) -> type:
    """The upstream EICConnector class, with `sdk_module` as its `eic`."""
    import aibrix_kvcache.l2.connectors as connectors

    if sdk_module is None:
        import aibrix_eic.engine as sdk_module
    path = os.path.join(os.path.dirname(connectors.__file__), "eic", "eic.py")
    # This name makes its relative imports resolve inside aibrix_kvcache; it
    # is not added to sys.modules, so it never shadows the shim.
    spec = importlib.util.spec_from_file_location("aibrix_kvcache.l2.connectors.eic.eic", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the upstream EIC connector from {path}")
    module = importlib.util.module_from_spec(spec)
    saved: ModuleType | None = sys.modules.get("eic")
    sys.modules["eic"] = sdk_module  # type: ignore[assignment]
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("eic", None)
        else:
            sys.modules["eic"] = saved
    return module.EICConnector
