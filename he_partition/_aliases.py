"""The flat module names of earlier releases (`he_partition.measurements`, ...) as aliases of their new homes.

External scripts import `he_partition.measurements`, `he_partition.bfv`, `he_partition.join_release`
and so on. Each old name resolves, lazily and only when imported, to the very module object of its
new home (`he_partition.core.measurements`, ...): the same functions, classes and private names,
so patching one patches the other. Nothing is imported ahead of use, so `import he_partition`
still does not load TenSEAL. New code imports the new paths; these names stay supported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Sequence

__all__ = ["MOVED", "install"]

#: old flat module name (under he_partition) -> its module now (under he_partition)
MOVED: dict[str, str] = {
    "errors": "core.errors", "validation": "core.validation", "noise": "core.noise",
    "backend": "core.backend", "measurements": "core.measurements", "estimation": "core.estimation",
    "summary": "core.summary", "accounting": "core.accounting",
    "bfv": "he.bfv", "keyholder": "he.keyholder", "join_he": "he.join_scheme",
    "gap": "strategies.gap", "hier": "strategies.hier", "dawa": "strategies.dawa",
    "privelet": "strategies.privelet", "auto": "strategies.auto", "hilbert": "strategies.hilbert",
    "join_release": "join.release", "join_parallel": "join.parallel",
    "pviews": "methods.pviews", "bayesian": "methods.bayesian", "guidance": "methods.guidance",
    "audit": "methods.audit",
}
# `he_partition.join` was a module and is now the join package, which re-exports that
# module's public names (he_partition.join.protocol), so it needs no alias.


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The import system keeps the target's own __name__/__spec__ (it does not override
        # attributes a module already has), so the alias is the module itself.
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module was executed when it was imported."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package: str) -> None:
        self._prefix = package + "."
        self._package = package

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self._prefix):
            return None
        new = MOVED.get(fullname[len(self._prefix):])
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(f"{self._package}.{new}"))


def install(package: str) -> None:
    """Resolve `package.<old name>` to `package.<new home>` from now on (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(package))
