"""Old home of the method subcommands; they live in `parties.cli.methods` now (kept so old imports work)."""

from __future__ import annotations

from .cli.methods import add_parser as register
from .cli.methods import load_matrix

__all__ = ["register", "load_matrix"]
