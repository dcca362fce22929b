"""SEAL objects to and from bytes: these bindings save and load only through file paths.

Shared by the BFV backend, the join scheme and the threshold key shares; also SEAL's ciphertext
layout written by hand (`seal_ciphertext_bytes`) and the secret key's view of a ciphertext. Loading goes through an anonymous
in-memory file (`memfd_create`, read back through /proc/self/fd), which no other process can
open by name and costs no directory create/remove per call; a private temporary directory
where memfd is unavailable. Saving goes through a private temporary directory.
"""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt
import tenseal.sealapi as sealapi

from he_partition.core.errors import InvalidInputError

__all__ = ["seal_bytes", "load_seal_bytes", "ciphertext_polys", "plaintext_coeffs", "seal_version", "seal_header",
           "seal_dyn_array", "seal_ciphertext_bytes", "seal_phase_and_plaintext"]

_MAGIC = b"\x5e\xa1"
_COMPR_NONE, _COMPR_ZLIB, _COMPR_ZSTD = 0, 1, 2


def seal_bytes(obj: Any) -> bytes:
    """The bytes SEAL's `save` writes for `obj` (through an anonymous in-memory file where there is one)."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("dpagg-seal", getattr(os, "MFD_CLOEXEC", 0))
        try:
            obj.save(f"/proc/self/fd/{fd}")
            size = os.fstat(fd).st_size
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix="dpagg-seal-") as d:
        path = os.path.join(d, "obj")
        obj.save(path)
        return Path(path).read_bytes()


_VERSION: list[bytes] = []


def seal_version() -> bytes:
    """SEAL's header bytes (header size, major, minor version) as the linked SEAL library writes them.

    A property of the library, not of a context: probed once per process (saving a plaintext) and cached.
    """
    if not _VERSION:
        import tenseal.sealapi as sealapi

        _VERSION.append(seal_bytes(sealapi.Plaintext("1"))[2:5])
    return _VERSION[0]


def seal_header(total: int, version: bytes | None = None) -> bytes:
    """SEAL's 16-byte header of an uncompressed object of `total` bytes: magic 0x5EA1, `version` (this library's by
    default: `seal_version`), compression mode none, 2 reserved bytes, the total size (little-endian u64)."""
    return _MAGIC + (version or seal_version()) + bytes([_COMPR_NONE]) + b"\x00\x00" + struct.pack("<Q", total)


def seal_dyn_array(values: npt.ArrayLike, version: bytes | None = None) -> bytes:
    """SEAL's uncompressed serialization of a DynArray of u64 `values`: its header, its length, the values."""
    data = np.ascontiguousarray(values, dtype="<u8")
    return seal_header(16 + 8 + data.nbytes, version) + struct.pack("<Q", data.size) + data.tobytes()


def _body(data: bytes, what: str) -> bytes:
    """The uncompressed members of a SEAL object's bytes (after its 16-byte header), checked against the header.

    SEAL's header: magic 0x5EA1, header size 16, major and minor version, compression mode (0
    none, 1 zlib, 2 zstd), 2 reserved bytes, the total size (little-endian u64).
    """
    if len(data) < 16 or data[:2] != _MAGIC or data[2] != 16:
        raise InvalidInputError(f"not a SEAL {what}: no SEAL header")
    mode, total = data[5], struct.unpack_from("<Q", data, 8)[0]
    if total != len(data):
        raise InvalidInputError(f"SEAL {what} of {len(data)} bytes says it has {total}")
    body = memoryview(data)[16:]
    try:
        if mode == _COMPR_NONE:
            return bytes(body)
        if mode == _COMPR_ZLIB:
            return zlib.decompress(body)
        if mode == _COMPR_ZSTD:
            import zstandard

            return zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 28)
    except Exception as exc:  # zlib.error, zstandard.ZstdError, ValueError, MemoryError
        raise InvalidInputError(f"SEAL {what}: its compressed members do not decompress: {exc}") from None
    raise InvalidInputError(f"SEAL {what}: unknown compression mode {mode}")


def _dyn_array(body: bytes, at: int, count: int, what: str) -> npt.NDArray[np.uint64]:
    """`count` u64 values of the (uncompressed) DynArray that starts at byte `at` of `body`."""
    if len(body) < at + 24 or body[at:at + 2] != _MAGIC or body[at + 5] != _COMPR_NONE:
        raise InvalidInputError(f"SEAL {what}: malformed coefficient array")
    stored = struct.unpack_from("<Q", body, at + 16)[0]
    if stored != count or len(body) != at + 24 + 8 * count:
        raise InvalidInputError(f"SEAL {what}: its coefficient array holds {stored} values in "
                                f"{len(body) - at - 24} bytes, expected {count}")
    return np.frombuffer(body, dtype="<u8", count=count, offset=at + 24).astype(np.uint64)


def ciphertext_polys(data: bytes) -> tuple[tuple[int, ...], bool, npt.NDArray[np.uint64]]:
    """(parms_id, NTT form, coefficients of shape (size, primes, N)) of SEAL ciphertext bytes.

    Reads the bytes SEAL's `save` writes (any compression) with numpy: what reading a loaded
    ciphertext through the bindings does one element per call (about 2.4 ms per polynomial
    against 0.2 ms here). Only parses: the caller checks the level and the residues' range.
    """
    body = _body(bytes(data), "ciphertext")
    if len(body) < 73:
        raise InvalidInputError("SEAL ciphertext: truncated members")
    parms_id = struct.unpack_from("<4Q", body, 0)
    ntt = body[32]
    size, n, k = struct.unpack_from("<QQQ", body, 33)
    if ntt > 1 or not (1 <= size <= 16 and 1 <= n <= 1 << 17 and 1 <= k <= 64):
        raise InvalidInputError(f"SEAL ciphertext: implausible shape ({size} parts, degree {n}, {k} primes)")
    polys = _dyn_array(body, 73, size * k * n, "ciphertext").reshape(size, k, n)
    return parms_id, bool(ntt), polys


def plaintext_coeffs(data: bytes) -> npt.NDArray[np.uint64]:
    """The coefficients of SEAL Plaintext bytes (coefficient form: its first `coeff_count` values)."""
    body = _body(bytes(data), "plaintext")
    if len(body) < 48:
        raise InvalidInputError("SEAL plaintext: truncated members")
    count = struct.unpack_from("<Q", body, 32)[0]
    if count > 1 << 24:
        raise InvalidInputError(f"SEAL plaintext: implausible coefficient count {count}")
    return _dyn_array(body, 48, count, "plaintext")


def load_seal_bytes(obj: Any, seal_context: Any, data: bytes) -> Any:
    """`obj.load(seal_context, <data>)`, returning `obj`; SEAL's own RuntimeError / ValueError on bad bytes."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("dpagg-seal", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, data) if len(data) < (1 << 20) else Path(f"/proc/self/fd/{fd}").write_bytes(data)
            obj.load(seal_context, f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return obj
    with tempfile.TemporaryDirectory(prefix="dpagg-seal-") as d:
        path = os.path.join(d, "obj")
        Path(path).write_bytes(data)
        obj.load(seal_context, path)
    return obj


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def seal_ciphertext_bytes(version: bytes, parms_id: Sequence[int], polys: npt.NDArray[np.uint64], *,
                          ntt: bool) -> bytes:
    """SEAL's serialization of a ciphertext with coefficients `polys` (shape (size, k, N)), uncompressed.

    A 16-byte header (magic 0x5EA1, `version`: header size and SEAL major/minor, no
    compression, total size), the parameter id, the NTT flag, size/degree/prime count,
    scale 1.0 and correction factor 1, then the coefficient array (RNS, polynomial-major).
    """
    body = (struct.pack("<4Q", *parms_id) + (b"\x01" if ntt else b"\x00")
            + struct.pack("<QQQdQ", polys.shape[0], polys.shape[2], polys.shape[1], 1.0, 1)
            + seal_dyn_array(polys.reshape(-1), version))
    return seal_header(16 + len(body), version) + body


def seal_phase_and_plaintext(seal: Any, ct: Any, secret: Any, moduli: Sequence[int], parms_id: Sequence[int],
                             version: bytes) -> tuple[list[int], list[int], int]:
    """(phase c0 + c1 s (+ c2 s^2 ...) mod Q as centred ints, plaintext polynomial, Q) of a SEAL ciphertext.

    `moduli`/`parms_id`: the ciphertext's level; `version`: SEAL's header bytes (see
    `seal_ciphertext_bytes`). The secret key's view of one ciphertext, for tests and audits.
    """
    k = len(moduli)
    n = int(ct.poly_modulus_degree())
    plain = sealapi.Plaintext()
    sealapi.Decryptor(seal, secret).decrypt(ct, plain)
    m = [int(plain[i]) for i in range(plain.coeff_count())] + [0] * (n - plain.coeff_count())
    evaluator = sealapi.Evaluator(seal)
    evaluator.transform_to_ntt_inplace(ct)
    arr = ct.dyn_array()
    c = np.array([arr[i] for i in range(arr.size())], dtype=np.uint64).reshape(ct.size(), k, n)
    evaluator.transform_from_ntt_inplace(ct)  # leave the caller's ciphertext as it was
    sk = secret.data().dyn_array()
    s_ntt = np.array([sk[i] for i in range(k * n)], dtype=np.uint64).reshape(k, n)
    phase_ntt = np.zeros((2, k, n), dtype=np.uint64)
    for j, q in enumerate(moduli):
        acc = c[0, j].astype(object)
        power = np.ones(n, dtype=object)
        for i in range(1, c.shape[0]):
            power = (power * s_ntt[j].astype(object)) % q
            acc = acc + c[i, j].astype(object) * power
        phase_ntt[0, j] = np.array([int(v) % q for v in acc], dtype=np.uint64)
    phase_ntt[1] = phase_ntt[0]  # SEAL refuses to transform a transparent (c1 = 0) ciphertext
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "phase.bin")
        open(path, "wb").write(seal_ciphertext_bytes(version, parms_id, phase_ntt, ntt=True))
        ph = sealapi.Ciphertext()
        ph.load(seal, path)
    evaluator.transform_from_ntt_inplace(ph)
    arr = ph.dyn_array()
    res = [[int(arr[j * n + i]) for i in range(n)] for j in range(k)]
    big_q = 1
    for q in moduli:
        big_q *= q
    phase = []
    for i in range(n):
        x = 0
        for j, q in enumerate(moduli):
            part = big_q // q
            x += res[j][i] * part * pow(part, -1, q)
        x %= big_q
        phase.append(x - big_q if x > big_q // 2 else x)
    return phase, m, big_q
