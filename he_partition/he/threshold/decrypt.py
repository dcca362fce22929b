"""n-of-n threshold BFV decryption: each holder's share h_i = c1 s_i + e_smudge, and the combine.

Input ciphertexts are SEAL ciphertext bytes (2 parts, coefficient form, any level) encrypted
under the collective key of `threshold.keys`. A share is `threshold.wire.DecryptionShare` bytes,
bound to hash(ciphertext), the holder id and the collective key's fingerprint; its payload is
c1 s_i + e_smudge in coefficient form, residues modulo each prime of the ciphertext's level.

Smudging: e_smudge is exactly uniform on [-2^B, 2^B) (B = 70 default, OS CSPRNG), known only to
the holder. With the data-dependent noise v of a sum of 10 owners' encryptions bounded by
2^17.6 per coefficient, one honest holder's smudge keeps the combiner's view of one ciphertext
within statistical distance N |v| / 2^(B+1) = 2^(13 + 17.6 - 71) ~ 2^-40.4 of a view that
depends on the data only through the plaintext. Decryption stays exact while
K 2^B + 2^61 (the project's flood) + |v| < Q / 2t (K = 3: up to B = 108).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.core.noise import RandomSource
from he_partition.he.bfv import MIN_NOISE_BUDGET_BITS
from he_partition.he.seal_io import seal_ciphertext_bytes
from he_partition.he.rns import residues
from he_partition.he.seal_io import ciphertext_polys, plaintext_coeffs, seal_bytes
from he_partition.he.threshold.c1 import c1_digest, ciphertext_parts
from he_partition.he.threshold.keys import HolderSecret, load_seal, seal_version, secret_plaintext
from he_partition.he.threshold.wire import (SMUDGING_BITS, DecryptionShare, check_shares, ciphertext_digest,
                                            smudging_words)


def _small_mulmod(a: npt.NDArray[np.uint64], b: int, q: int) -> npt.NDArray[np.uint64]:
    """a b mod q, element-wise, for a < 2^26 and 0 <= b < q < 2^62 (exact).

    The quotient floor(a b / q) < 2^26 is estimated in float64 (absolute error below 2^-25, so
    off by at most one), the remainder a b - est q is computed modulo 2^64 in uint64 (the true
    remainder lies in (-q, 2q), inside int64) and corrected into [0, q): `rns.mulmod`'s trick
    with a narrow left factor, which needs no 80-bit floats (about 5x faster here).
    """
    est = np.floor(a.astype(np.float64) * (float(b) / float(q))).astype(np.uint64)
    r = (a * np.uint64(b) - est * np.uint64(q)).view(np.int64)  # wraps mod 2^64: exact
    r = np.where(r < 0, r + np.int64(q), r)
    r = np.where(r >= np.int64(q), r - np.int64(q), r)
    return r.astype(np.uint64)


_PER_CONTEXT: dict[tuple[str, int], tuple[Any, Any]] = {}


def _per_context(ctx: ts.Context, what: str, make: Callable[[Any], Any]) -> Any:
    """`make(seal_context)`, made once per SEAL context (kept with the context alive) and per `what`."""
    sealctx = ctx.seal_context().data
    got = _PER_CONTEXT.get((what, id(sealctx)))
    if got is None or got[0] is not sealctx:
        got = _PER_CONTEXT[(what, id(sealctx))] = (sealctx, make(sealctx))
    return got[1]


def _encoder(ctx: ts.Context) -> Any:
    """SEAL's BatchEncoder for `ctx`'s parameters."""
    return _per_context(ctx, "encoder", seal.BatchEncoder)


def scaled_noise_plaintext(ctx: ts.Context, noise: Sequence[int] | npt.NDArray[np.int64],
                           moduli: Sequence[int]) -> npt.NDArray[np.uint64]:
    """round(Q m_i / t) mod each prime of a level: m_i the batch-encoded plaintext of per-slot `noise`.

    `noise` (at most N integers, any sign, the rest of the slots 0) is reduced mod t, batch-encoded
    by SEAL (slot values -> plaintext coefficients in [0, t)) and scaled exactly as SEAL's encryption
    scales a plaintext: Delta m_i + floor(((Q mod t) m_i + floor((t + 1) / 2)) / t), Delta = floor(Q / t),
    Q the product of `moduli` (the ciphertext's level).
    Why the rounding term matters (privacy, not only correctness): with Delta m_i alone, the combined
    phase's noise polynomial carries -(Q mod t) sum_i m_i / t, up to 2^47.6 per coefficient at these
    parameters (Q mod t ~ 2^46.1), a function of the holders' secret DP shares and pads that only the
    2^70 smudging would hide (statistical distance ~2^-10 per ciphertext). With SEAL's rounding the
    terms cancel against the decoder's round(Q m / t) up to one carry in {-1, 0, 1} per summand (tested
    in tests/he_partition/test_threshold_view.py). The combined value decodes to (m_d + sum_i noise_i)
    mod t exactly (tests/he_partition/test_threshold_noise.py). Adds no noise itself: the caller's
    `noise` is the holder's DP share (see `decryption_share`).

    Arithmetic: m < t < 2^50 is split as m1 2^25 + m0, so every product has a left factor below
    2^26 (`_small_mulmod`); the rounding quotient (< 2^50) is ((Q mod t) m + (t+1)/2 - x) / t with
    x the remainder, computed exactly modulo 2^64 by multiplying with t^-1 mod 2^64 (t is odd).
    """
    sealctx = ctx.seal_context().data
    n = int(sealctx.first_context_data().parms().poly_modulus_degree())
    t = int(sealctx.first_context_data().parms().plain_modulus().value())
    values = np.asarray(noise, dtype=np.int64).reshape(-1)
    if len(values) > n:
        raise InvalidInputError(f"a DP noise share has {len(values)} slots, a ciphertext holds {n}")
    slots = np.zeros(n, dtype=np.int64)
    slots[:len(values)] = values % t  # |noise| < 2^63 and t < 2^50: numpy's mod is exact and non-negative
    plain = seal.Plaintext()
    _encoder(ctx).encode(slots.tolist(), plain)
    m = np.zeros(n, dtype=np.uint64)
    coeffs = plaintext_coeffs(seal_bytes(plain))
    m[:len(coeffs)] = coeffs
    big_q = 1
    for q in moduli:
        big_q *= int(q)
    delta, rem, half = big_q // t, big_q % t, (t + 1) // 2
    m1, m0 = m >> np.uint64(25), m & np.uint64((1 << 25) - 1)
    x = (_small_mulmod(m1, (rem << 25) % t, t) + _small_mulmod(m0, rem, t) + np.uint64(half)) % np.uint64(t)
    with np.errstate(over="ignore"):  # exact modulo 2^64; the true quotient is below 2^50
        fix = (m * np.uint64(rem) + np.uint64(half) - x) * np.uint64(pow(t, -1, 1 << 64))
    out = np.empty((len(moduli), n), dtype=np.uint64)
    for j, q in enumerate(moduli):
        d = delta % int(q)
        v = _small_mulmod(m1, (d << 25) % int(q), int(q)) + _small_mulmod(m0, d, int(q))  # < 2 q < 2^63
        out[j] = (v + fix % np.uint64(q)) % np.uint64(q)
    return out


def padded_noise(dp_slots: Sequence[int] | npt.NDArray[np.int64], measured: Sequence[bool] | npt.NDArray[np.bool_],
                 rng: RandomSource, plain_modulus: int) -> npt.NDArray[np.int64]:
    """A holder's slot noise: its DP share on the `measured` slots, a uniform pad mod t on every other slot.

    Why the pads: the CS pads the slots a measurement does not use so that a single key holder sees
    nothing there, but the CS knows its own pads, so as the combiner of a threshold decryption it
    would read those slots in the clear -- and they carry data (the owners' prefix sums, for a
    partition-sums measurement: tests/he_partition/test_threshold_view.py). Each holder adds its own
    uniform pad there, so the combined unmeasured slots are uniform to the CS and to any coalition
    missing one holder. `dp_slots` (len(measured) values, any sign; the holder's DP share already
    in the measurement's slot encoding, e.g. `Measurement.noise_slots(discrete_laplace_share(...))`,
    or on the leading slots) is kept on the measured slots and ignored elsewhere.
    Privacy: adds no DP noise itself (the caller's share is epsilon = sensitivity / scale for L1
    sensitivity `sensitivity` under add/remove of one person with at most c records, charged by the
    holder); the pads are one-time pads, exactly uniform mod t, one `rng.integers` call for every
    slot whatever the layout. Who knows the noise: only the holder that owns `rng` knows its pads.
    """
    measured_mask = np.asarray(measured, dtype=bool)
    values = np.asarray(dp_slots, dtype=np.int64).reshape(-1)
    if len(values) != len(measured_mask):
        raise InvalidInputError(f"a holder's slot noise has {len(values)} values for {len(measured_mask)} slots")
    pads = np.asarray(rng.integers(plain_modulus, len(measured_mask)), dtype=np.int64)
    return np.where(measured_mask, values % plain_modulus, pads)


def secret_product(ctx: ts.Context, secret: HolderSecret, parms_id: Sequence[int],
                   c1: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """c1 s_i mod each prime of the level `parms_id` (shape (k, N), coefficient form): the secret part of a share.

    Computed inside SEAL (NTT, `multiply_plain` by s_i, inverse NTT: exact) on the ciphertext
    (c1, c1) and read back with numpy (`seal_io.ciphertext_polys`). The same for every
    share of a chunk whose c1 is fixed (the owners' signed aggregate): a holder keeps it per chunk
    (`ThresholdHolder.product`), never outside its own memory. Adds no noise.
    """
    c1 = np.asarray(c1, dtype=np.uint64)
    k = c1.shape[0]
    # (c1, c1): SEAL refuses a product whose second part is zero ("transparent"); part 0 is what is read
    raw = seal_ciphertext_bytes(seal_version(ctx), list(parms_id), np.stack([c1, c1]), ntt=False)
    ct = load_seal(seal.Ciphertext, ctx, raw, "c1 of a ciphertext")
    evaluator = seal.Evaluator(ctx.seal_context().data)
    evaluator.transform_to_ntt_inplace(ct)
    evaluator.multiply_plain_inplace(ct, secret_plaintext(ctx, secret, list(parms_id), k))  # (c1 s_i, c1 s_i)
    evaluator.transform_from_ntt_inplace(ct)
    out: npt.NDArray[np.uint64] = ciphertext_polys(seal_bytes(ct))[2][0]
    return out


def chunk_share(ctx: ts.Context, holder: int, key_fp: bytes, product: npt.NDArray[np.uint64], moduli: Sequence[int],
                bound: bytes, bits: int = SMUDGING_BITS, *, dp_noise: Sequence[int] | npt.NDArray[np.int64] | None = None,
                rng: RandomSource | None = None) -> bytes:
    """Holder `holder`'s share c1 s_i + e_smudge + Delta m_i from its `product` c1 s_i (`secret_product`), bound to `bound`.

    `bound`: the 32-byte digest the share is bound to (`threshold.wire.ciphertext_digest` of the
    ciphertext, or `threshold.c1.c1_digest` of the chunk's signed c1); the combiner refuses a
    share bound to anything else. Noise, privacy and who knows it: as `decryption_share`.
    """
    n = int(np.asarray(product).shape[1])
    hi, lo = smudging_words(n, bits, rng)  # drawn first: independent of everything data-dependent
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    h = (np.asarray(product, dtype=np.uint64) + residues(hi, lo, 62, 1 << bits, moduli)) % qs  # each < q < 2^61
    if dp_noise is not None:
        h = (h + scaled_noise_plaintext(ctx, dp_noise, moduli)) % qs
    return DecryptionShare(holder, key_fp, bound, h.astype("<u8").tobytes()).to_bytes()


def decryption_share(ctx: ts.Context, secret: HolderSecret, key_fp: bytes, ciphertext: bytes,
                     bits: int = SMUDGING_BITS, *, dp_noise: Sequence[int] | npt.NDArray[np.int64] | None = None,
                     rng: RandomSource | None = None, bound_to_c1: bool = False) -> bytes:
    """Holder `secret.holder`'s share of `ciphertext`: c1 s_i + e_smudge + Delta m_i, bound to the ciphertext and key.

    `bound_to_c1`: bound to the ciphertext's c1 (`threshold.c1.c1_digest`) instead, for a ciphertext whose c1
    the holder computed itself (a join value, `he_partition.join.holders`): `combine(..., bound_to_c1=True)`
    then takes the share with that c1 only, whatever c0 the combiner holds.

    `dp_noise`: the holder's share of the DP noise, one integer per measured slot (the first
    len(dp_noise) slots; unmeasured slots get none), typically
    `discrete_laplace_share(scale, K, slots, holder_noise_source(...))`; it is added inside the
    share as the scaled plaintext Delta m_i (`scaled_noise_plaintext`), so the combined
    decryption is data + (CS noise already in the ciphertext) + sum_i dp_noise_i and no party,
    the combiner included, ever sees the data without the holders' noise.
    Privacy: epsilon = sensitivity / scale for a measurement of L1 sensitivity `sensitivity`
    under add/remove of one person with at most c records, when the K holders' shares at
    `scale` sum to one discrete Laplace (`noise_shares.discrete_laplace_share`); the caller
    charges that epsilon (`parties.decryption.keyshare.holder.ThresholdHolder`). Who knows the noise:
    only this holder knows its dp_noise and its smudging; the combiner sees only their sum with
    the other holders' and the data. With `rng` the smudging is drawn from it
    (`keyed_smudging_noise`: a holder's keyed source makes a repeat identical), else from the
    OS CSPRNG.
    """
    parms_id, moduli, parts = ciphertext_parts(ctx, bytes(ciphertext))
    product = secret_product(ctx, secret, parms_id, parts[1])  # c1 s_i: c0 is never read
    bound = c1_digest(parts[1]) if bound_to_c1 else ciphertext_digest(bytes(ciphertext))
    return chunk_share(ctx, secret.holder, key_fp, product, moduli, bound, bits, dp_noise=dp_noise, rng=rng)


def combine(ctx: ts.Context, ciphertext: bytes, shares: Iterable[bytes], holders: Sequence[int],
            key_fp: bytes, *, min_budget: int = MIN_NOISE_BUDGET_BITS, bound_to_c1: bool = False) -> npt.NDArray[np.int64]:
    """The BFV plaintext slots of `ciphertext` from every holder's share (n-of-n), as integers mod t.

    Refuses (`ShareCombineError`, an InvalidInputError, naming the holder or the problem) a
    missing, duplicate, foreign, other-key or other-ciphertext share, a share payload of the wrong
    size or level or not reduced mod its prime, and -- the integrity check the single key holder
    makes (after its charge; docs/threshold.md section 3 step 3), made here because no holder can
    measure a noise budget alone -- a combined value whose invariant noise budget is below
    `min_budget` bits (default `bfv.MIN_NOISE_BUDGET_BITS` = 20; an honest K = 3 combine with
    B = 70 smudging has ~38): a share made with another secret or relabelled as another holder's,
    or a ciphertext not under the collective key, decodes to noise and is refused, never returned.
    `bound_to_c1`: the shares are bound to the ciphertext's c1 (`threshold.c1.c1_digest`: the
    holders' shares of a measurement chunk, computed on the owners' signed c1) rather than to
    the whole ciphertext. Holds no secret, adds no noise.
    """
    parms_id, moduli, parts = ciphertext_parts(ctx, bytes(ciphertext))
    got = [DecryptionShare.from_bytes(s) for s in shares]
    checked = check_shares(got, holders, key_fp, bound=c1_digest(parts[1])) if bound_to_c1 else \
        check_shares(got, holders, key_fp, bytes(ciphertext))
    phase = combined_phase(parts[0], checked, moduli)
    plain, budget = decode_phase(ctx, parms_id, phase)
    if budget < min_budget:
        raise ShareCombineError(f"the combined decryption has {budget} bits of noise budget (< {min_budget}): a share "
                                "was made with another secret or for another holder, or the ciphertext is not under "
                                "the collective key or is corrupt; nothing is returned")
    return np.array(_encoder(ctx).decode_uint64(plain), dtype=np.int64)


def decode_phase(ctx: ts.Context, parms_id: Sequence[int], phase: npt.NDArray[np.uint64]) -> tuple[Any, int]:
    """(SEAL Plaintext round(t phase / Q), invariant noise budget in bits) of a phase at level `parms_id`.

    The trivial ciphertext (phase, 0) decrypts to the same plaintext under any key, so SEAL's own
    decryptor (with a throw-away key, made once per context) decodes it and measures its budget.
    Holds no secret.
    """
    raw = seal_ciphertext_bytes(seal_version(ctx), list(parms_id), np.stack([phase, np.zeros_like(phase)]), ntt=False)
    trivial = load_seal(seal.Ciphertext, ctx, raw, "combined ciphertext")
    decryptor = _per_context(ctx, "throw-away decryptor",
                             lambda sealctx: seal.Decryptor(sealctx, seal.KeyGenerator(sealctx).secret_key()))
    plain = seal.Plaintext()
    decryptor.decrypt(trivial, plain)
    return plain, int(decryptor.invariant_noise_budget(trivial))


def combined_phase(c0: npt.NDArray[np.uint64], shares: Sequence[DecryptionShare],
                   moduli: Sequence[int]) -> npt.NDArray[np.uint64]:
    """c0 + sum_i h_i mod each prime (shape (k, N)): the combiner's whole view of one ciphertext.

    Checks each payload's size (naming the share's level when it has another prime count) and
    reduction; holds no secret and adds no noise.
    """
    k, n = len(moduli), int(c0.shape[1])
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    phase = np.asarray(c0, dtype=np.uint64)
    for share in shares:
        if len(share.payload) != 8 * k * n:
            levels = f" (a share at a level with {len(share.payload) // (8 * n)} primes)" \
                if len(share.payload) % (8 * n) == 0 else ""
            raise ShareCombineError(f"decryption share of holder {share.holder} has {len(share.payload)} bytes"
                                    f"{levels}, expected {8 * k * n} for a ciphertext at a level with {k} primes")
        h = np.frombuffer(share.payload, dtype="<u8").reshape(k, n).astype(np.uint64)
        if bool((h >= qs).any()):
            raise ShareCombineError(f"decryption share of holder {share.holder} is not reduced modulo its primes")
        phase = (phase + h) % qs  # both < q < 2^61
    return phase
