"""Domain errors of the core; the services map each class to one gRPC status code."""

from __future__ import annotations

__all__ = [
    "DPAggError",
    "InvalidInputError",
    "PrecisionError",
    "MeasurementShapeError",
    "BudgetExhaustedError",
    "ShareCombineError",
]


class DPAggError(Exception):
    """Base class of every error the core raises on purpose."""


class InvalidInputError(DPAggError, ValueError):
    """A caller passed a value of the wrong shape, type or range (INVALID_ARGUMENT)."""


class PrecisionError(DPAggError):
    """A ciphertext failed the decryption integrity check: wrong key, corrupt, or not the claimed measurement."""


class MeasurementShapeError(DPAggError):
    """A ciphertext does not have the slot layout of the measurement it claims to be."""


class BudgetExhaustedError(DPAggError):
    """A charge would take the privacy budget past its total (RESOURCE_EXHAUSTED)."""


class ShareCombineError(InvalidInputError):
    """Threshold decryption shares that must not be combined (INVALID_ARGUMENT): a share missing, duplicate,
    foreign, for another ciphertext or key, of the wrong shape or level, or a combined value with too little
    noise budget (a share made with the wrong secret, or a corrupt or rogue ciphertext)."""


class WorkerLostError(DPAggError):
    """A server's worker processes could not start or kept dying (UNAVAILABLE): the server's environment, not
    the caller's request, is at fault; nothing was released."""
