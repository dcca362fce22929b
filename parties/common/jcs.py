"""RFC 8785 JSON Canonicalization Scheme (JCS) for the JSON values a study contract holds.

The canonical text of a value is what a JavaScript engine prints for it with object keys
sorted: `JSON.stringify` number formatting (ECMAScript Number::toString: shortest
round-trip digits, "1" not "1.0", "1e-7", "1e+21"), strings escaped only where JSON
requires (`"`, `\\`, control characters; everything else as UTF-8), no whitespace, object
members sorted by the UTF-16 code units of their names. Any language with an RFC 8785
library (or `JSON.stringify` over key-sorted objects) reproduces it byte for byte; the test
vectors in proto/test-vectors.json pin it.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

__all__ = ["canonicalize", "number_text"]

#: Integers above this magnitude are not exactly representable as IEEE doubles (RFC 8785 section 3.2.2.3).
MAX_SAFE_INTEGER = 2**53 - 1


def number_text(x: float | int) -> str:
    """ECMAScript Number::toString of a finite double (RFC 8785 section 3.2.2.3)."""
    if isinstance(x, bool):
        raise TypeError("booleans are not numbers")
    if isinstance(x, int):
        if abs(x) > MAX_SAFE_INTEGER:
            raise ValueError(f"integer {x} is not exactly representable in JSON (|x| > 2^53 - 1)")
        return str(x)
    if not math.isfinite(x):
        raise ValueError(f"{x} is not a JSON number (RFC 8785 forbids NaN and Infinity)")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that round-trip (the same digits ECMAScript picks).
    _, digit_tuple, exponent = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = k + int(exponent)  # the value is 0.d1...dk * 10^n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


def _string_text(s: str) -> str:
    # Python's escaping with ensure_ascii=False is RFC 8785's: \" \\ \b \f \n \r \t, other C0 controls as
    # lowercase \u00xx, everything else literal.
    return json.dumps(s, ensure_ascii=False)


def canonicalize(value: Any) -> str:
    """The RFC 8785 canonical JSON text of `value` (dict/list/tuple/str/int/float/bool/None)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return number_text(value)
    if isinstance(value, str):
        return _string_text(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonicalize(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("JSON object keys must be strings")
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(_string_text(k) + ":" + canonicalize(value[k]) for k in keys) + "}"
    raise TypeError(f"{type(value).__name__} is not a JSON value")
