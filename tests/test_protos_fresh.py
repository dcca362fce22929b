"""The committed gRPC stubs in parties/wire/v1 must be exactly what scripts/gen_protos.py generates from proto/."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) is needed to regenerate the stubs")
pytest.importorskip("mypy_protobuf", reason="mypy-protobuf (the dev extra) is needed to regenerate the .pyi stubs")

#: Lines that only record which tool versions ran (they differ between versions, not between protos).
_VERSION_LINES = re.compile(
    r"^(# Protobuf Python Version: .*|GRPC_GENERATED_VERSION = .*|    \d+,\s*$|.*isort:skip_file.*)$", re.M)


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    return module


def _installed(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    gen = _load_generator()
    generated = gen.generate(tmp_path)
    names = sorted(p.name for p in generated)
    committed_dir = ROOT / "parties" / "wire" / "v1"
    committed = sorted(p.name for p in committed_dir.iterdir() if p.is_file())
    assert committed == names, "parties/wire/v1 has extra or missing files: run `python scripts/gen_protos.py`"
    installed = {d: _installed(d) for d in gen.TOOL_VERSIONS}
    exact = installed == gen.TOOL_VERSIONS
    stale = []
    for n in names:
        old, new = (committed_dir / n).read_text(), (tmp_path / "parties" / "wire" / "v1" / n).read_text()
        if exact:
            if old != new:
                stale.append(n)
        elif n.endswith(".py") and _VERSION_LINES.sub("", old) != _VERSION_LINES.sub("", new):
            stale.append(n)  # with other tool versions only the version markers may differ
    assert not stale, (f"stale generated stubs {stale}: run `python scripts/gen_protos.py` (tools {installed}; "
                       f"the committed stubs were made with {gen.TOOL_VERSIONS})")


def test_the_stubs_keep_the_proto_package_and_import_their_own_home() -> None:
    """Only the Python home moved: method paths and descriptor names stay `dpagg.v1` (the wire format)."""
    from parties.wire.v1 import analyst_pb2, analyst_pb2_grpc, common_pb2

    assert analyst_pb2.DESCRIPTOR.package == "dpagg.v1" and analyst_pb2.DESCRIPTOR.name == "dpagg/v1/analyst.proto"
    assert common_pb2.Range.DESCRIPTOR.full_name == "dpagg.v1.Range"
    assert common_pb2.Range.__module__ == "parties.wire.v1.common_pb2"
    source = Path(analyst_pb2_grpc.__file__).read_text()
    assert "'/dpagg.v1.Analyst/RangeCounts'" in source and "from dpagg" not in source


def test_every_proto_message_and_field_is_commented() -> None:
    """The .proto files are the contract for other languages: every message, field and rpc has a comment."""
    missing = []
    for proto in sorted((ROOT / "proto" / "dpagg" / "v1").glob("*.proto")):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            is_decl = (s.startswith(("message ", "rpc ", "service ", "enum "))
                       or (s.endswith(";") and "=" in s and not s.startswith(("syntax", "package", "import", "option"))))
            if is_decl and not (i > 0 and lines[i - 1].strip().startswith("//")):
                missing.append(f"{proto.name}:{i + 1}: {s}")
    assert not missing, "uncommented declarations:\n" + "\n".join(missing)
