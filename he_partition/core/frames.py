"""pandas and matplotlib views of a released summary and of range answers (both optional, imported on first use).

Post-processing only: a frame or a plot is a deterministic function of released numbers; it adds
no noise and spends no budget. `summary` is a `he_partition.core.summary.Summary` and answers are
its `RangeCount`s (typed loosely: `summary` imports this module, not the other way round). A
`domain` (anything with the study's bin `edges`, its `column`, `describe_range(lo, hi)` and
`categories`, e.g. `dpagg.DomainSpec`) labels bins with the values they hold; without one, bins
are labelled by index.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

import numpy as np

__all__ = ["BinDomain", "pandas_module", "summary_frame", "range_frame", "plot_summary"]


class BinDomain(Protocol):
    """What labelling needs of a study's domain (`parties.data_owner.domain.DomainSpec` has it)."""

    column: str
    edges: tuple[float, ...]
    categories: tuple[str, ...] | None

    def describe_range(self, lo: int, hi: int) -> str: ...


def pandas_module() -> Any:
    """pandas, or an ImportError that says how to install it."""
    try:
        import pandas
    except ImportError:
        raise ImportError("to_pandas() needs pandas, which dpagg does not install: pip install 'dpagg[pandas]' "
                          "(or pip install pandas)") from None
    return pandas


def _labels(lo: Sequence[int], hi: Sequence[int], domain: BinDomain | None, n: int) -> dict[str, list[Any]]:
    """value_lo, value_hi (numeric domains) and label columns for bin ranges [lo, hi)."""
    if domain is None:
        return {}
    if len(domain.edges) - 1 != n:
        from .errors import InvalidInputError

        raise InvalidInputError(f"the domain has {len(domain.edges) - 1} bins but the release has {n}: "
                                "label it with the study's own domain")
    cols: dict[str, list[Any]] = {}
    if domain.categories is None:
        cols["value_lo"] = [float(domain.edges[a]) for a in lo]
        cols["value_hi"] = [float(domain.edges[b]) for b in hi]
    cols["label"] = [domain.describe_range(int(a), int(b)) for a, b in zip(lo, hi)]
    return cols


def summary_frame(summary: Any, domain: BinDomain | None = None, confidence: float | None = None) -> Any:
    """The released partitions: start, stop (bins [start, stop)), with `domain` value_lo, value_hi and label,
    the noisy sum and the standard error of its noise; with `confidence` also estimate (the partition's count
    as the summary answers it: the sum itself, or a least-squares tree's estimate), ci_lo, ci_hi, confidence
    and interval_method (see `Summary.interval`)."""
    # The summary's columns (`columns.Column`): read-only arrays, views of the Arrow data it was read from, if it was.
    starts = np.asarray(summary.starts, dtype=np.int64)
    sums = np.asarray(summary.sums, dtype=np.int64)
    variance = np.asarray(summary.sum_variance, dtype=np.float64)
    stops = starts + summary.lengths
    data: dict[str, Any] = {"start": starts, "stop": stops}
    if domain is not None:
        data.update(_labels(starts.tolist(), stops.tolist(), domain, summary.domain_size))
    data["sum"] = sums
    data["standard_error"] = np.sqrt(variance)
    if confidence is not None:
        answers = summary.range_counts(np.stack([starts, stops], axis=1), confidence=confidence)
        data.update(estimate=[a.value for a in answers], ci_lo=[a.ci_lo for a in answers],
                    ci_hi=[a.ci_hi for a in answers], confidence=[a.confidence for a in answers],
                    interval_method=[a.interval_method for a in answers])
    return pandas_module().DataFrame(data, copy=False)


def range_frame(answers: Iterable[Any], domain: BinDomain | None = None, n_bins: int | None = None) -> Any:
    """Range answers, one row each: lo, hi, with `domain` value_lo, value_hi and label, value, standard_error,
    and ci_lo, ci_hi, confidence, interval_method when the answers carry intervals."""
    rows = list(answers)
    data: dict[str, Any] = {"lo": [c.lo for c in rows], "hi": [c.hi for c in rows]}
    if domain is not None:
        data.update(_labels(data["lo"], data["hi"], domain, len(domain.edges) - 1 if n_bins is None else n_bins))
    data.update(value=[c.value for c in rows], standard_error=[c.standard_error for c in rows])
    if any(c.confidence is not None for c in rows):
        for col in ("ci_lo", "ci_hi", "confidence", "interval_method"):
            data[col] = [getattr(c, col) for c in rows]
    return pandas_module().DataFrame(data, columns=list(data))


def plot_summary(summary: Any, ax: Any = None, *, domain: BinDomain | None = None,
                 confidence: float | None = None) -> Any:
    """Bars of the released estimate per bin: one bar per released partition (spread evenly over its bins, as
    the summary estimates it), or one per bin where every bin is estimated (wavelet releases); with
    `confidence`, error bars of each partition's interval per bin. The x axis is in the domain's values
    when `domain` is given (categories as tick labels), else bin indices. Returns the matplotlib axes
    (matplotlib is optional: pip install matplotlib)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot() needs matplotlib, which dpagg does not install: pip install matplotlib") from None
    if ax is None:
        _, ax = plt.subplots()
    per_bin = summary.estimator in ("haar", "haar_nonnegative")
    n = summary.domain_size
    lo = np.arange(n, dtype=np.int64) if per_bin else np.asarray(summary.starts, dtype=np.int64)
    hi = lo + 1 if per_bin else lo + summary.lengths
    prefix = np.concatenate([[0.0], np.cumsum(summary.estimate())])
    widths_bins = (hi - lo).astype(np.float64)
    heights = (prefix[hi] - prefix[lo]) / widths_bins
    if domain is not None and domain.categories is None:
        edges = np.asarray(domain.edges, dtype=np.float64)
        x, widths = edges[lo], edges[hi] - edges[lo]
        ax.set_xlabel(domain.column)
    else:
        x, widths = lo.astype(np.float64), widths_bins
        ax.set_xlabel(domain.column if domain is not None else "bin")
    err = None
    if confidence is not None:
        answers = summary.range_counts(np.stack([lo, hi], axis=1), confidence=confidence)
        err = np.array([((a.ci_hi or 0.0) - (a.ci_lo or 0.0)) / 2.0 for a in answers]) / widths_bins
    ax.bar(x, heights, width=widths, align="edge", yerr=err, edgecolor="black", linewidth=0.3,
           error_kw={"elinewidth": 0.8})
    if domain is not None and domain.categories is not None and n <= 40:
        ax.set_xticks(x + 0.5 * widths, list(domain.categories), rotation=90)
    ax.set_ylabel("estimated count per bin")
    ax.set_title(f"{summary.strategy} release, epsilon {summary.epsilon:g}")
    return ax
