"""Linear measurements of the aggregated histogram: what each side computes, and the decode map.

Layout. Each data owner uploads the *inclusive prefix sums* P of its own histogram
(P[i] = x[0] + ... + x[i]), encrypted in chunks of `slots` values. Prefix sums are linear,
so the sum of the owners' vectors is the prefix-sum vector of the aggregate. All slot
arithmetic is exact modulo the BFV plain modulus t.

For a measurement with public linear decode map A over its *measured slots* (A applied to
them gives the measured quantities) the computation side picks slot noise N with
A(N) = eta, its own noise draw, and sends the decryption side P + N' where N' is N on the
measured slots and an independent uniform pad mod t on every other slot. So the
decryption side's slots are a public invertible function of (measurement + eta) on the
measured slots and one-time-padded (exactly uniform, independent of the data) elsewhere.

No measurement multiplies the data by a plaintext: a product leaves data-dependent
residue in what the secret key reveals (CKKS: the mask's encoding error times the data;
BFV: carry terms). Padding instead of zeroing needs only additions, whose noise the
computation side floods (`he_partition.he.bfv`). The price: the decryption side can no longer
check that non-measured slots are zero; it checks the ciphertext's noise budget (wrong
key, corruption) and the decoded values' magnitude instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Sequence

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError, MeasurementShapeError, PrecisionError
from .accounting import RangeQuery
from .estimation import haar_depth, haar_forward_prefix
from .noise import RandomSource, discrete_laplace, laplace_scale, discrete_laplace_variance
from .backend import DEFAULT_PLAIN_MODULUS, centre, n_chunks
from .columns import Column
from .validation import positive_finite

__all__ = [
    "Measurement",
    "PrefixDifferences",
    "PartitionSums",
    "HaarCoefficients",
    "RangeCount",
    "PREFIX_MASK_EPSILON",
    "check_range",
    "range_count_batch",
    "owner_encoding",
    "MAX_DECODED_MAGNITUDE",
    "refuse_implausible",
    "measurement_from_dict",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Decoded measured values larger than this are refused: real ones (counts plus noise) stay
#: far below, while a ciphertext that is not what it claims decodes to values uniform
#: modulo t (2^49). The noise-budget check in the BFV backend is the primary integrity check.
MAX_DECODED_MAGNITUDE = 2**44


def owner_encoding(histogram: npt.ArrayLike) -> IntArray:
    """What a data owner encrypts: the inclusive prefix sums of its histogram."""
    return np.cumsum(np.asarray(histogram, dtype=np.int64))


def _decoded(values: npt.ArrayLike, modulus: int, check: bool = True) -> IntArray:
    """Centre decoded values modulo t and (with `check`) refuse implausible ones (see MAX_DECODED_MAGNITUDE)."""
    out = centre(values, modulus)
    if check:
        refuse_implausible(out)
    return out


def refuse_implausible(values: IntArray) -> None:
    """Raise PrecisionError if any value exceeds MAX_DECODED_MAGNITUDE in magnitude.

    The decryption side applies it to values that already carry its own noise draw
    (`DecryptionSide.decrypt_measurement`), so the refusal is post-processing of noised
    values, never a function of (data + the computation side's draw) alone. The text
    names neither the position nor the size of the value.
    """
    if values.size and int(np.max(np.abs(values))) > MAX_DECODED_MAGNITUDE:
        raise PrecisionError(
            f"a decoded value is implausibly large (limit 2^{MAX_DECODED_MAGNITUDE.bit_length() - 1}): the "
            "ciphertext was made under another key, is corrupt, is not shaped like this measurement, or an "
            "owner uploaded values outside the histogram's range"
        )


@dataclass(frozen=True)
class Measurement:
    """A linear measurement of the aggregated histogram, with its privacy parameters.

    Each of the (up to two) noise parties adds one discrete Laplace draw of scale
    `scale = sensitivity / epsilon` (rounded up) per measured value; one draw alone makes
    the released values epsilon-DP under add/remove of one record (one person with
    contribution bound c: `sensitivity` already includes c).
    """

    kind: ClassVar[str] = ""
    domain_size: int
    epsilon: float
    sensitivity: int

    def __post_init__(self) -> None:
        if self.domain_size < 1:
            raise InvalidInputError(f"domain_size must be >= 1, got {self.domain_size}")
        positive_finite("epsilon", self.epsilon)
        if self.sensitivity < 1:
            raise InvalidInputError(f"sensitivity must be >= 1, got {self.sensitivity}")

    @property
    def scale(self) -> Fraction:
        return laplace_scale(self.sensitivity, self.epsilon)

    @property
    def noise_variance(self) -> float:
        """Variance of one party's noise draw on one measured value."""
        return discrete_laplace_variance(self.scale)

    @property
    def count(self) -> int:
        """How many values the measurement releases."""
        raise NotImplementedError

    @property
    def unit_sensitivity(self) -> int:
        """L1 sensitivity of the measured values under add/remove of one record (contribution bound 1).

        `sensitivity` must be at least this times the contribution bound c; the decryption
        server refuses smaller values (their noise would be too small).
        """
        raise NotImplementedError

    def measured_slots(self) -> BoolArray | None:
        """Which slots carry the measurement (True), or None when all do.

        The computation side one-time-pads every other slot with a uniform value mod t.
        """
        raise NotImplementedError

    def computation_noise(self, rng: RandomSource) -> IntArray:
        """The computation side's draw, the input of `noise_slots`: one discrete Laplace value of
        `scale` per measured value (only the computation side knows it).

        Privacy: scale = sensitivity / epsilon rounded up, so the measured values plus this
        draw are epsilon-DP; neighbouring relation add/remove of one person with at most c
        records (`sensitivity` includes c). Spends nothing itself: the decryption side
        charges epsilon before it decrypts.
        """
        return discrete_laplace(self.scale, self.count, rng)

    def noise_slots(self, eta: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS) -> IntArray:
        """Slot-domain noise N with decode(N) == eta mod t (the computation side's draw)."""
        raise NotImplementedError

    def measured_chunks(self, slots: int) -> tuple[int, ...]:
        """Indices of the ciphertext chunks (of `slots` slots) holding at least one measured slot.

        Only these are sent to the decryption side: a chunk of pads alone carries nothing it
        needs, so both sides derive this list from the public measurement.
        """
        used = self.measured_slots()
        if used is None:
            return tuple(range(n_chunks(self.domain_size, slots)))
        return tuple(int(i) for i in np.unique(np.flatnonzero(used) // slots))

    def privacy_pieces(self) -> tuple[RangeQuery, ...]:
        """What the decryption side's view reveals, as noisy range counts with their DP epsilons.

        Used by the direct-query ledger (max-clique accounting); the release strategies are
        charged by measurement epsilon instead, so only `RangeCount` defines it.
        """
        raise NotImplementedError(f"{self.kind} measurements are charged by epsilon, not by range pieces")

    def decode(self, slots: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS, *, check: bool = True) -> IntArray:
        """The public map A from decrypted slots to measured values, exact modulo t (pads are ignored)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "domain_size": self.domain_size, "epsilon": self.epsilon,
                "sensitivity": self.sensitivity}


def _check_slots(slots: IntArray, n: int) -> None:
    if slots.shape != (n,):
        raise MeasurementShapeError(f"expected {n} decrypted slots, got shape {slots.shape}")


@dataclass(frozen=True)
class PrefixDifferences(Measurement):
    """Adjacent differences d[i] = x[i] - x[i-1] (x[-1] = 0) of the aggregated histogram.

    Sensitivity: adding or removing one record changes x[i] by 1 and so d[i] and d[i+1]
    by 1 each: L1 sensitivity 2 (times the contribution bound). Decode map: the second
    difference of the prefix sums, so N is the double cumulative sum of eta.
    """

    kind: ClassVar[str] = "prefix_differences"

    @property
    def count(self) -> int:
        return self.domain_size

    @property
    def unit_sensitivity(self) -> int:
        return 2

    def measured_slots(self) -> BoolArray | None:
        return None

    def noise_slots(self, eta: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS) -> IntArray:
        t = np.int64(modulus)
        return np.cumsum(np.cumsum(np.asarray(eta, dtype=np.int64)) % t) % t

    def decode(self, slots: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS, *, check: bool = True) -> IntArray:
        _check_slots(slots, self.domain_size)
        first = centre(np.diff(slots, prepend=0), modulus)
        return _decoded(np.diff(first, prepend=0), modulus, check)


@dataclass(frozen=True)
class PartitionSums(Measurement):
    """Sums of x over contiguous public partitions [starts[k], starts[k+1]).

    Sensitivity: the partitions are disjoint, so one record changes one sum by 1: L1
    sensitivity 1 (times the contribution bound; parallel composition). The mask keeps P
    at each partition's last bin; N holds the cumulative noise there, so consecutive
    differences of the decrypted slots are S_k + eta_k. Every other slot carries a
    uniform pad mod t (see the module docstring).
    """

    kind: ClassVar[str] = "partition_sums"
    #: Kept as a read-only int64 `Column` (reads like a tuple of ints; 8 bytes a start where a tuple
    #: of Python ints takes 36: 2^24 starts are 128 MB, not 600).
    starts: Sequence[int] = field(default=(0,))

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.starts, Column):
            s = np.array(self.starts, dtype=np.int64)  # a copy of its own (nobody else can change it)
            if s.ndim != 1:
                raise InvalidInputError("partition starts must be a flat sequence of integers")
            s.setflags(write=False)
            object.__setattr__(self, "starts", Column(s))
        s = np.asarray(self.starts)
        if s.size == 0 or s[0] != 0:
            raise InvalidInputError("partition starts must begin with 0")
        if np.any(np.diff(s) <= 0) or s[-1] >= self.domain_size:
            raise InvalidInputError(
                f"partition starts must be strictly increasing and < domain_size {self.domain_size}"
            )

    @cached_property
    def ends(self) -> IntArray:
        """Index of each partition's last bin (read-only; computed once: both sides use it several times)."""
        s = np.asarray(self.starts)
        ends = np.append(s[1:], self.domain_size) - 1
        ends.setflags(write=False)
        return ends

    @property
    def count(self) -> int:
        return len(self.starts)

    @property
    def unit_sensitivity(self) -> int:
        return 1

    def measured_slots(self) -> BoolArray | None:
        m = np.zeros(self.domain_size, dtype=bool)
        m[self.ends] = True
        return m

    def noise_slots(self, eta: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS) -> IntArray:
        n = np.zeros(self.domain_size, dtype=np.int64)
        n[self.ends] = np.cumsum(np.asarray(eta, dtype=np.int64)) % np.int64(modulus)
        return n

    def decode(self, slots: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS, *, check: bool = True) -> IntArray:
        _check_slots(slots, self.domain_size)
        return _decoded(np.diff(slots[self.ends], prepend=0), modulus, check)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["starts"] = np.asarray(self.starts).tolist()
        return d


@dataclass(frozen=True)
class HaarCoefficients(Measurement):
    """Unnormalised Haar wavelet coefficients of the aggregated histogram (Privelet, Xiao et al.).

    Tree: the dyadic binary tree over [0, 2^L), L = ceil(log2 n), restricted to [0, n)
    (unary nodes collapsed), so there are exactly n coefficients: the total, and for each
    internal node with midpoint m the difference S[a, m) - S[m, b) of its halves' sums
    (value i of the release belongs to the node with midpoint i + 1; value n - 1 is the
    total). See `he_partition.core.estimation`.

    Sensitivity: one record changes the total by 1 and the detail of each of its (at most L)
    ancestors by 1: L1 sensitivity (1 + L) * c. With one noise scale for every coefficient
    this is exactly Privelet's noise Lap((1 + log2 n) / eps) on the weighted coefficients.

    Layout: the inverse transform divides by 2 per level; modulo the odd prime t halving is
    exact (multiplication by 2^-1 mod t), so N = A^{-1}(eta) mod t is an integer vector
    and the decryption side sees P + A^{-1} eta mod t, a public invertible function of the
    noisy coefficients. No multiplier is needed, so the aggregate's size no longer limits
    the domain (the old CKKS layout failed above ~4e6 records per 4,096 bins).
    """

    kind: ClassVar[str] = "haar_coefficients"

    def __post_init__(self) -> None:
        super().__post_init__()
        unit = 1 + self.depth
        if self.sensitivity % unit:
            raise InvalidInputError(
                f"Haar sensitivity must be a multiple of 1 + ceil(log2 {self.domain_size}) = {unit} "
                f"(times the contribution bound), got {self.sensitivity}"
            )

    @property
    def depth(self) -> int:
        return haar_depth(self.domain_size)

    @property
    def unit_sensitivity(self) -> int:
        return 1 + self.depth

    @property
    def count(self) -> int:
        return self.domain_size

    def measured_slots(self) -> BoolArray | None:
        return None

    def noise_slots(self, eta: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS) -> IntArray:
        e = np.asarray(eta, dtype=np.int64)
        if e.shape != (self.domain_size,):
            raise MeasurementShapeError(f"expected {self.domain_size} noise values, got shape {e.shape}")
        n, t = self.domain_size, np.int64(modulus)
        # Exact inverse transform modulo the odd prime t: x / 2 is x // 2 for even x, (x + t) // 2 for odd.
        q = np.zeros(n + 1, dtype=np.int64)
        q[n] = e[n - 1] % t
        h = self.depth
        while h >= 1:
            half = 1 << (h - 1)
            m = np.arange(half, n, 2 * half, dtype=np.int64)
            if m.size:
                a, b = m - half, np.minimum(m + half, n)
                num = (e[m - 1] + q[a] + q[b]) % t
                q[m] = np.where(num % 2 == 0, num, num + t) // 2
            h -= 1
        return q[1:]

    def decode(self, slots: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS, *, check: bool = True) -> IntArray:
        _check_slots(slots, self.domain_size)
        return _decoded(haar_forward_prefix(np.asarray(slots, dtype=np.int64) % np.int64(modulus)), modulus, check)


#: DP epsilon at which the decryption side sees the prefix sum in front of a direct range
#: count (see `RangeCount`): the prefix hides behind a discrete Laplace mask of scale
#: sensitivity * 2^20, wide enough that the view costs ~1e-6, small enough (|mask| < 4e7 c
#: except with probability e^-40) that CKKS still decrypts the slot to the unit.
PREFIX_MASK_EPSILON = 2.0**-20


@dataclass(frozen=True)
class RangeCount(Measurement):
    """One direct noisy range count: sum(x[lo:hi]) of the aggregated histogram, lo < hi.

    Privacy: the released value is the count plus each noise party's discrete Laplace draw
    of scale sensitivity/epsilon: epsilon-DP under add/remove of one person who
    contributes at most c records (`sensitivity` = c, one range). Layout: the mask keeps
    P[hi-1] and, for lo > 0, P[lo-1]; the computation side adds mu to both slots and eta
    to P[hi-1], where mu is a discrete Laplace mask of scale sensitivity / PREFIX_MASK_EPSILON
    and eta the answer's noise (it alone knows both). The decryption side therefore sees
    (P[lo-1] + mu, count + eta): the prefix [0, lo) at PREFIX_MASK_EPSILON and the count
    at epsilon; every other slot carries a uniform pad mod t. `privacy_pieces` lists
    both; the ledger charges the maximum weighted overlap of all pieces answered so far
    (seed 004, `he_partition.core.accounting`), not their sum.
    """

    kind: ClassVar[str] = "range_count"
    lo: int = 0
    hi: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("lo", "hi"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidInputError(f"range {name} must be an integer, got {v!r}")
        check_range(self.lo, self.hi, self.domain_size)

    @property
    def count(self) -> int:
        return 1

    @property
    def unit_sensitivity(self) -> int:
        return 1

    @property
    def mask_scale(self) -> Fraction:
        """Scale of the computation side's prefix mask mu."""
        return laplace_scale(self.sensitivity, PREFIX_MASK_EPSILON)

    def _slots(self) -> list[int]:
        return ([self.lo - 1] if self.lo > 0 else []) + [self.hi - 1]

    def measured_slots(self) -> BoolArray | None:
        m = np.zeros(self.domain_size, dtype=bool)
        m[self._slots()] = True
        return m

    def computation_noise(self, rng: RandomSource) -> IntArray:
        """[eta] for lo = 0, else [mu, eta]: the prefix mask and the answer's noise (see the class).

        Privacy: eta has scale sensitivity / epsilon (the count, epsilon-DP), mu scale
        sensitivity / PREFIX_MASK_EPSILON (the prefix the decryption side sees, 2^-20-DP);
        sensitivity c, neighbouring relation add/remove of one person with at most c
        records. Only the computation side knows eta and mu.
        """
        eta = discrete_laplace(self.scale, 1, rng)
        if self.lo == 0:
            return eta
        return np.concatenate([discrete_laplace(self.mask_scale, 1, rng), eta])

    def noise_slots(self, eta: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS) -> IntArray:
        e = np.asarray(eta, dtype=np.int64)
        want = 1 if self.lo == 0 else 2
        if e.shape != (want,):
            raise MeasurementShapeError(f"a range count from bin {self.lo} takes {want} noise values, got {e.shape}")
        n = np.zeros(self.domain_size, dtype=np.int64)
        n[self._slots()] = np.cumsum(e) % np.int64(modulus)
        return n

    def decode(self, slots: IntArray, modulus: int = DEFAULT_PLAIN_MODULUS, *, check: bool = True) -> IntArray:
        _check_slots(slots, self.domain_size)
        value = slots[self.hi - 1] - (slots[self.lo - 1] if self.lo > 0 else 0)
        return _decoded(np.array([value], dtype=np.int64), modulus, check)

    def privacy_pieces(self) -> tuple[RangeQuery, ...]:
        count = RangeQuery((self.lo,), (self.hi,), self.epsilon)
        if self.lo == 0:
            return (count,)
        return (count, RangeQuery((0,), (self.lo,), PREFIX_MASK_EPSILON))

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["lo"], d["hi"] = int(self.lo), int(self.hi)
        return d


def check_range(lo: int, hi: int, domain_size: int, label: str = "range") -> None:
    """Refuse a range [lo, hi) that is empty or leaves the domain, naming it with `label`."""
    if not 0 <= lo < hi <= domain_size:
        raise InvalidInputError(
            f"{label} [{lo}, {hi}) is invalid: need 0 <= lo < hi <= {domain_size} (the domain size)"
        )


def range_count_batch(domain_size: int, epsilon: float, sensitivity: int, ranges: Sequence[tuple[int, int]], *,
                      max_ranges: int) -> list[RangeCount]:
    """One `RangeCount` per range [lo, hi) at `epsilon` (see its privacy statement), all validated up front.

    Raises InvalidInputError naming the problem: no ranges, more than `max_ranges`, epsilon
    not > 0 and finite, or range i empty or outside the domain.
    """
    eps = positive_finite("epsilon", epsilon)
    if not ranges:
        raise InvalidInputError("ranges is empty: ask at least one range [lo, hi)")
    if len(ranges) > max_ranges:
        raise InvalidInputError(f"at most {max_ranges} ranges per call, got {len(ranges)}; split the batch")
    out = []
    for i, (lo, hi) in enumerate(ranges):
        check_range(lo, hi, domain_size, f"range {i}")
        out.append(RangeCount(domain_size, eps, sensitivity, lo=int(lo), hi=int(hi)))
    return out


_KINDS: dict[str, type[Measurement]] = {
    PrefixDifferences.kind: PrefixDifferences,
    PartitionSums.kind: PartitionSums,
    HaarCoefficients.kind: HaarCoefficients,
    RangeCount.kind: RangeCount,
}


def measurement_from_dict(d: dict[str, Any]) -> Measurement:
    """Rebuild a measurement from `to_dict` output (validated like any construction)."""
    kind = d.get("kind")
    cls = _KINDS.get(str(kind))
    if cls is None:
        raise InvalidInputError(f"unknown measurement kind {kind!r}; known: {sorted(_KINDS)}")
    kwargs = {k: v for k, v in d.items() if k != "kind"}
    if "starts" in kwargs and not (isinstance(kwargs["starts"], np.ndarray) and kwargs["starts"].dtype == np.int64):
        kwargs["starts"] = tuple(int(v) for v in kwargs["starts"])
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidInputError(f"bad fields for measurement {kind!r}: {exc}") from exc
