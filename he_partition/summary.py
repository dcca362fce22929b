"""The released DP view: a partition of the domain with noisy sums, range counts with standard errors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

__all__ = ["Summary", "RangeCount", "SUMMARY_FORMAT"]

SUMMARY_FORMAT = "dpagg.summary.v1"


@dataclass(frozen=True)
class RangeCount:
    """An estimated count over [lo, hi) and the standard error of its DP noise."""

    lo: int
    hi: int
    value: float
    standard_error: float


@dataclass(frozen=True)
class Summary:
    """A released DP summary (post-processing only: querying it spends no budget).

    `starts[k]` is the first bin of partition k; `sums[k]` its released noisy sum (integer:
    true sum plus every noise party's discrete Laplace draw); `sum_variance[k]` the
    variance of that noise. Per-bin estimates spread each sum uniformly over its bins.
    Standard errors describe the DP noise only: ranges that cut through a partition also
    carry the (unknown, data-dependent) error of uniform spreading.
    """

    domain_size: int
    epsilon: float
    strategy: str
    noise_parties: int
    starts: tuple[int, ...]
    sums: tuple[int, ...]
    sum_variance: tuple[float, ...]
    contribution_bound: int = 1
    epsilon_spent: tuple[tuple[str, float], ...] = ()
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
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

    # -- derived views -------------------------------------------------------------
    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        s = np.asarray(self.starts, dtype=np.int64)
        return np.diff(np.append(s, self.domain_size))

    @property
    def n_partitions(self) -> int:
        return len(self.starts)

    def estimate(self) -> npt.NDArray[np.float64]:
        """Per-bin estimates: each partition's noisy sum spread evenly over its bins."""
        lengths = self.lengths
        return np.repeat(np.asarray(self.sums, dtype=np.float64) / lengths, lengths)

    def range_count(self, lo: int, hi: int) -> RangeCount:
        """Estimated number of records in bins [lo, hi), with the standard error of its noise."""
        if not (0 <= lo < hi <= self.domain_size):
            raise InvalidInputError(f"range must satisfy 0 <= lo < hi <= {self.domain_size}, got [{lo}, {hi})")
        s = np.asarray(self.starts, dtype=np.int64)
        e = s + self.lengths
        first = int(np.searchsorted(s, lo, side="right")) - 1
        last = int(np.searchsorted(s, hi, side="left"))
        idx = np.arange(first, last)
        overlap = np.minimum(e[idx], hi) - np.maximum(s[idx], lo)
        frac = overlap / self.lengths[idx]
        value = float(np.sum(frac * np.asarray(self.sums, dtype=np.float64)[idx]))
        var = float(np.sum(frac**2 * np.asarray(self.sum_variance)[idx]))
        return RangeCount(lo, hi, value, float(np.sqrt(var)))

    def range_counts(self, ranges: npt.ArrayLike) -> list[RangeCount]:
        """Many range counts at once; `ranges` is a sequence of (lo, hi) pairs."""
        arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        return [self.range_count(int(a), int(b)) for a, b in arr]

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
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

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
