"""A join's values decrypted by key-share holders, each holder computing the values' ciphertexts itself.

With one key holder the computation server (CS) sends it each measured value as a ciphertext,
and the key holder returns slot 0 plus its own noise: whatever the CS put in that ciphertext,
the key holder's answer is one decoded, noised slot. With K holders the CS is the combiner: it
adds c0 and the holders' shares c1 s_i + e_i and reads the whole phase. A ciphertext the CS
made up then shows it far more than one slot: an owner's raw indicator plane decrypts to every
position of it (`tests/he_partition/test_join_holders.py` recovers all 8,192 with holders that
share whatever they are sent), and a chosen c1 gives it c1 s plus the smudging, a noisy linear
equation in the secret key per coefficient. For ordinary studies the holders bind their shares
to the owners' signed c1 (docs/threshold.md, section 3a), which works because a release's c1 is
a sum of the owners' c1. A join value is a sum of products, relinearized and rotated: its c1 is
no sum of anything the owners sent, so it cannot be checked by adding. So each holder computes
it: from the owners' indicator planes it runs the same circuit as the CS, with the CS's own
evaluator (`parallel.JoinEvaluator` on the holder's executor: products, one relinearization, the
rotation-sum per cell, then the value's +-1 sum of cells, `JoinScheme.signed_sum`) under the
collective join keys. SEAL's evaluation is deterministic, so
its c1 is the CS's, bit for bit, and the holder binds its share to that c1's digest
(`threshold.c1.c1_digest`): the combine refuses shares bound to anything else, and the CS can
choose c0 only, which changes nothing it learns.

Each holder's share of a value (`HolderJoinValues.shares`): c1 s_i + its smudging, uniform on
[-2^110, 2^110) (`JOIN_SMUDGING_BITS`: the flood's width, so each honest holder alone hides the
product's data- and key-dependent noise, about 2^59 at the capacity edge: N 2^59 / 2^111 = 2^-39
per value), + Delta (its DP share in slot 0, a uniform pad mod t in every other slot). The
value is decrypted at the full level (three data primes): at the last prime the switch's
rounding is the CS's to know and the holders' smudging leaves no budget (docs/threshold.md,
section 8). After a rotation-sum every slot holds the cell total, so the pads are what keeps
the CS from reading the total in the other slots without the DP noise. The CS adds its own draw
to slot 0 as a plaintext (`noised_for_holders`: c0 only, so c1 stays the holders'), and floods
nothing: the holders' smudging does what its flood did against the key holder.

The well-formedness check (`he_partition.join.wellformed`: every plane 0/1 and one-hot) is each
holder's own too: from a seed the holders fix after the uploads close, each computes every round's
residue from the owner's planes (`check_values`), commits to its shares of them, reveals them once
every commitment is in, and combines everyone's itself (`check_passes`): no holder shares a join
value before it saw both owners' residues decrypt to 0. The commitments matter: a holder that saw
the others' shares first could pick its own to cancel them into zeros and pass a malformed upload.

Measured cost: each holder runs the whole circuit, the CS's join work (the products and
rotation-sums) once more per holder; see docs/threshold.md, section 8.
"""
from __future__ import annotations

import hmac
from typing import Any, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..core.measurements import Measurement
from ..core.noise import CipherRandom, RandomSource
from ..execution.base import ChunkExecutor
from ..he.join_scheme import JoinParams, JoinScheme
from ..he.threshold.decrypt import combine, decryption_share, padded_noise
from ..he.threshold.keys import HolderSecret
from ..he.threshold.wire import key_share_commitment
from .parallel import JoinEvaluator
from .wellformed import partial_sums

__all__ = ["JOIN_SMUDGING_BITS", "join_public_bytes", "rotation_steps", "HolderJoinValues", "check_values",
           "check_commitment", "check_passes", "noised_for_holders", "combine_values"]

IntArray = npt.NDArray[np.int64]

#: Each holder's smudging on a join value's share: the width of the single key holder's flood (`he.flooding`).
JOIN_SMUDGING_BITS = 110


def join_public_bytes(version: int, public_key: bytes, relin_keys: bytes, galois_keys: bytes) -> bytes:
    """The join study's public key material (`JoinScheme.public_bytes`) of the holders' collective keys: what the
    owners encrypt under, and whose SHA-256 the study's contract names (`context_fingerprint`)."""
    return JoinScheme.from_keys(JoinParams.for_version(version), public_key, relin_keys, galois_keys).public_bytes()


def rotation_steps(slots: int) -> list[int]:
    """The row rotations of the join's rotation-sum (1, 2, ..., slots / 4) and 0, the column swap: the Galois
    elements its collective Galois keys need (`threshold.galois.galois_elements`)."""
    return [1 << i for i in range(max(1, slots // 2).bit_length() - 1)] + [0]


class HolderJoinValues:
    """Holder `secret.holder`'s side of one join release: the cell totals it computed from the owners' planes.

    `ctx`: the TenSEAL context at the join's parameters (`threshold.relin.join_context`); `public`: the
    collective join keys (`JoinScheme.public_bytes`); `a`, `b`: the owners' indicator planes (groups x values of
    serialized fresh ciphertexts, as the owners uploaded them); `bins[k]`: the row-major cell of bin k of the
    flattened table (`release.bin_cells`); `executor`: where the products run (the holder's own local worker
    processes, or None: this process). Building it runs the products and rotation-sums: the CS's join work.
    """

    def __init__(self, ctx: Any, secret: HolderSecret, key_fp: bytes, public: bytes,
                 a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]], bins: Sequence[int], *,
                 executor: ChunkExecutor | None = None) -> None:
        self.ctx, self.secret, self.key_fp = ctx, secret, key_fp
        self.scheme = JoinScheme.from_public(public)
        self.planes = (a, b)
        # The CS's own evaluator (he_partition.join.parallel), on this holder's executor (None: in this process):
        # the cell totals in blocks, each value's un-noised ciphertext summed from them. Draws nothing here.
        self._evaluator = JoinEvaluator(public, a, b, bins, CipherRandom(), executor=executor)
        self._evaluator.__enter__()

    def close(self) -> None:
        """Let go of the cell totals (and the executor's blocks)."""
        self._evaluator.__exit__(None, None, None)

    def __enter__(self) -> "HolderJoinValues":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def shares(self, m: Measurement, dp_shares: Sequence[int] | IntArray, rng: RandomSource, *,
               secret: HolderSecret | None = None) -> list[bytes]:
        """This holder's decryption share of each value `m` measures, bound to the c1 it computed.

        Privacy: adds this holder's DP share `dp_shares[v]` to slot 0 of value v (drawn and charged by the
        caller: epsilon m.epsilon for L1 sensitivity m.sensitivity under add/remove of one shared customer, who
        changes one cell by 1; the holders' shares sum to one discrete Laplace of scale m.scale, or tolerate
        missing holders as the contract's `noise_tolerates` says), a uniform pad mod t on every other slot, and
        smudging on [-2^110, 2^110), all from `rng` (this holder's keyed source: a repeat gives the same bytes).
        Who knows the noise: only this holder; the combiner sees the sum over the holders. `secret`: the key share
        to use in place of the one given at construction (a t-of-N participant set's Lagrange-weighted share).
        """
        if len(dp_shares) != m.count:
            raise InvalidInputError(f"{m.kind} measures {m.count} values, {len(dp_shares)} DP shares given")
        slots, t = self.scheme.slots, self.scheme.plain_modulus
        measured = np.zeros(slots, dtype=bool)
        measured[0] = True
        out = []
        for value, dp in zip(self._evaluator.values(m), dp_shares):
            noise = padded_noise(np.concatenate([[int(dp)], np.zeros(slots - 1, dtype=np.int64)]), measured, rng, t)
            out.append(decryption_share(self.ctx, secret or self.secret, self.key_fp, value, JOIN_SMUDGING_BITS,
                                        dp_noise=noise,
                                        rng=rng, bound_to_c1=True))
        return out

    def check_shares(self, side: int, owner_id: str, seed: bytes, rng: RandomSource, *,
                     secret: HolderSecret | None = None) -> list[bytes]:
        """This holder's shares of the well-formedness residues of owner `side`'s planes (`check_values`, each round's
        ciphertext computed here), bound to their c1: smudging on [-2^110, 2^110), no pads and no DP noise (every slot
        of an honest upload's residue is 0; a malformed one shows where that owner deviated, as the single key
        holder's check does). Commit to them (`check_commitment`) and reveal them only once every holder's
        commitment is in, so no holder picks its share after seeing the others'. Spends nothing."""
        return [decryption_share(self.ctx, secret or self.secret, self.key_fp, ct, JOIN_SMUDGING_BITS, rng=rng,
                                 bound_to_c1=True)
                for ct in check_values(self.scheme, self.planes[side], seed, owner_id)]


def check_values(scheme: JoinScheme, planes: Sequence[Sequence[bytes]], seed: bytes, owner_id: str) -> list[bytes]:
    """Each round's well-formedness residue of one owner's planes (`wellformed.partial_sums`, relinearized), at the
    full level and not flooded: what every holder computes alike (SEAL's evaluation is deterministic)."""
    sums = partial_sums(scheme, enumerate(planes), seed, owner_id)
    if not sums or any(z is None for z in sums):
        raise InvalidInputError("a join upload with no groups cannot be checked")
    return [scheme.serialize(scheme._relinearized(z)) for z in sums]


def check_commitment(holder: int, seed: bytes, shares: Sequence[bytes]) -> bytes:
    """A holder's commitment to its check shares (all rounds), bound to the holder and the check's seed."""
    return key_share_commitment(holder, seed, b"".join(len(x).to_bytes(4, "big") + x for x in shares))


def check_passes(ctx: Any, scheme: JoinScheme, planes: Sequence[Sequence[bytes]], seed: bytes, owner_id: str,
                 commitments: Mapping[int, bytes], shares: Mapping[int, Sequence[bytes]], key_fp: bytes) -> bool:
    """Each holder's own verdict on one owner's upload: True when every slot of every round decrypts to 0.

    The holder recomputes the residues (c0 included) from the planes, checks every holder's revealed shares
    against its commitment (InvalidInputError naming the holder: a share chosen after the others', which could
    cancel them into zeros, is refused), and combines them itself; the relay's verdict is never taken.
    A combine without noise budget (a share made with another secret) raises `ShareCombineError`.
    """
    holders = sorted(commitments)
    for h in holders:
        if h not in shares or not hmac.compare_digest(check_commitment(h, seed, shares[h]), commitments[h]):
            raise InvalidInputError(f"the check shares of holder {h} do not match its commitment: not combined")
    values = check_values(scheme, planes, seed, owner_id)
    return all(not combine(ctx, v, [shares[h][r] for h in holders], holders, key_fp, bound_to_c1=True).any()
               for r, v in enumerate(values))


def noised_for_holders(scheme: JoinScheme, value: Any, draw: int) -> bytes:
    """The CS's half of a value decrypted by key-share holders: `value` + Delta `draw` in slot 0, as a plaintext.

    Privacy: adds the CS's discrete Laplace draw (scale m.sensitivity / m.epsilon, drawn by the caller from the
    CS's source: only it knows the draw; neighbouring relation add/remove of one shared customer). A plaintext
    addition changes c0 only (`JoinScheme.plus_plain`), so the value's c1 stays the one every holder computed; no
    pads (each holder pads) and no flood (each holder smudges). Spends nothing: the holders charge.
    """
    return scheme.serialize(scheme.plus_plain(value, [int(draw)]))


def combine_values(ctx: Any, values: Sequence[bytes], shares: Sequence[Sequence[bytes]],
                   holders: Sequence[int], key_fp: bytes, plain_modulus: int) -> IntArray:
    """Slot 0 of each value (centred mod t) from the holders' shares, each bound to the value's c1.

    Refuses (`ShareCombineError`) a share bound to another c1 (a value the holders did not compute), another
    key or holder, and a combined value without noise budget. Holds no secret, adds no noise.
    """
    if len(values) != len(shares):
        raise InvalidInputError(f"{len(values)} values, shares for {len(shares)}")
    t = int(plain_modulus)
    first = np.array([int(combine(ctx, v, s, holders, key_fp, bound_to_c1=True)[0]) for v, s in zip(values, shares)],
                     dtype=np.int64)
    return np.where(first > t // 2, first - t, first)

