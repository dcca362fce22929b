"""pandas views of results that have no class of their own (pandas is optional: pip install 'dpagg[pandas]')."""

from __future__ import annotations

from typing import Any

from he_partition.core.frames import pandas_module
from he_partition.core.summary import Summary

__all__ = ["join_table_frame"]


def join_table_frame(summary: Summary, *, standard_errors: bool = False) -> Any:
    """A join release's table as a DataFrame, rows x columns (the two owners' bins): each cell's estimate,
    or with `standard_errors=True` the standard error of its noise (which, as in `cell_table`, does not
    cover the even spreading of a partition's sum over its cells). Post-processing: spends no budget."""
    from he_partition.join.release import cell_table

    est, se = cell_table(summary)
    frame = pandas_module().DataFrame(se if standard_errors else est)
    frame.index.name, frame.columns.name = "row", "column"
    return frame
