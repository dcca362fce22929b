"""Cross-organization join: pseudonyms and placement (`protocol`), its DP release (`release`), the evaluator (`parallel`).

May import `he_partition.core`, `he_partition.he`, `he_partition.strategies` and
`he_partition.protocol`. `he_partition.join` was one module before the layout by family; its
public names are still importable from here, loaded from `protocol` at first use (PEP 562), so a
worker process that needs only `he_partition.join.oprf` does not load numpy, SEAL or the protocol.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .protocol import *  # noqa: F401,F403  (the module's public API, kept where it was)
    from .protocol import __all__ as __all__


def __getattr__(name: str) -> Any:
    """`protocol`'s public names (and its __all__, for a star import), imported at first use."""
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    protocol = importlib.import_module(".protocol", __name__)
    if name == "__all__" or name in protocol.__all__:
        return getattr(protocol, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
