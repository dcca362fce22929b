"""Cross-organization join: pseudonyms and placement (`protocol`), its DP release (`release`), the evaluator (`parallel`).

May import `he_partition.core`, `he_partition.he`, `he_partition.strategies` and
`he_partition.protocol`. `he_partition.join` was one module before the layout by family; its
public names are still importable from here.
"""

from .protocol import *  # noqa: F401,F403  (the module's public API, kept where it was)
from .protocol import __all__ as __all__
