"""Well-formedness of a join owner's upload, checked under encryption (docs/join.md, "Checked uploads").

An owner uploads, per group of `slots` positions, one indicator plane per attribute value:
x[g, v, i] is 1 where its record at position i has value v, else 0, and at most one value
is set per position (one record per position). An owner that uploads anything else (a 2 or
a 1,000 in a slot, or two values set at one position) multiplies the other owner's records
at those positions in the joint table and can read their attributes from the release past
the noise. So before the key holder decrypts any join cell, the computation server proves to
it, for each owner separately, that

    z = sum_g [ sum_v <r[g, v], x[g, v] * (x[g, v] - 1)> + <r[g, d], s[g] * (s[g] - 1)> ] = 0 (mod t),

where s[g] = sum_v x[g, v] is the number of values set at each position of group g, and the
coefficients r (one per slot of every plane and of the sum) are derived from a seed the key
holder chose (`coefficients`) after the uploads were committed. x(x - 1) = 0 exactly when
x is 0 or 1, and s(s - 1) = 0 exactly when at most one value is set: an honest upload gives
z = 0 for every r.

Soundness: the slots hold values mod t (t prime, the plain modulus). For a malformed upload
some e = x(x - 1) or s(s - 1) is nonzero mod t, and z is a linear form in the uniform r with
a nonzero coefficient, so Pr[z = 0] = 1/t exactly (one nonzero term suffices; the other
terms only shift z). A value that is 0 or 1 mod t but not as an integer (t + 1, say) is the
same plaintext as 0 or 1, so it has no effect on the joint table either. With t about
2^20 (version 1) or 2^23 (version 2) one check misses with probability about 1e-6 or 1.2e-7,
so the check is repeated with independent coefficients: `check_rounds(t)` rounds bring the
miss below 2^-SOUNDNESS_BITS = 2^-40 (3 rounds for version 1, whose t is a little below
2^20, and 2 for version 2).

What the key holder learns: the computation server multiplies each round's coefficients by
its own uniform nonzero blind rho (known only to it), so the decrypted slot holds rho * z:
0 for an honest upload, uniform over the nonzero residues otherwise; every other slot gets a
uniform pad and the ciphertext is flooded like every released join value
(`JoinScheme.noised`). So the decryption says "well-formed or not" and nothing else; nothing
is charged for it.

Cost per owner and round structure: groups x (values + 1) ciphertext squarings (x^2 and s^2),
groups x (values + 1) x rounds plaintext products, one relinearization and 13 rotations per
round.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..core.noise import CipherRandom, RandomSource
from ..he.join_checks import accumulate_weighted, plane_sum, square_minus_self
from ..he.join_scheme import JoinScheme

__all__ = ["SOUNDNESS_BITS", "SEED_BYTES", "check_rounds", "coefficients", "residues", "residues_plain",
           "well_formed"]

IntArray = npt.NDArray[np.int64]

#: A malformed upload passes all rounds with probability at most 2^-SOUNDNESS_BITS.
SOUNDNESS_BITS = 40
#: Length of the key holder's seed for a study's coefficients.
SEED_BYTES = 32


def check_rounds(plain_modulus: int) -> int:
    """Rounds so that t^-rounds <= 2^-SOUNDNESS_BITS (one round misses with probability 1/t)."""
    if plain_modulus < 3:
        raise InvalidInputError(f"plain modulus {plain_modulus} is too small for the well-formedness check")
    return max(1, math.ceil(SOUNDNESS_BITS / math.log2(plain_modulus)))


def coefficients(seed: bytes, owner_id: str, rnd: int, group: int, plane: int, slots: int,
                 plain_modulus: int) -> IntArray:
    """Round `rnd`'s coefficients for `plane` of `group` of `owner_id`'s upload (plane == values: the sum plane).

    SHAKE-256 of the key holder's seed and the plane's name, 8 bytes per slot reduced mod t
    (statistical distance from uniform below 2^-40 for t < 2^24). Both servers derive the
    same coefficients from the seed; the owners never see it.
    """
    if len(seed) != SEED_BYTES:
        raise InvalidInputError(f"a check seed is {SEED_BYTES} bytes, got {len(seed)}")
    label = f"dpagg-join-wellformed\x00{owner_id}\x00{rnd}\x00{group}\x00{plane}".encode()
    words = np.frombuffer(hashlib.shake_256(seed + label).digest(8 * slots), dtype="<u8")
    return (words % np.uint64(plain_modulus)).astype(np.int64)


def residues(scheme: JoinScheme, groups: Iterable[Sequence[bytes]], seed: bytes, owner_id: str,
             blind: RandomSource | None = None) -> list[bytes]:
    """The computation server's half: per round, Enc(rho * z) in slot 0, pads elsewhere, flooded (serialized).

    `groups` yields the owner's committed upload group by group (one serialized ciphertext
    per value). Each plane x is squared once (x^2 - x, and s^2 - s for the sum s of the
    group's planes), multiplied by each round's coefficients times the round's blind rho,
    and summed; each round's sum is relinearized and rotation-summed into every slot.
    `blind` draws rho uniform on [1, t) (None: a `CipherRandom` under a fresh OS key).
    Privacy: see the module docstring (0, or a uniform nonzero residue, and nothing else).
    """
    t, slots = scheme.plain_modulus, scheme.slots
    rounds = check_rounds(t)
    source = blind if blind is not None else CipherRandom()
    rhos = [int(v) + 1 for v in source.integers(t - 1, rounds)]
    acc: list[Any] = [None] * rounds
    count = 0
    for g, planes in enumerate(groups):
        cts = [scheme.deserialize(p) for p in planes]
        for k, ct in enumerate([*cts, plane_sum(scheme, cts)]):  # the planes, then their sum (k == values)
            e = square_minus_self(scheme, ct)
            for rnd in range(rounds):
                r = coefficients(seed, owner_id, rnd, g, k, slots, t)
                acc[rnd] = accumulate_weighted(scheme, acc[rnd], e, r * rhos[rnd] % t)
        count += 1
    if not count:
        raise InvalidInputError("a join upload with no groups cannot be checked")
    pads = CipherRandom()
    return [scheme.serialize(scheme.noised(scheme.total(a), [0], 1, lambda n: pads.integers(t, n))) for a in acc]


def residues_plain(planes: npt.ArrayLike, seed: bytes, owner_id: str, plain_modulus: int) -> list[int]:
    """z of each round in plaintext, unblinded (groups, values, slots): the reference `residues` must match."""
    x = np.mod(np.asarray(planes, dtype=np.int64), plain_modulus)
    t = plain_modulus
    out = []
    for rnd in range(check_rounds(t)):
        z = 0
        for g in range(x.shape[0]):
            s = x[g].sum(axis=0) % t
            for k, plane in enumerate([*x[g], s]):
                e = (plane * (plane - 1)) % t
                r = coefficients(seed, owner_id, rnd, g, k, x.shape[2], t)
                z = (z + int(np.sum((r * e) % t))) % t
        out.append(z)
    return out


def well_formed(scheme: JoinScheme, cts: Sequence[Any]) -> bool:
    """The key holder's half: True when slot 0 of every round's ciphertext decrypts to 0."""
    rounds = check_rounds(scheme.plain_modulus)
    if len(cts) != rounds:
        raise InvalidInputError(f"the well-formedness check has {rounds} rounds, {len(cts)} ciphertexts arrived")
    return all(int(scheme.decrypt(ct)[0]) == 0 for ct in cts)
