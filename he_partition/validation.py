"""Shared argument checks of the core, with messages that name the parameter and the bad value."""

from __future__ import annotations

import math

import numpy as np

from .errors import InvalidInputError

__all__ = ["positive_finite"]


def positive_finite(name: str, value: float) -> float:
    """`value` as a float if it is a real number > 0 and finite; TypeError / InvalidInputError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v <= 0.0:
        raise InvalidInputError(f"{name} must be > 0 and finite, got {value!r}")
    return v
