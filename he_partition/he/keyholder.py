"""What the decryption server's secret key reveals: the production backends and the key holder's raw view.

A stable hook for tests and audits of the central promise ("the key holder only ever
learns DP-noised values"): `residual_view` returns everything the secret key reveals
about one ciphertext chunk beyond its exact integer slot values, so a test can try to
distinguish datasets from it exactly as a curious decryption server would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .bfv import BfvBackend, BfvParams, generate_secret_context, load_context, public_context_bytes

__all__ = ["generate_backends", "residual_view"]


def generate_backends(params: BfvParams = BfvParams()) -> tuple[BfvBackend, BfvBackend]:
    """A fresh key pair as (decryption_backend, public_backend) for the production scheme (BFV).

    The public backend is rebuilt from the serialized public context, exactly as data
    owners and the computation server get it: it cannot decrypt.
    """
    secret = generate_secret_context(params)
    return BfvBackend(secret), BfvBackend(load_context(public_context_bytes(secret)))


def residual_view(decryption_backend: Any, chunk: Any) -> npt.NDArray[Any]:
    """The noise polynomial of one ciphertext chunk, centred: what the key reveals beyond the slots.

    With the secret key s the holder computes the phase c0 + c1 s mod Q of the chunk; the
    phase is round(Q m / t) + v where m is the plaintext polynomial (its batch decoding is
    the slot values, which `decrypt` returns) and v the noise. This returns v for each of
    the N coefficients, exactly (int64 when every |v| < 2^63, as for the release's ciphertexts;
    Python ints in an object array for the join's, flooded at 2^110).
    """
    phase, m, big_q = decryption_backend.phase_and_plaintext(chunk)
    t = decryption_backend.plain_modulus
    half = big_q // 2
    out = []
    for p, mi in zip(phase, m):
        v = (p - (big_q * mi + t // 2) // t) % big_q
        out.append(v - big_q if v > half else v)
    if all(-(2**63) <= v < 2**63 for v in out):
        return np.array(out, dtype=np.int64)
    return np.array(out, dtype=object)  # the join floods wider than int64 (he_partition.he.join_scheme)
