"""A reusable attacker on the views of n-of-n threshold decryption: a test double, not a mock.

It runs the real scheme (collective key, TenSEAL owners, the real `ComputationSide` measurement,
real holder shares with their DP shares and smudging, the real combine arithmetic) and gives an
attacker the view a party has, with everything that party knows subtracted:

- `share_view`: one holder's share h_0 with the public ciphertext (c0, c1) -- the view of
  anyone holding a share, the CS relaying it included;
- `combined_view`: the CS as combiner: c0 + sum_i h_i, with its own flood removed (it drew the
  flood, so flooding never protects against it; the scenario runs the CS with flooding off,
  which is the same view) and its own DP draw and pads known;
- `coalition_view`: the CS with holders 1..K-1 against the honest holder 0: c0 + c1 (s_1 + ...)
  + h_0, with the coalition's own DP shares known.

Distinguishers: a measured-value threshold test (the best test on one DP value: how often the
attacker's guess between neighbouring datasets is right), the residue-prediction attack of
tests/he_partition/test_keyholder.py on the residual noise polynomial, a nearest-mean classifier
on any feature vector, and the residual's distribution (KS against the smudging's). The broken
variants (`bits=1`: no smudging; `dp=False`: no holder DP share; `pads=False`: no holder pads) are what the tests check the
distinguishers against, so they can fail.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import tenseal.sealapi as seal

from he_partition.core.measurements import Measurement
from he_partition.core.noise import KeyedRandom, SeededRandom
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.bfv import BfvBackend
from he_partition.he.threshold.context import collective_context, vector_ciphertext
from he_partition.he.threshold.decrypt import decode_phase, decryption_share, padded_noise
from he_partition.he.threshold.keys import load_seal, read_u64
from he_partition.he.threshold.wire import DecryptionShare
from he_partition.protocol import ComputationSide, encrypt_histogram

N = 8192


@dataclass
class View:
    """What a party holds for one ciphertext: a phase polynomial (RNS) and what it knows about it."""

    phase: npt.NDArray[np.uint64]  # (k, N) residues
    parms_id: list[int]
    moduli: list[int]
    eta: npt.NDArray[np.int64]  # the CS's own DP draw (known to the CS)
    pads: npt.NDArray[np.int64]  # the CS's slot noise (eta-encoding and pads), known to the CS
    c1: npt.NDArray[np.uint64]
    c0: npt.NDArray[np.uint64]


class ThresholdScenario:
    """K holders on one collective key (tests/he_partition/test_threshold.make_setup), one measurement per trial."""

    def __init__(self, setup: dict[str, Any], measurement: Measurement, *, bits: int = 70, dp: bool = True,
                 pads: bool | None = None, holders: Sequence[int] = (0, 1, 2),
                 secrets: Mapping[int, Any] | None = None) -> None:
        """`holders`: the holders whose shares combine; `secrets` (default the setup's s_i): what each multiplies
        c1 by, e.g. a t-of-N participant's lambda_j S_j (`threshold.shamir.participant_secret`)."""
        self.s, self.m, self.bits, self.dp, self.holders = setup, measurement, bits, dp, list(holders)
        self.secrets = dict(secrets) if secrets is not None else setup["secrets"]
        self.pads = dp if pads is None else pads
        self.ctx = setup["ctx"]
        self.public = BfvBackend(collective_context(self.ctx, setup["pk"]))
        self.public.flooding = False  # the CS knows its flood: subtracting it gives this view exactly
        self.t = self.public.plain_modulus

    def holder_noise(self, holder: int, trial: int) -> npt.NDArray[np.int64] | None:
        """Holder `holder`'s slot noise: its DP share in the measurement's own slot encoding and its pads on the
        unmeasured slots (`threshold.decrypt.padded_noise`); the broken variants drop either or both (None)."""
        if not self.dp and not self.pads:
            return None
        d = discrete_laplace_share(Fraction(self.m.scale), len(self.holders), self.m.count,
                                   holder_noise_source(b"view-test-noise-key-%d" % holder, holder,
                                                       max(len(self.holders), max(self.holders) + 1),
                                                       b"trial-%d" % trial)) * int(self.dp)
        measured = self.m.measured_slots()
        if not self.pads:
            return np.asarray(self.m.noise_slots(d, self.t), dtype=np.int64)
        return padded_noise(self.m.noise_slots(d, self.t), np.ones(N, dtype=bool) if measured is None else measured,
                            KeyedRandom(b"view-test-pads-key-%d" % holder, b"trial-%d" % trial), self.t)

    def run(self, x: npt.NDArray[np.int64], trial: int) -> tuple[bytes, dict[int, bytes], View]:
        agg = encrypt_histogram(self.public, x)
        chunk = ComputationSide(self.public, SeededRandom(5000 + trial)).measure(agg, self.m).chunks[0]
        ct = vector_ciphertext(bytes(chunk.serialize()))
        rng = SeededRandom(5000 + trial)
        eta = self.m.computation_noise(rng)
        slot_noise = ComputationSide(self.public, SeededRandom(5000 + trial)).slot_noise(self.m)
        shares = {h: decryption_share(self.ctx, self.secrets[h], self.s["fp"], ct, self.bits,
                                      dp_noise=self.holder_noise(h, trial),
                                      rng=KeyedRandom(b"view-test-smudge-key-%d" % h, b"trial-%d" % trial))
                  for h in self.holders}
        c = load_seal(seal.Ciphertext, self.ctx, ct, "ciphertext")
        sealctx = self.ctx.seal_context().data
        moduli = [int(q.value()) for q in sealctx.get_context_data(c.parms_id()).parms().coeff_modulus()]
        k = len(moduli)
        polys = read_u64(c.dyn_array(), 2 * k * N).reshape(2, k, N)
        view = View(np.zeros((k, N), dtype=np.uint64), list(c.parms_id()), moduli, eta, slot_noise, polys[1], polys[0])
        return ct, shares, view

    def payload(self, share: bytes) -> npt.NDArray[np.uint64]:
        k = len(self.public.context.seal_context().data.first_context_data().parms().coeff_modulus())
        return np.frombuffer(DecryptionShare.from_bytes(share).payload, dtype="<u8").reshape(k, N).astype(np.uint64)

    def combined_view(self, x: npt.NDArray[np.int64], trial: int) -> View:
        """The CS's view: c0 + sum_i h_i."""
        _, shares, view = self.run(x, trial)
        qs = np.array(view.moduli, dtype=np.uint64)[:, None]
        phase = view.c0.copy()
        for raw in shares.values():
            phase = (phase + self.payload(raw)) % qs
        view.phase = phase
        return view

    def coalition_view(self, x: npt.NDArray[np.int64], trial: int, honest: int = 0) -> tuple[View, list[Any]]:
        """The CS with every holder but `honest`: c0 + c1 sum_{j != honest} s_j + h_honest, and the coalition's DP shares."""
        ct, shares, view = self.run(x, trial)
        qs = np.array(view.moduli, dtype=np.uint64)[:, None]
        phase = (view.c0 + self.payload(shares[honest])) % qs
        known = []
        for h in self.holders:
            if h != honest:  # c1 s_h, computed with the coalition's own secret (smudging of 2 bits: exact up to +-2)
                phase = (phase + self.payload(decryption_share(self.ctx, self.secrets[h], self.s["fp"], ct, 1))) % qs
                known.append(self.holder_noise(h, trial))
        view.phase = phase
        return view, known

    def share_view(self, x: npt.NDArray[np.int64], trial: int, holder: int = 0) -> tuple[View, npt.NDArray[np.uint64]]:
        """(the public ciphertext, holder `holder`'s share payload h_i)."""
        _, shares, view = self.run(x, trial)
        return view, self.payload(shares[holder])


def decode(ctx: Any, view: View) -> tuple[npt.NDArray[np.int64], list[int]]:
    """(slot values, plaintext coefficients) of a view's phase: what its holder decodes."""
    plain, _ = decode_phase(ctx, view.parms_id, view.phase)
    sealctx = ctx.seal_context().data
    slots = np.array(seal.BatchEncoder(sealctx).decode_uint64(plain), dtype=np.int64)
    count = int(plain.coeff_count())
    coeffs = [int(plain[i]) for i in range(count)] + [0] * (N - count)
    return slots, coeffs


def residual(view: View, coeffs: Sequence[int], t: int) -> npt.NDArray[np.float64]:
    """The phase minus round(Q m / t), centred, per coefficient (exact integers, returned as floats)."""
    big_q = 1
    for q in view.moduli:
        big_q *= q
    phase = [0] * N
    for j, q in enumerate(view.moduli):
        basis = (big_q // q) * pow(big_q // q, -1, q)
        row = view.phase[j].tolist()
        for i in range(N):
            phase[i] += row[i] * basis
    half = big_q // 2
    out = np.empty(N, dtype=np.float64)
    for i in range(N):
        v = (phase[i] - (big_q * coeffs[i] + t // 2) // t) % big_q
        out[i] = float(v - big_q if v > half else v)
    return out


def measured_value_guess(observed: float, value_a: float, value_b: float) -> bool:
    """The best test on one value with symmetric noise: guess A when `observed` is nearer A's true value."""
    return abs(observed - value_a) < abs(observed - value_b) or \
        (abs(observed - value_a) == abs(observed - value_b) and bool(np.random.default_rng(int(observed) & 0xFFFF)
                                                                      .integers(2)))


def nearest_mean(train_a: Sequence[npt.NDArray[np.float64]], train_b: Sequence[npt.NDArray[np.float64]],
                 test: npt.NDArray[np.float64]) -> bool:
    """Guess A when `test` is nearer (L2) the mean of the A training views than of the B ones."""
    ma, mb = np.mean(train_a, axis=0), np.mean(train_b, axis=0)
    return float(np.sum((test - ma) ** 2)) < float(np.sum((test - mb) ** 2))


def chance_limit(trials: int, p: float, false_alarm: float = 1e-6) -> int:
    """The smallest c with P(Binomial(trials, p) > c) <= false_alarm: above it the attacker beats the bound p."""
    from scipy import stats

    return int(stats.binom.isf(false_alarm, trials, p))


def crafted_ciphertext(ctx: Any, seed: int = 1) -> tuple[bytes, int]:
    """(a ciphertext a deviating CS builds, c1 = floor(Delta / 3) as a constant polynomial; Delta = floor(Q / t)).

    c0 is uniform; nothing about it is a measurement. A holder that issues a share of it gives
    h = floor(Delta / 3) s_i + E_i + round(Q m_i / t): reduced mod Delta, the DP share and pads
    (multiples of Delta up to a rounding term < 2^47) vanish and floor(Delta / 3) s_i (about 2^109
    per unit of s_i) stands far above the 2^70 smudging.
    """
    from he_partition.he.bfv import seal_ciphertext_bytes
    from he_partition.he.threshold.keys import seal_version

    sealctx = ctx.seal_context().data
    data = sealctx.first_context_data()
    moduli = [int(q.value()) for q in data.parms().coeff_modulus()]
    big_q = int(np.prod(np.array(moduli, dtype=object)))
    t = int(data.parms().plain_modulus().value())
    c1 = (big_q // t) // 3
    polys = np.zeros((2, len(moduli), N), dtype=np.uint64)
    rng = np.random.default_rng(seed)
    for j, q in enumerate(moduli):
        polys[0, j] = rng.integers(0, q, N, dtype=np.uint64)
        polys[1, j, 0] = c1 % q
    return seal_ciphertext_bytes(seal_version(ctx), list(data.parms_id()), polys, ntt=False), c1


def secret_from_crafted_share(ctx: Any, payload: npt.NDArray[np.uint64], c1: int) -> list[int]:
    """The attacker's estimate of s_i (coefficients in {-1, 0, 1}) from a share of `crafted_ciphertext`."""
    data = ctx.seal_context().data.first_context_data()
    moduli = [int(q.value()) for q in data.parms().coeff_modulus()]
    big_q = int(np.prod(np.array(moduli, dtype=object)))
    delta = big_q // int(data.parms().plain_modulus().value())
    composed = [0] * N
    for j, q in enumerate(moduli):
        basis = (big_q // q) * pow(big_q // q, -1, q)
        for i, v in enumerate(payload[j].tolist()):
            composed[i] += v * basis
    out = []
    for v in composed:
        r = (v % big_q) % delta
        out.append(min((abs((r - k * c1 + delta // 2) % delta - delta // 2), k) for k in (-1, 0, 1))[1])
    return out


def secret_coefficients(ctx: Any, secret: Any) -> list[int]:
    """A holder's s_i in coefficient form, centred (what the attacker is after; for checking its estimate)."""
    from he_partition.he.bfv import seal_ciphertext_bytes
    from he_partition.he.threshold.keys import seal_version

    sealctx = ctx.seal_context().data
    data = sealctx.first_context_data()
    k = len(data.parms().coeff_modulus())
    q0 = int(data.parms().coeff_modulus()[0].value())
    polys = np.stack([secret.s_ntt[:k], secret.s_ntt[:k]]).astype(np.uint64)
    ct = load_seal(seal.Ciphertext, ctx, seal_ciphertext_bytes(seal_version(ctx), list(data.parms_id()), polys,
                                                               ntt=True), "secret")
    seal.Evaluator(sealctx).transform_from_ntt_inplace(ct)
    row = read_u64(ct.dyn_array(), N).tolist()
    return [int(x) if x < q0 // 2 else int(x) - q0 for x in row]
