"""Fail when a requirement of the named installed distributions is missing
or at a version they refuse.

deploy/Dockerfile installs aibrix-kvcache and aibrix-eic with --no-deps
(aibrix-kvcache declares the PyPI `asyncio` backport, which must not shadow
the standard library's module), so pip never checks their requirements. This
does, after the install, for every requirement whose environment marker
applies (extras left out), except the names given with --skip:

    python3 verify_requirements.py aibrix-eic aibrix-kvcache --skip asyncio

Exit status 0 when all are met, 1 with one line per unmet requirement.
Runs on the image's own interpreter with the standard library and
`packaging` (pip's copy when the image has no other).
"""

import argparse
import re
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
except ImportError:  # every pip carries a copy
    from pip._vendor.packaging.requirements import Requirement


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unmet(distributions: list[str], skip: set[str]) -> list[str]:
    """One message per requirement of `distributions` not met here."""
    skip = {canonical(name) for name in skip}
    problems = []
    for distribution in distributions:
        try:
            requirements = metadata.requires(distribution) or []
        except metadata.PackageNotFoundError:
            problems.append(f"{distribution} is not installed")
            continue
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue  # another Python, platform or an extra
            if canonical(requirement.name) in skip:
                continue
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                problems.append(f"{distribution} requires {requirement}, which is not installed")
                continue
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{distribution} requires {requirement}, but {requirement.name} {version} is installed")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("distributions", nargs="+")
    parser.add_argument("--skip", action="append", default=[], help="a requirement not to check (repeatable)")
    args = parser.parse_args(argv)
    problems = unmet(args.distributions, set(args.skip))
    for problem in problems:
        print(f"unmet: {problem}", file=sys.stderr)
    if not problems:
        print(f"requirements of {', '.join(args.distributions)} are met")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
