"""proto/test-vectors.json: current with the code, and checkable by another language (Node, standard library only)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parties.common.contract import CONTRACT_VERSION_V1, StudyContract
from parties.common.signing import submission_digest, stream_digest, verify_submission
from parties.decryption.ledger import SqliteLedgerStore

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "proto" / "test-vectors.json"


def test_the_vector_file_is_what_the_code_computes() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_test_vectors.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_python_reads_every_vector_back() -> None:
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    assert len(data["contracts"]) >= 5 and len(data["submissions"]) >= 2
    for v in data["contracts"]:
        c = StudyContract.from_dict(v["contract"])
        assert c.canonical_json() == v["canonical_json"] and c.contract_hash == v["contract_hash"], v["name"]
        assert hashlib.sha256(v["canonical_json"].encode()).hexdigest() == v["contract_hash"]
    for v in data["submissions"]:
        chunks = [bytes.fromhex(h) for h in v["chunks_hex"]]
        digest = submission_digest(v["study_id"], v["owner_id"], v["idempotency_key"], v["contract_hash"],
                                   stream_digest(chunks))
        assert digest.hex() == v["submission_digest"]
        verify_submission(bytes.fromhex(v["public_key"]), digest, bytes.fromhex(v["signature"]))


def test_python_opens_and_verifies_every_owner_upload_vector() -> None:
    """owner_uploads: the key holders' side of each sealed, committed upload (what the TypeScript SDK must match)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from he_partition.he.seal_io import ciphertext_polys
    from he_partition.he.threshold.c1 import c1_bytes, c1_stream_digest
    from he_partition.he.threshold.context import vector_ciphertext
    from parties.common.sealing import Commitment, open_chunk, open_key_share, upload_key_from_shares
    from parties.decryption.keyshare.uploads import c1_statement

    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    contract = StudyContract.from_dict(next(v["contract"] for v in data["contracts"] if "sealed" in v["name"]))
    assert len(data["owner_uploads"]) >= 2
    for v in data["owner_uploads"]:
        place = dict(study_id=v["study_id"], owner_id=v["owner_id"], idempotency_key=v["idempotency_key"],
                     contract_hash=v["contract_hash"])
        assert v["contract_hash"] == contract.contract_hash and tuple(v["holder_seal_keys"]) == contract.holder_seal_keys
        chunks = [bytes.fromhex(h) for h in v["chunks_hex"]]
        parts = [c1_bytes(ciphertext_polys(vector_ciphertext(c))[2][1]) for c in chunks]
        assert [p.hex() for p in parts] == v["c1_parts_hex"]
        stmt = c1_statement(v["study_id"], v["owner_id"], v["idempotency_key"], v["contract_hash"],
                            c1_stream_digest(parts))
        verify_submission(bytes.fromhex(v["public_key"]), stmt, bytes.fromhex(v["c1_signature"]))
        shares = [bytes.fromhex(h) for h in v["key_shares_hex"]]
        opened = []
        for j, (share, private) in enumerate(zip(shares, v["holder_private_keys"])):
            key = X25519PrivateKey.from_private_bytes(bytes.fromhex(private))
            opened.append(open_key_share(key, bytes.fromhex(contract.holder_seal_keys[j]), share, j, **place))
        upload_key = upload_key_from_shares(opened)
        assert upload_key.hex() == v["upload_key"]
        sealed = [bytes.fromhex(h) for h in v["sealed_chunks_hex"]]
        assert [open_chunk(upload_key, i, s, **place) for i, s in enumerate(sealed)] == chunks
        Commitment(v["owner_id"], v["idempotency_key"], bytes.fromhex(v["c1_parts_digest"]), tuple(shares),
                   bytes.fromhex(v["commitment_signature"])).verify(contract)
        digest = submission_digest(v["study_id"], v["owner_id"], v["idempotency_key"], v["contract_hash"],
                                   stream_digest(sealed))
        verify_submission(bytes.fromhex(v["public_key"]), digest, bytes.fromhex(v["signature"]))


def test_node_recomputes_every_vector_from_the_proto_definitions() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the cross-language check of proto/test-vectors.json needs it")
    proc = subprocess.run([node, str(ROOT / "sdk-ts" / "analyst" / "check-vectors.cjs"), str(VECTORS)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout and " checks passed" in proc.stdout


def test_a_v1_study_reopened_with_the_same_terms_is_found_not_refused(tmp_path: Path) -> None:
    """Ledgers from before v2 keep their contracts; reopening such a study with equal terms is idempotent."""
    store = SqliteLedgerStore(tmp_path / "ledger.sqlite3")
    try:
        terms = dict(study_id="s1", domain_size=100, epsilon=1.0, expected_owners=("a", "b"),
                     context_fingerprint="ab" * 32, strategy="gap")
        old, existed = store.create_study(StudyContract(**terms, version=CONTRACT_VERSION_V1))  # type: ignore[arg-type]
        assert not existed
        again, existed = store.create_study(StudyContract(**terms))  # type: ignore[arg-type]
        assert existed and again.version == CONTRACT_VERSION_V1 and again.contract_hash == old.contract_hash
    finally:
        store.close()
