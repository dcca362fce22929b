#!/usr/bin/env python
"""Regenerate the committed Python gRPC stubs (dpagg/v1/*_pb2*.py and .pyi) from proto/dpagg/v1/*.proto.

Usage: python scripts/gen_protos.py [--out DIR]

The proto path mirrors the Python package path (proto/dpagg/v1/x.proto ->
dpagg/v1/x_pb2.py), so the generated `from dpagg.v1 import common_pb2` imports work
unchanged. Requires grpcio-tools and mypy-protobuf (the `dev` extra).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = "dpagg/v1"

#: The tool versions the committed stubs were generated with (the `dev` extra should pin them):
#: other versions write different version markers, and mypy-protobuf formats .pyi differently.
TOOL_VERSIONS = {"grpcio-tools": "1.85.1", "mypy-protobuf": "5.1.0"}

_INIT_TOP = '"""The dpagg package (here only its generated gRPC/protobuf code, dpagg.v1)."""\n'
_INIT_V1 = '"""dpagg.v1 messages and service stubs, generated from proto/dpagg/v1/*.proto; do not edit."""\n'


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE).glob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Generate the stubs under `out` (which becomes the directory holding `dpagg/`)."""
    files = proto_files()
    if not files:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE}")
    plugin = shutil.which("protoc-gen-mypy_grpc") or shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
        f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", f"--mypy_grpc_out={out}",
    ]
    if plugin:
        cmd.append(f"--plugin=protoc-gen-mypy_grpc={plugin}")
    cmd += [str(f.relative_to(PROTO_ROOT)) for f in files]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"protoc failed ({proc.returncode}):\n{proc.stderr}")
    top = out / "dpagg" / "__init__.py"
    if not top.exists():  # in the repository it is the SDK's front door (hand-written): never overwritten
        top.write_text(_INIT_TOP)
    (out / PACKAGE / "__init__.py").write_text(_INIT_V1)
    return sorted(p for p in (out / PACKAGE).iterdir() if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT, help="directory to write dpagg/ into (default: repo root)")
    args = ap.parse_args(argv)
    for p in generate(args.out):
        print(p.relative_to(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
