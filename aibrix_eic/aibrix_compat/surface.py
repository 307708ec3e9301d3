"""The parts of aibrix-kvcache our workarounds and `pd/` rely on, declared
as data (registry.py lists them per workaround), and the check that the
installed aibrix-kvcache still has each with the shape we use.

The check reads AIBrix's source with `ast` instead of importing it: the PD
connector's module imports vLLM, and an instance attribute exists only once
an object is built. A name that is gone, a method whose parameters changed
or a class whose bases changed is one `Missing`, saying what we expected.
"""

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Need:
    """One name in one aibrix-kvcache module. `name` is `Class`,
    `Class.attribute` or a module-level name; `params` (a method's first
    parameters, in order) or `bases` (a class's base classes, as written)
    say what shape we use."""

    module: str  # "aibrix_kvcache.cache_manager"
    name: str  # "BaseKVCacheManager._release"
    params: tuple[str, ...] | None = None
    bases: tuple[str, ...] | None = None

    def __str__(self) -> str:
        shape = ""
        if self.params is not None:
            shape = f"({', '.join(self.params)}, ...)"
        elif self.bases is not None:
            shape = f" subclassing {', '.join(self.bases)}"
        return f"{self.module}.{self.name}{shape}"


@dataclass(frozen=True)
class Missing:
    need: Need
    problem: str  # what the installed source has instead

    def __str__(self) -> str:
        return f"{self.need}: {self.problem}"


def aibrix_root() -> Path | None:
    """The installed aibrix_kvcache package's directory, or None."""
    try:
        import aibrix_kvcache
    except ImportError:
        return None
    return Path(aibrix_kvcache.__file__).parent


def missing(needs: tuple[Need, ...], root: Path | None = None) -> list[Missing]:
    """The needs the aibrix-kvcache source under `root` (the installed one
    by default) does not meet."""
    root = aibrix_root() if root is None else root
    return [problem for need in needs if (problem := _check(need, root)) is not None]


def _check(need: Need, root: Path | None) -> Missing | None:
    if root is None:
        return Missing(need, "aibrix-kvcache is not installed")
    tree = _parse(root, need.module)
    if tree is None:
        return Missing(need, "its module is not in the installed aibrix-kvcache (or has no source)")
    owner, _, member = need.name.rpartition(".")
    if not owner:
        node = _top_level(tree, member)
        if node is None:
            return Missing(need, "no such module-level name")
        return _shape(need, node)
    cls = _top_level(tree, owner)
    if not isinstance(cls, ast.ClassDef):
        return Missing(need, f"no class {owner}")
    node = _member(cls, member)
    if node is None:
        return Missing(need, f"class {owner} has no {member} (neither in its body nor set on self)")
    return _shape(need, node)


def _shape(need: Need, node: ast.AST) -> Missing | None:
    if need.params is not None:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Missing(need, "is not a method")
        args = node.args
        names = tuple(a.arg for a in (*args.posonlyargs, *args.args))
        if names[: len(need.params)] != need.params:
            return Missing(need, f"its parameters are ({', '.join(names)})")
    if need.bases is not None:
        if not isinstance(node, ast.ClassDef):
            return Missing(need, "is not a class")
        bases = tuple(ast.unparse(base).rpartition(".")[2] for base in node.bases)
        if not set(need.bases) <= set(bases):
            return Missing(need, f"its bases are ({', '.join(bases)})")
    return None


@functools.lru_cache(maxsize=32)
def _parse_file(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _parse(root: Path, module: str) -> ast.Module | None:
    parts = module.split(".")[1:]  # below aibrix_kvcache
    base = root.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return _parse_file(path)
    return None


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    """The module-level statement that binds `name` (a def, a class, an
    assignment or an import); None when nothing does."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        imports = node.names if isinstance(node, (ast.Import, ast.ImportFrom)) else ()
        if any((alias.asname or alias.name.split(".")[0]) == name for alias in imports):
            return node
        if name in _assigned(node, lambda target: isinstance(target, ast.Name), lambda target: target.id):
            return node
    return None


def _member(cls: ast.ClassDef, name: str) -> ast.AST | None:
    """A def or assignment in the class body, else an assignment to
    `self.<name>` in any of its methods."""
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if name in _assigned(node, lambda target: isinstance(target, ast.Name), lambda target: target.id):
            return node
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(method):
            if name in _assigned(inner, _is_self_attribute, lambda target: target.attr):
                return inner
    return None


def _is_self_attribute(target: ast.expr) -> bool:
    return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"


def _assigned(node: ast.AST, wanted: Callable[[Any], bool], name_of: Callable[[Any], str]) -> set[str]:
    """The names `node` assigns to targets that `wanted` accepts."""
    if isinstance(node, ast.Assign):
        targets = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return set()
    return {name_of(target) for target in targets if wanted(target)}
