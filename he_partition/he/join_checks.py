"""The ciphertext operations of the join well-formedness check (he_partition.join.wellformed), on a JoinScheme.

Kept next to the scheme (the only package that touches SEAL): the sum of a group's planes,
x^2 - x of a plane, and a product with a plaintext of per-slot coefficients accumulated into
a running sum (left unrelinearized, 3 parts; `JoinScheme.total` relinearizes once).
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

__all__ = ["plane_sum", "square_minus_self", "accumulate_weighted", "poly_slots"]


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


def square_minus_self(scheme: JoinScheme, ct: Any) -> Any:
    """x^2 - x, slot by slot: one ciphertext squaring, relinearized (2 parts). Relinearized before the plaintext
    products: a 3-part ciphertext times a small plaintext, relinearized after, measured 2^88 of noise, against
    2^55 this way (he_partition.join.wellformed)."""
    out = seal.Ciphertext()
    scheme._evaluator.square(ct, out)
    scheme._evaluator.relinearize_inplace(out, scheme._relin)
    scheme._evaluator.sub_inplace(out, ct)
    return out


def _poly(scheme: JoinScheme, coeffs: npt.NDArray[np.int64]) -> Any:
    """The plaintext polynomial sum_j coeffs[j] X^j (coefficients in [0, t), not a batch encoding).

    Loaded from SEAL's own serialization of a coefficient-form plaintext, built with numpy (about
    0.1 ms, where parsing SEAL's hex-string form took 12.6 ms per polynomial); SEAL's load checks
    it against the context (degree, coefficients below t).
    """
    body = bytes(32) + struct.pack("<Qd", len(coeffs), 1.0) + seal_dyn_array(coeffs)  # parms_id zero: coefficient form
    return load_seal_bytes(seal.Plaintext(), scheme.context, seal_header(16 + len(body)) + body)


def poly_slots(scheme: JoinScheme, coeffs: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The slot values (mod t) of the plaintext polynomial with coefficients `coeffs` (what a product with it
    multiplies each slot by)."""
    c = np.asarray(coeffs, dtype=np.int64).ravel()
    if c.size != scheme.slots or c.min(initial=0) < 0 or c.max(initial=0) >= scheme.plain_modulus:
        raise InvalidInputError(f"a plaintext polynomial has {scheme.slots} coefficients in [0, t)")
    return np.array(scheme._encoder.decode_uint64(_poly(scheme, c)), dtype=np.int64)


def accumulate_weighted(scheme: JoinScheme, acc: Any | None, ct: Any, coeffs: npt.ArrayLike) -> Any:
    """acc + ct * R, R the plaintext polynomial with coefficients `coeffs` (small: the product's noise grows with
    their size, not with t): one plaintext product. Each slot is multiplied by R's value there (`poly_slots`)."""
    c = np.asarray(coeffs, dtype=np.int64).ravel()
    if c.size != scheme.slots or c.min(initial=0) < 0 or c.max(initial=0) >= scheme.plain_modulus:
        raise InvalidInputError(f"a plaintext polynomial has {scheme.slots} coefficients in [0, t)")
    term = seal.Ciphertext()
    scheme._evaluator.multiply_plain(ct, _poly(scheme, c), term)
    if acc is None:
        return term
    scheme._evaluator.add_inplace(acc, term)
    return acc
