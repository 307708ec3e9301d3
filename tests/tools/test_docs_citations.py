"""What the documentation cites exists: every repository file path, every
`file.py:N` line, every function, class and test name named in docs/*.md,
the READMEs and benchmarks/RESULTS.md, and every link to a page or heading. A user has only the
repository; a stale citation sends them looking for code that is gone.

Names from other projects (AIBrix, vLLM, LMCache, SGLang, the EIC SDK) are
looked up in the installed aibrix_kvcache or listed in EXTERNAL with where
they live."""

import ast
import builtins
import functools
import importlib
import importlib.util
import os
import re
import sys

import pytest
from markdown_anchors import anchors_of, slug

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(
    [os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")]
    + ["README.md", "CHANGELOG.md", os.path.join("tests", "README.md")]
    + [os.path.join("benchmarks", "README.md"), os.path.join("benchmarks", "RESULTS.md")]
)
LINKED_PAGES = DOCS
SOURCE_DIRS = ("aibrix_eic", "tests", "benchmarks", "scripts", "deploy")

# Cited names that live in other projects, and where.
EXTERNAL = {
    # files of other repositories, named where the docs compare with them
    "eic.py": "AIBrix, python/aibrix_kvcache/aibrix_kvcache/l2/connectors/eic/eic.py",
    "test_l2cache.py": "AIBrix's tests (python/aibrix_kvcache/tests)",
    "aibrix_offloading_connector_type1.py": "aibrix-kvcache, aibrix_kvcache/integration/vllm/kv_connector/",
    "test_cache_manager.py": "AIBrix's tests (python/aibrix_kvcache/tests)",
    "eic_storage.py": "SGLang, python/sglang/srt/mem_cache/storage/eic/eic_storage.py",
    "eic_connector.py": "LMCache, lmcache/v1/storage_backend/connector/eic_connector.py",
    "eic_memory_pool.py": "bytedance-iaas/sglang, python/sglang/srt/mem_cache/eic_memory_pool.py",
    "EIC_PATCH.md": "bytedance-iaas/sglang, the fork's notes on its EIC changes",
    # classes of other projects
    "EICKVClient": "LMCache's EIC connector",
    "EICStorage": "SGLang's EIC storage",
    "CacheConfig": "vLLM",
    "madvise": "libc",
    "cpu_attn.py": "vLLM, vllm/v1/attention/backends/cpu_attn.py",
    "gpu_model_runner.py": "vLLM, vllm/v1/worker/gpu_model_runner.py (AIBrix's 0.10.2 patch changes it)",
    "get_block_ids_with_load_errors": "vLLM, KVConnectorBase_V1 (vllm/distributed/kv_transfer/kv_connector/v1/base.py)",
    "test_request": "AIBrix's vLLM 0.10.2 patch, a scheduler hook Type3 needs (not a test)",
}
# Files of other projects that comments of our code name.
EXTERNAL_IN_CODE = {
    "retry.py": "redis-py",
    "backoff.py": "redis-py",
    "prometheus.py": "vLLM, vllm/v1/metrics/prometheus.py",
    "loggers.py": "vLLM, vllm/v1/metrics/loggers.py (the external prefix cache counters and log line)",
    "shm_broadcast.py": "vLLM, vllm/distributed/device_communicators/shm_broadcast.py",
}
# Files our code writes at run time, named in its comments.
WRITTEN_FILES = {"bench-eic.yaml", "aibrix_eic_breaker_bench.yaml", "upstream.yaml"}
# Paths the docs use as examples of a user's own files, not the repository's.
EXAMPLE_FILES = {"eic.yaml", "down.yaml", "bench.json", "out.png", "serve.json", "flags"}


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _without_urls(text: str) -> str:
    """The text without links to other sites, their link texts included
    (`[eic_storage.py](https://...)` names another project's file)."""
    text = re.sub(r"\[[^\]]*\]\(https?://[^)]*\)", " ", text)
    return re.sub(r"https?://[^\s)>\]]+", " ", text)


@functools.cache
def _repo_files() -> dict[str, list[str]]:
    """basename -> repository paths (tracked folders only, no venvs)."""
    found: dict[str, list[str]] = {}
    for top in (*SOURCE_DIRS, "docs", ".ci"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for name in files:
                found.setdefault(name, []).append(os.path.relpath(os.path.join(folder, name), ROOT))
    for name in os.listdir(ROOT):
        if os.path.isfile(os.path.join(ROOT, name)):
            found.setdefault(name, []).append(name)
    return found


def _aibrix_root() -> str:
    import aibrix_kvcache

    return os.path.dirname(aibrix_kvcache.__file__)


def resolve_path(cited: str, page: str) -> list[str]:
    """The files a cited path can mean: from the repository root, from the
    page's folder, under aibrix_eic/ or tests/, by basename, or in aibrix_kvcache."""
    candidates = []
    for base in ("", os.path.dirname(page), "aibrix_eic", "tests", "benchmarks"):
        path = os.path.normpath(os.path.join(base, cited))
        if os.path.isfile(os.path.join(ROOT, path)):
            candidates.append(os.path.join(ROOT, path))
    if "/" not in cited:
        candidates += [os.path.join(ROOT, p) for p in _repo_files().get(cited, [])]
    aibrix = _aibrix_root()
    for prefix in ("python/aibrix_kvcache/aibrix_kvcache/", "aibrix_kvcache/", ""):
        if cited.startswith(prefix) and os.path.isfile(os.path.join(aibrix, cited[len(prefix) :])):
            candidates.append(os.path.join(aibrix, cited[len(prefix) :]))
            break
    return candidates


_PATH = re.compile(r"(?<![\w/.@~$-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|yaml|yml|toml|sh|txt|ini|pth))(?::(\d+))?(?![\w/-])")


def cited_paths(page: str) -> list[tuple[str, int | None]]:
    text = _without_urls(_read(page))
    # A path of the user's machine (/etc/..., ~/...) is not the repository's.
    return [(m.group(1), int(m.group(2)) if m.group(2) else None) for m in _PATH.finditer(text)]


@pytest.mark.parametrize("page", DOCS)
def test_every_cited_file_and_line_exists(page):
    missing = []
    for cited, line in cited_paths(page):
        name = os.path.basename(cited)
        if name in EXTERNAL or name in EXAMPLE_FILES:
            continue
        candidates = resolve_path(cited, page)
        if not candidates:
            missing.append(cited)
        elif line is not None and not any(_line_count(path) >= line for path in candidates):
            missing.append(f"{cited}:{line} (the file has {max(_line_count(p) for p in candidates)} lines)")
    assert not missing, f"{page} cites what does not exist: {sorted(set(missing))}"


@functools.cache
def _line_count(path: str) -> int:
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def _code_files() -> list[str]:
    found = []
    for top in ("aibrix_eic", "benchmarks"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [os.path.relpath(os.path.join(folder, n), ROOT) for n in files if n.endswith(".py")]
    return sorted(found)


@pytest.mark.parametrize("source", _code_files())
def test_files_named_in_our_code_exist(source):
    """Comments and docstrings of the package and the benchmarks name
    modules that exist (a module renamed leaves its old name behind)."""
    missing = []
    for cited, line in cited_paths(source):
        name = os.path.basename(cited)
        if name in EXTERNAL or name in EXTERNAL_IN_CODE or name in WRITTEN_FILES:
            continue
        candidates = resolve_path(cited, source)
        if not candidates or (line is not None and not any(_line_count(p) >= line for p in candidates)):
            missing.append(cited if line is None else f"{cited}:{line}")
    assert not missing, f"{source} names files that do not exist: {sorted(set(missing))}"


_LOG_SOURCE = re.compile(r"\[(\w+\.py):(\d+)\] ([A-Za-z][^:=%\n]{8,40})")


@pytest.mark.parametrize("page", DOCS)
def test_log_lines_quoted_with_their_source_line_come_from_that_line(page):
    """vLLM prints `[file.py:N]` before each message: a quoted log line must
    still be logged at that line (its call, or the message one line below)."""
    wrong = []
    for name, line, message in _LOG_SOURCE.findall(_read(page)):
        paths = [p for p in resolve_path(name, page) if p.startswith(os.path.join(ROOT, "aibrix_eic"))]
        number = int(line)
        near = [
            text for path in paths for text in _read(os.path.relpath(path, ROOT)).splitlines()[number - 1 : number + 1]
        ]
        if not any(message.strip() in text for text in near):
            wrong.append(f"[{name}:{line}] {message.strip()}")
    assert not wrong, f"{page} quotes log lines from lines that do not log them: {sorted(set(wrong))}"


# ------------------------------------------------------------------ names


def _source_files() -> list[str]:
    roots = [os.path.join(ROOT, d) for d in SOURCE_DIRS] + [_aibrix_root()]
    found = []
    for top in roots:
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            found += [os.path.join(folder, name) for name in files if name.endswith(".py")]
    return found


@functools.cache
def _index() -> tuple[frozenset[str], dict[str, set[str]], dict[str, set[str]]]:
    """Every function, class, attribute and variable name defined in our code
    and in aibrix_kvcache; per class name, its members; per class name, its bases."""
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in _source_files():
        with open(path, encoding="utf-8") as f:
            try:
                tree = ast.parse(f.read())
            except SyntaxError:
                continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            if isinstance(node, ast.ClassDef):
                own = members.setdefault(node.name, set())
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                )
                for inner in ast.walk(node):
                    if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and inner is not node:
                        own.add(inner.name)
                    elif isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                        own.add(inner.attr)  # self.x = ...
                    elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                        own.add(inner.id)  # class-level fields
    return frozenset(names), members, bases


def _defined_names() -> frozenset[str]:
    return _index()[0]


def _class_has(cls: str, attr: str, seen: frozenset[str] = frozenset()) -> bool:
    _, members, bases = _index()
    if attr in members.get(cls, ()):
        return True
    return any(_class_has(base, attr, seen | {cls}) for base in bases.get(cls, ()) if base not in seen)


@functools.cache
def _test_names() -> frozenset[str]:
    return frozenset(n for n in _defined_names() if n.startswith("test_"))


_CODE = re.compile(r"`([^`\n]+)`")
# `Class.attr`, `Class.attr()`, `function()`, `module.path.name()`.
_DOTTED = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(\(.*\))?$")


def cited_names(page: str) -> list[str]:
    """Names of code in code spans: `Class.attr`, `snake_function()`,
    `aibrix_eic.path.name`."""
    names = []
    for span in _CODE.findall(_without_urls(_read(page))):
        span = span.strip()
        if _PATH.fullmatch(span):
            continue  # a file name, checked as a path
        match = _DOTTED.match(span)
        if match is None:
            continue
        dotted, call = match.groups()
        parts = dotted.split(".")
        if parts[0] == "aibrix_eic" or (parts[0][:1].isupper() and len(parts) == 2) or (call and len(parts) == 1):
            names.append(dotted)
    return names


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] == "aibrix_eic":
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            try:
                target = importlib.import_module(module)
            except ModuleNotFoundError as e:
                # a module of ours whose dependency this venv lacks (aibrix_eic.pd needs vLLM): read its source
                try:
                    spec = importlib.util.find_spec(module) if not (e.name or "").startswith("aibrix_eic") else None
                except ModuleNotFoundError:  # `module` is a name inside that module, whose import fails
                    spec = None
                if spec is not None and spec.origin:
                    return _defined_in(spec.origin, parts[cut:])
                continue
            except ImportError:
                continue
            for attr in parts[cut:]:
                if not hasattr(target, attr):
                    return False
                target = getattr(target, attr)
            return True
        return False
    if parts[0] in EXTERNAL:
        return True
    if len(parts) == 1:
        return hasattr(builtins, parts[0]) or parts[0] in _defined_names()
    if parts[0][:1].isupper() and len(parts) == 2:
        _, members, _ = _index()
        return parts[0] in members and _class_has(parts[0], parts[1])
    return all(part in _defined_names() for part in parts)


def _defined_in(path: str, attrs: list[str]) -> bool:
    """Whether a module file defines attrs[0] at its top level (and each
    later attr as a member of that class)."""
    if not attrs:
        return True
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    top = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    top |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    return attrs[0] in top and all(_class_has(attrs[0], attr) for attr in attrs[1:2])


@pytest.mark.parametrize("page", DOCS)
def test_every_cited_function_and_class_exists(page):
    missing = sorted({name for name in cited_names(page) if not _resolves(name)})
    assert not missing, f"{page} names code that does not exist: {missing}"


_TEST_NAME = re.compile(r"(?<![\w/])(test_\w+)(\.\.\.)?(?![\w.]*\.py)")


@pytest.mark.parametrize("page", DOCS)
def test_every_cited_test_exists(page):
    text = _without_urls(_read(page))
    missing = []
    for name, ellipsis in _TEST_NAME.findall(text):
        if name in EXTERNAL:
            continue
        # `test_close_flushes...` names the tests that start so
        found = any(t.startswith(name) for t in _test_names()) if ellipsis else name in _test_names()
        if not found:
            missing.append(name + ellipsis)
    assert not missing, f"{page} names tests that do not exist: {sorted(set(missing))}"


# ------------------------------------------------------------------ links


_slug = slug


def anchors(path: str) -> set[str]:
    return anchors_of(_read(path))


_LINK = re.compile(r"\]\(([^)\s]+?\.md)?(#[^)\s]+)?\)")


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_link_to_a_page_and_heading_resolves(page):
    broken = []
    for target, anchor in _LINK.findall(_read(page)):
        if not target and not anchor:
            continue
        if target.startswith("http"):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
        if not os.path.isfile(os.path.join(ROOT, path)) or (anchor and anchor[1:] not in anchors(path)):
            broken.append(f"{target}{anchor}")
    assert not broken, f"{page} links to what does not exist: {broken}"


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Each check fails on a citation that is stale, so a passing run means something."""
    assert not resolve_path("writes/no_such_module.py", "docs/x.md")
    assert resolve_path("writes/flusher.py", "docs/x.md")
    assert _line_count(resolve_path("connector.py", "docs/x.md")[0]) < 100_000
    assert not _resolves("EICConnector.no_such_method")
    assert _resolves("EICConnector.health")
    assert not _resolves("aibrix_eic.no_such_function")
    assert _resolves("aibrix_eic.install")
    assert "test_no_such_test" not in _test_names()
    assert "test_the_checks_catch_what_they_are_for" in _test_names()
    assert _slug("The engine's shared mode") == "the-engines-shared-mode"
    assert _slug("`aibrix-eic bench [options]`") == "aibrix-eic-bench-options"
    assert sys.modules["aibrix_eic"] is not None


# ------------------------------------------- messages point to installed pages


def _message_strings(path: str) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings."""
    tree = ast.parse(_read(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def _package_files() -> list[str]:
    return [f for f in _code_files() if f.startswith("aibrix_eic")]


def test_no_message_sends_a_user_to_a_docs_file():
    """A message names a page through docs_url (its path where this install
    keeps the docs), not as docs/PAGE.md of a source tree the user may not have."""
    offending = [
        f"{path}:{line}: {text[:80]!r}"
        for path in _package_files()
        for line, text in _message_strings(path)
        if re.search(r"docs/[\w-]+\.md", text)
    ]
    assert not offending, offending


def test_every_docs_url_names_a_page_and_a_heading_that_exist():
    named = []
    for path in _package_files():
        for node in ast.walk(ast.parse(_read(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "docs_url":
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                assert len(args) == len(node.args), f"{path}:{node.lineno}: docs_url takes literal page and heading"
                named.append((path, node.lineno, *args))
    assert len(named) >= 5, "the messages that point to the documentation were found"
    for path, line, page, *heading in named:
        assert os.path.isfile(os.path.join(ROOT, "docs", page)), f"{path}:{line}: no docs/{page}"
        if heading:
            assert heading[0] in anchors(os.path.join("docs", page)), (
                f"{path}:{line}: no heading #{heading[0]} in {page}"
            )


def test_a_docs_reference_is_a_page_on_this_host_never_a_placeholder():
    """docs_url names the installed page (the wheel's aibrix_eic/docs, or a
    checkout's docs/), whose anchor exists; the wheel carries docs/, and
    the package's metadata names no documentation site that does not exist."""
    import tomllib

    from aibrix_eic.util.docs import docs_url

    reference = docs_url("config.md", "model-identity")
    page, _, anchor = reference.partition("#")
    assert os.path.isabs(page) and os.path.isfile(page), reference
    assert anchor in anchors(os.path.relpath(page, ROOT)), reference
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]["docs"] == "aibrix_eic/docs"
    assert "Documentation" not in project["project"]["urls"]
    placeholders = [
        path
        for path in [*_code_files(), "pyproject.toml", "README.md"]
        if "github.com/aibrix-eic/aibrix-eic" in _read(path)
    ]
    assert not placeholders, f"placeholder URL in {placeholders}"
