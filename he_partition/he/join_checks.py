"""The ciphertext operations of the join well-formedness check (he_partition.join.wellformed), on a JoinScheme.

Kept next to the scheme (the only package that touches SEAL): the sum of a group's planes,
x^2 - x of a plane, and a product with a plaintext of per-slot coefficients accumulated into
a running sum (left unrelinearized, 3 parts; `JoinScheme.total` relinearizes once).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import numpy.typing as npt
import tenseal.sealapi as seal

from ..core.errors import InvalidInputError
from .join_scheme import JoinScheme

__all__ = ["plane_sum", "square_minus_self", "accumulate_weighted"]


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
    """x^2 - x, slot by slot (3 parts: one ciphertext squaring, not relinearized)."""
    out = seal.Ciphertext()
    scheme._evaluator.square(ct, out)
    scheme._evaluator.sub_inplace(out, ct)  # SEAL pads the 2-part operand
    return out


def accumulate_weighted(scheme: JoinScheme, acc: Any | None, ct: Any, weights: npt.ArrayLike) -> Any:
    """acc + ct * weights, the weights one integer per slot (reduced mod t): one plaintext product."""
    w = np.mod(np.asarray(weights, dtype=np.int64).ravel(), scheme.plain_modulus)
    if w.size != scheme.slots:
        raise InvalidInputError(f"{w.size} weights for {scheme.slots} slots")
    pt = seal.Plaintext()
    scheme._encoder.encode(w.astype(np.uint64).tolist(), pt)
    term = seal.Ciphertext()
    scheme._evaluator.multiply_plain(ct, pt, term)
    if acc is None:
        return term
    scheme._evaluator.add_inplace(acc, term)
    return acc
