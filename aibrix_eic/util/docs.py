"""Where the documentation is online. The wheel carries no docs/, so a
message that sends a user to a page names its URL; DOCS_URL is pyproject's
`[project.urls] Documentation` (tests/tools/test_docs_citations.py keeps the
two equal and checks every page and heading named with docs_url)."""

DOCS_URL = "https://github.com/aibrix-eic/aibrix-eic/blob/main/docs"


def docs_url(page: str, heading: str = "") -> str:
    """docs_url("config.md", "model-identity"): that page (and heading) online."""
    return f"{DOCS_URL}/{page}" + (f"#{heading}" if heading else "")
