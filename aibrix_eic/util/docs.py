"""Where the documentation is on this host. There is no published site: the
wheel carries docs/ as aibrix_eic/docs (pyproject.toml's force-include), and
a checkout has docs/ beside the package. A message that sends a user to a
page names that page's path here (tests/tools/test_docs_citations.py checks
every page and heading named with docs_url, and that the paths exist)."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
# The wheel's copy first, then a checkout's (an editable install has only that).
DOCS_DIRS = (_PACKAGE / "docs", _PACKAGE.parent / "docs")


def docs_dir() -> Path | None:
    """The directory holding the documentation, or None if this install has
    none (a wheel built without it)."""
    return next((d for d in DOCS_DIRS if (d / "config.md").is_file()), None)


def docs_url(page: str, heading: str = "") -> str:
    """docs_url("config.md", "model-identity"): the page's path on this host
    (and the heading's anchor)."""
    directory = docs_dir()
    where = str(directory / page) if directory else f"docs/{page} in the aibrix-eic source"
    return where + (f"#{heading}" if heading else "")
