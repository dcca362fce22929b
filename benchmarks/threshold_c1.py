"""Cost of the holders' c1 check: bytes forwarded per holder and time, 10 owners x 1M bins.

Run: python -m benchmarks.threshold_c1 [--bins 1000000] [--owners 10]. Library level, one process
(no gRPC transfer): each owner's c1 parts and signature (`sign_c1_upload`), the computation
server's extraction of every owner's parts from its stored chunks (`owner_c1_parts`' work), a
holder's `UploadC1Book.accept` (10 signatures, parse, per-chunk sum) and its `check` of one
full-domain measurement (every chunk: the aggregate with noise on c0). Writes
benchmarks/results/threshold_c1.json.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.common import write_result
from he_partition.core.backend import n_chunks
from he_partition.he.bfv import BfvBackend, generate_secret_context
from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector
from he_partition.he.threshold.context import collective_context, vector_ciphertext
from he_partition.he.threshold.keys import collective_public_key, holder_keygen
from he_partition.he.threshold.wire import key_share_commitment
from parties.common.contract import StudyContract
from parties.common.signing import generate_signing_key
from parties.decryption.keyshare.uploads import OwnerC1Parts, UploadC1Book, sign_c1_upload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bins", type=int, default=1_000_000)
    ap.add_argument("--owners", type=int, default=10)
    args = ap.parse_args()
    ctx = generate_secret_context()
    seed = b"benchmark-common-seed-0123456789"
    keys = {h: holder_keygen(ctx, seed, h) for h in range(3)}
    pk = collective_public_key(ctx, seed, {h: key_share_commitment(h, seed, keys[h][1]) for h in keys},
                               {h: keys[h][1] for h in keys})
    be = BfvBackend(collective_context(ctx, pk))
    owners = [f"o{i}" for i in range(args.owners)]
    signing = {o: generate_signing_key() for o in owners}
    from he_partition.he.bfv import context_fingerprint
    contract = StudyContract(study_id="bench", domain_size=args.bins, epsilon=1.0, expected_owners=tuple(owners),
                             context_fingerprint=context_fingerprint(bytes(be.context.serialize())), strategy="hier",
                             owner_keys={o: signing[o][1].hex() for o in owners})
    chunks = n_chunks(args.bins, be.slots)
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    uploads = {o: [be.serialize_chunk(c) for c in be.encrypt(rng.integers(0, 100, args.bins)).chunks]
               for o in owners}
    encrypt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sigs = {o: sign_c1_upload(signing[o][0], be.context, study_id="bench", owner_id=o, idempotency_key="k",
                              contract_hash=contract.contract_hash, chunks=uploads[o]) for o in owners}
    owner_s = (time.perf_counter() - t0) / len(owners)
    t0 = time.perf_counter()
    parts = [OwnerC1Parts(o, "k", tuple(c1_bytes(c1_of_vector(be.context, c)) for c in uploads[o]), sigs[o])
             for o in owners]
    cs_s = time.perf_counter() - t0
    forwarded = sum(len(p) for u in parts for p in u.parts)
    book = UploadC1Book(be.context)
    t0 = time.perf_counter()
    book.accept(contract, parts)
    accept_s = time.perf_counter() - t0
    aggregate = [be.deserialize_chunk(uploads[owners[0]][i]) for i in range(chunks)]
    for o in owners[1:]:
        aggregate = [a + be.deserialize_chunk(uploads[o][i]) for i, a in enumerate(aggregate)]
    be.noise_in_c0 = True
    noise = rng.integers(-50, 50, be.slots).tolist()
    measured = [vector_ciphertext(be.serialize_chunk(a + noise)) for a in aggregate]
    t0 = time.perf_counter()
    book.check("bench", measured, list(range(chunks)))
    check_s = time.perf_counter() - t0
    out = {"bins": args.bins, "owners": args.owners, "chunks": chunks,
           "bytes_forwarded_per_holder": forwarded, "bytes_per_owner_chunk": forwarded // (chunks * args.owners),
           "owner_encrypt_seconds": round(encrypt_s / args.owners, 2),
           "owner_c1_sign_seconds": round(owner_s, 2), "cs_extract_seconds_all_owners": round(cs_s, 2),
           "holder_accept_seconds": round(accept_s, 2), "holder_check_seconds_full_measurement": round(check_s, 2)}
    print(out)
    write_result("threshold_c1", out)


if __name__ == "__main__":
    main()
