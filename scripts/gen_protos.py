#!/usr/bin/env python
"""Regenerate the committed Python gRPC stubs (parties/wire/v1/*_pb2*.py and .pyi) from proto/dpagg/v1/*.proto.

Usage: python scripts/gen_protos.py [--out DIR]

The proto package stays `dpagg.v1` (it is part of the wire format: method paths such as
`/dpagg.v1.Analyst/RangeCounts`, message names, the descriptors' file names). Only the Python
home of the generated modules differs from the proto path: protoc writes dpagg/v1/x_pb2.py with
`from parties.wire.v1 import common_pb2` imports, and this script moves the files to parties/wire/v1/
and rewrites exactly two generated forms, the `from parties.wire.v1 import` lines and the Python
module names ('dpagg.v1.x_pb2') the messages are built under. Service and message names
('dpagg.v1.Analyst', '.dpagg.v1.Range') are left alone. Requires grpcio-tools and mypy-protobuf
(the `dev` extra).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
#: Where the .proto files live under proto/ (and so the proto package's path: never changes).
PROTO_PACKAGE = "dpagg/v1"
#: Where the generated Python modules live in the repository.
PACKAGE = "parties/wire/v1"

#: The tool versions the committed stubs were generated with (the `dev` extra should pin them):
#: other versions write different version markers, and mypy-protobuf formats .pyi differently.
TOOL_VERSIONS = {"grpcio-tools": "1.85.1", "mypy-protobuf": "5.1.0"}

_INIT_V1 = ('"""dpagg.v1 messages and service stubs (parties.wire.v1), generated from proto/dpagg/v1/*.proto;'
            ' do not edit."""\n')

#: The generated text that names the Python module path (not the proto package).
_IMPORT_LINE = re.compile(r"^from dpagg\.v1 import ", re.M)
_MODULE_NAME = re.compile(r"'dpagg\.v1\.(\w+_pb2)'")


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))


def _relocate(text: str) -> str:
    text = _IMPORT_LINE.sub("from parties.wire.v1 import ", text)
    return _MODULE_NAME.sub(r"'parties.wire.v1.\1'", text)


def generate(out: Path) -> list[Path]:
    """Generate the stubs under `out` (which becomes the directory holding `parties/wire/v1/`)."""
    files = proto_files()
    if not files:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PROTO_PACKAGE}")
    plugin = shutil.which("protoc-gen-mypy_grpc") or shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    target = out / PACKAGE
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
            f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", f"--mypy_grpc_out={tmp}",
        ]
        if plugin:
            cmd.append(f"--plugin=protoc-gen-mypy_grpc={plugin}")
        cmd += [str(f.relative_to(PROTO_ROOT)) for f in files]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"protoc failed ({proc.returncode}):\n{proc.stderr}")
        for p in sorted((Path(tmp) / PROTO_PACKAGE).iterdir()):
            if p.is_file():
                (target / p.name).write_text(_relocate(p.read_text()))
    (target / "__init__.py").write_text(_INIT_V1)
    return sorted(p for p in target.iterdir() if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT, help="directory to write parties/wire/v1/ into (default: repo root)")
    args = ap.parse_args(argv)
    for p in generate(args.out):
        print(p.relative_to(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
