"""SEAL objects to and from bytes: these bindings save and load only through file paths.

Shared by the join scheme and the threshold key shares. Loading goes through an anonymous
in-memory file (`memfd_create`, read back through /proc/self/fd), which no other process can
open by name and costs no directory create/remove per call; a private temporary directory
where memfd is unavailable. Saving goes through a private temporary directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["seal_bytes", "load_seal_bytes"]


def seal_bytes(obj: Any) -> bytes:
    """The bytes SEAL's `save` writes for `obj`."""
    with tempfile.TemporaryDirectory(prefix="dpagg-seal-") as d:
        path = os.path.join(d, "obj")
        obj.save(path)
        return Path(path).read_bytes()


def load_seal_bytes(obj: Any, seal_context: Any, data: bytes) -> Any:
    """`obj.load(seal_context, <data>)`, returning `obj`; SEAL's own RuntimeError / ValueError on bad bytes."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("dpagg-seal", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, data) if len(data) < (1 << 20) else Path(f"/proc/self/fd/{fd}").write_bytes(data)
            obj.load(seal_context, f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return obj
    with tempfile.TemporaryDirectory(prefix="dpagg-seal-") as d:
        path = os.path.join(d, "obj")
        Path(path).write_bytes(data)
        obj.load(seal_context, path)
    return obj
