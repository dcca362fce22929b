"""The three roles of a release (data owners, computation side, decryption side) and `release()`."""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from .core.backend import ChunkedVector, PlainBackend, VectorBackend, sum_vectors, DEFAULT_SLOTS
from .core.errors import BudgetExhaustedError, InvalidInputError
from .execution.base import ChunkExecutor, SimulatedOwners, split_noise
from .strategies.gap import GapParams, gap_strategy
from .strategies.hier import HierParams, hier_strategy
from .strategies.dawa import DawaParams, dawa_strategy
from .strategies.privelet import PriveletParams, privelet_strategy
from .strategies.auto import AutoParams, auto_strategy
from .core.measurements import (MAX_DECODED_MAGNITUDE, HaarCoefficients, Measurement, PartitionSums,
                                PrefixDifferences, owner_encoding, refuse_implausible)
from .core.accounting import exact_decimal
from .core.noise import RandomSource, as_random_source, discrete_laplace
from .core.summary import Summary
from .core.validation import validate_epsilon

__all__ = [
    "Budget",
    "ComputationSide",
    "DecryptionSide",
    "encrypt_histogram",
    "validate_histogram",
    "validate_histograms",
    "run_strategy",
    "make_strategy",
    "release",
    "STRATEGIES",
    "STRATEGY_MEASUREMENT_KINDS",
    "DEFAULT_STRATEGY",
    "EPSILON_TOLERANCE",
    "MIN_RELEASE_EPSILON",
    "MAX_NOISE_SCALE",
]

IntArray = npt.NDArray[np.int64]

#: A strategy's float split (eps/3 three times) can overshoot its total by a few ulps; a last
#: share within this relative slack is booked at exactly what is left (never past the total).
EPSILON_TOLERANCE = 1e-9

#: `spend_rest` refuses to start a release for less than this (a rounding leftover of the
#: budget): its noise would be far beyond any useful value (RESOURCE_EXHAUSTED instead).
MIN_RELEASE_EPSILON = 1e-9

#: A measurement whose noise scale exceeds this is refused before anything is charged: one
#: party's noise alone would pass MAX_DECODED_MAGNITUDE with probability above e^-64, so its
#: answer would be a refusal decided by the noise (a public fact: scale = sensitivity / epsilon).
MAX_NOISE_SCALE = MAX_DECODED_MAGNITUDE // 64


def validate_histogram(h: Any, *, name: str = "histogram") -> IntArray:
    """A 1-D, non-empty array of finite, non-negative integer counts (clear errors otherwise)."""
    arr = np.asarray(h)
    if arr.ndim != 1:
        raise InvalidInputError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidInputError(f"{name} is empty: the domain needs at least one bin")
    if arr.dtype.kind not in "iuf" and arr.dtype != bool:
        raise InvalidInputError(f"{name} must hold numbers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            raise InvalidInputError(f"{name} has NaN or infinite counts (first at bin {int(np.argmax(bad))})")
        if np.any(arr != np.rint(arr)):
            raise InvalidInputError(f"{name} has non-integer counts (first at bin {int(np.argmax(arr != np.rint(arr)))})")
    out = arr.astype(np.int64)
    if np.any(out < 0):
        raise InvalidInputError(f"{name} has negative counts (first at bin {int(np.argmax(out < 0))})")
    return out


def validate_histograms(histograms: Sequence[Any]) -> list[IntArray]:
    if isinstance(histograms, np.ndarray) and histograms.ndim == 1:
        raise InvalidInputError("histograms must be a sequence of per-owner 1-D arrays, got a single 1-D array")
    hs = [validate_histogram(h, name=f"histogram of owner {i}") for i, h in enumerate(histograms)]
    if not hs:
        raise InvalidInputError("at least one data owner's histogram is needed")
    n = hs[0].size
    for i, h in enumerate(hs):
        if h.size != n:
            raise InvalidInputError(f"histogram lengths differ: owner 0 has {n} bins, owner {i} has {h.size}")
    return hs


def encrypt_histogram(backend: VectorBackend, histogram: npt.ArrayLike) -> ChunkedVector:
    """Data-owner step: validate, prefix-encode and encrypt one histogram."""
    return backend.encrypt(owner_encoding(validate_histogram(histogram)))


@dataclass
class Budget:
    """In-memory privacy budget with a dry-run before every charge, in exact decimal arithmetic.

    Every epsilon counts as the decimal it prints as (0.1 is 1/10) and sums are fractions,
    so the charges never pass the total. A charge that overshoots the total by at most
    EPSILON_TOLERANCE (relative) is a strategy's float split (eps/3 three times) and is
    booked at exactly what is left; the services' ledger
    (`parties.decryption.ledger.check_charge`) applies the same rule per release.
    """

    total: float
    charges: list[tuple[str, float]] = field(default_factory=list)

    @property
    def spent(self) -> float:
        return float(sum((exact_decimal(e) for _, e in self.charges), Fraction(0)))

    def charge(self, what: str, epsilon: float) -> None:
        """Spend `epsilon` for `what` (sequential composition), or raise BudgetExhaustedError.

        Privacy: books the epsilon of a measurement whose sensitivity and neighbouring
        relation are the measurement's (add/remove of one person, contribution bound
        included in its sensitivity); draws no noise, so nobody knows noise from it.
        Nothing is recorded when the charge does not fit.
        """
        left = exact_decimal(self.total) - sum((exact_decimal(e) for _, e in self.charges), Fraction(0))
        want = exact_decimal(epsilon)
        if want > left:
            if not (left > 0 and want <= left * (1 + Fraction(EPSILON_TOLERANCE))):
                raise BudgetExhaustedError(
                    f"charging {epsilon:.12g} for {what} would pass the total {self.total:.12g} "
                    f"({float(left):.12g} left)"
                )
            booked = float(left)
            while exact_decimal(booked) > left:
                booked = math.nextafter(booked, -math.inf)
            epsilon = booked
        self.charges.append((what, epsilon))


class ComputationSide:
    """Holds only public material: aggregates ciphertexts and adds its own noise.

    For each measurement it draws eta ~ discrete Laplace(sensitivity / eps) per value
    (it alone knows eta; epsilon and sensitivity are the measurement's, under add/remove
    of one person with contribution bound c), then one uniform pad mod t per slot the
    measurement does not use, and adds the slot noise N' (N with decode(N) = eta on the
    measured slots, the pads elsewhere) under a fresh encryption, then floods the noise
    polynomial (`VectorBackend.add_noise`). So the decryption side's slots are eta-noised
    measurements and exactly uniform pads, and its view of the noise is data-independent
    up to the flooding's statistical distance. Chunks without a measured slot are not
    sent at all (None).
    """

    def __init__(self, backend: VectorBackend, rng: RandomSource) -> None:
        self.backend = backend
        self.rng = rng

    def aggregate(self, vectors: Iterable[ChunkedVector]) -> ChunkedVector:
        return sum_vectors(self.backend, vectors)

    def measure(self, aggregate: ChunkedVector, m: Measurement) -> ChunkedVector:
        """The noised measurement ciphertext; chunks without a measured slot are None (never sent)."""
        done = dict(self.measure_chunks(aggregate, m))
        return ChunkedVector(aggregate.length, tuple(done.get(i) for i in range(len(aggregate.chunks))))

    def measure_chunks(self, aggregate: ChunkedVector, m: Measurement) -> Iterator[tuple[int, Any]]:
        """`measure` as a stream of (chunk index, ciphertext), encrypting each chunk only when asked for.

        Privacy: adds `m.computation_noise` (discrete Laplace of scale m.sensitivity /
        m.epsilon per measured value: m.epsilon-DP, neighbouring relation add/remove of one
        person with at most c records) and uniform pads mod t on the other slots; only this
        (computation) side knows eta and the pads. Spends nothing: the decryption side
        charges m.epsilon before it decrypts.

        Every noise draw (eta, then the pads) is taken before the first chunk is produced,
        so seeded runs draw in the same order either way.
        """
        if aggregate.length != m.domain_size:
            raise InvalidInputError(
                f"measurement is for {m.domain_size} bins but the aggregate has {aggregate.length}"
            )
        noise = self.slot_noise(m)
        return self.backend.noised_chunks(aggregate, noise, keep=m.measured_chunks(self.backend.slots))

    def measure_on(self, executor: ChunkExecutor, key: str, m: Measurement) -> Iterator[tuple[int, bytes]]:
        """`measure_chunks` with the chunk work on `executor` (aggregate loaded under `key`): serialized chunks.

        Privacy: as `measure_chunks` (eta of scale m.sensitivity / m.epsilon per measured
        value, m.epsilon-DP; neighbouring relation: add/remove of one person with at most c
        records; pads on
        the other slots; only the computation side knows them). Every draw is made here,
        before fan-out, in the same order as `measure_chunks`, so every executor releases
        the same values under a seed and a retried chunk carries the same noise.
        """
        noise = self.slot_noise(m)
        return executor.noised(key, split_noise(noise, self.backend.slots, m.measured_chunks(self.backend.slots)))

    def slot_noise(self, m: Measurement) -> IntArray:
        """The slot noise N' of one measurement: eta on the measured slots, uniform pads mod t on the others.

        Privacy: eta ~ discrete Laplace(m.sensitivity / m.epsilon) per measured value
        (m.epsilon-DP; neighbouring relation: add/remove of one person with at most c
        records); the pads hide
        the unused slots. Drawn from this side's RandomSource, eta first, then the pads;
        only the computation side knows them. Spends nothing.
        """
        t = self.backend.plain_modulus
        eta = m.computation_noise(self.rng)
        noise = m.noise_slots(eta, t)
        used = m.measured_slots()
        if used is not None:
            free = ~used
            noise[free] = self.rng.integers(t, int(np.count_nonzero(free)))
        return noise


class DecryptionSide:
    """Key holder: fixes its own noise, charges the budget, decrypts, decodes, checks the noised values.

    With noise_parties == 2 it adds an independent discrete Laplace draw of the same
    scale to every decoded value (it alone knows that draw), so the computation side,
    which knows its own draw, still sees an eps-DP value. With noise_parties == 1 it adds
    none: an explicit opt-in for deployments where the computation side never sees a
    release (in-process trusted-curator baseline). Every value leaving it is an integer.

    The one rule (docs/threat-model.md, "What a deviating computation server learns from
    the decryption server"): the draw is fixed and the budget charged before anything
    that depends on the secret key is looked at; the checks before the charge run on
    public facts only (shapes, the contract). The integrity check (noise budget) and the
    magnitude check run after the charge, so every refusal they cause is paid for.
    """

    def __init__(self, backend: VectorBackend, rng: RandomSource, budget: Budget, noise_parties: int = 2) -> None:
        if not backend.can_decrypt:
            raise InvalidInputError("the decryption side needs a backend holding the secret key")
        if noise_parties not in (1, 2):
            raise InvalidInputError(f"noise_parties must be 1 or 2, got {noise_parties}")
        self.backend = backend
        self.rng = rng
        self.budget = budget
        self.noise_parties = noise_parties

    def decrypt_measurement(self, m: Measurement, ciphertext: ChunkedVector, *, verified: bool = False) -> IntArray:
        """Draw, charge, then verify (unless `verified`), decrypt, noise and check the magnitude.

        Privacy: this side's discrete Laplace draw of scale m.sensitivity / m.epsilon
        (only the decryption side knows it; none with noise_parties == 1) is taken from
        `rng` first; then m.epsilon is charged to `budget`; only then are the ciphertexts
        integrity-checked (`backend.verify`, PrecisionError: the epsilon stays spent),
        decrypted, decoded, noised, and checked for magnitude (PrecisionError, the epsilon
        stays spent). Neighbouring relation add/remove of one person with at most c records
        (in m.sensitivity). A backend may have decrypted the chunks already, inside the key
        holder's processes (the decryption server's pipeline, `parties.decryption.workers`):
        the values and check outcomes are read here only after the charge; a refused charge
        leaves them unread.
        """
        if ciphertext.length != m.domain_size:
            raise InvalidInputError(f"ciphertext has {ciphertext.length} slots in use, measurement expects {m.domain_size}")
        if m.scale > MAX_NOISE_SCALE:
            raise InvalidInputError(
                f"measurement epsilon {m.epsilon:.6g} is too small for sensitivity {m.sensitivity}: its noise scale "
                f"{float(m.scale):.6g} exceeds {MAX_NOISE_SCALE} (the noise alone would pass the decode bound); "
                "nothing was charged or decrypted"
            )
        own = (discrete_laplace(m.scale, m.count, self.rng) if self.noise_parties == 2
               else np.zeros(m.count, dtype=np.int64))
        self.budget.charge(m.kind, m.epsilon)
        if not verified:
            self.backend.verify(ciphertext)  # wrong key or corrupt: refused after the charge (a function of s)
        values = m.decode(self.backend.decrypt(ciphertext, verified=True), self.backend.plain_modulus,
                          check=False) + own
        refuse_implausible(values)
        return values


Strategy = Generator[Measurement, IntArray, Summary]
STRATEGIES = ("auto", "gap", "hier", "dawa", "privelet")

#: The measurement kinds each strategy asks for; a decryption side decrypts only these for
#: a study of that strategy (plus direct range counts, which every study may pay for).
STRATEGY_MEASUREMENT_KINDS: dict[str, frozenset[str]] = {
    "gap": frozenset({PrefixDifferences.kind, PartitionSums.kind}),
    "hier": frozenset({PartitionSums.kind}),
    "auto": frozenset({PartitionSums.kind}),
    "dawa": frozenset({PartitionSums.kind}),
    "privelet": frozenset({HaarCoefficients.kind}),
}

#: release()'s default: the best strategy on the DPBench benchmark (benchmarks/accuracy.py).
DEFAULT_STRATEGY = "auto"

_PARAM_TYPES: dict[str, type] = {"gap": GapParams, "hier": HierParams, "dawa": DawaParams,
                                 "privelet": PriveletParams, "auto": AutoParams}


def make_strategy(name: str, domain_size: int, epsilon: float, *, noise_parties: int,
                  contribution_bound: int = 1, params: Any = None) -> Strategy:
    """Instantiate a strategy coroutine by name.

    `params`: None for the strategy's defaults, its params dataclass (e.g. HierParams), or
    a dict of that dataclass's fields.
    """
    if name not in _PARAM_TYPES:
        raise InvalidInputError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    ptype = _PARAM_TYPES[name]
    if params is None:
        p = ptype()
    elif isinstance(params, ptype):
        p = params
    elif isinstance(params, dict):
        try:
            p = ptype(**params)
        except TypeError as exc:
            raise InvalidInputError(f"bad params for strategy {name!r}: {exc}") from exc
    else:
        raise InvalidInputError(
            f"params for strategy {name!r} must be None, a dict or a {ptype.__name__}, got {type(params).__name__}"
        )
    kw = dict(noise_parties=noise_parties, contribution_bound=contribution_bound)
    if name == "gap":
        return gap_strategy(domain_size, epsilon, params=p, **kw)
    if name == "hier":
        return hier_strategy(domain_size, epsilon, params=p, **kw)
    if name == "privelet":
        return privelet_strategy(domain_size, epsilon, params=p, **kw)
    if name == "auto":
        return auto_strategy(domain_size, epsilon, params=p, **kw)
    return dawa_strategy(domain_size, epsilon, params=p, **kw)


def run_strategy(strategy: Strategy, measure: Callable[[Measurement], IntArray]) -> Summary:
    """Drive a strategy: each yielded measurement is measured (noised, decrypted) and sent back."""
    try:
        m = next(strategy)
        while True:
            m = strategy.send(measure(m))
    except StopIteration as stop:
        result: Summary = stop.value
        return result


def release(
    histograms: Sequence[npt.ArrayLike],
    epsilon: float,
    *,
    strategy: str = DEFAULT_STRATEGY,
    backend: str = "plain",
    noise_parties: int = 2,
    rng: RandomSource | int | None = None,
    contribution_bound: int = 1,
    params: Any = None,
    executor: ChunkExecutor | None = None,
) -> Summary:
    """Run the whole protocol in one process: owners -> computation -> decryption.

    Privacy: the summary is `epsilon`-DP under add/remove of one record (one person with
    at most `contribution_bound` records in the combined histograms), from the point of
    view of each server (each one's own noise draw suffices, noise_parties=2) and of
    everyone who sees the release. The computation side sees only ciphertexts; the
    decryption side sees only noised measurements; both noises are discrete Laplace.

    `strategy`: one of STRATEGIES; the default "auto" (least-squares tree chosen from n and
    eps, refined where the released values show empty regions) was the most accurate on the
    DPBench benchmark (benchmarks/accuracy.py). `params`: the strategy's params dataclass or
    a dict of its fields (None: defaults).

    `rng`: None draws from a `CipherRandom` (AES-CTR under a fresh OS key; production). An int seed or a RandomSource makes
    every draw come from it in a fixed order (computation side, then decryption side, per
    measurement), so the plain and BFV backends release the same summary (flooding draws from the OS
    CSPRNG always, but changes no slot value).

    `executor` (BFV only): run the owners' encryption and the computation side's chunk work
    on it (`he_partition.execution`: in-process, local worker processes, Ray), as the
    servers do: each worker encrypts every owner's chunks of its share (the owners are
    simulated there, `SimulatedOwners`: in a deployment each encrypts on its own machine)
    and keeps their sum; per measurement every draw is made here before fan-out and the
    workers add it under a fresh encryption and flood. The decryption side checks each
    chunk as it arrives. The same seed releases the same summary as without an executor.
    """
    hs = validate_histograms(histograms)
    eps = validate_epsilon(epsilon)
    if noise_parties not in (1, 2):
        raise InvalidInputError(f"noise_parties must be 1 or 2, got {noise_parties}")
    if isinstance(contribution_bound, bool) or int(contribution_bound) != contribution_bound or contribution_bound < 1:
        raise InvalidInputError(f"contribution_bound must be an integer >= 1, got {contribution_bound}")
    if strategy not in STRATEGIES:
        raise InvalidInputError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    source = as_random_source(rng)
    n = hs[0].size

    owner_be: VectorBackend
    ds_be: VectorBackend
    if backend == "plain":
        owner_be = ds_be = PlainBackend(DEFAULT_SLOTS)
    elif backend == "bfv":
        from .he.keyholder import generate_backends

        ds_be, owner_be = generate_backends()
    elif backend == "ckks":
        raise InvalidInputError(
            "backend 'ckks' was removed: its decryptions leaked un-noised data to the key holder "
            "(docs/threat-model.md); use backend='bfv' (exact integers, flooded noise)"
        )
    else:
        raise InvalidInputError(f"unknown backend {backend!r}; choose 'plain' or 'bfv'")

    cs = ComputationSide(owner_be, source)
    ds = DecryptionSide(ds_be, source, Budget(eps), noise_parties)
    strat = make_strategy(strategy, n, eps, noise_parties=noise_parties,
                          contribution_bound=int(contribution_bound), params=params)
    if executor is not None:
        if backend != "bfv":
            raise InvalidInputError(f"an executor runs BFV chunk work; backend {backend!r} has none (use backend='bfv')")
        return _release_on(executor, hs, cs, ds, strat)
    aggregate = cs.aggregate(encrypt_histogram(owner_be, h) for h in hs)
    return run_strategy(strat, lambda m: ds.decrypt_measurement(m, cs.measure(aggregate, m)))


def _release_on(executor: ChunkExecutor, hs: Sequence[IntArray], cs: ComputationSide, ds: DecryptionSide,
                strat: Strategy) -> Summary:
    """`release`'s owners, computation side and decryption side with the chunk work on `executor`.

    Privacy: as `release` (the computation side's draws through `ComputationSide.measure_on`,
    the decryption side's through `DecryptionSide.decrypt_measurement`, in the same order as
    without an executor); spends exactly what `release` spends.
    """
    from .he.bfv import BfvBackend, public_context_bytes

    public = cs.backend
    ds_be = ds.backend
    assert isinstance(ds_be, BfvBackend)  # `release` builds the BFV pair before it calls this
    context = public_context_bytes(ds_be.context)
    n = int(hs[0].size)
    owners = SimulatedOwners.of(context, [owner_encoding(h) for h in hs], public.slots)
    key = f"release-{secrets.token_hex(8)}"
    executor.load(key, context, owners, len(owners.indices))

    def measure(m: Measurement) -> IntArray:
        chunks: list[Any] = [None] * len(owners.indices)
        for i, data in cs.measure_on(executor, key, m):
            one: list[Any] = [None] * len(chunks)
            one[i] = chunks[i] = ds_be.deserialize_chunk(data)
            ds_be.verify(ChunkedVector(n, tuple(one)))  # as the DS does: each chunk as it arrives
        return ds.decrypt_measurement(m, ChunkedVector(n, tuple(chunks)), verified=True)

    try:
        return run_strategy(strat, measure)
    finally:
        executor.drop(key)
