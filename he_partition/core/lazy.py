"""Package attributes imported at first use (PEP 562), so that importing one light submodule does not load a whole
package's heavy modules: a worker process that needs only `he_partition.join.oprf` starts in about a third of the
time (no numpy, no SEAL, no strategies)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Mapping

__all__ = ["exports"]


def exports(package: str, modules: Mapping[str, Iterable[str]]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`, whose submodule m (relative: ".protocol") defines the public names
    modules[m]; a name is imported at first use and then kept in the package's namespace."""
    sources = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(package)
        value = getattr(importlib.import_module(source, package), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *sources})

    return __getattr__, __dir__
