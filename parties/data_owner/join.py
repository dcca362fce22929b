"""A data owner's side of a join study (docs/join.md): key agreement, pseudonyms, placement, encrypted upload.

`submit_join(owner, study_id, records)` runs the whole owner protocol through the
computation server: it posts this owner's X25519 key and waits for the other owner's,
derives the join key, has the key holder evaluate its blinded identifiers (the oblivious
PRF, `_oblivious_outputs`: the key holder sees random group elements, this owner never the
key), posts the pseudonyms of its identifiers (plus the shared dummies),
waits for the placement and checks it, encrypts its indicator planes under the study's
join key (fingerprint checked against the contract) and uploads them signed, like any
submission. Identifiers and attribute values never leave this process.

The X25519 private key is kept in `state_dir` (0600) so that a re-run posts the same key
(the server keeps the first one) and derives the same pseudonyms; it is deleted once the
upload is committed (a re-run then finds the committed upload and sends nothing). In a
signed study the key is signed with the owner's contract-bound Ed25519 key, and the other
owner's key is used only if its signature checks against the contract.

Before it sends anything, the owner accepts the other owner's quota of oblivious evaluations
(`join_quotas`): the quota follows the partner's declared record count, which whoever opened
the study wrote, and a partner colluding with the computation server may test that many
guessed identifiers against this owner's list. Both sides' counts and quotas are logged, and
a partner quota above `max_partner_records` (default `DEFAULT_PARTNER_FACTOR` x this owner's
records) plus the dummies' allowance is refused before the join key is posted.

A study whose contract pins K >= 2 key-share holders has its OPRF key shared among them
(join_holders): the owner sends each page to t of them (`key_holders`, in the contract's holder
order) and adds their answers.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from he_partition.he.bfv import context_fingerprint
from he_partition.core.errors import DPAggError, InvalidInputError
from he_partition.join import oprf
from he_partition.join.protocol import (JoinKeyPair, check_placement, dummy_count, encode_indicators, oprf_input,
                                        posted_pseudonyms)
from he_partition.he.join_scheme import JoinScheme

from ..common.contract import StudyContract
from ..common.join_keys import sign_join_key, verify_join_key
from ..common.tls import write_private_file
from .client import DataOwnerClient, EncryptedHistogram, SubmitResult
from .domain import DomainSpec
from .join_quota import DEFAULT_PARTNER_FACTOR, JoinQuotas, join_quotas
from .join_holders import SharedEvaluator, shared_outputs
from ..decryption.oprf import PAGE_ELEMENTS

__all__ = ["submit_join", "read_join_csv", "JoinRecords", "PART_PSEUDONYMS", "evaluation_batch", "JoinQuotas",
           "join_quotas", "DEFAULT_PARTNER_FACTOR"]

log = logging.getLogger("dpagg.join")

#: Pseudonyms per JoinPlacement message (16 MB; gRPC's message cap is 64 MB); longer lists go in parts.
PART_PSEUDONYMS = 500_000
#: The first pause between polls for the other owner's key or pseudonyms (it doubles up to `poll_interval`).
FIRST_POLL_PAUSE = 0.05


@dataclass(frozen=True)
class JoinRecords:
    """An owner's records for a join: identifier -> attribute bin, and what the file held."""

    values: dict[str, int]
    records_read: int
    out_of_domain: int


def read_join_csv(path: str | os.PathLike[str], spec: DomainSpec, id_column: str, *,
                  drop_bad: bool = False) -> JoinRecords:
    """Read identifier and attribute columns; bin the attribute with `spec`. A record whose value is outside the
    domain is left out (counted); an empty identifier or value is an error unless `drop_bad`."""
    shown = os.fspath(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        for col in (id_column, spec.column):
            if col not in header:
                raise InvalidInputError(f"{shown} has no column {col!r} (columns: {', '.join(header) or 'none'})")
        ii, vi = header.index(id_column), header.index(spec.column)
        ids: list[str] = []
        raw: list[str] = []
        bad = 0
        for row in reader:
            if not row or all(not f.strip() for f in row):
                continue
            ident = row[ii].strip() if ii < len(row) else ""
            value = row[vi].strip() if vi < len(row) else ""
            if not ident or not value or len(row) != len(header):
                if drop_bad:
                    bad += 1
                    continue
                raise InvalidInputError(f"{shown}: line {reader.line_num} has an empty identifier or value, or "
                                        f"{len(row)} fields for {len(header)} columns; fix it or pass "
                                        "--drop-bad-values")
            ids.append(ident)
            raw.append(value)
    if spec.is_categorical:
        bins = spec.bin_of(np.asarray(raw, dtype=object))
    else:
        try:
            bins = spec.bin_of(np.asarray([float(v) for v in raw], dtype=np.float64))
        except ValueError as exc:
            raise InvalidInputError(f"{shown}: column {spec.column!r} holds a value that is not a number: "
                                    f"{exc}") from exc
    keep = {i: int(b) for i, b in zip(ids, bins) if b >= 0}
    if len(keep) != int(np.sum(bins >= 0)):
        raise InvalidInputError(f"{shown}: an identifier appears twice; keep one record per identifier")
    return JoinRecords(keep, len(ids) + bad, len(ids) - len(keep) + bad)


def _key_path(state_dir: Path, study_id: str, owner_id: str) -> Path:
    return Path(state_dir).expanduser() / f"{study_id}.{owner_id}.join-x25519.key"


def _key_pair(state_dir: Path | None, study_id: str, owner_id: str) -> JoinKeyPair:
    if state_dir is None:
        return JoinKeyPair()
    path = _key_path(state_dir, study_id, owner_id)
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, X25519PrivateKey):
            raise InvalidInputError(f"{path} does not hold an X25519 key; delete it only if nothing was posted yet")
        return JoinKeyPair(key)
    key = X25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private_file(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return JoinKeyPair(key)


def _wait(what: str, poll: Callable[[], Any], ready: Callable[[Any], bool], timeout: float, interval: float) -> Any:
    """Poll until `ready`: first after 50 ms, the pause doubling up to `interval` (the other owner is usually a
    moment behind, so a fixed half-second pause mostly waited for nothing)."""
    end = time.monotonic() + timeout
    pause = min(FIRST_POLL_PAUSE, interval)
    while True:
        out = poll()
        if ready(out):
            return out
        if time.monotonic() >= end:
            raise DPAggError(f"{what} within {timeout:g} s; run the same command again later (nothing is lost: "
                             "what you posted is kept)")
        time.sleep(pause)
        pause = min(2 * pause, interval)


def _scheme(owner: DataOwnerClient, contract: StudyContract) -> JoinScheme:
    source = owner.decryption if owner.decryption is not None else owner.computation
    data = source.public_context(study_id=contract.study_id)
    if context_fingerprint(data) != contract.context_fingerprint:
        raise InvalidInputError(f"the join key served for study {contract.study_id} is not the one its contract "
                                "names; refusing to encrypt under it")
    return JoinScheme.from_public(data, contract.join_terms().scheme_params)


def submit_join(owner: DataOwnerClient, study_id: str, records: Mapping[str, int], *, idempotency_key: str,
                state_dir: Path | str | None = None, wait_timeout: float = 600.0, poll_interval: float = 0.5,
                progress: bool | None = None, max_partner_records: int | None = None,
                key_holders: Sequence[SharedEvaluator | None] | None = None) -> SubmitResult:
    """Run this owner's side of join study `study_id` with `records` (identifier -> attribute bin).

    Before anything is sent (its join key, an evaluation page, pseudonyms, an upload), both sides' declared
    counts and quotas are logged (`join_quotas`; "dpagg.join", INFO) and the study is refused
    (FailedPreconditionError, nothing kept) if the other owner's quota of oblivious evaluations exceeds
    `max_partner_records` (default DEFAULT_PARTNER_FACTOR x len(records)) plus the dummies' allowance: with the
    computation server it could test that many guessed identifiers against this owner's list.

    Privacy: nothing about identifiers or values leaves unencrypted: the key holder receives
    blinded identifiers (uniformly random group elements, their count padded with up to
    2 x offset private dummies), the computation server HMAC pseudonyms of oblivious PRF
    values under a key it cannot derive, sorted (a uniformly
    random order: nothing of the file's order), and ciphertexts. The shared dummies and
    each owner's private dummies (three discrete Laplace counts at padding_epsilon/3,
    sensitivity 1, add/remove one shared customer; only the owners know them) make the
    set sizes it sees padding_epsilon-DP with delta `padding_delta` (at most 1e-6); the
    study's ledger booked that epsilon when it opened.
    """
    cs = owner.computation
    contract = owner.contract(study_id)
    terms = contract.join_terms()
    if owner.owner_id not in contract.expected_owners:
        raise InvalidInputError(f"owner {owner.owner_id} is not one of join study {study_id}'s owners")
    side = contract.expected_owners.index(owner.owner_id)
    n_values = terms.values_of(side)
    if any(not 0 <= int(v) < n_values for v in records.values()):
        raise InvalidInputError(f"attribute bins must be in [0, {n_values}) for this owner's side of the table")
    if not records:
        raise InvalidInputError("no records to join: refusing an empty submission")
    owner._check_signing_key(contract)
    state = Path(state_dir) if state_dir is not None else None
    status = cs.upload_status(study_id, owner.owner_id, idempotency_key)
    if status.state == "COMMITTED":  # a re-run after the upload: nothing to send, and the key is not needed
        _forget_key(state, study_id, owner.owner_id)
        return SubmitResult(study_id, owner.owner_id, idempotency_key, True, True, status.chunk_count, 0, 0, 1, 0.0)
    quotas = join_quotas(contract, owner.owner_id, len(records), max_partner_records=max_partner_records)
    log.info("%s", quotas.describe())
    quotas.check()  # before this owner's join key, any evaluation page or upload leaves
    pair = _key_pair(state, study_id, owner.owner_id)
    # The study's public join key (tens of MB with the rotation keys) is fetched while this owner waits for the
    # other one; it is public, and nothing below depends on when it arrived.
    fetcher = ThreadPoolExecutor(1, thread_name_prefix="dpagg-join-key")
    scheme_of = fetcher.submit(_scheme, owner, contract)
    fetcher.shutdown(wait=False)
    signature = (sign_join_key(owner._signing_key, contract, owner.owner_id, pair.public_bytes)
                 if contract.signed and owner._signing_key is not None else b"")
    peer, peer_signature = _wait("the other owner has not posted its join key",
                                 lambda: cs.join_exchange(study_id, owner.owner_id, pair.public_bytes, signature),
                                 lambda r: bool(r[0]), wait_timeout, poll_interval)
    verify_join_key(contract, contract.expected_owners[1 - side], peer, peer_signature)
    key = pair.join_key(peer, study_id=study_id, contract_hash=contract.contract_hash)
    ids = list(records)
    outputs = _oblivious_outputs(owner, contract, pair, ids, key_holders) if terms.oblivious else None
    mine, real = posted_pseudonyms(pair, key, ids, terms, study_id=study_id, prf_outputs=outputs)
    if len(mine) <= PART_PSEUDONYMS:
        cs.join_placement(study_id, owner.owner_id, b"".join(mine))
    else:  # in consecutive parts of the sorted list: no single message carries more than PART_PSEUDONYMS
        parts = -(-len(mine) // PART_PSEUDONYMS)
        for k in range(parts):
            cs.join_placement(study_id, owner.owner_id, b"".join(mine[k * PART_PSEUDONYMS:(k + 1) * PART_PSEUDONYMS]),
                              part=k, parts=parts)
    _, positions, capacity = _wait("the other owner has not posted its pseudonyms",
                                   lambda: cs.join_placement(study_id, owner.owner_id), lambda r: r[0],
                                   wait_timeout, poll_interval)
    if capacity != terms.capacity or len(positions) != len(mine):
        raise InvalidInputError(f"the placement does not fit the study (capacity {capacity} vs {terms.capacity}, "
                                f"{len(positions)} positions for {len(mine)} pseudonyms): refusing it")
    placement = dict(zip(mine, positions))
    check_placement(mine, placement, capacity)
    scheme = scheme_of.result()
    value_of = {p: int(records[i]) for p, i in zip(real, ids)}
    planes = encode_indicators(placement, value_of, n_values, capacity, scheme.slots)
    chunks = tuple(scheme.serialize(scheme.encrypt(plane)) for group in planes for plane in group)
    enc = EncryptedHistogram(study_id, contract.domain_size, contract.context_fingerprint, chunks,
                             contract.contract_hash, contract.signed)
    result = owner.upload(enc, idempotency_key=idempotency_key, progress=progress)
    if result.committed:
        _forget_key(state, study_id, owner.owner_id)
    return result


def evaluation_batch(secret: bytes, inputs: list[bytes], pads: int, *,
                     pool: oprf.OprfPool | None = None) -> tuple[list[bytes], list[bytes], list[int]]:
    """(the blinded elements to send, sorted; the blinds of `inputs`; where each input's element is in the batch).

    A big batch is blinded in `pool`'s worker processes (None: this process's default pool, `oprf.blind`).

    Blinds and padding elements come from `secret` (this owner's private secret), so a re-run with the same
    records sends the same batch (the key holder answers each page once). The batch is sorted: uniformly random
    elements in a uniformly random order, so the key holder cannot tell the `pads` padding elements (they hide
    the record count as the private dummies do) from the records'."""
    seed = hmac.new(secret, b"oprf-blinds", hashlib.sha256).digest()
    order = sorted(range(len(inputs)), key=lambda i: inputs[i])  # blinds follow the records, not the file order
    scalars = oprf.blind_scalars(seed, len(inputs))
    blinds: list[bytes] = [b""] * len(inputs)
    for k, i in enumerate(order):
        blinds[i] = scalars[k]
    elements = oprf.blind(inputs, blinds, pool=pool)
    padding = [bytes(oprf.random_element(hashlib.sha512(b"dpagg/oprf-pad|" + seed + j.to_bytes(8, "big"))
                                                        .digest())) for j in range(pads)]
    batch = sorted(elements + padding)
    where = {e: k for k, e in enumerate(batch)}
    return batch, blinds, [where[e] for e in elements]


def _oblivious_outputs(owner: DataOwnerClient, contract: StudyContract, pair: JoinKeyPair, ids: list[str],
                       key_holders: Sequence[SharedEvaluator | None] | None = None) -> list[bytes]:
    """The oblivious PRF value of each identifier (he_partition.join.oprf), evaluated blindly by the key holder.

    The key holder sees |records| + min(P, allowance) uniformly random group elements (P: this owner's private
    dummy count, `private_dummies`), never an identifier; this owner never sees the study's OPRF key."""
    shared = len(contract.holder_seal_keys) >= 2  # K key-share holders, pinned by the signed contract
    if shared and not key_holders:
        raise InvalidInputError(f"join study {contract.study_id}'s pseudonyms are evaluated by its "
                                f"{len(contract.holder_seal_keys)} key-share holders: this owner needs their addresses "
                                "in the contract's holder order (key_holders=)")
    if owner.decryption is None and not shared:
        raise InvalidInputError(f"join study {contract.study_id} has oblivious pseudonyms: the key holder evaluates "
                                "them, so this owner needs its address (--decryption / DataOwnerClient(decryption=))")
    terms = contract.join_terms()
    side = contract.expected_owners.index(owner.owner_id)
    quota = terms.evaluation_quota(side)
    if len(ids) > quota:
        raise InvalidInputError(f"{len(ids)} records, but this owner's quota of oblivious evaluations in study "
                                f"{contract.study_id} is {quota} (its declared records plus its dummies' allowance): "
                                "bound the records or open a study that declares more")
    if len(ids) >= oprf.MIN_POOLED_ELEMENTS:
        oprf.default_pool().start()  # the workers start while the identifiers are prepared and the blinds drawn
    secret = pair.private_secret(contract.study_id)
    drawn = dummy_count(secret, terms.padding_epsilon, terms.padding_offset, label=b"private-dummy-count")
    pads = max(0, min(drawn, terms.dummy_allowance(), quota - len(ids)))
    inputs = [oprf_input(i) for i in ids]
    if len(set(inputs)) != len(inputs):  # before any evaluation is spent
        raise InvalidInputError("an identifier appears twice (after normalization): keep one record per "
                                "identifier (the join's contribution bound)")
    if shared:
        return shared_outputs(key_holders or (), contract, owner.owner_id, secret, inputs, pads,
                              page_elements=PAGE_ELEMENTS)
    assert owner.decryption is not None  # checked above: a single key holder's study needs its address
    batch, blinds, where = evaluation_batch(secret, inputs, pads)
    evaluated = owner.decryption.evaluate_pseudonyms(study_id=contract.study_id, owner_id=owner.owner_id,
                                                     contract_hash=contract.contract_hash, elements=batch)
    return oprf.finalize(inputs, blinds, [evaluated[k] for k in where])


def _forget_key(state_dir: Path | None, study_id: str, owner_id: str) -> None:
    """Delete this owner's X25519 private key once its upload is committed (nothing needs it any more)."""
    if state_dir is not None:
        _key_path(state_dir, study_id, owner_id).unlink(missing_ok=True)
