"""The architecture's import arrows, checked on the source: a broken arrow fails here, not in review."""

from __future__ import annotations

import ast
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
                   "parties.decryption.server", "parties.decryption.servicer", "he_partition.he.keyholder",
                   "parties.decryption.keyshare.holder", "parties.decryption.keyshare.service",
                   "parties.decryption.keyshare.servicer"}
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
    return [p for p in sorted((ROOT / "he_partition").rglob("*.py")) if _layer(p) != "__init__"]


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


#: Module names that moved into a package: each module has one name, its home in the package.
GONE = ("he_partition.measurements", "he_partition.bfv", "he_partition.join_release",
        "he_partition.he.threshold_c1", "he_partition.he.threshold_setup", "parties.decryption.keyshare_client",
        "parties.decryption.keyshare_uploads", "parties.computation.c1_forward", "parties.methods_cli")


@pytest.mark.parametrize("name", GONE)
def test_a_moved_module_has_no_second_name(name: str) -> None:
    """Checked on the source tree (an editable install elsewhere could still serve an old file)."""
    path = ROOT.joinpath(*name.split("."))
    assert not path.with_suffix(".py").exists() and not (path / "__init__.py").exists(), name


def test_importing_the_core_installs_no_import_hook() -> None:
    code = "import sys; before = list(sys.meta_path); import he_partition; print(sys.meta_path == before)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "True"


def test_importing_the_core_does_not_load_tenseal() -> None:
    code = "import sys, he_partition, he_partition.core.measurements, he_partition.protocol; print('tenseal' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


#: The threshold mode's packages: each says what it holds, what it may import and its privacy promise.
THRESHOLD_PACKAGES = ("he_partition/he/threshold", "parties/decryption/keyshare", "parties/computation/threshold")


def test_every_package_says_what_it_holds_and_may_import() -> None:
    inits = [*sorted((ROOT / "he_partition").glob("*/**/__init__.py")), *(ROOT / p / "__init__.py" for p in THRESHOLD_PACKAGES)]
    for init in inits:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)}: docstring must say what it may import"
    for package in THRESHOLD_PACKAGES:
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
        assert "privacy promise" in doc.lower(), f"{package}: docstring must say which privacy promise it keeps"


#: No module over ~500 lines without a reason stated at its top (docs/architecture.md, "Habits").
MODULE_LINES = 550


@pytest.mark.parametrize("path", [*_he_modules(), *_party_modules()], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_states_why_at_its_top(path: Path) -> None:
    lines = path.read_text().count("\n")
    if lines <= MODULE_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "Size:" in doc, f"{path.relative_to(ROOT)} has {lines} lines: split it, or say why at its top ('Size: ...')"


def test_the_executor_interface_imports_none_of_its_implementations() -> None:
    """`execution/base.py` is the interface; `execution/factory.py` builds an implementation by name."""
    implementations = {f"he_partition.execution.{m}" for m in ("inprocess", "processes", "ray_cluster", "factory")}
    names = _imports(ROOT / "he_partition" / "execution" / "base.py")
    bad = [n for n in names if any(n == m or n.startswith(m + ".") for m in implementations)]
    assert not bad, f"he_partition/execution/base.py imports {bad}"
