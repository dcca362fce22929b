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

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import RandomSource
from he_partition.he.bfv import seal_ciphertext_bytes
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
    """Delta * m_i mod each prime of a level: m_i the batch-encoded plaintext of per-slot `noise`.

    `noise` (at most N integers, any sign, the rest of the slots 0) is reduced mod t, batch-encoded
    by SEAL (slot values -> plaintext coefficients in [0, t)) and scaled by Delta = floor(Q / t),
    Q the product of `moduli` (the ciphertext's level), as SEAL's encryption scales a plaintext.
    Rounding: SEAL encrypts m_d as round(Q m_d / t) = Delta m_d + round((Q mod t) m_d / t), the
    holders add Delta m_i with no correction term, so the combined phase is
    Delta (m_d + sum m_i) + err with |err| <= K t (the missing correction terms, each < t, and the
    Q mod t < t lost on a wrap of the sum past t) ~ 2^50.6 for K = 3, far below the Q / 2t ~ 2^109
    decryption margin: the combined value decodes to (m_d + sum_i noise_i) mod t exactly
    (tests/he_partition/test_threshold_noise.py). Adds no noise itself: the caller's `noise` is the
    holder's DP share (see `decryption_share`).
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
    return np.stack([mulmod(m % np.uint64(q), delta % int(q), int(q)) for q in moduli])


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
            key_fp: bytes) -> npt.NDArray[np.int64]:
    """The BFV plaintext slots of `ciphertext` from every holder's share (n-of-n), as integers mod t.

    Refuses (InvalidInputError, naming the holder) a missing, duplicate, foreign, other-key or
    other-ciphertext share, and a share payload of the wrong size or not reduced mod its prime.
    """
    checked = check_shares([DecryptionShare.from_bytes(s) for s in shares], holders, key_fp, bytes(ciphertext))
    ct, moduli, n = _ciphertext(ctx, ciphertext)
    k = len(moduli)
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    phase = read_u64(ct.dyn_array(), k * n).reshape(k, n)  # part 0
    for share in checked:
        if len(share.payload) != 8 * k * n:
            raise InvalidInputError(f"decryption share of holder {share.holder} has {len(share.payload)} bytes, "
                                    f"expected {8 * k * n}")
        h = np.frombuffer(share.payload, dtype="<u8").reshape(k, n).astype(np.uint64)
        if any(int(h[j].max()) >= m for j, m in enumerate(moduli)):
            raise InvalidInputError(f"decryption share of holder {share.holder} is not reduced modulo its primes")
        phase = (phase + h) % qs  # both < q < 2^61
    # (phase, 0) decrypts to round(t phase / Q) under any key: decode it with SEAL's own decoder.
    raw = seal_ciphertext_bytes(seal_version(ctx), list(ct.parms_id()),
                                np.stack([phase, np.zeros_like(phase)]), ntt=False)
    trivial = load_seal(seal.Ciphertext, ctx, raw, "combined ciphertext")
    sealctx = ctx.seal_context().data
    plain = seal.Plaintext()
    seal.Decryptor(sealctx, seal.KeyGenerator(sealctx).secret_key()).decrypt(trivial, plain)
    return np.array(seal.BatchEncoder(sealctx).decode_uint64(plain), dtype=np.int64)
