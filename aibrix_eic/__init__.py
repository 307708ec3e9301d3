"""aibrix_eic: an EIC L2 backend for AIBrix KV-cache offloading.

Importing this package is cheap (no torch, no aibrix_kvcache): it runs in
every interpreter through the .pth hook. `install()` routes AIBrix's
`Connector.create(backend_name="EIC")` to `aibrix_eic.connector.EICConnector`.
"""

# The package's one version: pyproject.toml reads it from here
# ([tool.hatch.version]); CHANGELOG.md names what each version changed.
__version__ = "0.1.0"


def install() -> None:
    """Make AIBrix's EIC backend resolve to our connector in this process."""
    from .plugin import install as _install

    _install()


def health() -> list[dict[str, object]]:  # no typing import: this module stays cheap
    """`health()` of every EIC connector alive in this process (one per TP
    rank in a vLLM worker): the counters and breaker state that the
    `aibrix_eic_*` metrics also export. docs/operations.md lists the fields."""
    from .observability.health import health as _health

    return _health()


__all__ = ["__version__", "health", "install"]
