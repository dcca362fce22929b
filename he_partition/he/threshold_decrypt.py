"""n-of-n threshold BFV decryption: each holder's share h_i = c1 s_i + e_smudge, and the combine.

Input ciphertexts are SEAL ciphertext bytes (2 parts, coefficient form, any level) encrypted
under the collective key of `threshold_keys`. A share is `threshold_wire.DecryptionShare` bytes,
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

from typing import Any, Iterable, Sequence

import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.core.noise import RandomSource
from he_partition.he.bfv import MIN_NOISE_BUDGET_BITS, seal_ciphertext_bytes
from he_partition.he.rns import mulmod, residues
from he_partition.he.threshold_keys import HolderSecret, load_seal, read_u64, seal_version, secret_plaintext
from he_partition.he.threshold_wire import (SMUDGING_BITS, DecryptionShare, check_shares, ciphertext_digest,
                                            smudging_words)


def _ciphertext(ctx: ts.Context, data: bytes) -> tuple[Any, list[int], int]:
    ct = load_seal(seal.Ciphertext, ctx, bytes(data), "ciphertext")
    if ct.size() != 2 or ct.is_ntt_form():
        raise InvalidInputError(f"threshold decryption needs a 2-part coefficient-form ciphertext, got {ct.size()} "
                                f"parts{' in NTT form' if ct.is_ntt_form() else ''}")
    level = ctx.seal_context().data.get_context_data(ct.parms_id())
    return ct, [int(m.value()) for m in level.parms().coeff_modulus()], int(ct.poly_modulus_degree())


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
    seal.BatchEncoder(sealctx).encode(slots.tolist(), plain)
    m = np.zeros(n, dtype=np.uint64)
    count = int(plain.coeff_count())
    m[:count] = read_u64(plain.dyn_array(), count)
    big_q = 1
    for q in moduli:
        big_q *= int(q)
    delta = big_q // t
    # SEAL's rounding term: < Q mod t < t < 2^50 (exact in Python integers: the product reaches 2^99)
    fix = np.array(((m.astype(object) * (big_q % t) + (t + 1) // 2) // t).tolist(), dtype=np.uint64)
    return np.stack([(mulmod(m % np.uint64(q), delta % int(q), int(q)) + fix % np.uint64(q)) % np.uint64(q)
                     for q in moduli])


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


def decryption_share(ctx: ts.Context, secret: HolderSecret, key_fp: bytes, ciphertext: bytes,
                     bits: int = SMUDGING_BITS, *, dp_noise: Sequence[int] | npt.NDArray[np.int64] | None = None,
                     rng: RandomSource | None = None) -> bytes:
    """Holder `secret.holder`'s share of `ciphertext`: c1 s_i + e_smudge + Delta m_i, bound to the ciphertext and key.

    `dp_noise`: the holder's share of the DP noise, one integer per measured slot (the first
    len(dp_noise) slots; unmeasured slots get none), typically
    `discrete_laplace_share(scale, K, slots, holder_noise_source(...))`; it is added inside the
    share as the scaled plaintext Delta m_i (`scaled_noise_plaintext`), so the combined
    decryption is data + (CS noise already in the ciphertext) + sum_i dp_noise_i and no party,
    the combiner included, ever sees the data without the holders' noise.
    Privacy: epsilon = sensitivity / scale for a measurement of L1 sensitivity `sensitivity`
    under add/remove of one person with at most c records, when the K holders' shares at
    `scale` sum to one discrete Laplace (`noise_shares.discrete_laplace_share`); the caller
    charges that epsilon (`parties.decryption.keyshare.ThresholdHolder`). Who knows the noise:
    only this holder knows its dp_noise and its smudging; the combiner sees only their sum with
    the other holders' and the data. With `rng` the smudging is drawn from it
    (`keyed_smudging_noise`: a holder's keyed source makes a repeat identical), else from the
    OS CSPRNG.
    """
    ct, moduli, n = _ciphertext(ctx, ciphertext)
    k = len(moduli)
    hi, lo = smudging_words(n, bits, rng)  # drawn before anything data-dependent is read
    evaluator = seal.Evaluator(ctx.seal_context().data)
    evaluator.transform_to_ntt_inplace(ct)
    evaluator.multiply_plain_inplace(ct, secret_plaintext(ctx, secret, list(ct.parms_id()), k))  # (c0 s_i, c1 s_i)
    evaluator.transform_from_ntt_inplace(ct)
    h = read_u64(ct.dyn_array(), k * n, start=k * n).reshape(k, n)  # c1 s_i: the only polynomial read
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    h = (h + residues(hi, lo, 62, 1 << bits, moduli)) % qs  # each term < q < 2^61: no overflow
    if dp_noise is not None:
        h = (h + scaled_noise_plaintext(ctx, dp_noise, moduli)) % qs
    return DecryptionShare(secret.holder, key_fp, ciphertext_digest(bytes(ciphertext)),
                           h.astype("<u8").tobytes()).to_bytes()


def combine(ctx: ts.Context, ciphertext: bytes, shares: Iterable[bytes], holders: Sequence[int],
            key_fp: bytes, *, min_budget: int = MIN_NOISE_BUDGET_BITS) -> npt.NDArray[np.int64]:
    """The BFV plaintext slots of `ciphertext` from every holder's share (n-of-n), as integers mod t.

    Refuses (`ShareCombineError`, an InvalidInputError, naming the holder or the problem) a
    missing, duplicate, foreign, other-key or other-ciphertext share, a share payload of the wrong
    size or level or not reduced mod its prime, and -- the integrity check the single key holder
    makes before it charges (docs/threshold.md section 3 step 3), made here because no holder can
    measure a noise budget alone -- a combined value whose invariant noise budget is below
    `min_budget` bits (default `bfv.MIN_NOISE_BUDGET_BITS` = 20; an honest K = 3 combine with
    B = 70 smudging has ~38): a share made with another secret or relabelled as another holder's,
    or a ciphertext not under the collective key, decodes to noise and is refused, never returned.
    """
    ct, moduli, n = _ciphertext(ctx, ciphertext)
    checked = check_shares([DecryptionShare.from_bytes(s) for s in shares], holders, key_fp, bytes(ciphertext))
    phase = combined_phase(ct, checked, moduli, n)
    plain, budget = decode_phase(ctx, list(ct.parms_id()), phase)
    if budget < min_budget:
        raise ShareCombineError(f"the combined decryption has {budget} bits of noise budget (< {min_budget}): a share "
                                "was made with another secret or for another holder, or the ciphertext is not under "
                                "the collective key or is corrupt; nothing is returned")
    return np.array(seal.BatchEncoder(ctx.seal_context().data).decode_uint64(plain), dtype=np.int64)


def decode_phase(ctx: ts.Context, parms_id: Sequence[int], phase: npt.NDArray[np.uint64]) -> tuple[Any, int]:
    """(SEAL Plaintext round(t phase / Q), invariant noise budget in bits) of a phase at level `parms_id`.

    The trivial ciphertext (phase, 0) decrypts to the same plaintext under any key, so SEAL's own
    decryptor (with a throw-away key) decodes it and measures its budget. Holds no secret.
    """
    raw = seal_ciphertext_bytes(seal_version(ctx), list(parms_id), np.stack([phase, np.zeros_like(phase)]), ntt=False)
    trivial = load_seal(seal.Ciphertext, ctx, raw, "combined ciphertext")
    sealctx = ctx.seal_context().data
    decryptor = seal.Decryptor(sealctx, seal.KeyGenerator(sealctx).secret_key())
    plain = seal.Plaintext()
    decryptor.decrypt(trivial, plain)
    return plain, int(decryptor.invariant_noise_budget(trivial))


def combined_phase(ct: Any, shares: Sequence[DecryptionShare], moduli: Sequence[int],
                   n: int) -> npt.NDArray[np.uint64]:
    """c0 + sum_i h_i mod each prime (shape (k, N)): the combiner's whole view of one ciphertext.

    Checks each payload's size (naming the share's level when it has another prime count) and
    reduction; holds no secret and adds no noise.
    """
    k = len(moduli)
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    phase = read_u64(ct.dyn_array(), k * n).reshape(k, n)  # part 0
    for share in shares:
        if len(share.payload) != 8 * k * n:
            levels = f" (a share at a level with {len(share.payload) // (8 * n)} primes)" \
                if len(share.payload) % (8 * n) == 0 else ""
            raise ShareCombineError(f"decryption share of holder {share.holder} has {len(share.payload)} bytes"
                                    f"{levels}, expected {8 * k * n} for a ciphertext at a level with {k} primes")
        h = np.frombuffer(share.payload, dtype="<u8").reshape(k, n).astype(np.uint64)
        if any(int(h[j].max()) >= m for j, m in enumerate(moduli)):
            raise ShareCombineError(f"decryption share of holder {share.holder} is not reduced modulo its primes")
        phase = (phase + h) % qs  # both < q < 2^61
    return phase
