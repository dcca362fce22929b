"""The BFV scheme of the cross-organization join, on SEAL's own Python bindings (`tenseal.sealapi`).

The join multiplies ciphertexts (owner A's attribute indicators times owner B's) and sums
every slot of the products with rotations, which TenSEAL's vector API cannot express; so
this module drives SEAL directly. Parameters: N = 8192 (8,192 slots), coefficient primes
[60, 50, 50, 58] (the last is SEAL's special prime), plain modulus a batching prime of
`JOIN_VERSIONS[version]` bits: 20 for version 1, 23 for version 2 (a product of two fresh
ciphertexts keeps ~100 of its 132 bits of noise budget at 20 bits; the release's 49-bit
modulus would leave too little for the flooding below). A study's contract names its version.

What the decryption server sees: products of ciphertexts carry data-dependent noise
(terms like m_a * e_b). Before any ciphertext leaves the computation server it adds an
encryption of its DP noise, one-time pads on every slot the release does not use, and
floods: the transparent ciphertext (r, 0) with r uniform on [-2^FLOOD_BITS, 2^FLOOD_BITS)
per coefficient from the OS CSPRNG. The measured noise of a folded product is below
2^56 (`tests/he_partition/test_join.py`), so the decryptor's residual view is
data-independent up to statistical distance N * 2^56 / 2^(FLOOD_BITS+1) = 2^-42 per
ciphertext, and the budget left (29 bits at version 1, 26 at version 2's capacity edge;
>= 20 required) still decrypts exactly. A released value that
sums k cells (`signed_sum`: a partition, a Haar node) has at most k times that noise:
distance at most k * 2^-42 (2^-30 for the total of a 64 x 64 table).

After flooding, `noised` switches the ciphertext down to the last data prime (60 bits): a
public, deterministic map of the flooded ciphertext that anyone, the key holder included,
could apply itself, so the key holder's view is a function of what it saw before and its
statistical distance from a data-independent view cannot grow (data-processing inequality).
The flood then appears scaled by q_last / q (`flood_width`); the budget left is ~25 bits
(>= 20 required), and the ciphertext is a third of the bytes (131 KB), decrypts and
budget-checks about 3x faster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt
import tenseal.sealapi as seal

from .flooding import FLOOD_BITS, flood_residues
from .seal_io import load_seal_bytes, seal_bytes, seal_ciphertext_bytes, seal_phase_and_plaintext
from ..core.errors import InvalidInputError, PrecisionError

__all__ = ["JoinParams", "JoinScheme", "FLOOD_BITS", "flood_residues", "MIN_NOISE_BUDGET_BITS", "JOIN_VERSIONS",
           "CURRENT_JOIN_VERSION", "join_plain_modulus"]

#: Decryption refuses a ciphertext with less noise budget (another key, corruption, or too many operations).
MIN_NOISE_BUDGET_BITS = 20
#: Join scheme versions and their plain modulus bits. A join study's contract names its version
#: (JoinTerms.version); the key holder keeps one key pair per version. Version 1 (20-bit t) caps
#: the capacity at 507,904 positions, version 2 (23-bit t) at 4,128,768; version 2 leaves about 3
#: bits less noise budget after the release's evaluation (docs/join.md, Scale).
JOIN_VERSIONS: dict[int, int] = {1: 20, 2: 23}
#: The version new join studies get (`dpagg open-join`, the benchmark).
CURRENT_JOIN_VERSION = 2
# Public key material of a version above 1 starts with this and the version byte; version 1's has no
# header (its key files and the fingerprints in its contracts predate versions).
_PUBLIC_MAGIC = b"dpagg-join-key-v"


@dataclass(frozen=True)
class JoinParams:
    poly_modulus_degree: int = 8192
    coeff_modulus_bits: tuple[int, ...] = (60, 50, 50, 58)
    plain_modulus_bits: int = 20

    @classmethod
    def for_version(cls, version: int) -> "JoinParams":
        """The parameters of join scheme `version` (InvalidInputError for an unknown one)."""
        if isinstance(version, bool) or version not in JOIN_VERSIONS:
            raise InvalidInputError(f"join scheme version {version!r} is unknown (known: "
                                    f"{', '.join(map(str, sorted(JOIN_VERSIONS)))})")
        return cls(plain_modulus_bits=JOIN_VERSIONS[version])

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree

    @property
    def version(self) -> int:
        """The join scheme version of these parameters (0 for parameters no version names, e.g. a test's)."""
        if self != JoinParams(plain_modulus_bits=self.plain_modulus_bits):
            return 0
        return next((v for v, bits in JOIN_VERSIONS.items() if bits == self.plain_modulus_bits), 0)

    def describe(self) -> str:
        return f"join scheme version {self.version} ({self.plain_modulus_bits}-bit plain modulus)"


def join_plain_modulus(version: int) -> int:
    """The plain modulus t of join scheme `version` (the batching prime SEAL picks for its bits and N)."""
    params = JoinParams.for_version(version)
    return int(seal.PlainModulus.Batching(params.poly_modulus_degree, params.plain_modulus_bits).value())


@lru_cache(maxsize=8)
def _context(params: JoinParams) -> Any:
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.BFV)
    parms.set_poly_modulus_degree(params.poly_modulus_degree)
    parms.set_coeff_modulus(seal.CoeffModulus.Create(params.poly_modulus_degree, list(params.coeff_modulus_bits)))
    parms.set_plain_modulus(seal.PlainModulus.Batching(params.poly_modulus_degree, params.plain_modulus_bits))
    return seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)


_dump = seal_bytes


def _load(factory: Callable[[], Any], context: Any, data: bytes, what: str, params: JoinParams | None = None) -> Any:
    try:
        return load_seal_bytes(factory(), context, data)
    except (RuntimeError, ValueError) as exc:
        scheme = params.describe() if params is not None else "this join scheme"
        raise InvalidInputError(f"not a valid {what} for {scheme}: {exc}") from exc


def _version_of(factory: Callable[[], Any], data: bytes, what: str, params: JoinParams) -> str:
    """Why `data` did not load under `params`: a message naming the version it belongs to, if it is one's."""
    for version in sorted(JOIN_VERSIONS):
        other = JoinParams.for_version(version)
        if other == params:
            continue
        try:
            _load(factory, _context(other), data, what, other)
        except InvalidInputError:
            continue
        return (f"a {what} of {other.describe()}, but this study uses {params.describe()} (its contract names "
                f"the version): refusing it")
    return f"not a valid {what} for {params.describe()}"


class JoinScheme:
    """One join key: encrypt (anyone with the public part), evaluate (computation server), decrypt (key holder).

    `JoinScheme.generate()` makes a key pair with relinearization and rotation keys (the
    decryption server); `public_bytes()` is what it hands out; `JoinScheme.from_public(data)`
    rebuilds a scheme that can encrypt and evaluate but not decrypt.
    """

    def __init__(self, params: JoinParams, context: Any, public_key: Any, relin_keys: Any, galois_keys: Any,
                 secret_key: Any = None) -> None:
        self.params = params
        self.context = context
        self.slots = params.slots
        self.plain_modulus = int(context.key_context_data().parms().plain_modulus().value())
        first = context.first_context_data()
        self.moduli = [int(m.value()) for m in first.parms().coeff_modulus()]
        self._public_key, self._relin, self._galois, self._secret = public_key, relin_keys, galois_keys, secret_key
        self._encoder = seal.BatchEncoder(context)
        self._encryptor = seal.Encryptor(context, public_key)
        self._evaluator = seal.Evaluator(context)
        self._decryptor = seal.Decryptor(context, secret_key) if secret_key is not None else None
        self.flooding = True  # tests switch it off to show what flooding hides; nothing else can
        self._version = _dump(self.encrypt([0]))[2:5]  # SEAL's header size and version, for raw ciphertexts

    # -- keys ---------------------------------------------------------------------------------
    @classmethod
    def generate(cls, params: JoinParams = JoinParams()) -> "JoinScheme":
        ctx = _context(params)
        keygen = seal.KeyGenerator(ctx)
        pk, rk, gk = seal.PublicKey(), seal.RelinKeys(), seal.GaloisKeys()
        keygen.create_public_key(pk)
        keygen.create_relin_keys(rk)
        keygen.create_galois_keys(gk)
        return cls(params, ctx, pk, rk, gk, keygen.secret_key())

    def public_bytes(self) -> bytes:
        """Public key, relinearization and rotation keys (length-prefixed); never the secret key."""
        parts = [_dump(self._public_key), _dump(self._relin), _dump(self._galois)]
        body = b"".join(len(p).to_bytes(8, "big") + p for p in parts)
        version = self.params.version
        return body if version == 1 else _PUBLIC_MAGIC + bytes([version]) + body

    @classmethod
    def from_public(cls, data: bytes, params: JoinParams | None = None) -> "JoinScheme":
        """The scheme of public key material: of the version it records (`params` None), or of `params`,
        refusing another version's key with an error naming both versions."""
        data = bytes(data)
        if data.startswith(_PUBLIC_MAGIC) and len(data) > len(_PUBLIC_MAGIC):
            stated, data = data[len(_PUBLIC_MAGIC)], data[len(_PUBLIC_MAGIC) + 1:]
        else:
            stated = 1
        if params is None:
            params = JoinParams.for_version(stated)
        if stated != params.version:
            known = JoinParams.for_version(stated).describe() if stated in JOIN_VERSIONS else (
                f"unknown join scheme version {stated}")
            raise InvalidInputError(f"this join public key is for {known}, but {params.describe()} is expected "
                                    "(the study's contract names the version)")
        ctx = _context(params)
        parts: list[bytes] = []
        at = 0
        while at < len(data):
            n = int.from_bytes(data[at:at + 8], "big")
            parts.append(data[at + 8:at + 8 + n])
            at += 8 + n
        if len(parts) != 3 or at != len(data):
            raise InvalidInputError("join public key material is malformed (expected public, relin and galois keys)")
        return cls(params, ctx, _load(seal.PublicKey, ctx, parts[0], "public key", params),
                   _load(seal.RelinKeys, ctx, parts[1], "relinearization key", params),
                   _load(seal.GaloisKeys, ctx, parts[2], "rotation key", params))

    @classmethod
    def from_keys(cls, params: JoinParams, public_key: bytes, relin_keys: bytes, galois_keys: bytes) -> "JoinScheme":
        """The public scheme of SEAL key bytes made elsewhere (key-share holders' collective keys,
        he_partition.join.holders); InvalidInputError naming the key that does not load."""
        ctx = _context(params)
        return cls(params, ctx, _load(seal.PublicKey, ctx, public_key, "public key", params),
                   _load(seal.RelinKeys, ctx, relin_keys, "relinearization key", params),
                   _load(seal.GaloisKeys, ctx, galois_keys, "rotation key", params))

    def secret_bytes(self) -> bytes:
        """The secret key, for the key holder's 0600 key file only (never sent anywhere)."""
        if self._secret is None:
            raise InvalidInputError("this join scheme holds no secret key")
        return _dump(self._secret)

    @classmethod
    def from_secret(cls, public: bytes, secret: bytes, params: JoinParams | None = None) -> "JoinScheme":
        """The key holder's scheme from its key files; refuses a secret key that does not match the public key."""
        pub = cls.from_public(public, params)
        sk = _load(seal.SecretKey, pub.context, secret, "secret key", pub.params)
        scheme = cls(pub.params, pub.context, pub._public_key, pub._relin, pub._galois, sk)
        if scheme.decrypt(pub.encrypt([7]))[0] != 7:
            raise InvalidInputError("the join secret key does not belong to the join public key")
        return scheme

    @property
    def can_decrypt(self) -> bool:
        return self._decryptor is not None

    # -- owners -------------------------------------------------------------------------------
    def encrypt(self, values: npt.ArrayLike) -> Any:
        """Encrypt up to `slots` integers (reduced mod the plain modulus; missing slots are 0)."""
        arr = np.asarray(values, dtype=np.int64).ravel()
        if arr.size > self.slots:
            raise InvalidInputError(f"{arr.size} values do not fit one ciphertext of {self.slots} slots")
        full = np.zeros(self.slots, dtype=np.int64)
        full[:arr.size] = np.mod(arr, self.plain_modulus)
        pt = seal.Plaintext()
        self._encoder.encode(full.astype(np.uint64).tolist(), pt)
        ct = seal.Ciphertext()
        self._encryptor.encrypt(pt, ct)
        return ct

    def serialize(self, ct: Any) -> bytes:
        return _dump(ct)

    def _parse(self, data: bytes) -> Any:
        """A SEAL ciphertext of this scheme's parameters, any level and size (InvalidInputError otherwise)."""
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise InvalidInputError("a join ciphertext must be non-empty bytes")
        try:
            return _load(seal.Ciphertext, self.context, bytes(data), "ciphertext", self.params)
        except InvalidInputError as exc:
            raise InvalidInputError(_version_of(seal.Ciphertext, bytes(data), "ciphertext", self.params)) from exc

    def deserialize(self, data: bytes) -> Any:
        """A ciphertext of this scheme's parameters (InvalidInputError for anything else)."""
        ct = self._parse(data)
        if ct.size() != 2 or ct.poly_modulus_degree() != self.slots:
            raise InvalidInputError(f"a join upload must be a fresh 2-part ciphertext, got {ct.size()} parts")
        if list(ct.parms_id()) != list(self.context.first_parms_id()):
            # Nothing in the join switches modulus: a lower level is a client's mistake or an attempt to
            # make the release fail (the flood needs the whole modulus).
            raise InvalidInputError("a join ciphertext must be at the full modulus level (it was modulus-switched)")
        return ct

    def deserialize_released(self, data: bytes) -> Any:
        """A ciphertext the computation server released to the key holder (`noised`): 2 parts, at the last data
        level (flooded, then modulus-switched) or at the full level (a computation server from before the switch).
        InvalidInputError for anything else."""
        ct = self._parse(data)
        levels = (list(self.context.first_parms_id()), list(self.context.last_parms_id()))
        if ct.size() != 2 or ct.poly_modulus_degree() != self.slots or list(ct.parms_id()) not in levels:
            raise InvalidInputError(f"a released join value must be a 2-part ciphertext at the full or the last data "
                                    f"level, got {ct.size()} parts")
        return ct

    def flood_width(self, ct: Any) -> float:
        """The width of the flood as it appears in `ct`'s noise: 2^(FLOOD_BITS + 1) scaled by the modulus switch
        (q_level / q_full; 1 at the full level). Tests compare the key holder's residual view with it."""
        level = np.prod([float(q) for q in self._level_moduli(ct)])
        return float(2.0 ** (FLOOD_BITS + 1) * level / np.prod([float(q) for q in self.moduli]))

    # -- computation server -------------------------------------------------------------------
    def multiply_accumulate(self, acc: Any | None, a: Any, b: Any) -> Any:
        """acc + a * b, left unrelinearized (3 parts) so a sum of products relinearizes once."""
        prod = seal.Ciphertext()
        self._evaluator.multiply(a, b, prod)
        if acc is None:
            return prod
        self._evaluator.add_inplace(acc, prod)
        return acc

    def total(self, ct: Any) -> Any:
        """Relinearize, then rotate-and-add until every slot holds the sum of all slots (13 rotations)."""
        cur = self._relinearized(ct)
        step = 1
        while step <= self.slots // 2:
            r = seal.Ciphertext()
            if step < self.slots // 2:
                self._evaluator.rotate_rows(cur, step, self._galois, r)
            else:  # the last step swaps the two rows of 4,096 slots
                self._evaluator.rotate_columns(cur, self._galois, r)
            nxt = seal.Ciphertext()
            self._evaluator.add(cur, r, nxt)
            cur = nxt
            step *= 2
        return cur

    def signed_sum(self, terms: Sequence[tuple[int, Any]]) -> Any:
        """sum of coef * ct over `terms`, coef +1 or -1 (the measured values of a release, he_partition.join.release).

        Additions only: the noise of the result is at most the sum of the terms' noises. The
        result may be a term itself (one +1 term): callers never modify it in place.
        """
        if not terms:
            raise InvalidInputError("a measured value needs at least one term")
        if any(coef not in (1, -1) for coef, _ in terms):
            raise InvalidInputError(f"measured values combine cells with coefficients +-1, got {[c for c, _ in terms]}")
        cts = [(coef, self._relinearized(ct)) for coef, ct in terms]
        (c1, x1), rest = cts[0], cts[1:]
        if not rest:
            if c1 > 0:
                return x1
            out = seal.Ciphertext()
            self._evaluator.negate(x1, out)
            return out
        (c2, x2), rest = rest[0], rest[1:]
        out = seal.Ciphertext()
        if c1 == c2:
            self._evaluator.add(x1, x2, out)
            if c1 < 0:
                self._evaluator.negate_inplace(out)
        elif c1 > 0:
            self._evaluator.sub(x1, x2, out)
        else:
            self._evaluator.sub(x2, x1, out)
        for coef, ct in rest:
            if coef > 0:
                self._evaluator.add_inplace(out, ct)
            else:
                self._evaluator.sub_inplace(out, ct)
        return out

    def plus_plain(self, ct: Any, values: Sequence[int] | npt.NDArray[np.int64]) -> Any:
        """ct + the plaintext of `values` on the leading slots (0 elsewhere): c0 changes, c1 does not (key-share
        holders bind their shares to c1, he_partition.join.holders). Adds exactly `values`; draws nothing."""
        vec = np.zeros(self.slots, dtype=np.int64)
        arr = np.asarray(values, dtype=np.int64).ravel()
        if arr.size > self.slots:
            raise InvalidInputError(f"{arr.size} values do not fit one ciphertext of {self.slots} slots")
        vec[:arr.size] = np.mod(arr, self.plain_modulus)
        pt = seal.Plaintext()
        self._encoder.encode(vec.astype(np.uint64).tolist(), pt)
        out = seal.Ciphertext()
        self._evaluator.add_plain(ct, pt, out)
        return out

    def _relinearized(self, ct: Any) -> Any:
        if ct.size() <= 2:
            return ct
        out = seal.Ciphertext()
        self._evaluator.relinearize(ct, self._relin, out)
        return out

    def noised(self, ct: Any, noise: Sequence[int] | npt.NDArray[np.int64], measured: int,
               pad_source: Callable[[int], npt.NDArray[np.int64]]) -> Any:
        """ct + Enc(noise on the first `measured` slots, pads elsewhere) + flood: what leaves for the key holder.

        Slots past `measured` get fresh pads uniform mod t from `pad_source(n)` (the
        computation server's CSPRNG), so the key holder learns nothing from them; the
        flood hides the data-dependent noise (module docstring).
        """
        noise = np.asarray(noise, dtype=np.int64)
        if noise.size != measured or not 0 < measured <= self.slots:
            raise InvalidInputError(f"noise for {measured} measured slots expected, got {noise.size}")
        vec = np.empty(self.slots, dtype=np.int64)
        vec[:measured] = noise
        vec[measured:] = pad_source(self.slots - measured)
        out = seal.Ciphertext()
        self._evaluator.add(self._relinearized(ct), self.encrypt(vec), out)
        if self.flooding:
            self._evaluator.add_inplace(out, self._flood(out))
            # Flooded at the full modulus, then switched down to the last data prime (a public, deterministic map of
            # the flooded ciphertext, so the key holder's view is no more informative than before: module docstring).
            self._evaluator.mod_switch_to_inplace(out, self.context.last_parms_id())
        return out

    def _flood(self, like: Any) -> Any:
        """The transparent ciphertext (r, 0) at `like`'s level, r uniform on [-2^FLOOD_BITS, 2^FLOOD_BITS)."""
        words = np.frombuffer(os.urandom(16 * self.slots), dtype="<u8").reshape(self.slots, 2)
        moduli = self._level_moduli(like)
        coeffs = np.zeros((2, len(moduli), self.slots), dtype=np.uint64)
        coeffs[0] = flood_residues(words, moduli)
        raw = seal_ciphertext_bytes(self._version, list(like.parms_id()), coeffs, ntt=False)
        return _load(seal.Ciphertext, self.context, raw, "flooding ciphertext")

    def _level_moduli(self, ct: Any) -> list[int]:
        data = self.context.get_context_data(ct.parms_id())
        return [int(m.value()) for m in data.parms().coeff_modulus()]

    # -- key holder ---------------------------------------------------------------------------
    def noise_budget(self, ct: Any) -> int:
        if self._decryptor is None:
            raise InvalidInputError("only the key holder can measure the noise budget")
        return int(self._decryptor.invariant_noise_budget(ct))

    def phase_and_plaintext(self, ct: Any) -> tuple[list[int], list[int], int]:
        """Everything the secret key reveals about `ct` (see `seal_io.seal_phase_and_plaintext`); a test hook."""
        if self._secret is None:
            raise InvalidInputError("the key holder's view needs the secret key")
        return seal_phase_and_plaintext(self.context, ct, self._secret, self._level_moduli(ct), list(ct.parms_id()),
                                        self._version)

    def decrypt(self, ct: Any) -> npt.NDArray[np.int64]:
        """All slots as centred integers; refuses (PrecisionError) a ciphertext with too little noise budget."""
        if self._decryptor is None:
            raise InvalidInputError("this join scheme holds no secret key: only the decryption server decrypts")
        budget = self.noise_budget(ct)
        if budget < MIN_NOISE_BUDGET_BITS:
            raise PrecisionError(f"join ciphertext has {budget} bits of noise budget (< {MIN_NOISE_BUDGET_BITS}): "
                                 "not made under this key, corrupted, or computed too deep; nothing was decrypted")
        pt = seal.Plaintext()
        self._decryptor.decrypt(ct, pt)
        vals = np.array(self._encoder.decode_uint64(pt), dtype=np.int64)
        t = self.plain_modulus
        return np.where(vals > t // 2, vals - t, vals)
