"""Write proto/test-vectors.json: contract hashes, signed submissions and every byte an owner seals and commits.

    python scripts/gen_test_vectors.py          # rewrite the file
    python scripts/gen_test_vectors.py --check  # exit 1 if the file differs from what the code computes

Everything in the file is computed by the code the servers run (parties.common.contract,
parties.common.jcs, parties.common.signing); tests/parties/test_test_vectors.py checks the
file is current and has Node verify it independently. The signing key is a fixed test key
(bytes 0..31), and so are the key holders' X25519 seal keys (bytes 64.., one per holder): never use them
for anything else. "owner_uploads" carries, for a sealed study with three key holders, every byte
an owner's upload derives: the c1 part of each chunk, the c1 digest, statement and signature, the
upload key, the sealed chunks, the sealed key shares, the commitment statement and signature, and
the submission digest and signature over the sealed chunks. Its chunks are TenSEAL BFV vectors of
tiny made-up ciphertexts (degree 8, 3 primes): the layout is real, the numbers are not an encryption.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parties.common.contract import CONTRACT_VERSION_V1, StudyContract  # noqa: E402
from parties.common.jcs import number_text  # noqa: E402
from parties.common.signing import public_key_of, sign_submission, stream_digest, submission_digest  # noqa: E402
from parties.common.sealing import (commitment_statement, seal_chunk, seal_upload_key,  # noqa: E402
                                    sealed_key_shares)
from parties.decryption.keyshare.uploads import c1_statement  # noqa: E402
from he_partition.he.seal_io import seal_ciphertext_bytes  # noqa: E402
from he_partition.he.threshold.c1 import c1_bytes, c1_stream_digest  # noqa: E402
from he_partition.he.threshold.context import vector_ciphertext  # noqa: E402
from he_partition.he.seal_io import ciphertext_polys  # noqa: E402

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

OUT = ROOT / "proto" / "test-vectors.json"
FP = "0123456789abcdef" * 4
TEST_KEY = bytes(range(32))

NUMBERS = [0.0, 1.0, -1.0, 0.5, 0.1, 1 / 3, 100.0, 123456.789, 1e-6, 1e-7, 2.5e-7, 1e20, 1e21, 1.5e300,
           5e-324, 1.7976931348623157e308, 9007199254740992.0, 0.000123, 4.35, 1e16]


def _contracts() -> list[tuple[str, StudyContract]]:
    public = public_key_of(TEST_KEY).hex()
    base: dict[str, Any] = {"study_id": "s1", "domain_size": 100, "epsilon": 1.0, "expected_owners": ("b", "a"),
                            "context_fingerprint": FP, "domain_spec": "age:0:100:100", "strategy": "gap"}
    return [
        ("plain study, integral epsilon", StudyContract(**base)),
        ("fractional epsilon, strategy parameters", StudyContract(
            **{**base, "epsilon": 0.1, "strategy_params_json": '{"threshold_k":2.0,"gap_fraction":0.25}'})),
        ("signed study (owner_keys)", StudyContract(
            **{**base, "expected_owners": ("a",), "owner_keys": (("a", public),)})),
        ("correlated records, a person at up to 3 organizations, non-ASCII text", StudyContract(
            **{**base, "epsilon": 2.5, "correlation_leakage": 0.75, "correlation_source": "Größe τ=0.5 n=120",
               "max_organizations": 3, "domain_spec": "Größe:0:2.5:100", "strategy": "auto"})),
        ("v1 contract (created before RFC 8785)", StudyContract(**{**base, "version": CONTRACT_VERSION_V1})),
        ("sealed study (holder_seal_keys, noise_tolerates)", sealed_contract()),
    ]


def _submissions() -> list[dict[str, Any]]:
    out = []
    for name, chunks in (("one chunk", [b"ciphertext-0"]), ("three chunks", [b"a", b"bc", bytes(range(256))])):
        contract_hash = _contracts()[2][1].contract_hash
        fields = {"study_id": "s1", "owner_id": "a", "idempotency_key": "up-0123456789abcdef0123",
                  "contract_hash": contract_hash}
        stream = stream_digest(chunks)
        digest = submission_digest(fields["study_id"], fields["owner_id"], fields["idempotency_key"], contract_hash,
                                   stream)
        out.append({"name": name, **fields, "chunks_hex": [c.hex() for c in chunks],
                    "ciphertext_digest": stream.hex(), "submission_digest": digest.hex(),
                    "private_key_seed": TEST_KEY.hex(), "public_key": public_key_of(TEST_KEY).hex(),
                    "signature": sign_submission(TEST_KEY, digest).hex()})
    return out


HOLDER_KEYS = [bytes(range(64 + 32 * j, 96 + 32 * j)) for j in range(3)]
TINY_PRIMES = (1125899906826241, 1125899906629633, 1125899906565121)  # any values below 2^61; made up
SEAL_VERSION = bytes([16, 4, 3])  # the header TenSEAL 0.3.18 (SEAL 4.3) writes; fixed so the file is stable


def _holder_public(private: bytes) -> str:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _tiny_vector(seed: int) -> bytes:
    """A TenSEAL BFV vector (shape 8, one SEAL ciphertext of 2 parts x 3 primes x 8 coefficients), made-up residues."""
    rng = np.random.default_rng(seed)
    polys = np.stack([np.stack([rng.integers(0, q, size=8, dtype=np.uint64) for q in TINY_PRIMES]) for _ in range(2)])
    seal = seal_ciphertext_bytes(SEAL_VERSION, (1, 2, 3, 4), polys, ntt=False)
    shape = bytes([8])
    return b"\x0a" + bytes([len(shape)]) + shape + b"\x12" + _varint(len(seal)) + seal


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def sealed_contract() -> StudyContract:
    """A signed study with three key holders' seal keys, noise tolerating two (the owner_uploads' contract)."""
    return StudyContract(study_id="s1", domain_size=100, epsilon=1.0, expected_owners=("a", "b"),
                         context_fingerprint=FP, domain_spec="age:0:100:100", strategy="gap",
                         owner_keys=(("a", public_key_of(TEST_KEY).hex()), ("b", "11" * 32)),
                         holder_seal_keys=tuple(_holder_public(k) for k in HOLDER_KEYS), noise_tolerates=2)


def _owner_uploads() -> list[dict[str, Any]]:
    contract = sealed_contract()
    out = []
    for name, seeds in (("one chunk", (7,)), ("two chunks", (8, 9))):
        chunks = [_tiny_vector(s) for s in seeds]
        place = dict(study_id="s1", owner_id="a", idempotency_key="up-00000000000000000001",
                     contract_hash=contract.contract_hash)
        parts = [c1_bytes(ciphertext_polys(vector_ciphertext(c))[2][1]) for c in chunks]
        parts_digest = c1_stream_digest(parts)
        c1_stmt = c1_statement(place["study_id"], place["owner_id"], place["idempotency_key"],
                               place["contract_hash"], parts_digest)
        plain_digest = stream_digest(chunks)
        key = seal_upload_key(TEST_KEY, plain_digest, **place)
        sealed = [seal_chunk(key, i, c, **place) for i, c in enumerate(chunks)]
        shares = sealed_key_shares(key, contract.holder_seal_keys, **place)
        statement = commitment_statement(place["study_id"], place["owner_id"], place["idempotency_key"],
                                         place["contract_hash"], parts_digest, shares)
        sealed_stream = stream_digest(sealed)
        digest = submission_digest(place["study_id"], place["owner_id"], place["idempotency_key"],
                                   place["contract_hash"], sealed_stream)
        out.append({
            "name": name, **place, "private_key_seed": TEST_KEY.hex(), "public_key": public_key_of(TEST_KEY).hex(),
            "holder_private_keys": [k.hex() for k in HOLDER_KEYS], "holder_seal_keys": list(contract.holder_seal_keys),
            "chunks_hex": [c.hex() for c in chunks], "c1_parts_hex": [p.hex() for p in parts],
            "c1_parts_digest": parts_digest.hex(), "c1_statement": c1_stmt.hex(),
            "c1_signature": sign_submission(TEST_KEY, c1_stmt).hex(),
            "plain_stream_digest": plain_digest.hex(), "upload_key": key.hex(),
            "sealed_chunks_hex": [c.hex() for c in sealed], "key_shares_hex": [x.hex() for x in shares],
            "commitment_statement": statement.hex(), "commitment_signature": sign_submission(TEST_KEY, statement).hex(),
            "ciphertext_digest": sealed_stream.hex(), "submission_digest": digest.hex(),
            "signature": sign_submission(TEST_KEY, digest).hex(),
        })
    return out


def vectors() -> dict[str, Any]:
    return {
        "about": "dpagg test vectors: see StudyContract and OwnerSignature in proto/dpagg/v1/common.proto, and "
                 "parties.common.sealing for owner_uploads. Generated by scripts/gen_test_vectors.py from the code "
                 "the servers run.",
        "contracts": [{"name": name, "contract": c.to_dict(), "canonical_json": c.canonical_json(),
                       "contract_hash": c.contract_hash} for name, c in _contracts()],
        "rfc8785_numbers": [{"double": repr(x), "canonical": number_text(x)} for x in NUMBERS],
        "submissions": _submissions(),
        "owner_uploads": _owner_uploads(),
    }


def render() -> str:
    return json.dumps(vectors(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python scripts/gen_test_vectors.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
