"""A join release's table for people: row and column labels from each side's binning, the JSON form, the shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from he_partition.core.summary import Summary
from he_partition.join.release import cell_table

from ..common.contract import StudyContract

__all__ = ["axis_labels", "join_shape_line", "join_table_json", "join_table_lines"]


def axis_labels(spec: str, n: int, fallback: str) -> list[str]:
    """One label per bin of a side's domain spec ("age in [17, 22)"), or "<fallback> k" when the spec is missing
    or does not parse to `n` bins."""
    from ..data_owner.domain import DomainSpec

    try:
        domain = DomainSpec.parse(spec) if spec else None
    except Exception:  # noqa: BLE001 - an unreadable spec only costs the labels
        domain = None
    if domain is None or domain.n_bins != n:
        return [f"{fallback} {k}" for k in range(n)]
    return [domain.describe_range(k, k + 1) for k in range(n)]


def _join(summary: Summary) -> dict[str, Any] | None:
    join = summary.params.get("join")
    return join if isinstance(join, dict) else None


def join_table_json(summary: Summary) -> dict[str, Any] | None:
    """The whole table (None for a release that is not a join's): labels, estimates, standard errors, terms."""
    join = _join(summary)
    if join is None:
        return None
    rows, cols = (int(x) for x in join["shape"])
    est, se = cell_table(summary)
    return {"shape": [rows, cols], "row_labels": axis_labels(str(join.get("row_spec", "")), rows, "row"),
            "col_labels": axis_labels(str(join.get("col_spec", "")), cols, "column"),
            "estimate": est.tolist(), "standard_error": se.tolist(),
            "release": join.get("release", "cells"), "order": join.get("order", "row"),
            "padding_epsilon": join.get("padding_epsilon"), "padding_delta": join.get("padding_delta")}


def join_table_lines(summary: Summary) -> list[str]:
    """The table as text: a header line, a column-label line, then one labelled line per row ([] if not a join)."""
    table = join_table_json(summary)
    join = _join(summary)
    if table is None or join is None:
        return []
    rows, cols = table["shape"]
    se = np.asarray(table["standard_error"])
    spread = f"+- {se.min():.1f}" if np.ptp(se) < 0.05 else f"+- {se.min():.1f} to {se.max():.1f}"
    how = ("every cell noised" if table["release"] == "cells" else
           (f"{table['release']} partitions over the {table['order']}-ordered cells, each partition's "
            "sum spread evenly over its cells"))
    lines = [(f"joint table, {rows} rows ({join.get('row_spec') or 'owner 1'}) x {cols} columns "
              f"({join.get('col_spec') or 'owner 2'}): {how}; cells {spread} (noise only)")]
    width = max(7, *(len(c) for c in table["col_labels"]))
    lead = max(len(r) for r in table["row_labels"])
    lines.append(" " * lead + " " + " ".join(f"{c:>{width}}" for c in table["col_labels"]))
    for label, values in zip(table["row_labels"], table["estimate"]):
        lines.append(f"{label:<{lead}} " + " ".join(f"{v:>{width}.0f}" for v in values))
    return lines


def join_shape_line(contract: StudyContract) -> str | None:
    """`status`'s line for a join study: shape, binnings, capacity, release, padding (None for other studies)."""
    if not contract.is_join:
        return None
    t = contract.join_terms()
    return (f"join table {t.rows} x {t.cols}: rows {t.row_spec or 'owner ' + contract.expected_owners[0]}, columns "
            f"{t.col_spec or 'owner ' + contract.expected_owners[1]}; capacity {t.capacity}; release {t.release} "
            f"({t.order} order); padding epsilon {t.padding_epsilon:g}, offset {t.padding_offset}, delta {t.delta:.2g}")
