"""Where the computation server's chunk work runs: one executor interface, three implementations.

The chunk work is the owners' aggregate (a sum per chunk, kept by the workers for the whole
release) and, per measurement, the computation side's noise + flood + serialize of each
chunk. `InProcessExecutor` runs it in the calling process (tests, one-core hosts),
`ProcessExecutor` in local worker processes (one per core: the servers' default) and
`RayExecutor` on a Ray cluster (`pip install 'dpagg[ray]'`; Ray is imported only when that
executor is built). Every noise draw and pad is made by the caller before fan-out and
travels as plain integers; workers add only encryption and flooding randomness, so every
executor releases the same values under a seed, and a task retried after a worker died
re-sends the same values.

May import `he_partition.core` and `he_partition.he`; nothing above them. The names below load at first
use (`he_partition.core.lazy`): the worker processes' helpers (`spawning`) import without the executors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import exports

if TYPE_CHECKING:
    from .base import ChunkBytes, ChunkExecutor, ChunkFiles, ChunkSource, ChunkWorker, SimulatedOwners
    from .factory import make_executor
    from .inprocess import InProcessExecutor
    from .processes import ProcessExecutor

__all__ = ["ChunkBytes", "ChunkExecutor", "ChunkFiles", "ChunkSource", "ChunkWorker", "InProcessExecutor",
           "ProcessExecutor", "SimulatedOwners", "make_executor"]

__getattr__, __dir__ = exports(__name__, {
    ".base": ["ChunkBytes", "ChunkExecutor", "ChunkFiles", "ChunkSource", "ChunkWorker", "SimulatedOwners"],
    ".factory": ["make_executor"], ".inprocess": ["InProcessExecutor"], ".processes": ["ProcessExecutor"]})
