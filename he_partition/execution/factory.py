"""Build a chunk executor by name: the one place that knows the implementations.

`base` holds the interface (`ChunkExecutor`) and what every implementation shares, and imports
none of them; this module picks one by name and imports it only when built (Ray only for "ray").
"""

from __future__ import annotations

from ..core.backend import VectorBackend
from ..core.errors import InvalidInputError
from .base import ChunkExecutor

__all__ = ["EXECUTOR_KINDS", "make_executor"]

EXECUTOR_KINDS = ("inprocess", "processes", "ray")


def make_executor(kind: str, *, workers: int = 0, cluster: str = "",
                  backend: VectorBackend | None = None, node_ip: str = "127.0.0.1") -> ChunkExecutor:
    """An executor by name: "inprocess", "processes" (`workers`, 0 = one per core) or "ray" (`cluster` address;
    `node_ip`: the address the driver's Ray processes bind to and advertise)."""
    if kind == "inprocess":
        from .inprocess import InProcessExecutor

        return InProcessExecutor(backend)
    if kind == "processes":
        from .processes import ProcessExecutor

        return ProcessExecutor(workers)
    if kind == "ray":
        from .ray_cluster import RayExecutor

        return RayExecutor(workers, address=cluster, node_ip=node_ip)
    raise InvalidInputError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTOR_KINDS)}")
