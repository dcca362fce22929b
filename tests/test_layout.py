"""The architecture's import arrows, checked on the source: a broken arrow fails here, not in review."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: he_partition's layers: what each package may import from he_partition (besides itself).
ALLOWED = {
    "core": set(),
    "he": {"core"},
    "strategies": {"core"},
    "execution": {"core", "he"},
    "protocol": {"core", "strategies", "he", "execution"},  # release(backend="bfv") builds the in-process keys
    "join": {"core", "he", "strategies", "protocol", "execution"},  # the cell totals run on the chunk executor
    "methods": {"core", "strategies", "protocol"},
}
#: Top-level distributions the pure core never imports: parties, the network, storage.
FORBIDDEN_IN_CORE = {"parties", "dpagg", "grpc", "sqlite3", "socket", "requests", "urllib"}
#: Decryption-side modules: only the decryption server and the launchers that start it import them.
DECRYPTION_SIDE = {"parties.decryption.handler", "parties.decryption.ledger", "parties.decryption.keys",
                   "parties.decryption.server", "parties.decryption.servicer", "he_partition.he.keyholder"}
LAUNCHERS = ("parties/cli", "parties/demo.py", "parties/decryption/")


def _imports(path: Path) -> list[str]:
    """Absolute names of every module `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{a.name}" for a in node.names]
    return names


def _layer(path: Path) -> str:
    rel = path.relative_to(ROOT / "he_partition").parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _he_modules() -> list[Path]:
    return [p for p in sorted((ROOT / "he_partition").rglob("*.py")) if _layer(p) not in {"__init__", "_aliases"}]


@pytest.mark.parametrize("path", _he_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_he_partition_layers_import_only_downwards(path: Path) -> None:
    layer = _layer(path)
    bad = []
    for name in _imports(path):
        top = name.split(".")[0]
        if top in FORBIDDEN_IN_CORE:
            bad.append(name)
        if top == "tenseal" and layer != "he":
            bad.append(name)
        if name.startswith("he_partition."):
            target = name.split(".")[1]
            if target in ALLOWED and target != layer and target not in ALLOWED[layer]:
                bad.append(name)
    assert not bad, f"{path.relative_to(ROOT)} ({layer}) imports {sorted(set(bad))}"


def _party_modules() -> list[Path]:
    return sorted((ROOT / "parties").rglob("*.py"))


@pytest.mark.parametrize("path", _party_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_decryption_server_imports_decryption_side_code(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    if rel.startswith(LAUNCHERS):
        return
    bad = [n for n in _imports(path) if any(n == m or n.startswith(m + ".") for m in DECRYPTION_SIDE)]
    assert not bad, f"{rel} imports decryption-side code {bad}"


def test_the_boundary_check_sees_a_broken_arrow(tmp_path: Path) -> None:
    """The checker itself: a core module importing a party is caught."""
    fake = ROOT / "he_partition" / "core" / "_layout_probe.py"
    fake.write_text("from parties.common import util\nimport tenseal\n")
    try:
        with pytest.raises(AssertionError, match="imports"):
            test_he_partition_layers_import_only_downwards(fake)
    finally:
        fake.unlink()


def test_only_the_he_package_imports_tenseal() -> None:
    importers = {str(p.relative_to(ROOT)) for p in [*_he_modules(), *_party_modules()]
                 if any(n.split(".")[0] == "tenseal" for n in _imports(p))}
    assert importers and all(p.startswith("he_partition/he/") for p in importers), importers


def test_old_flat_module_names_are_the_new_modules() -> None:
    """External scripts keep importing `he_partition.measurements` and friends: the same module objects."""
    from he_partition import _aliases

    for old, new in _aliases.MOVED.items():
        assert importlib.import_module(f"he_partition.{old}") is importlib.import_module(f"he_partition.{new}"), old
    from he_partition.join import JOIN_STRATEGY, JoinTerms  # the old module's names, from the package
    from he_partition.join.protocol import JOIN_STRATEGY as js, JoinTerms as jt

    assert (JOIN_STRATEGY, JoinTerms) == (js, jt)


def test_importing_the_core_does_not_load_tenseal() -> None:
    code = "import sys, he_partition, he_partition.measurements, he_partition.protocol; print('tenseal' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_every_package_says_what_it_holds_and_may_import() -> None:
    for init in sorted((ROOT / "he_partition").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)}: docstring must say what it may import"


#: "No module over ~500 lines without a reason stated at its top" (issue 28).
MODULE_LINES = 550


@pytest.mark.parametrize("path", [*_he_modules(), *_party_modules()], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_states_why_at_its_top(path: Path) -> None:
    lines = path.read_text().count("\n")
    if lines <= MODULE_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "Size:" in doc, f"{path.relative_to(ROOT)} has {lines} lines: split it, or say why at its top ('Size: ...')"
