"""Shared argument checks of the core, with messages that name the parameter and the bad value."""

from __future__ import annotations

import math

import numpy as np

from .errors import InvalidInputError

__all__ = ["positive_finite", "validate_epsilon"]


def positive_finite(name: str, value: float) -> float:
    """`value` as a float if it is a real number > 0 and finite; TypeError / InvalidInputError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v <= 0.0:
        raise InvalidInputError(f"{name} must be > 0 and finite, got {value!r}")
    return v


def validate_epsilon(epsilon: object) -> float:
    """A release's epsilon from user input (numbers or numeric strings); InvalidInputError otherwise."""
    try:
        eps = float(epsilon)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"epsilon must be a number, got {epsilon!r}") from exc
    if not (math.isfinite(eps) and eps > 0):
        raise InvalidInputError(f"epsilon must be > 0 and finite, got {epsilon}")
    return eps
