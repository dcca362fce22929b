"""A public TenSEAL BFV context that encrypts under the collective public key.

TenSEAL's Python API cannot take a foreign public key, but its context serializes as the protobuf
`TenSEALContextProto` (tenseal/proto/tensealcontext.proto): field 1 the encryption parameters,
field 2 the public part (1 public_key, 2 auto_flags, 3 scale, 4 relin_keys, 5 galois_keys),
field 3 the private part, field 4 the encryption type. We keep fields 1 and 4 and the public
flags of a project context, put the collective key in public_key, and drop the secret key and
the single-key relinearization and Galois keys (they would belong to another secret). Owners
then encrypt through unmodified TenSEAL (`ts.bfv_vector(ctx, row)`).
"""
from __future__ import annotations

import tenseal as ts

from he_partition.core.errors import InvalidInputError
from he_partition.he.params import generate_secret_context
from he_partition.he.seal_io import _varint


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, raw value bytes) of a protobuf message (wire types 0, 1, 2, 5)."""
    out, pos = [], 0

    def varint() -> int:
        nonlocal pos
        value, shift = 0, 0
        while True:
            if pos >= len(data):
                raise InvalidInputError("truncated TenSEAL context (varint)")
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while pos < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        start = pos
        if wire == 0:
            varint()
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length = varint()
            start = pos
            pos += length
        else:
            raise InvalidInputError(f"TenSEAL context has unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise InvalidInputError("truncated TenSEAL context")
        out.append((field, wire, data[start:pos]))
    return out


def _field(field: int, wire: int, value: bytes) -> bytes:
    head = _varint(field << 3 | wire)
    return head + (_varint(len(value)) + value if wire == 2 else value)


def collective_context(template: ts.Context, public_key: bytes) -> ts.Context:
    """A public TenSEAL context with `template`'s BFV parameters, encrypting under `public_key` (SEAL bytes)."""
    fields = _fields(bytes(template.serialize(save_public_key=False, save_secret_key=False,
                                              save_galois_keys=False, save_relin_keys=False)))
    public = _field(1, 2, public_key)
    out = b""
    for field, wire, value in fields:
        if field == 2:
            public += b"".join(_field(f, w, v) for f, w, v in _fields(value) if f in (2, 3))
        elif field in (1, 4):
            out += _field(field, wire, value)
    try:
        return ts.context_from(out + _field(2, 2, public))
    except (ValueError, RuntimeError) as exc:
        raise InvalidInputError(f"the collective public key does not load into a TenSEAL context: {exc}") from exc


def vector_ciphertext(vector_bytes: bytes) -> bytes:
    """The SEAL ciphertext bytes inside a serialized TenSEAL BFVVector (protobuf field 2, one ciphertext)."""
    parts = [v for f, w, v in _fields(bytes(vector_bytes)) if f == 2 and w == 2]
    if len(parts) != 1:
        raise InvalidInputError(f"a TenSEAL BFV vector must hold exactly one ciphertext, found {len(parts)}")
    return parts[0]


def collective_context_bytes(public_key: bytes) -> bytes:
    """The canonical serialized public context around `public_key`: every holder and the CS get the same bytes.

    Built on a fresh project context as template, because a context's auto flags change with
    use (a used template serializes other flag bytes); the SHA-256 of these bytes is the
    collective key fingerprint studies carry (`bfv.context_fingerprint`, what owners check).
    """
    return bytes(collective_context(generate_secret_context(), public_key).serialize())
