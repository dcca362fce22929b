"""Collective relinearization keys for n-of-n threshold BFV: the two-round RKG of Mouchet et al. (PETS 2021).

A SEAL relinearization key is a key-switching key from s^2 to s: for each data prime q_j of the
key level (the decomposition, d = k - 1 components) a pair (b_j, a_j) in NTT form with
b_j = -(a_j s) + e_j + [P s^2]_j, where [x]_j = x w_j is x times the gadget element w_j that is
P mod q_j in RNS row j and 0 in every other row, the special prime P's included (what SEAL's
`create_relin_keys` makes; `threshold.galois` has the same layout for s(X^g)). s^2 is not linear in
the holders' s_i, so the key takes two rounds over a common a_j (from the setup seed, tag
`relin/<j>`, `relin_tag`):

- round 1 (`RelinRoundOne`, `relin_round_one`): holder i draws an ephemeral ternary u_i (a fresh
  SEAL secret key) and publishes per j (h0_i, h1_i) = (-(u_i a_j) + s_i w_j + e0_i, s_i a_j + e1_i);
  everyone sums the revealed parts to (h0, h1) = (-(u a_j) + s w_j + e0, s a_j + e1) itself
  (`round_one_sum`, after the commitment checks: nobody takes a relayed sum on trust);
- round 2 (`relin_round_two`): holder i publishes per j h'_i = s_i h0 + (u_i - s_i) h1 + e2_i, the
  sum of the paper's two round-2 parts (the key only uses their sum, so the holder sends one
  polynomial per j: half the bytes and no more than the pair reveals);
- the key (`collective_relin_keys`): (b_j, a_j) = (sum_i h'_i, h1), and
  b_j + h1 s = s^2 w_j + s e0 + u e1 + e2, a key for s^2 whose error s e0 + u e1 + e2 (u = sum u_i)
  has coefficients up to about K sqrt(N) times one SEAL key's: measured in `benchmarks/threshold_relin.py`
  (docs/threshold.md section 8), far below the product noise a join relinearizes.

Both rounds are commit-then-reveal (`threshold.wire.key_share_commitment` over the share bytes,
which name the holder and the round): no holder picks its part after seeing the others'. What is
not checked: that a committed part is well formed (over the common a_j, with small errors, with the
holder's own s_i). There is no proof of it; a malformed part makes a key that does not relinearize,
which the closing test product's combined decryption refuses (its noise budget), as for Galois keys.

The ephemeral u_i and the errors come from SEAL's KeyGenerator (its CSPRNG and its error
distribution, as SEAL's own keys): u_i is a fresh SEAL secret key; each error is e = b + a' x of a
fresh SEAL public key (b, a') = (-(a' x) + e, a') under a known x. u_i lives in the holder's memory
between its two rounds only and serves one round 2 (`RelinRoundOne.take_ephemeral`).
Adds no DP noise and spends no budget.
"""
from __future__ import annotations

import struct
import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError
from he_partition.he.rns import mulmod
from he_partition.he.seal_io import ciphertext_polys, plaintext_coeffs, seal_bytes, seal_ciphertext_bytes
from he_partition.he.threshold.keys import HolderSecret, key_moduli, load_seal, seal_version
from he_partition.he.threshold.wire import common_polynomial, verify_reveals

__all__ = ["RelinRoundOne", "relin_tag", "relin_round_one", "round_one_sum", "relin_round_two",
           "collective_relin_keys", "join_context"]

U64 = npt.NDArray[np.uint64]
_ROUND_ONE, _ROUND_TWO = b"DPTR1", b"DPTR2"


def relin_tag(index: int) -> bytes:
    """The `common_polynomial` domain tag of the relinearization key's decomposition component `index`."""
    return b"relin/" + struct.pack(">I", index)


def join_context(version: int) -> ts.Context:
    """A TenSEAL BFV context with join scheme `version`'s parameters (the same SEAL parms_id as `JoinScheme`'s).

    The threshold functions take a TenSEAL context; the join's collective key, Galois and relinearization
    keys are made on this one and load into the join scheme's SEAL context unchanged."""
    from he_partition.he.join_scheme import JoinParams, join_plain_modulus

    params = JoinParams.for_version(version)
    return ts.context(ts.SCHEME_TYPE.BFV, poly_modulus_degree=params.poly_modulus_degree,
                      plain_modulus=join_plain_modulus(version), coeff_mod_bit_sizes=list(params.coeff_modulus_bits))


def _shape(ctx: ts.Context) -> tuple[list[int], int, int]:
    moduli = key_moduli(ctx)
    n = int(ctx.seal_context().data.key_context_data().parms().poly_modulus_degree())
    return moduli, len(moduli) - 1, n


def _mul(x: U64, y: U64, moduli: list[int]) -> U64:
    return np.stack([mulmod(x[r], y[r], q) for r, q in enumerate(moduli)])


def _qs(moduli: list[int]) -> U64:
    return np.array(moduli, dtype=np.uint64)[:, None]


def _common(ctx: ts.Context, seed: bytes, index: int) -> U64:
    moduli, _, n = _shape(ctx)
    return np.array(common_polynomial(seed, moduli, n, tag=relin_tag(index)), dtype=np.uint64)


class _Sampler:
    """SEAL's ternary secret and errors in NTT form at the key level, from one fresh KeyGenerator."""

    def __init__(self, ctx: ts.Context) -> None:
        self.moduli, _, self.n = _shape(ctx)
        self.gen = seal.KeyGenerator(ctx.seal_context().data)
        self.secret = plaintext_coeffs(seal_bytes(self.gen.secret_key())).reshape(len(self.moduli), self.n)

    def error(self) -> U64:
        """e of a fresh public key (-(a' x) + e, a') under the generator's secret x: b + a' x, NTT form."""
        pk = seal.PublicKey()
        self.gen.create_public_key(pk)
        _, _, polys = ciphertext_polys(seal_bytes(pk))
        e: U64 = (polys[0] + _mul(polys[1], self.secret, self.moduli)) % _qs(self.moduli)
        return e


def _gadget(s: U64, index: int, moduli: list[int]) -> U64:
    """s w_index: (P mod q_index) s in RNS row `index`, 0 in every other row (SEAL's key-switching gadget)."""
    out = np.zeros_like(s)
    q = moduli[index]
    out[index] = mulmod(s[index], moduli[-1] % q, q)
    return out


def _pack(magic: bytes, holder: int, parts: U64) -> bytes:
    return magic + struct.pack(">B4I", holder, *parts.shape) + np.ascontiguousarray(parts, dtype="<u8").tobytes()


def _unpack(ctx: ts.Context, magic: bytes, data: bytes, what: str, per_component: int) -> tuple[int, U64]:
    """(holder, parts of shape (d, per_component, k, N)) of a round's share bytes, checked: magic, shape, size, range."""
    moduli, d, n = _shape(ctx)
    want = (d, per_component, len(moduli), n)
    head = len(magic) + 17
    if not isinstance(data, (bytes, bytearray)) or len(data) < head or not bytes(data).startswith(magic):
        raise InvalidInputError(f"not a {what} (wrong magic bytes or too short)")
    holder, *shape = struct.unpack(">B4I", data[len(magic):head])
    if tuple(shape) != want or len(data) != head + 8 * int(np.prod(want)):
        raise InvalidInputError(f"{what} of holder {holder} has shape {tuple(shape)} and {len(data)} bytes, expected "
                                f"{want} and {head + 8 * int(np.prod(want))}")
    parts = np.frombuffer(bytes(data), dtype="<u8", offset=head).reshape(want).astype(np.uint64)
    if any(int(parts[:, :, r].max()) >= q for r, q in enumerate(moduli)):
        raise InvalidInputError(f"{what} of holder {holder} has a coefficient not reduced modulo its prime")
    return holder, parts


def _summed(ctx: ts.Context, seed: bytes, commitments: dict[int, bytes], reveals: dict[int, bytes], magic: bytes,
            what: str, per_component: int) -> U64:
    """The sum of every holder's revealed parts, after the reveal checks (refusals name the holder)."""
    verify_reveals(seed, commitments, reveals)
    moduli = key_moduli(ctx)
    total: U64 | None = None
    for holder in sorted(reveals):
        embedded, parts = _unpack(ctx, magic, reveals[holder], what, per_component)
        if embedded != holder:
            raise InvalidInputError(f"{what} revealed as holder {holder} names holder {embedded}")
        total = parts if total is None else (total + parts) % _qs(moduli)  # both < q < 2^61
    assert total is not None
    return total


class RelinRoundOne:
    """Holder `holder`'s round-1 state: its public part (`share`) and its ephemeral u_i, kept for one round 2."""

    def __init__(self, holder: int, share: bytes, ephemeral: U64) -> None:
        self.holder, self.share = int(holder), share
        self._ephemeral: U64 | None = ephemeral

    def take_ephemeral(self) -> U64:
        """u_i, once: a second round 2 from the same round 1 is refused (InvalidInputError)."""
        if self._ephemeral is None:
            raise InvalidInputError(f"holder {self.holder}'s relinearization round 1 was already used for a round 2")
        u, self._ephemeral = self._ephemeral, None
        return u


def relin_round_one(ctx: ts.Context, secret: HolderSecret, seed: bytes) -> RelinRoundOne:
    """Holder `secret.holder`'s round-1 part: per j, (-(u_i a_j) + s_i w_j + e0, s_i a_j + e1) over the common a_j.

    Publish `key_share_commitment(holder, seed, state.share)` first and `state.share` only once every
    holder's commitment is in. Keep the returned state (u_i) in memory for `relin_round_two`.
    """
    moduli, d, n = _shape(ctx)
    s = np.asarray(secret.s_ntt, dtype=np.uint64)
    if s.shape != (len(moduli), n):
        raise InvalidInputError(f"holder secret has shape {s.shape}, the key level ({len(moduli)}, {n})")
    qs = _qs(moduli)
    sampler = _Sampler(ctx)
    u = sampler.secret
    parts = np.empty((d, 2, len(moduli), n), dtype=np.uint64)
    for j in range(d):
        a = _common(ctx, seed, j)
        parts[j, 0] = (qs - _mul(u, a, moduli) + _gadget(s, j, moduli) + sampler.error()) % qs
        parts[j, 1] = (_mul(s, a, moduli) + sampler.error()) % qs
    return RelinRoundOne(secret.holder, _pack(_ROUND_ONE, secret.holder, parts), u)


def round_one_sum(ctx: ts.Context, seed: bytes, commitments: dict[int, bytes], reveals: dict[int, bytes]) -> U64:
    """(h0, h1) per j, shape (d, 2, k, N): the sum of every holder's round-1 part, after the reveal checks.

    Refuses (InvalidInputError, naming the holder) a missing, uncommitted or rogue part (not matching
    its commitment), one naming another holder, of the wrong shape or not reduced. Each holder runs
    this itself on the reveals: the relay's sum is never taken on trust.
    """
    return _summed(ctx, seed, commitments, reveals, _ROUND_ONE, "relinearization round-1 part", 2)


def relin_round_two(ctx: ts.Context, secret: HolderSecret, state: RelinRoundOne, seed: bytes,
                    commitments: dict[int, bytes], reveals: dict[int, bytes]) -> bytes:
    """Holder `secret.holder`'s round-2 part: per j, s_i h0 + (u_i - s_i) h1 + e2 on the round-1 sums.

    Sums the round-1 reveals itself (`round_one_sum`); refuses a reveal set that does not hold its own
    round-1 part, and a second use of `state`. Commit-then-reveal as round 1.
    """
    if state.holder != secret.holder or reveals.get(secret.holder) != state.share:
        raise InvalidInputError(f"the round-1 reveals do not hold holder {secret.holder}'s own round-1 part")
    h = round_one_sum(ctx, seed, commitments, reveals)
    moduli, d, n = _shape(ctx)
    qs = _qs(moduli)
    s = np.asarray(secret.s_ntt, dtype=np.uint64)
    u_minus_s = (state.take_ephemeral() + qs - s) % qs
    sampler = _Sampler(ctx)
    parts = np.empty((d, 1, len(moduli), n), dtype=np.uint64)
    for j in range(d):
        parts[j, 0] = (_mul(s, h[j, 0], moduli) + _mul(u_minus_s, h[j, 1], moduli) + sampler.error()) % qs
    return _pack(_ROUND_TWO, secret.holder, parts)


def collective_relin_keys(ctx: ts.Context, seed: bytes, round_one: tuple[dict[int, bytes], dict[int, bytes]],
                          commitments: dict[int, bytes], reveals: dict[int, bytes]) -> bytes:
    """SEAL RelinKeys bytes (uncompressed) of (sum_i h'_i, h1) per j, after both rounds' reveal checks.

    `round_one`: round 1's (commitments, reveals), from which h1 is summed again here.
    Refuses as `round_one_sum` does, for either round. SEAL validates the key on load.
    """
    h = round_one_sum(ctx, seed, *round_one)
    total = _summed(ctx, seed, commitments, reveals, _ROUND_TWO, "relinearization round-2 part", 1)
    moduli, d, n = _shape(ctx)
    version = seal_version(ctx)
    parms_id = list(ctx.seal_context().data.key_parms_id())
    parts = [struct.pack("<4Q", *parms_id), struct.pack("<QQ", 1, d)]  # one key (for s^2) of d components
    for j in range(d):
        parts.append(seal_ciphertext_bytes(version, parms_id, np.stack([total[j, 0], h[j, 1]]), ntt=True))
    payload = b"".join(parts)
    raw = b"\x5e\xa1" + version + b"\x00\x00\x00" + struct.pack("<Q", 16 + len(payload)) + payload
    load_seal(seal.RelinKeys, ctx, raw, "collective relinearization keys")
    return raw
