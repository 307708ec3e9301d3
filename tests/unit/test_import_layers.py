"""Imports point one way: each package may import its own modules and the
layers below it (docs/architecture.md lists them), never one above. Read
from the source with `ast`, so a lazy import inside a function counts too;
imports under `if TYPE_CHECKING:` are for annotations only and are skipped."""

import ast
from pathlib import Path

import aibrix_eic

PACKAGE = Path(aibrix_eic.__file__).parent
# Lowest first; a unit is a top-level module or subpackage of aibrix_eic.
LAYERS = [
    {"util"},
    {"engine"},
    {"config", "keys"},
    {"observability", "aibrix_compat"},
    {"link"},
    {"request"},
    {"writes"},
    {"connector", "lifecycle", "plugin", "cli", "pd", "tier", "__init__", "__main__", "_pth_hook"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
ENTRY_POINTS = LAYERS[-1]  # what AIBrix, vLLM and operators call: they may call each other


def unit_of(module: str) -> str:
    """'aibrix_eic.link.sdk' -> 'link'; 'aibrix_eic' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every aibrix_eic import in a file."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = type_checking_lines(tree)
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("aibrix_eic")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("aibrix_eic"):
                continue
            # `from . import x` may name a submodule: judge it by its own unit
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.append((node.lineno, candidate if unit_of(target) == "__init__" else target))
    return found


def test_every_unit_has_a_layer():
    units = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert units <= set(RANK), f"units without a layer: {sorted(units - set(RANK))}"


def test_imports_point_down():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        for line, target in imported_modules(path):
            target_unit = unit_of(target)
            if target_unit == source or target_unit not in RANK or {source, target_unit} <= ENTRY_POINTS:
                continue  # its own package, a name of aibrix_eic/__init__ (like __version__), entry points
            if RANK[target_unit] >= RANK[source]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} ({source} -> {target_unit})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)
