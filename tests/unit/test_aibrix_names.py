"""Every aibrix-kvcache name our workarounds and pd/ rely on
(aibrix_compat/registry.py's RELIANCES) exists in the installed
aibrix-kvcache with the shape they use, read from its source; a name used
in those modules but not declared fails here too. A new AIBrix that drops
or reshapes one fails this test, naming it, instead of misbehaving quietly;
the simulations below remove names from a copy of AIBrix's source."""

import ast
import re
from pathlib import Path

import pytest

import aibrix_eic
from aibrix_eic.aibrix_compat import registry, surface

PACKAGE = Path(aibrix_eic.__file__).parent
# The modules that reach into AIBrix: the workarounds, the backend lookup, the token parser and pd/.
USERS = ("aibrix_compat/timeouts.py", "aibrix_compat/ingestion.py", "aibrix_compat/flush.py")
USERS += ("aibrix_compat/backends.py", "aibrix_compat/tokens.py", "pd/connector.py")
NEEDS = sorted({need for needs in registry.RELIANCES.values() for need in needs}, key=str)


def problems(root: Path | None = None) -> list[str]:
    """'who relies on what, and what AIBrix has instead', one per problem."""
    return [
        f"{who} relies on {problem}"
        for who, needs in registry.RELIANCES.items()
        for problem in surface.missing(needs, root)
    ]


def test_every_aibrix_name_we_rely_on_is_in_the_installed_aibrix_kvcache():
    assert registry.aibrix_version() == registry.TESTED
    found = problems()
    assert not found, "aibrix-kvcache changed under us:\n" + "\n".join(found)


def test_the_private_names_are_declared_for_the_workarounds_and_pd():
    private = {need.name for need in NEEDS if need.name.rpartition(".")[2].startswith("_")}
    assert len(private) >= 13, sorted(private)
    assert set(registry.RELIANCES) == {w.name for w in registry.WORKAROUNDS} | {
        "aibrix_compat/tokens.py",
        "pd/connector.py",
    }
    assert all(registry.RELIANCES.values())


def private_names_used(path: Path) -> set[str]:
    """Private attributes read in a module of ours (`x._name`, and
    getattr/hasattr with "_name") that the module does not define itself."""
    tree = ast.parse(path.read_text())
    used, own = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            (own if isinstance(node.ctx, ast.Store) else used).add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("_"):
                used.add(name.value)
    return {name for name in used - own if not name.startswith(("_aibrix_eic", "__"))}


@pytest.mark.parametrize("user", USERS)
def test_every_private_aibrix_name_a_module_reads_is_declared(user):
    declared = {need.name.rpartition(".")[2] for need in NEEDS}
    undeclared = private_names_used(PACKAGE / user) - declared
    assert not undeclared, f"{user} reads AIBrix's {sorted(undeclared)}: declare them in aibrix_compat/registry.py"


def aibrix_copy(tmp_path: Path, module: str, edit) -> Path:
    """A root holding `module`'s installed source after `edit(text)`."""
    root = surface.aibrix_root()
    assert root is not None
    relative = Path(*module.split(".")[1:]).with_suffix(".py")
    target = tmp_path / "aibrix_kvcache" / relative
    target.parent.mkdir(parents=True)
    target.write_text(edit((root / relative).read_text()))
    return tmp_path / "aibrix_kvcache"


@pytest.mark.parametrize("need", NEEDS, ids=str)
def test_a_removed_name_fails_naming_it_and_who_relies_on_it(tmp_path, monkeypatch, need):
    gone = need.name.rpartition(".")[2]
    fake = aibrix_copy(tmp_path, need.module, lambda text: re.sub(rf"\b{re.escape(gone)}\b", gone + "_renamed", text))
    monkeypatch.setattr(surface, "aibrix_root", lambda: fake)
    found = problems()
    assert any(f"relies on {need}: " in line for line in found), found
    who = [who for who, needs in registry.RELIANCES.items() if need in needs]
    assert any(line.startswith(who[0]) and need.module in line for line in found)


def test_a_changed_signature_says_what_the_parameters_are_now(tmp_path, monkeypatch):
    need = next(n for n in registry.PD_NEEDS if n.name.endswith("._recv_kv_from_cache_impl"))
    fake = aibrix_copy(tmp_path, need.module, lambda text: text.replace("seq_request_meta", "meta"))
    monkeypatch.setattr(surface, "aibrix_root", lambda: fake)
    assert f"pd/connector.py relies on {need}: its parameters are (self, meta)" in problems()


def test_a_changed_base_class_says_what_the_bases_are_now(tmp_path, monkeypatch):
    need = registry.PD_NEEDS[0]
    assert need.bases == ("KVConnectorBase_V1",)
    fake = aibrix_copy(
        tmp_path,
        need.module,
        lambda text: text.replace(
            "class AIBrixPDReuseConnector(KVConnectorBase_V1)", "class AIBrixPDReuseConnector(Base)"
        ),
    )
    monkeypatch.setattr(surface, "aibrix_root", lambda: fake)
    assert f"pd/connector.py relies on {need}: its bases are (Base)" in problems()


def test_an_untested_aibrix_missing_a_name_skips_the_workaround_and_says_which(tmp_path, monkeypatch):
    fake = aibrix_copy(
        tmp_path, "aibrix_kvcache.cache_manager", lambda text: text.replace("def flush(", "def flush_all(")
    )
    monkeypatch.setattr(surface, "aibrix_root", lambda: fake)
    state = registry.decide(registry.FLUSH, environ={}, version="0.8.1")
    assert not state.on and state.warn
    assert "aibrix_kvcache.cache_manager.BaseKVCacheManager.flush(self, ...)" in state.why and "skipped" in state.why
