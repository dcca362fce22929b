"""Well-formedness of a join owner's upload, checked under encryption (docs/join.md, "Checked uploads").

An owner uploads, per group of `slots` positions, one indicator plane per attribute value:
x[g, v, i] is 1 where its record at position i has value v, else 0, and at most one value
is set per position (one record per position). An owner that uploads anything else (a 2 or
a 1,000 in a slot, or two values set at one position) multiplies the other owner's records
at those positions in the joint table and can read their attributes from the release past
the noise. So before the key holder decrypts any join cell, the computation server shows
it, for each owner separately, that in every slot i

    z_i = sum_g [ (sum_v a[g, v]_i x[g, v]_i)^2 - sum_v a[g, v]_i^2 x[g, v]_i ] = 0 (mod t),

where a[g, v] are the slot values of a random plaintext polynomial A[g, v] whose N
coefficients are uniform on [0, 2^COEFF_BITS), derived from a seed the key holder chose after
the uploads were committed (`coefficients`). Where the x[g, v]_i are 0 or 1 and at most one
is set, the square is a[g, v]_i^2 for the one set (or 0) and the bracket vanishes: an honest
upload gives z = 0 in every slot, for every A.

Soundness: the slots hold values mod t (t prime, the plain modulus). Expanded, a group's
bracket at slot i is sum_v a_v^2 (x_v^2 - x_v) + 2 sum_{v<w} a_v a_w x_v x_w: a quadratic
form in the a_v that is nonzero exactly when some x_v is neither 0 nor 1 or two are set
(2 is invertible mod an odd t). The slot values are evaluations of the polynomials at the N
roots the batch encoding uses, a_v = sum_j A[v]_j w_i^j with w_i != 0: nonzero linear forms in
independent uniform coefficients, a disjoint set per (group, value). So a malformed slot's
z_i is a nonzero polynomial of degree 2 in those coefficients, and Pr[z_i = 0] <=
2 / 2^COEFF_BITS (Schwartz-Zippel over a set of 2^COEFF_BITS < t distinct residues; 2/t if t
were the smaller). A value that is 0 or 1 mod t but not as an integer (t + 1, say) is the
same plaintext as 0 or 1, so it does not change the joint table either. The check repeats
with independent polynomials: `check_rounds(t)` rounds bring the miss below 2^-SOUNDNESS_BITS
= 2^-40 (6 rounds of 7 bits, for both join scheme versions).

Why small polynomial coefficients and no rotation-sum: a plaintext product multiplies the
noise by about the plaintext polynomial's size (uniform slot values make coefficients
uniform mod t, 2^23; these are 2^8), and a rotation-sum over the slots adds about 12 bits.
Measured with 2 groups of 16 planes: 2^58 of noise before the flood (statistical distance
about 2^-40 under the 2^110 flood, like a released join cell's 2^-42).

What the key holder learns: every slot of each round's ciphertext, flooded like every
released join value and switched to the last prime (`JoinScheme.noised`). For an honest
upload all are 0: nothing. For a malformed one, z_i at the positions where the owner
deviated (0 wherever it followed the protocol): where and by how much that owner cheated,
nothing of the other owner's data, which this check never touches. Nothing is charged.

Cost per owner: per group, each plane's NTT once, then per round 2 x values plaintext
products in NTT form and one ciphertext squaring (groups x rounds squarings, where squaring
every plane and the planes' sum took groups x (values + 1), and 5 rounds of coefficient-form
plaintext products on them cost as much again); one relinearization per round; no rotations;
rounds ciphertexts to the key holder.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..he.join_checks import one_hot_residue, plane_sum, poly_slots, to_ntt
from ..he.join_scheme import JoinScheme

__all__ = ["SOUNDNESS_BITS", "COEFF_BITS", "SEED_BYTES", "check_rounds", "coefficients", "finish", "partial_sums",
           "residues", "residues_plain",
           "well_formed"]

IntArray = npt.NDArray[np.int64]

#: A malformed upload passes all rounds with probability at most 2^-SOUNDNESS_BITS.
SOUNDNESS_BITS = 40
#: Bits of each coefficient of the random plaintext polynomials (a round misses with probability 2 / 2^COEFF_BITS).
COEFF_BITS = 8
#: Length of the key holder's seed for a study's coefficients.
SEED_BYTES = 32


def check_rounds(plain_modulus: int) -> int:
    """Rounds so that the miss, 2 / min(2^COEFF_BITS, t) per round (a quadratic form: Schwartz-Zippel), is at most
    2^-SOUNDNESS_BITS over all."""
    if plain_modulus < 3:
        raise InvalidInputError(f"plain modulus {plain_modulus} is too small for the well-formedness check")
    return math.ceil(SOUNDNESS_BITS / (min(COEFF_BITS, math.log2(plain_modulus)) - 1))


def coefficients(seed: bytes, owner_id: str, rnd: int, group: int, plane: int, slots: int,
                 plain_modulus: int) -> IntArray:
    """Round `rnd`'s polynomial for `plane` (the attribute value) of `group` of `owner_id`'s upload.

    N coefficients uniform on [0, min(2^COEFF_BITS, t)): SHAKE-256 of the key holder's seed and
    the plane's name, one byte each (COEFF_BITS = 8). Both servers derive the same polynomial
    from the seed; the owners never see it.
    """
    if len(seed) != SEED_BYTES:
        raise InvalidInputError(f"a check seed is {SEED_BYTES} bytes, got {len(seed)}")
    label = f"dpagg-join-wellformed\x00{owner_id}\x00{rnd}\x00{group}\x00{plane}".encode()
    words = np.frombuffer(hashlib.shake_256(seed + label).digest(slots), dtype=np.uint8).astype(np.int64)
    return words % min(1 << COEFF_BITS, plain_modulus)


def partial_sums(scheme: JoinScheme, groups: Iterable[tuple[int, Sequence[bytes]]], seed: bytes,
                 owner_id: str) -> list[Any]:
    """Each round's sum over the listed (group index, serialized planes) pairs, not yet relinearized nor noised
    (None per round if there are none): a worker's share of `residues`; `finish` adds the shares up and floods
    them."""
    t, slots = scheme.plain_modulus, scheme.slots
    rounds = check_rounds(t)
    acc: list[Any] = [None] * rounds
    for g, planes in groups:
        cts = [to_ntt(scheme, scheme.deserialize(p)) for p in planes]
        for rnd in range(rounds):
            z = one_hot_residue(scheme, cts, [coefficients(seed, owner_id, rnd, g, v, slots, t)
                                              for v in range(len(cts))])
            acc[rnd] = z if acc[rnd] is None else plane_sum(scheme, [acc[rnd], z])
    return acc


def finish(scheme: JoinScheme, shares: Iterable[Sequence[Any]]) -> list[bytes]:
    """Per round, the sum of the shares' sums, flooded and switched down (serialized): what the key holder decrypts."""
    total: list[Any] | None = None
    for share in shares:
        total = list(share) if total is None else [a if b is None else b if a is None else plane_sum(scheme, [a, b])
                                                   for a, b in zip(total, share)]
    if total is None or any(a is None for a in total):
        raise InvalidInputError("a join upload with no groups cannot be checked")
    # Slot by slot, no rotation-sum: a rotation-sum would add about 12 bits of noise (measured 2^70 against 2^58),
    # and an honest upload's slots are all 0, so there is nothing for pads to hide.
    zeros = np.zeros(scheme.slots, dtype=np.int64)
    return [scheme.serialize(scheme.noised(scheme._relinearized(a), zeros, scheme.slots, lambda n: zeros[:n]))
            for a in total]


def residues(scheme: JoinScheme, groups: Iterable[Sequence[bytes]], seed: bytes, owner_id: str) -> list[bytes]:
    """The computation server's half: per round, Enc(z) (every slot), flooded and switched down (serialized).

    `groups` yields the owner's committed upload group by group (one serialized ciphertext
    per value). Per round, each group's planes are weighted by that round's polynomials, the
    weighted sum squared, and the doubly weighted planes subtracted (`one_hot_residue`); the
    groups' results are summed. Privacy: see the
    module docstring (all 0 for an honest upload; flooded as every released join value).
    The server spreads the groups over its workers (`he_partition.join.check_workers`).
    """
    return finish(scheme, [partial_sums(scheme, enumerate(groups), seed, owner_id)])


def residues_plain(scheme: JoinScheme, planes: npt.ArrayLike, seed: bytes, owner_id: str) -> list[IntArray]:
    """Each round's slots in plaintext, mod t (planes: groups, values, slots): the reference `residues` must match."""
    t = scheme.plain_modulus
    x = np.mod(np.asarray(planes, dtype=np.int64), t)
    out = []
    for rnd in range(check_rounds(t)):
        z = np.zeros(x.shape[2], dtype=np.int64)
        for g in range(x.shape[0]):
            a = [poly_slots(scheme, coefficients(seed, owner_id, rnd, g, v, x.shape[2], t)) for v in range(x.shape[1])]
            y = sum((av * xv) % t for av, xv in zip(a, x[g])) % t
            lin = sum((av * av % t) * xv % t for av, xv in zip(a, x[g])) % t
            z = (z + y * y - lin) % t
        out.append(z)
    return out


def well_formed(scheme: JoinScheme, cts: Sequence[Any]) -> bool:
    """The key holder's half: True when every slot of every round's ciphertext decrypts to 0."""
    rounds = check_rounds(scheme.plain_modulus)
    if len(cts) != rounds:
        raise InvalidInputError(f"the well-formedness check has {rounds} rounds, {len(cts)} ciphertexts arrived")
    return all(not scheme.decrypt(ct).any() for ct in cts)
