"""Exact-integer BFV (TenSEAL) implementation of the vector interface; the only module that imports tenseal.

Why BFV and not CKKS (measured, see docs/threat-model.md): a CKKS decryption is the data
plus encoding and rounding residues that are deterministic functions of the owners' exact
values, so the key holder learned un-noised prefix sums from them. BFV computes exactly
modulo the plain modulus t, so the decrypted slots are exactly the values the measurement
put there. What the secret key reveals beyond the slots is the *noise polynomial* of the
ciphertext: fresh encryption noise (independent of the data) plus, for each encryption
that was summed, the rounding of round(q m / t) (|.| <= 1/2 per coefficient, a function
of that owner's plaintext). `BfvBackend.add_noise` floods that part: it adds a
"transparent" ciphertext (r, 0) whose r is uniform on [-2^61, 2^61), so the key holder's
view of the noise is within statistical distance N * B / 2^62 of a data-independent one
(B = data-dependent noise bound, (k + 2) / 2 for k summed encryptions plus the computation
side's noise encryption).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import tempfile
from typing import Any

import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as sealapi

from ..core.backend import ChunkedVector, ChunkwiseArithmetic, IntArray, split_chunks
from ..core.errors import InvalidInputError, PrecisionError
from .flooding import flood_residues
from .params import BfvParams, generate_secret_context
from .seal_io import _varint, seal_ciphertext_bytes, seal_phase_and_plaintext, seal_version

__all__ = [
    "BfvParams",
    "BfvBackend",
    "FLOOD_BITS",
    "FLOODED_MIN_BUDGET_BITS",
    "MIN_NOISE_BUDGET_BITS",
    "generate_secret_context",
    "public_context_bytes",
    "load_context",
    "context_fingerprint",
]

#: The flooding polynomial r is uniform on [-2^FLOOD_BITS, 2^FLOOD_BITS) per coefficient.
FLOOD_BITS = 61

#: A ciphertext whose invariant noise budget is below this is refused before decryption:
#: an honest flooded ciphertext keeps about 48 bits (measured); one made under another key,
#: or with corrupted coefficients, has 0.
MIN_NOISE_BUDGET_BITS = 20

#: The decryption server's integrity check after its own flood (`BfvBackend.holder_flooded`):
#: an honest chunk keeps 2 bits of noise budget then (measured: the flood is 2^108 at these
#: parameters, Delta / 2 = 2^110), a foreign-key or corrupt one 0. Budget >= 1 bit is the
#: budget at which SEAL's decryption is still exact.
FLOODED_MIN_BUDGET_BITS = 1
#: The decryption server's own flood is 2^(bit length of Delta - HOLDER_FLOOD_MARGIN_BITS) wide:
#: 2^108 for Delta ~ 2^111 (N = 8192, primes [60, 50, 50], t of 49 bits), a quarter of Delta / 2,
#: so |honest noise (< 2^62) + flood| stays below Delta / 2 and decoding stays exact.
HOLDER_FLOOD_MARGIN_BITS = 4
_HOLDER_FLOOD_TAG = b"dpagg/holder-flood/v1"


def public_context_bytes(ctx: ts.Context) -> bytes:
    """Serialize only public material (public key, no secret key, no Galois or relinearization keys)."""
    return bytes(ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                               save_relin_keys=False))


def load_context(data: bytes) -> ts.Context:
    """Load a serialized context; raises InvalidInputError on malformed bytes or a non-BFV context."""
    try:
        ctx = ts.context_from(data)
    except Exception as exc:  # TenSEAL raises bare ValueError/RuntimeError on garbage.
        raise InvalidInputError(f"bytes are not a serialized TenSEAL context: {exc}") from exc
    scheme = ctx.seal_context().data.key_context_data().parms().scheme()
    if getattr(scheme, "name", str(scheme)) != "BFV":
        raise InvalidInputError(f"the context is for scheme {scheme.name}, dpagg needs BFV")
    return ctx


def context_fingerprint(ctx_bytes: bytes) -> str:
    """SHA-256 of a serialized public context: lets parties check they use the same key."""
    return hashlib.sha256(ctx_bytes).hexdigest()


class _CiphertextCodec:
    """Raw SEAL ciphertext bytes for one context: the bridge TenSEAL's Python API lacks.

    SEAL serializes a ciphertext as a 16-byte header, its metadata and the coefficient
    array (RNS, polynomial-major). Writing the array uncompressed lets us build a
    ciphertext from chosen coefficients (the flooding term) and read one back (the key
    holder's view in `he_partition.he.keyholder`).
    """

    def __init__(self, context: ts.Context, slots: int) -> None:
        seal = context.seal_context().data
        data = seal.first_context_data()
        self.moduli = [int(m.value()) for m in data.parms().coeff_modulus()]
        self.degree = int(data.parms().poly_modulus_degree())
        self.parms_id = [int(x) for x in seal.first_parms_id()]
        self._version = seal_version()  # header size, major, minor version
        shape = _varint(slots)
        self._shape_field = b"\x0a" + _varint(len(shape)) + shape

    def seal_bytes(self, polys: npt.NDArray[np.uint64], *, ntt: bool) -> bytes:
        """An uncompressed SEAL ciphertext of `polys` (shape (size, k, N), residues mod each prime)."""
        return seal_ciphertext_bytes(self._version, self.parms_id, polys, ntt=ntt)

    def vector_bytes(self, polys: npt.NDArray[np.uint64]) -> bytes:
        """TenSEAL BFVVector serialization (protobuf: shape, ciphertext) around `seal_bytes`."""
        seal = self.seal_bytes(polys, ntt=False)
        return self._shape_field + b"\x12" + _varint(len(seal)) + seal

    def residues(self, values: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """Signed coefficients (|v| < 2^63) reduced modulo each prime: shape (k, N)."""
        return np.stack([np.mod(values, np.int64(q)).astype(np.uint64) for q in self.moduli])


class BfvBackend(ChunkwiseArithmetic):
    """Chunked BFV vectors over one TenSEAL context, exact modulo `plain_modulus`.

    With a public context it can encrypt and compute (data owners, computation server);
    only with the secret context (decryption server) can it decrypt. Decryption refuses a
    ciphertext whose noise budget shows it was made under another key or corrupted.
    """

    def __init__(self, context: ts.Context) -> None:
        self.context = context
        parms = context.seal_context().data.key_context_data().parms()
        self.slots = int(parms.poly_modulus_degree())
        self.plain_modulus = int(parms.plain_modulus().value())
        self._codec = _CiphertextCodec(context, self.slots)
        self._decryptor: Any = None
        #: Tests switch this off to show the attack flooding stops (tests/he_partition/test_keyholder.py);
        #: nothing in the services or the CLI can.
        self.flooding = True
        #: Add the slot noise to c0 only, as a plaintext, so every measurement chunk keeps the
        #: owners' aggregate c1, which the key holders take from the owners' signed c1 parts
        #: (he_partition.he.threshold.c1). False (unsigned studies): a fresh encryption.
        self.noise_in_c0 = False
        #: With `noise_in_c0`: flood c0 too. True for the single key holder of a signed study (it
        #: decrypts the whole polynomial); False in threshold mode (the holders never see c0).
        self.flood_in_c0 = False

    @property
    def can_decrypt(self) -> bool:
        return bool(self.context.is_private())

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector:
        arr = _as_int_vector(values)
        chunks = tuple(ts.bfv_vector(self.context, np.mod(c, self.plain_modulus).tolist())
                       for c in split_chunks(arr, self.slots))
        return ChunkedVector(arr.size, chunks)

    def _noised_chunk(self, chunk: Any, noise: IntArray) -> Any:
        """chunk + a fresh encryption of `noise` (or, with `noise_in_c0`, `noise` as a plaintext on c0), then flooded.

        Flooding adds the transparent ciphertext (r, 0), r uniform on [-2^61, 2^61) per
        coefficient from the OS CSPRNG (never a seeded source: it changes no slot value, so
        seeded releases stay equal to the plain backend's). Only the computation side
        knows r; the decryption side sees the phase noise + r, whose data-dependent part
        (|.| <= B) is hidden up to statistical distance N * B / 2^62 per ciphertext.
        With `noise_in_c0` the noise is a plaintext on c0 and c1 stays the owners' aggregate; the
        flood (r, 0) changes c0 only, so it keeps c1 too. It is added with `flood_in_c0` (the single
        key holder of a signed study, which decrypts the whole polynomial) and left out in threshold
        mode: the key-share holders never see c0 (they compute on the owners' signed c1), and the
        combiner is this server, which would know r; there each holder's smudging (2^70) hides the
        owners' noise.
        """
        if self.noise_in_c0:  # plaintext addition: c0 += round(Q m / t), c1 unchanged
            noised = chunk + np.mod(np.asarray(noise, dtype=np.int64), self.plain_modulus).tolist()
            return noised + self._flood() if self.flood_in_c0 and self.flooding else noised
        noised = chunk + self.encrypt(noise).chunks[0]
        return noised + self._flood() if self.flooding else noised

    def _flood(self) -> Any:
        n = self._codec.degree
        r = np.frombuffer(os.urandom(8 * n), dtype=np.int64) >> (63 - FLOOD_BITS)
        polys = np.zeros((2, len(self._codec.moduli), n), dtype=np.uint64)
        polys[0] = self._codec.residues(r)
        return ts.bfv_vector_from(self.context, self._codec.vector_bytes(polys))

    @property
    def holder_flood_bits(self) -> int:
        """The width (bits) of the decryption server's own flood at this context: Delta's bit length minus 4."""
        delta = 1
        for q in self._codec.moduli:
            delta *= q
        return (delta // self.plain_modulus).bit_length() - HOLDER_FLOOD_MARGIN_BITS

    def holder_flooded(self, data: bytes, key: bytes, *, chunk: int = 0) -> bytes:
        """The serialized chunk `data` with the key holder's own flood e added to c0: (c0 + e, c1).

        e is uniform on [-2^holder_flood_bits, 2^holder_flood_bits) per coefficient (2^108 at the
        project's parameters), drawn from SHAKE-256 of HMAC-SHA256(`key`, the chunk's level and
        coefficients): the same ciphertext gets the same e, so sending it again cannot average
        the flood away, and any other ciphertext gets an independent one. It changes no slot
        value of an honest chunk (its noise, < 2^62, plus e stays below Delta / 2 = 2^110), but it
        blurs the phase c0 + c1 s by 2^109 before the integrity check (`decrypt_flooded`), so
        whether a chosen ciphertext passes no longer resolves the key. InvalidInputError when
        `data` is no 2-part chunk at this context's first level (a public fact of the bytes).
        Privacy: spends no epsilon and is no DP noise (no sensitivity or neighbouring relation
        applies: it changes no slot value of an honest chunk); who knows e: only the key holder,
        whose flood `key` derives it (`DecryptionHandler` derives the key from its noise key).
        """
        from .threshold.c1 import ciphertext_parts
        from .threshold.context import vector_ciphertext

        try:
            parms_id, moduli, polys = ciphertext_parts(self.context, vector_ciphertext(data))
        except InvalidInputError as exc:
            raise InvalidInputError(f"chunk {chunk}: {exc}; nothing was charged or decrypted") from None
        if parms_id != self._codec.parms_id:
            raise InvalidInputError(f"chunk {chunk} is at another level than this key's first one: nothing was "
                                    "charged or decrypted")
        seed = hmac.new(key, _HOLDER_FLOOD_TAG + struct.pack("<4Q", *parms_id) + polys.tobytes(),
                        hashlib.sha256).digest()
        words = np.frombuffer(hashlib.shake_256(seed).digest(16 * self.slots), dtype="<u8").reshape(self.slots, 2)
        e = flood_residues(words, moduli, bits=self.holder_flood_bits)
        q = np.array(moduli, dtype=np.uint64)[:, None]
        polys[0] = (polys[0] + e) % q  # both below q < 2^61: no overflow
        return self._codec.vector_bytes(polys)

    def decrypt_flooded(self, chunk: Any) -> tuple[IntArray, bool]:
        """(slot values, passed) of one chunk that carries the key holder's flood (`holder_flooded`).

        `passed`: its noise budget is at least FLOODED_MIN_BUDGET_BITS (another key or a corrupt
        chunk has 0). The chunk is decrypted either way, so the work does not depend on the
        outcome; the caller reads both only after the charge.
        """
        chunk.link_context(self.context)
        passed = self.noise_budget(chunk) >= FLOODED_MIN_BUDGET_BITS
        return np.asarray(chunk.decrypt(), dtype=np.int64), passed

    def noise_budget(self, chunk: Any) -> int:
        """SEAL's invariant noise budget of one chunk, in bits (secret key needed)."""
        if self._decryptor is None:
            if not self.can_decrypt:
                raise InvalidInputError("this context holds no secret key; only the decryption server can decrypt")
            self._decryptor = sealapi.Decryptor(self.context.seal_context().data, self.context.secret_key().data)
        return int(self._decryptor.invariant_noise_budget(chunk.ciphertext()[0]))

    def verify(self, a: ChunkedVector) -> None:
        """Refuse chunks whose invariant noise budget is below MIN_NOISE_BUDGET_BITS (another key, corruption).

        An honest flooded ciphertext keeps ~49 bits; a foreign-key one has 0, and so does one
        whose coefficients were altered above the flooding level. Whether it passes is a function
        of the phase c0 + c1 s: the decryption server runs its own check (`decrypt_flooded`,
        after its flood) only after the charge; this one serves in-process callers.
        """
        for i, c in enumerate(a.chunks):
            if c is None:  # not sent: no measured slot
                continue
            c.link_context(self.context)
            if self.noise_budget(c) < MIN_NOISE_BUDGET_BITS:
                raise PrecisionError(
                    f"ciphertext chunk {i} failed the decryption integrity check (its noise budget is below "
                    f"{MIN_NOISE_BUDGET_BITS} bits): it was made under another key or is corrupt"
                )

    def decrypt(self, a: ChunkedVector, *, verified: bool = False) -> IntArray:
        """Exact slot values, centred in (-t/2, t/2]; refuses foreign-key or corrupt chunks (`verify`,
        skipped when the caller has just run it: `verified=True`)."""
        if not self.can_decrypt:
            raise InvalidInputError("this context holds no secret key; only the decryption server can decrypt")
        if not verified:
            self.verify(a)
        parts = []
        for c in a.chunks:
            parts.append(np.zeros(self.slots, dtype=np.int64) if c is None else np.asarray(c.decrypt(), dtype=np.int64))
        return np.concatenate(parts)[: a.length] if parts else np.zeros(0, dtype=np.int64)

    def with_c1(self, data: bytes, c1: npt.NDArray[np.uint64], *, chunk: int = 0) -> bytes:
        """The serialized chunk `data` with its c1 replaced by `c1` (shape (k, N), residues at the first level).

        The single key holder of a signed study decrypts the computation server's c0 together
        with the owners' aggregate c1 it verified itself (`UploadC1Book`), never the c1 it was
        sent. InvalidInputError when `data` is no 2-part ciphertext at that level.
        """
        from .threshold.c1 import C1_MISMATCH, ciphertext_parts  # threshold.c1 imports this module's helpers
        from .threshold.context import vector_ciphertext

        try:
            parms_id, _, polys = ciphertext_parts(self.context, vector_ciphertext(data))
        except InvalidInputError as exc:
            raise InvalidInputError(f"chunk {chunk}: {exc}; nothing was charged or decrypted") from None
        if parms_id != self._codec.parms_id or polys.shape[1:] != np.shape(c1):
            raise InvalidInputError(f"chunk {chunk}: {C1_MISMATCH} (the ciphertext is at another level than the "
                                    "owners' uploads): nothing was charged or decrypted")
        polys[1] = c1
        return self._codec.vector_bytes(polys)

    def serialize_chunk(self, chunk: Any) -> bytes:
        return bytes(chunk.serialize())

    def deserialize_chunk(self, data: bytes) -> Any:
        try:
            vec = ts.bfv_vector_from(self.context, data)
        except Exception as exc:
            raise InvalidInputError(f"bytes are not a BFV ciphertext for this context: {exc}") from exc
        if vec.size() != self.slots:
            raise InvalidInputError(f"a ciphertext chunk must hold {self.slots} slots, got {vec.size()}")
        return vec

    # -- the key holder's raw view (he_partition.he.keyholder) ------------------------

    def phase_and_plaintext(self, chunk: Any) -> tuple[list[int], list[int], int]:
        """(phase c0 + c1 s mod Q as centred ints, plaintext polynomial coefficients, Q).

        Everything the secret key reveals about one chunk: the plaintext polynomial m (the
        slots are its batch decoding) and the phase, whose difference from the scaled
        plaintext is the noise polynomial. Secret key needed; slow (test hook).
        """
        if not self.can_decrypt:
            raise InvalidInputError("the key holder's view needs the secret context")
        seal = self.context.seal_context().data
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ct.bin")
            chunk.ciphertext()[0].save(path)
            ct = sealapi.Ciphertext()
            ct.load(seal, path)
            key_path = os.path.join(tmp, "sk.bin")
            self.context.secret_key().data.save(key_path)
            secret = sealapi.SecretKey()
            secret.load(seal, key_path)
        return seal_phase_and_plaintext(seal, ct, secret, self._codec.moduli, self._codec.parms_id,
                                        self._codec._version)


def _as_int_vector(values: npt.ArrayLike) -> IntArray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InvalidInputError(f"expected a 1-D vector, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.rint(arr)):
            raise InvalidInputError("BFV encrypts integers: got NaN, infinite or fractional values")
    elif arr.dtype.kind not in "iub":
        raise InvalidInputError(f"BFV encrypts integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)

