"""The anchors of a Markdown page's headings, as GitHub makes them: what a
link `page.md#anchor` (in the docs, a message or an alert's runbook_url) must
name to resolve."""

import re


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    """Every heading's anchor in a page's text (a repeated heading gets -1, -2, ...)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            anchor = slug(match.group(1))
            n = counts.get(anchor, 0)
            counts[anchor] = n + 1
            found.add(anchor if n == 0 else f"{anchor}-{n}")
    return found
