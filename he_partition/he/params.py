"""The BFV parameters dpagg uses and the making of a fresh key pair under them (TenSEAL)."""

from __future__ import annotations

from dataclasses import dataclass

import tenseal as ts
import tenseal.sealapi as sealapi

from ..core.errors import InvalidInputError

__all__ = ["BfvParams", "generate_secret_context"]


@dataclass(frozen=True)
class BfvParams:
    """BFV parameters.

    N = 8192 (8,192 slots), coefficient primes [60, 50, 50, 58] (218 bits, the 128-bit
    security maximum for N = 8192; the 58-bit special prime is the key level) and a 49-bit
    batching plain modulus t = 562949952847873. Measured: a fresh ciphertext has a 103-bit
    invariant noise budget; after flooding with 2^61, 49 bits remain. Decoded values must
    lie in (-t/2, t/2), i.e. |value| < 2.8e14; every intermediate slot value wraps modulo t
    harmlessly.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 50, 50, 58)
    plain_modulus_bits: int = 49

    def __post_init__(self) -> None:
        if self.poly_modulus_degree not in (4096, 8192, 16384, 32768):
            raise InvalidInputError(
                f"poly_modulus_degree must be one of 4096, 8192, 16384, 32768, got {self.poly_modulus_degree}"
            )
        if self.plain_modulus_bits in self.coeff_mod_bit_sizes or not 20 <= self.plain_modulus_bits <= 59:
            raise InvalidInputError(
                f"plain_modulus_bits must be in [20, 59] and differ from the coefficient primes' sizes "
                f"{self.coeff_mod_bit_sizes} (SEAL would pick the same prime), got {self.plain_modulus_bits}"
            )

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree

    @property
    def plain_modulus(self) -> int:
        return int(sealapi.PlainModulus.Batching(self.poly_modulus_degree, self.plain_modulus_bits).value())


def generate_secret_context(params: BfvParams = BfvParams()) -> ts.Context:
    """Generate a fresh key pair. Call only on the decryption side: the result holds the secret key."""
    return ts.context(
        ts.SCHEME_TYPE.BFV,
        params.poly_modulus_degree,
        plain_modulus=params.plain_modulus,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
