"""Accuracy preview: the error a study's release will carry for a range of a given length, before any budget is spent.

An operator picks epsilon by the error it buys. For a study's terms (domain size, strategy, epsilon,
contribution bound, noise draws per value) this module runs the strategy's own design (its
measurements, their epsilons and noise variances, its estimator) without any data and without
noise, and asks the resulting summary the standard error and the confidence interval of ranges of
the given length, exactly as a release's summary answers them. Nothing is measured: no noise is
drawn, no budget is spent, and no owner's data is read.

What it assumes: the strategies whose design does not depend on the data ("hier", "privelet", and
"auto", which picks its design from n and epsilon only) are previewed as they run on dense data,
where "auto" and "hier" refine every cell (on sparse data they stop refining cells that look empty,
which makes ranges inside those cells coarser, not noisier). "gap" and "dawa" choose their partition
from the data itself, so their error cannot be known ahead: they are refused with that reason.
The preview is the noise's error only; a range that cuts a released partition also carries the
bias of spreading that partition's count evenly, which no preview (and no interval) covers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..core.errors import InvalidInputError
from ..core.intervals import DEFAULT_CONFIDENCE, check_confidence
from ..core.measurements import Measurement
from ..core.summary import Summary
from ..core.validation import validate_epsilon
from ..protocol import STRATEGIES, make_strategy, run_strategy

__all__ = ["RangeAccuracy", "AccuracyPreview", "accuracy_preview", "design_summary", "PREVIEWABLE", "default_lengths"]

#: Strategies whose error is known before the data: their measurements do not depend on it (on dense data).
PREVIEWABLE = ("auto", "hier", "privelet")

#: Range positions the preview averages over (evenly spaced; every position when there are fewer).
MAX_POSITIONS = 64

#: What each measured value is answered with while the design runs: large enough that no adaptive strategy
#: takes any cell for empty (the dense-data design), small enough to stay an exact float.
_DENSE = 1 << 40


@dataclass(frozen=True)
class RangeAccuracy:
    """The preview for ranges of `length` bins.

    `standard_error`: the root mean square of the noise's error of such a range's answer (over the
    noise, averaged over the range's positions in the domain): the expected error in the
    root-mean-square sense. `interval_halfwidth`: the mean half-width of the confidence interval a
    release reports for such a range at `confidence` (the interval is [value - h, value + h]);
    `interval_method`: how that interval is computed ("exact", "chernoff" or "bound"; the most
    common over the positions). `worst_standard_error`: the largest over the positions.
    `cuts_partition`: the share of positions whose range cuts a released partition (their bias is
    not in the figures). `positions`: how many positions were averaged.
    """

    length: int
    standard_error: float
    interval_halfwidth: float
    interval_method: str
    confidence: float
    worst_standard_error: float
    cuts_partition: float
    positions: int

    @property
    def interval_width(self) -> float:
        """Full width (2 h) of the mean confidence interval."""
        return 2.0 * self.interval_halfwidth

    def as_dict(self) -> dict[str, Any]:
        return {"length": self.length, "standard_error": self.standard_error,
                "interval_halfwidth": self.interval_halfwidth, "interval_width": self.interval_width,
                "interval_method": self.interval_method, "confidence": self.confidence,
                "worst_standard_error": self.worst_standard_error, "cuts_partition": self.cuts_partition,
                "positions": self.positions}


@dataclass(frozen=True)
class AccuracyPreview:
    """A study's accuracy preview: its terms, the design the strategy chose, and one RangeAccuracy per length."""

    domain_size: int
    epsilon: float
    strategy: str
    contribution_bound: int
    noise_draws: float
    design: str
    ranges: tuple[RangeAccuracy, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"domain_size": self.domain_size, "epsilon": self.epsilon, "strategy": self.strategy,
                "contribution_bound": self.contribution_bound, "noise_draws": self.noise_draws,
                "design": self.design, "ranges": [r.as_dict() for r in self.ranges]}

    def lines(self) -> list[str]:
        """The preview in words, one line per range length (what `dpagg accuracy` prints)."""
        out = []
        for r in self.ranges:
            cut = f"; {100 * r.cuts_partition:.0f}% of such ranges cut a partition (bias not included)" \
                if r.cuts_partition else ""
            out.append(f"a range of {r.length} bin{'s' if r.length != 1 else ''}: expected error +-"
                       f"{r.standard_error:.3g} (root mean square), {100 * r.confidence:g}% interval +-"
                       f"{r.interval_halfwidth:.3g} ({r.interval_method}){cut}")
        return out


def _dense_values(m: Measurement) -> np.ndarray:
    return np.full(m.count, _DENSE, dtype=np.int64)


def design_summary(domain_size: int, epsilon: float, *, strategy: str = "auto", noise_parties: int = 2,
                   contribution_bound: int = 1, params: Any = None, noise_draws: float | None = None) -> Summary:
    """The summary a release of these terms has on dense data, with every released value a placeholder: its
    structure, noise variances and estimator are the release's, its values are not (use it for standard
    errors and intervals only). `noise_draws`: the noise variance per value in discrete Laplace draws of its
    scale when it differs from `noise_parties` (a threshold study's 1 + K/(K - T)). Draws no noise, spends
    no budget, reads no data."""
    if strategy not in STRATEGIES:
        raise InvalidInputError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if strategy not in PREVIEWABLE:
        raise InvalidInputError(
            f"strategy {strategy!r} chooses its partition from the data, so its error cannot be known before the "
            f"release; a preview is possible for {', '.join(PREVIEWABLE)}")
    if isinstance(domain_size, bool) or int(domain_size) != domain_size or domain_size < 1:
        raise InvalidInputError(f"domain_size must be an integer >= 1, got {domain_size!r}")
    eps = validate_epsilon(epsilon)
    strat = make_strategy(strategy, int(domain_size), eps, noise_parties=noise_parties,
                          contribution_bound=contribution_bound, params=params)
    summary = run_strategy(strat, _dense_values)
    if noise_draws is not None and not math.isclose(noise_draws, noise_parties):
        if not (math.isfinite(noise_draws) and noise_draws > 0):
            raise InvalidInputError(f"noise_draws must be > 0, got {noise_draws}")
        summary = summary.with_noise_variance_factor(
            noise_draws / noise_parties,
            holder_noise={"holder_variance_factor": float(noise_draws) - noise_parties + 1.0})
    return summary


def default_lengths(domain_size: int) -> list[int]:
    """Range lengths a preview shows when none are asked: one bin, a tenth and half of the domain."""
    return sorted({1, max(1, domain_size // 10), max(1, domain_size // 2)})


def _positions(n: int, length: int) -> np.ndarray:
    count = n - length + 1
    if count <= MAX_POSITIONS:
        return np.arange(count, dtype=np.int64)
    return np.unique(np.linspace(0, count - 1, MAX_POSITIONS).round().astype(np.int64))


def accuracy_preview(domain_size: int, epsilon: float, lengths: Sequence[int] | None = None, *,
                     strategy: str = "auto", confidence: float = DEFAULT_CONFIDENCE, noise_parties: int = 2,
                     contribution_bound: int = 1, params: Any = None,
                     noise_draws: float | None = None) -> AccuracyPreview:
    """The expected error and confidence interval of a range of each of `lengths` bins (default: 1 bin, a
    tenth and half of the domain) in a release of these terms (see the module docstring for what is assumed).

    Post-processing of nothing: no noise is drawn, no budget is spent, no data is read. The figures are those
    the release's own summary reports: `Summary.range_counts` standard errors and `Summary.interval` intervals.
    """
    conf = check_confidence(confidence)
    summary = design_summary(domain_size, epsilon, strategy=strategy, noise_parties=noise_parties,
                             contribution_bound=contribution_bound, params=params, noise_draws=noise_draws)
    n = summary.domain_size
    asked = default_lengths(n) if lengths is None else list(lengths)
    out = []
    for length in asked:
        if isinstance(length, bool) or int(length) != length or not 1 <= int(length) <= n:
            raise InvalidInputError(f"a range length must be a whole number of bins in [1, {n}], got {length!r}")
        length = int(length)
        starts = _positions(n, length)
        ranges = np.stack([starts, starts + length], axis=1)
        counts = summary.range_counts(ranges, confidence=conf)
        se = np.array([c.standard_error for c in counts])
        half = np.array([(c.ci_hi - c.ci_lo) / 2.0 for c in counts if c.ci_hi is not None and c.ci_lo is not None])
        methods = Counter(c.interval_method or "" for c in counts)
        cuts = np.mean([summary.cuts_partition(int(a), int(b)) for a, b in ranges])
        out.append(RangeAccuracy(length=length, standard_error=float(np.sqrt(np.mean(se ** 2))),
                                 interval_halfwidth=float(np.mean(half)), interval_method=methods.most_common(1)[0][0],
                                 confidence=conf, worst_standard_error=float(se.max()), cuts_partition=float(cuts),
                                 positions=int(starts.size)))
    design = str(summary.params.get("design", "tree" if summary.estimator == "tree" else summary.estimator))
    return AccuracyPreview(domain_size=n, epsilon=float(epsilon), strategy=strategy,
                           contribution_bound=int(contribution_bound),
                           noise_draws=float(noise_parties if noise_draws is None else noise_draws),
                           design=design, ranges=tuple(out))
