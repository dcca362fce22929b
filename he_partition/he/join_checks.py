"""The ciphertext operations of the join well-formedness check (he_partition.join.wellformed), on a JoinScheme.

Kept next to the scheme (the only package that touches SEAL): the sum of ciphertexts, a plane
in NTT form (`to_ntt`), and a group's one-hot residue y^2 - sum_v A_v^2 x_v with y = sum_v A_v x_v
for small random plaintext polynomials A_v (`one_hot_residue`): the plaintext products in NTT
form (0.23 ms each, against 2.9 ms for SEAL's product with a coefficient-form plaintext), one
squaring, left unrelinearized (3 parts) so a round's sum relinearizes once.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt
import tenseal.sealapi as seal

from ..core.errors import InvalidInputError
from .join_scheme import JoinScheme
from .seal_io import load_seal_bytes, seal_dyn_array, seal_header

__all__ = ["plane_sum", "to_ntt", "one_hot_residue", "poly_slots"]


def plane_sum(scheme: JoinScheme, cts: Sequence[Any]) -> Any:
    """sum of `cts` (a new ciphertext unless there is one term; the terms are not modified)."""
    if not cts:
        raise InvalidInputError("a group of a join upload holds no planes")
    total = cts[0]
    for ct in cts[1:]:
        nxt = seal.Ciphertext()
        scheme._evaluator.add(total, ct, nxt)
        total = nxt
    return total


def to_ntt(scheme: JoinScheme, ct: Any) -> Any:
    """A copy of `ct` in NTT form (what `one_hot_residue` takes: its plaintext products are then pointwise)."""
    out = seal.Ciphertext()
    scheme._evaluator.transform_to_ntt(ct, out)
    return out


def _poly(scheme: JoinScheme, coeffs: npt.NDArray[np.int64]) -> Any:
    """The plaintext polynomial sum_j coeffs[j] X^j (coefficients in [0, t), not a batch encoding).

    Loaded from SEAL's own serialization of a coefficient-form plaintext, built with numpy (about
    0.1 ms, where parsing SEAL's hex-string form took 12.6 ms per polynomial); SEAL's load checks
    it against the context (degree, coefficients below t).
    """
    body = bytes(32) + struct.pack("<Qd", len(coeffs), 1.0) + seal_dyn_array(coeffs)  # parms_id zero: coefficient form
    return load_seal_bytes(seal.Plaintext(), scheme.context, seal_header(16 + len(body)) + body)


def _checked_poly(scheme: JoinScheme, coeffs: npt.ArrayLike) -> Any:
    """`_poly` of `coeffs`, refused (InvalidInputError) unless they are the scheme's N coefficients in [0, t)."""
    c = np.asarray(coeffs, dtype=np.int64).ravel()
    if c.size != scheme.slots or c.min(initial=0) < 0 or c.max(initial=0) >= scheme.plain_modulus:
        raise InvalidInputError(f"a plaintext polynomial has {scheme.slots} coefficients in [0, t)")
    return _poly(scheme, c)


def poly_slots(scheme: JoinScheme, coeffs: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The slot values (mod t) of the plaintext polynomial with coefficients `coeffs` (what a product with it
    multiplies each slot by)."""
    return np.array(scheme._encoder.decode_uint64(_checked_poly(scheme, coeffs)), dtype=np.int64)


def one_hot_residue(scheme: JoinScheme, planes: Sequence[Any], coeffs: Sequence[npt.ArrayLike]) -> Any:
    """y^2 - sum_v A_v (A_v x_v) with y = sum_v A_v x_v, for the planes x_v (in NTT form, `to_ntt`) and A_v the
    plaintext polynomial with coefficients coeffs[v] (small: the products' noise grows with their size, not with
    t). Slot by slot, with a_v the value of A_v there: (sum_v a_v x_v)^2 - sum_v a_v^2 x_v, 0 wherever the x_v are
    0/1 with at most one set. One squaring, 2 x values plaintext products; 3 parts (not relinearized)."""
    if not planes or len(planes) != len(coeffs):
        raise InvalidInputError("one plaintext polynomial per indicator plane, and at least one plane")
    ev = scheme._evaluator
    y = lin = None
    for ct, c in zip(planes, coeffs):
        plain = _checked_poly(scheme, c)
        ev.transform_to_ntt_inplace(plain, ct.parms_id())
        ax, aax = seal.Ciphertext(), seal.Ciphertext()
        ev.multiply_plain(ct, plain, ax)
        ev.multiply_plain(ax, plain, aax)
        if y is None:
            y, lin = ax, aax
        else:
            ev.add_inplace(y, ax)
            ev.add_inplace(lin, aax)
    ev.transform_from_ntt_inplace(y)
    ev.transform_from_ntt_inplace(lin)
    out = seal.Ciphertext()
    ev.square(y, out)
    ev.sub_inplace(out, lin)
    return out
