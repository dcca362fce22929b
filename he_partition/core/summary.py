"""The released DP view: a partition of the domain with noisy sums, range counts with standard errors.

Size: every estimator's answers, standard errors and intervals read the same lazily built indexes
(the least-squares tree, the partition prefix sums), which live on the frozen summary; frames and
plots, which only read answers, are in `frames`, and the interval arithmetic in `intervals`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

from .columns import float_column, int_column
from .errors import InvalidInputError
from .frames import plot_summary, range_frame, summary_frame
from .estimation import (IntervalTree, haar_inverse_prefix, haar_nonnegative_prefix, haar_prefix_adjoint,
                         haar_range_variance, range_weights)
from .intervals import (ConfidenceInterval, bound_halfwidth, check_confidence, chernoff_halfwidth, grouped_terms,
                        weighted_sum_halfwidth)

__all__ = ["Summary", "RangeCount", "RangeCounts", "ReleasedValues", "SUMMARY_FORMAT", "ESTIMATORS"]

SUMMARY_FORMAT = "dpagg.summary.v1"

#: Most cells (tree) or bins (wavelet) whose least-squares answers get the Chernoff bound on their exact weights;
#: above, the bound from the standard error alone (a Chernoff search over every released value would be slow).
MAX_TERMS = 1 << 14

#: How per-bin estimates are derived from the released values.
#: "partition": spread each of `sums` evenly over its partition (the original gap summaries);
#: "tree": least-squares consistent estimate over every released partition-sum measurement
#: (Hay et al.), leaves spread evenly; "haar": inverse Haar transform of released wavelet
#: coefficients (Privelet); "haar_nonnegative": the same with the non-negative refinement.
ESTIMATORS = ("partition", "tree", "haar", "haar_nonnegative")

_RELEASED_KINDS = ("partition_sums", "haar_coefficients")


@dataclass(frozen=True)
class ReleasedValues:
    """One released measurement, as analysts see it: its values and their noise variance.

    `values` are the integers that left the decryption side (true value plus every noise
    party's discrete Laplace draw); `variance` is the total noise variance of each value;
    `starts` are the partition starts of a "partition_sums" measurement (empty for
    "haar_coefficients", whose layout follows from the domain size).
    """

    kind: str
    values: Sequence[int]  # a tuple or a read-only `columns.Column` (made one at construction)
    variance: float
    epsilon: float
    starts: Sequence[int] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", int_column(self.values))  # 8 bytes a value (`columns.Column`)
        object.__setattr__(self, "starts", int_column(self.starts))
        if self.kind not in _RELEASED_KINDS:
            raise InvalidInputError(f"unknown released kind {self.kind!r}; known: {', '.join(_RELEASED_KINDS)}")
        if not (np.isfinite(self.variance) and self.variance >= 0):
            raise InvalidInputError(f"released variance must be finite and >= 0, got {self.variance}")
        if self.kind == "partition_sums" and len(self.starts) != len(self.values):
            raise InvalidInputError(
                f"a partition_sums release needs one value per partition, got {len(self.values)} values for "
                f"{len(self.starts)} starts"
            )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "values": list(self.values), "variance": self.variance,
                             "epsilon": self.epsilon}
        if self.starts:
            d["starts"] = list(self.starts)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReleasedValues":
        return cls(kind=str(d["kind"]), values=tuple(int(v) for v in d["values"]), variance=float(d["variance"]),
                   epsilon=float(d["epsilon"]), starts=tuple(int(v) for v in d.get("starts", ())))


@dataclass(frozen=True)
class RangeCount:
    """An estimated count over [lo, hi) and the standard error of its DP noise.

    When asked for a confidence level (`Summary.range_counts(..., confidence=0.95)`),
    [ci_lo, ci_hi] is an interval that contains the true count in at least `confidence`
    of releases, over the noise; the bias of spreading a count evenly inside a partition
    is not covered (see `he_partition.core.intervals`). Otherwise the three are None.
    """

    lo: int
    hi: int
    value: float
    standard_error: float
    ci_lo: float | None = None
    ci_hi: float | None = None
    confidence: float | None = None
    interval_method: str | None = None

    def interval(self) -> tuple[float, float] | None:
        """(ci_lo, ci_hi), or None when no confidence level was asked for."""
        return None if self.ci_lo is None or self.ci_hi is None else (self.ci_lo, self.ci_hi)

    def as_dict(self) -> dict[str, Any]:
        """lo, hi, value, standard_error, and ci_lo, ci_hi, confidence (and interval_method, how the interval was
        computed: "exact", "chernoff" or "bound") only when an interval was asked for."""
        d: dict[str, Any] = {"lo": self.lo, "hi": self.hi, "value": self.value, "standard_error": self.standard_error}
        if self.confidence is not None:
            d.update(ci_lo=self.ci_lo, ci_hi=self.ci_hi, confidence=self.confidence)
            if self.interval_method is not None:
                d["interval_method"] = self.interval_method
        return d


class RangeCounts(list[RangeCount]):
    """Range answers: a list of RangeCount with `to_pandas()`. `domain` (set by the analyst client when the
    release records its domain) labels the rows with the values each range holds."""

    domain: Any = None

    def to_pandas(self, domain: Any = None) -> Any:
        """A pandas DataFrame, one row per range: lo, hi, with a domain (`domain`, else the one these answers
        carry) value_lo, value_hi and label, then value, standard_error, and ci_lo, ci_hi, confidence,
        interval_method when the answers carry intervals (pandas is optional: pip install 'dpagg[pandas]')."""
        return range_frame(self, domain if domain is not None else self.domain)


#: The last tree built, keyed by the identity of its inputs (see `Summary._tree`).
_LAST_TREE: list[tuple[Any, int, Any, IntervalTree]] = []


@dataclass(frozen=True)
class Summary:
    """A released DP summary (post-processing only: querying it spends no budget).

    `starts[k]` is the first bin of partition k; `sums[k]` its released noisy sum (integer:
    true sum plus every noise party's discrete Laplace draw); `sum_variance[k]` the
    variance of that noise. With the default estimator "partition", per-bin estimates
    spread each sum uniformly over its bins.

    Other strategies also fill `released` (every released measurement, in release order)
    and name an `estimator` (see ESTIMATORS); estimates and standard errors then come from
    all released values. `starts`/`sums`/`sum_variance` still hold a valid partition view
    (one released partition with its own noisy sums, or the noisy total for wavelet
    releases), so readers that know only those fields keep working. For "tree", `starts`
    is also the partition whose least-squares cell estimates are spread evenly over bins.

    Standard errors describe the DP noise only and are exact for the linear estimators:
    ranges that cut through a partition (a leaf) also carry the (unknown, data-dependent)
    error of uniform spreading, and "haar_nonnegative" is a non-linear refinement whose
    reported standard error is that of the linear estimate it refines.
    """

    domain_size: int
    epsilon: float
    strategy: str
    noise_parties: int
    starts: Sequence[int]  # each a tuple or a read-only `columns.Column` (made one at construction)
    sums: Sequence[int]
    sum_variance: Sequence[float]
    contribution_bound: int = 1
    epsilon_spent: tuple[tuple[str, float], ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    estimator: str = "partition"
    released: tuple[ReleasedValues, ...] = ()

    def __post_init__(self) -> None:
        for name, column in (("starts", int_column), ("sums", int_column), ("sum_variance", float_column)):
            object.__setattr__(self, name, column(getattr(self, name)))  # 8 bytes a value (`columns.Column`)
        k = len(self.starts)
        if k == 0 or self.starts[0] != 0:
            raise InvalidInputError("a summary needs partition starts beginning with 0")
        if len(self.sums) != k or len(self.sum_variance) != k:
            raise InvalidInputError(
                f"starts, sums and sum_variance must have equal lengths, got {k}, {len(self.sums)}, "
                f"{len(self.sum_variance)}"
            )
        s = np.asarray(self.starts)
        if np.any(np.diff(s) <= 0) or s[-1] >= self.domain_size:
            raise InvalidInputError("partition starts must be strictly increasing and inside the domain")
        if self.estimator not in ESTIMATORS:
            raise InvalidInputError(f"unknown estimator {self.estimator!r}; known: {', '.join(ESTIMATORS)}")
        if self.estimator == "tree":
            if not self.released or any(r.kind != "partition_sums" for r in self.released):
                raise InvalidInputError("a tree summary needs released partition sums (and only those)")
            # The nesting checked now; the tree itself (and its solve) only when an estimate is first asked for.
            IntervalTree.check(self.domain_size, [(r.starts, r.values, r.variance) for r in self.released],
                               cells=self.starts)
        elif self.estimator in ("haar", "haar_nonnegative"):
            if len(self.released) != 1 or self.released[0].kind != "haar_coefficients":
                raise InvalidInputError("a wavelet summary needs exactly one released haar_coefficients measurement")
            if len(self.released[0].values) != self.domain_size:
                raise InvalidInputError(
                    f"a wavelet release needs {self.domain_size} coefficients, got {len(self.released[0].values)}"
                )

    # -- estimators ----------------------------------------------------------------
    @cached_property
    def _tree(self) -> IntervalTree:
        # `dataclasses.replace` (a strategy renaming its summary) re-runs __post_init__ on the very same
        # released tuples: reuse the tree built for them instead of solving the GLS again.
        for released, n, starts, tree in _LAST_TREE:
            if released is self.released and n == self.domain_size and starts is self.starts:
                return tree
        tree = IntervalTree(self.domain_size, [(r.starts, r.values, r.variance) for r in self.released],
                            cells=self.starts)
        _LAST_TREE[:] = [(self.released, self.domain_size, self.starts, tree)]
        return tree

    @cached_property
    def _bin_estimates(self) -> npt.NDArray[np.float64]:
        if self.estimator == "tree":
            est = self._tree.bin_estimates()
        elif self.estimator in ("haar", "haar_nonnegative"):
            coeffs = np.asarray(self.released[0].values, dtype=np.float64)
            inv = haar_nonnegative_prefix if self.estimator == "haar_nonnegative" else haar_inverse_prefix
            est = np.diff(inv(coeffs), prepend=0.0)
        else:
            lengths = self.lengths
            est = np.repeat(np.asarray(self.sums, dtype=np.float64) / lengths, lengths)
        est.setflags(write=False)
        return est

    @cached_property
    def _estimate_prefix(self) -> npt.NDArray[np.float64]:
        """Prefix sums of the per-bin estimates with a leading 0: a range's value is two lookups."""
        pe = np.concatenate([[0.0], np.cumsum(self._bin_estimates)])
        pe.setflags(write=False)
        return pe

    @cached_property
    def _linear_haar_prefix(self) -> npt.NDArray[np.float64]:
        """Prefix sums (leading 0) of the linear inverse Haar estimate (what "haar_nonnegative" refines)."""
        pp = np.concatenate([[0.0], haar_inverse_prefix(np.asarray(self.released[0].values, dtype=np.float64))])
        pp.setflags(write=False)
        return pp

    def _bin_weight_variance(self, weights: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Noise variance of w . estimate() for each row w (weights over bins)."""
        w = np.atleast_2d(weights)
        if self.estimator == "tree":
            leaves = self._tree.leaf_starts
            lengths = np.diff(np.append(leaves, self.domain_size))
            csum = np.concatenate([np.zeros((w.shape[0], 1)), np.cumsum(w, axis=1)], axis=1)
            leaf_w = (csum[:, np.append(leaves[1:], self.domain_size)] - csum[:, leaves]) / lengths[None, :]
            return self._tree.query_variance(leaf_w)
        if self.estimator in ("haar", "haar_nonnegative"):
            var = self.released[0].variance
            g = w - np.concatenate([w[:, 1:], np.zeros((w.shape[0], 1))], axis=1)  # weights on prefix sums
            return np.array([var * float(np.sum(haar_prefix_adjoint(row) ** 2)) for row in g])
        s = np.asarray(self.starts, dtype=np.int64)
        lengths = self.lengths
        csum = np.concatenate([np.zeros((w.shape[0], 1)), np.cumsum(w, axis=1)], axis=1)
        frac = (csum[:, s + lengths] - csum[:, s]) / lengths[None, :]
        return np.asarray(np.sum(frac**2 * np.asarray(self.sum_variance)[None, :], axis=1), dtype=np.float64)

    # -- derived views -------------------------------------------------------------
    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        s = np.asarray(self.starts, dtype=np.int64)
        return np.diff(np.append(s, self.domain_size))

    @property
    def n_partitions(self) -> int:
        return len(self.starts)

    def estimate(self) -> npt.NDArray[np.float64]:
        """Per-bin estimates (a fresh array): for "partition", each noisy sum spread evenly over its bins."""
        return np.array(self._bin_estimates)

    def range_count(self, lo: int, hi: int, *, confidence: float | None = None) -> RangeCount:
        """Estimated number of records in bins [lo, hi), with the standard error of its noise, and with
        `confidence` (e.g. 0.95) a confidence interval (`interval`)."""
        if not (0 <= lo < hi <= self.domain_size):
            raise InvalidInputError(f"range must satisfy 0 <= lo < hi <= {self.domain_size}, got [{lo}, {hi})")
        if self.estimator != "partition":
            return self.range_counts([(lo, hi)], confidence=confidence)[0]
        if confidence is not None:
            c = self.range_count(lo, hi)
            ci = self.interval(lo, hi, confidence)
            return RangeCount(lo, hi, c.value, c.standard_error, ci.lo, ci.hi, ci.confidence, ci.method)
        s, e, sums, variances, cum_sums, cum_vars = self._partition_index
        first = int(np.searchsorted(s, lo, side="right")) - 1
        last = int(np.searchsorted(s, hi, side="left"))  # partitions first .. last - 1 overlap [lo, hi)
        # The partitions wholly inside [lo, hi) from the prefix sums (O(log partitions) per range, not O(range)):
        # only the first and the last partition can be cut, each contributing its overlapping fraction.
        value = variance = 0.0
        inner_lo, inner_hi = first, last
        for j in {first, last - 1}:
            frac = (min(int(e[j]), hi) - max(int(s[j]), lo)) / (int(e[j]) - int(s[j]))
            if frac < 1.0:
                value += frac * float(sums[j])
                variance += frac * frac * float(variances[j])
                if j == first:
                    inner_lo = first + 1
                if j == last - 1:
                    inner_hi = last - 1
        if inner_hi > inner_lo:
            value += float(cum_sums[inner_hi] - cum_sums[inner_lo])
            variance += float(cum_vars[inner_hi] - cum_vars[inner_lo])
        return RangeCount(lo, hi, value, float(np.sqrt(max(variance, 0.0))))

    @cached_property
    def _partition_index(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64],
                                        npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Starts, ends, sums, variances and their prefix sums, built once per summary (post-processing only)."""
        starts = np.asarray(self.starts, dtype=np.int64)
        ends = starts + np.asarray(self.lengths, dtype=np.int64)
        sums = np.asarray(self.sums, dtype=np.float64)
        variances = np.asarray(self.sum_variance, dtype=np.float64)
        return (starts, ends, sums, variances, np.concatenate([[0.0], np.cumsum(sums)]),
                np.concatenate([[0.0], np.cumsum(variances)]))

    def range_counts(self, ranges: npt.ArrayLike, *, confidence: float | None = None) -> RangeCounts:
        """Many range counts at once; `ranges` is a sequence of (lo, hi) pairs. With `confidence` (e.g. 0.95)
        each answer also carries a confidence interval (see `interval`)."""
        arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        if self.estimator == "partition":
            return RangeCounts(self.range_count(int(a), int(b), confidence=confidence) for a, b in arr)
        bad = (arr[:, 0] < 0) | (arr[:, 0] >= arr[:, 1]) | (arr[:, 1] > self.domain_size)
        if bad.any():
            a, b = arr[int(np.argmax(bad))]
            raise InvalidInputError(f"range must satisfy 0 <= lo < hi <= {self.domain_size}, got [{a}, {b})")
        pe = self._estimate_prefix
        values = pe[arr[:, 1]] - pe[arr[:, 0]]
        # O(depths) / O(log n) per range, vectorised: no row over every leaf or bin is formed.
        if self.estimator == "tree":
            var = self._tree.range_variance(arr[:, 0], arr[:, 1])
        else:
            var = haar_range_variance(self.domain_size, arr[:, 0], arr[:, 1], self.released[0].variance)
        counts = RangeCounts(RangeCount(int(a), int(b), float(v), float(np.sqrt(max(s2, 0.0))))
                             for (a, b), v, s2 in zip(arr, values, var))
        if confidence is None:
            return counts
        cis = [self._partition_interval(c, confidence) if self._one_partition_level else
               self._bound_interval(c, confidence) for c in counts]
        return RangeCounts(RangeCount(c.lo, c.hi, c.value, c.standard_error, ci.lo, ci.hi, ci.confidence, ci.method)
                           for c, ci in zip(counts, cis))

    # -- confidence intervals (post-processing: no noise, no budget) ----------------
    @property
    def draws_per_value(self) -> float:
        """How many discrete Laplace draws' worth of noise each released value carries: `noise_parties`, or
        with a threshold study's holder noise (params "holder_noise") one server draw plus the key holders'
        K/(K - T). Assuming fewer draws for the same variance only widens an interval."""
        holder = self.params.get("holder_noise")
        if isinstance(holder, dict) and "holder_variance_factor" in holder:
            return float(self.noise_parties) - 1.0 + float(holder["holder_variance_factor"])
        return float(max(self.noise_parties, 1))

    def interval(self, lo: int, hi: int, confidence: float = 0.95) -> ConfidenceInterval:
        """A confidence interval for the count in bins [lo, hi): in at least `confidence` of releases it
        contains the true count, over the noise; the bias of spreading a count evenly inside a partition
        (ranges that cut one, see `cuts_partition`) is not covered.

        Computed from the noise actually added (he_partition.core.intervals): exact for one released
        value, a sum of whole partitions, or one that also cuts partitions (the noise's distribution,
        computed), the Chernoff bound on the exact discrete Laplace MGF where that does not fit,
        and a bound from the standard error and the smallest released variance for the
        least-squares (tree, wavelet) estimators. Post-processing: adds no noise, spends no budget.
        """
        confidence = check_confidence(confidence)
        if self.estimator != "partition" and not self._one_partition_level:
            return self._bound_interval(self.range_counts([(lo, hi)])[0], confidence)
        return self._partition_interval(self.range_count(lo, hi), confidence)

    @cached_property
    def _one_partition_level(self) -> bool:
        """A "tree" of one released partition (`auto`'s one count per bin) estimates each cell by its released
        value, as the "partition" estimator does: it gets the partition's intervals (exact for whole ones)."""
        return (self.estimator == "tree" and len(self.released) == 1
                and self.released[0].starts == tuple(self.starts))

    def _partition_interval(self, c: RangeCount, confidence: float) -> ConfidenceInterval:
        """The interval of `c` (an answer of the "partition" estimator, or of a one-level tree) from the
        released partition sums' noise: exact where the distribution fits, else the Chernoff bound."""
        lo, hi = c.lo, c.hi
        s, e, _, variances, _, _ = self._partition_index
        first = int(np.searchsorted(s, lo, side="right")) - 1
        last = int(np.searchsorted(s, hi, side="left"))
        lengths = (e[first:last] - s[first:last]).astype(np.float64)
        overlap = (np.minimum(e[first:last], hi) - np.maximum(s[first:last], lo)).astype(np.float64)
        weights = overlap / lengths
        half, method = weighted_sum_halfwidth(weights, variances[first:last], confidence, self.draws_per_value)
        return ConfidenceInterval(c.value - half, c.value + half, confidence, method)

    def _bound_interval(self, c: RangeCount, confidence: float) -> ConfidenceInterval:
        """The interval of a least-squares answer from its standard error and the smallest released variance
        (its least-squares weights are not kept), centred on the linear estimate."""
        released = [r.variance for r in self.released if r.variance > 0]
        min_var = min(released) if released else min((v for v in self.sum_variance if v > 0), default=0.0)
        half = bound_halfwidth(c.standard_error, min_var, confidence, self.draws_per_value) if min_var > 0 else 0.0
        method, terms = "bound", self._noise_terms(c.lo, c.hi) if half > 0 else None
        if terms is not None:  # both are guarantees: the narrower one holds
            w, v, n = grouped_terms(*terms)
            tight = chernoff_halfwidth(w, v, confidence, self.draws_per_value, counts=n)
            half, method = (tight, "chernoff") if tight < half else (half, method)
        center = c.value
        if self.estimator == "haar_nonnegative":  # the refinement is not linear: the interval is the linear one's
            prefix = self._linear_haar_prefix
            center = float(prefix[c.hi] - prefix[c.lo])
        return ConfidenceInterval(center - half, center + half, confidence, method)

    def _noise_terms(self, lo: int, hi: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
        """The least-squares answer for [lo, hi) as weights on independent released values and their variances
        (None beyond MAX_TERMS values, where the Chernoff search would be slow): the adjoint of the estimator."""
        if self.estimator == "tree":
            tree = self._tree
            if tree.leaf_starts.size > MAX_TERMS:
                return None
            return tree.query_terms(range_weights(tree.leaf_starts, self.domain_size, [lo], [hi])[0])
        if self.domain_size > MAX_TERMS:
            return None
        g = np.zeros(self.domain_size)  # weights on the prefix sums: +1 at hi - 1, -1 at lo - 1
        g[hi - 1] += 1.0
        if lo > 0:
            g[lo - 1] -= 1.0
        weights = haar_prefix_adjoint(g)
        return weights, np.full(weights.size, self.released[0].variance)

    def weighted_count(self, weights: npt.ArrayLike) -> tuple[float, float]:
        """Estimate of sum_i weights[i] * x[i] and the standard error of its noise.

        Used for sets of bins (e.g. a 2-D rectangle flattened along a Hilbert curve is a
        union of 1-D ranges: weights are its 0/1 indicator).
        """
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (self.domain_size,) or not np.all(np.isfinite(w)):
            raise InvalidInputError(f"weights must be {self.domain_size} finite numbers, got shape {w.shape}")
        value = float(w @ self._bin_estimates)
        var = float(self._bin_weight_variance(w[None, :])[0])
        return value, float(np.sqrt(max(var, 0.0)))

    def cuts_partition(self, lo: int, hi: int) -> bool:
        """Whether [lo, hi) starts or ends strictly inside a partition whose sum is spread evenly over its bins:
        then its estimate also carries the (unknown, data-dependent) error of that spreading, which its standard
        error (noise only) does not cover. Wavelet releases estimate every bin itself, so nothing is cut."""
        if self.estimator in ("haar", "haar_nonnegative"):
            return False
        bounds = {int(s) for s in self.starts} | {int(self.domain_size)}
        return lo not in bounds or hi not in bounds

    def with_noise_variance_factor(self, factor: float, **params: Any) -> "Summary":
        """This summary with every noise variance (sum_variance and each released measurement's) times `factor`,
        and `params` added to its params: for values that carry more noise than the strategy assumed (e.g. the
        key holders' share noise of a threshold study with noise_tolerates > 0). Every noise variance of the
        released values grows by the same factor, so the least-squares estimates are unchanged and their
        standard errors grow by sqrt(factor). Adds no noise; post-processing of released values."""
        if not (np.isfinite(factor) and factor > 0):
            raise InvalidInputError(f"a noise variance factor must be finite and > 0, got {factor}")
        released = tuple(ReleasedValues(kind=r.kind, values=r.values, variance=r.variance * factor, epsilon=r.epsilon,
                                        starts=r.starts) for r in self.released)
        return Summary(domain_size=self.domain_size, epsilon=self.epsilon, strategy=self.strategy,
                       noise_parties=self.noise_parties, starts=self.starts, sums=self.sums,
                       sum_variance=tuple(float(v) * factor for v in self.sum_variance),
                       contribution_bound=self.contribution_bound, epsilon_spent=self.epsilon_spent,
                       params={**self.params, **params}, estimator=self.estimator, released=released)

    def to_pandas(self, domain: Any = None, *, confidence: float | None = None) -> Any:
        """The released partitions as a pandas DataFrame: start, stop (bins [start, stop)), the noisy sum and
        the standard error of its noise; a `domain` (e.g. `dpagg.DomainSpec`) adds value_lo, value_hi and
        label, `confidence` the interval columns (`he_partition.core.frames.summary_frame`). pandas is
        optional (pip install 'dpagg[pandas]'). Per-bin estimates are `estimate()`."""
        return summary_frame(self, domain, confidence)

    def plot(self, ax: Any = None, *, domain: Any = None, confidence: float | None = None) -> Any:
        """Bars of the released estimate per bin, one per released partition, on matplotlib axes (returned);
        see `he_partition.core.frames.plot_summary`. matplotlib is optional and imported here, on first use."""
        return plot_summary(self, ax, domain=domain, confidence=confidence)

    # -- serialization -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SUMMARY_FORMAT,
            "domain_size": self.domain_size,
            "epsilon": self.epsilon,
            "strategy": self.strategy,
            "noise_parties": self.noise_parties,
            "contribution_bound": self.contribution_bound,
            "starts": list(self.starts),
            "sums": list(self.sums),
            "sum_variance": list(self.sum_variance),
            "epsilon_spent": [[k, v] for k, v in self.epsilon_spent],
            "params": self.params,
            # Optional fields are written only when used, so partition summaries are unchanged.
            **({"estimator": self.estimator} if self.estimator != "partition" else {}),
            **({"released": [r.to_dict() for r in self.released]} if self.released else {}),
        }

    def to_json(self) -> str:
        """The summary document, byte-identical to `json.dumps(self.to_dict(), separators=(",", ":"))`.

        The long lists (one number per partition: 8M for a 2^23-bin summary released bin by
        bin) are written in blocks, so no more than one block's number strings exist at once
        (the plain encoder holds one string object per number until it joins them: ~1 GB per
        8M-number list). The per-partition variances take only a few distinct values, one per
        measurement level, and each distinct value is formatted once, by the same encoder, so
        the text is exactly what `json.dumps` writes.
        """
        d = self.to_dict()
        tag = uuid.uuid4().hex
        parts: dict[str, str] = {}

        def swap(holder: dict[str, Any], key: str, render: Callable[[Sequence[Any]], str]) -> None:
            values = holder.get(key)
            if isinstance(values, list) and len(values) >= _LONG_LIST:
                marker = f"{key}:{len(parts)}:{tag}"
                parts[marker] = render(values)
                holder[key] = marker

        swap(d, "starts", _int_list_json)
        swap(d, "sums", _int_list_json)
        swap(d, "sum_variance", _float_list_json)
        for r in d.get("released", []):
            swap(r, "values", _int_list_json)
            swap(r, "starts", _int_list_json)
        text = json.dumps(d, separators=(",", ":"))
        for marker, rendered in parts.items():
            text = text.replace(f'"{marker}"', rendered, 1)
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Summary":
        if d.get("format") != SUMMARY_FORMAT:
            raise InvalidInputError(f"not a {SUMMARY_FORMAT} document (format={d.get('format')!r})")
        try:
            return cls(
                domain_size=int(d["domain_size"]),
                epsilon=float(d["epsilon"]),
                strategy=str(d["strategy"]),
                noise_parties=int(d["noise_parties"]),
                contribution_bound=int(d.get("contribution_bound", 1)),
                starts=tuple(int(v) for v in d["starts"]),
                sums=tuple(int(v) for v in d["sums"]),
                sum_variance=tuple(float(v) for v in d["sum_variance"]),
                epsilon_spent=tuple((str(k), float(v)) for k, v in d.get("epsilon_spent", [])),
                params=dict(d.get("params", {})),
                estimator=str(d.get("estimator", "partition")),
                released=tuple(ReleasedValues.from_dict(r) for r in d.get("released", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"malformed summary document: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> "Summary":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"summary is not valid JSON: {exc}") from exc
        if not isinstance(d, dict):
            raise InvalidInputError("summary JSON must be an object")
        return cls.from_dict(d)


#: Lists at least this long are written by `_int_list_json` / `_float_list_json`, in blocks of `_BLOCK`.
_LONG_LIST, _BLOCK, _SEP = 1024, 1 << 16, (",", ":")


def _int_list_json(values: Sequence[int]) -> str:
    """`json.dumps(values, separators=(",", ":"))` for a list of Python ints, one block of strings at a time."""
    if set(map(type, values)) - {int}:  # bools, numpy scalars: the encoder's own rules
        return json.dumps(list(values), separators=(",", ":"))
    return "[" + ",".join(json.dumps(values[i:i + _BLOCK], separators=_SEP)[1:-1] for i in range(0, len(values), _BLOCK)) + "]"


def _float_list_json(values: Sequence[float]) -> str:
    """`json.dumps(values, separators=(",", ":"))` for a list of floats, formatting each distinct value once."""
    if len(values) < _LONG_LIST:
        return json.dumps(list(values), separators=(",", ":"))
    arr = np.asarray(values, dtype=np.float64)
    uniq, inverse = np.unique(arr, return_inverse=True)
    if uniq.size * 4 > arr.size or np.isnan(uniq).any():  # np.unique keeps every NaN apart; no gain either way
        return json.dumps(list(values), separators=(",", ":"))
    text = [json.dumps(float(u)) for u in uniq]
    inverse = inverse.ravel()
    return "[" + ",".join(",".join([text[i] for i in inverse[k:k + _BLOCK].tolist()])
                          for k in range(0, inverse.size, _BLOCK)) + "]"
