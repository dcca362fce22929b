"""The computation server's relay of the key-share holders' key setup: the deployment, then each study's key.

`fix_deployment` (`dpagg setup-key`) has every holder record t and every holder's identity keys,
once; no key is made. `setup_study_key` (run by `ThresholdDecryption.open_study` before the study
opens anywhere) relays the rounds of `he_partition.he.threshold.setup` for one study, in a session
that names it (`study_session`), through every holder: the CS builds the key itself from the checked
reveals, compares every holder's fingerprint with its own, relays the t-of-N dealing unread, and
combines the test shares of the setup's own test ciphertext (`SetupRelay.test_ciphertext`).

A join study's key (`join_version`) is made at the join scheme's parameters and adds the
collective Galois and relinearization rounds and a test product (`join_rounds`); the CS builds
those keys from the relayed reveals too, and the key's fingerprint is that of the join's public
key material, which every holder must report alike when it files the key.
"""
from __future__ import annotations

import logging
import secrets
from typing import Any, Mapping

import numpy as np

import hashlib

from he_partition.he.bfv import context_fingerprint
from he_partition.he.join_scheme import JoinParams
from he_partition.he.threshold.context import collective_context_bytes
from he_partition.he.threshold.galois import collective_galois_keys, galois_elements
from he_partition.he.threshold.keys import collective_public_key, key_fingerprint
from he_partition.he.threshold.relin import collective_relin_keys, join_context
from he_partition.he.threshold.setup import SetupRelay, common_seed, setup_test_product, study_session
from he_partition.he.threshold.shamir import check_threshold, subsets
from he_partition.join.holders import join_public_bytes, rotation_steps

from ...common.errors import FailedPreconditionError
from ...decryption.keyshare.resharing import HolderIdentity
from .relay import HolderRelay


__all__ = ["fix_deployment", "setup_study_key"]

log = logging.getLogger("dpagg.computation.threshold")


def fix_deployment(td: HolderRelay, threshold: int = 0) -> tuple[str, bool]:
    """Fix the deployment at every holder: t (`threshold` > 0: t-of-N, t > N/2; 0: N-of-N) and every
    holder's identity keys; (the identities' digest, already_deployed). No key is made here: each study
    gets its own collective key when it is opened (`open_study`). Idempotent: a deployment is reported,
    not replaced (another t is refused); without `threshold`, the deployed t stands."""
    names = td.names
    if threshold:
        check_threshold(int(threshold), list(range(td.k)))
    status = td._all("did not report its key state", lambda c: c.key_setup("status", b"", names))
    have = {s.threshold for s in status if s.state == "deployed"}
    if not threshold and len(have) == 1 and all(s.state == "deployed" for s in status):
        t = have.pop()
        threshold = t if t < td.k else 0
    identities = {i: HolderIdentity(bytes.fromhex(s.seal_public_key), bytes.fromhex(s.signing_public_key))
                  .to_bytes() for i, s in enumerate(status)}
    replies = td._all("refused the deployment", lambda c: c.key_setup("deploy", b"", names, identities,
                                                                      threshold=int(threshold)))
    digests = {r.fingerprint for r in replies}
    if len(digests) != 1:
        raise FailedPreconditionError("the holders recorded different identity lists: " + ", ".join(
            f"{n}: {r.fingerprint[:16]}" for n, r in zip(names, replies)))
    with td._lock:
        td.threshold, td._known_threshold = (int(threshold) or None), True
    already = all(r.state == "already deployed" for r in replies)
    log.info("deployment of holders %s (%s) %s; each study gets its own key at open-study", ", ".join(names),
             f"any {threshold} of {td.k}" if threshold else f"all {td.k}",
             "already fixed" if already else "fixed")
    return digests.pop(), already


def setup_study_key(td: HolderRelay, study_id: str, join_version: int = 0) -> str:
    """Run the collective key setup for `study_id` through every holder (all K, also with a t-of-N key: the
    dealing needs every holder); the key's fingerprint. The session names the study
    (`study_session`), so each holder files the key under that study and no message of one study's
    setup serves another's.

    t-of-N: after the key is built, each holder deals its share to every holder (sealed to the
    recipient, signed; relayed here unread), and the test decryption runs once per participant set of
    t holders. A join key (`join_version`) adds `join_rounds` (t-of-N: before the dealing)."""
    names = td.names
    threshold = td.tofn() or 0
    session = study_session(study_id, secrets.token_bytes(16))
    template = join_context(join_version) if join_version else td._template
    relay = SetupRelay(template, session, list(range(td.k)))

    def step(name: str, messages: Mapping[int, bytes] | None = None, **kw: Any) -> dict[int, bytes]:
        replies = td._all(f"refused setup step {name} of study {study_id}'s key",
                            lambda c: c.key_setup(name, session, names, messages, **kw))
        for i, r in enumerate(replies):
            relay.submit(name, i, r.message)
        return relay.collected(name)

    seed_commits = step("commit_seed", threshold=int(threshold), join_version=int(join_version))
    contributions = step("reveal_seed", seed_commits)
    key_commits = step("commit_key", contributions)
    reveals = step("reveal_key", key_commits)
    seed = common_seed(session, contributions)
    public_key = collective_public_key(template, seed, key_commits, reveals)
    fingerprint = (hashlib.sha256(public_key).hexdigest() if join_version
                   else context_fingerprint(collective_context_bytes(public_key)))
    built = td._all("refused to build the key", lambda c: c.key_setup("build_key", session, names, reveals))
    if any(r.fingerprint != fingerprint for r in built):
        raise FailedPreconditionError("the holders built different collective keys: setup stopped (relay "
                                      f"{fingerprint[:16]}, holders {[r.fingerprint[:16] for r in built]})")
    join_keys = join_rounds(td, relay, step, session, seed, join_version) if join_version and threshold else None
    ct = relay.test_ciphertext(public_key, seed)
    if threshold:
        status = td._all("did not report its key state", lambda c: c.key_setup("status", b"", names))
        identities = {i: HolderIdentity(bytes.fromhex(s.seal_public_key), bytes.fromhex(s.signing_public_key))
                      .to_bytes() for i, s in enumerate(status)}
        dealt = step("deal", identities)
        step("receive", dealt)
        parts: list[int] = []
        for p in subsets(range(td.k), int(threshold)):
            got = td._all("refused a test share", lambda c, p=p: c.key_setup(
                "test_share", session, names, ciphertext=ct, participants=p), p)
            shares = {i: r.message for i, r in zip(p, got)}
            parts += relay.combine_test(ct, shares, key_fingerprint(public_key), p).tolist()
        values = np.array(parts, dtype=np.int64)
    else:
        shares = step("test_share", ciphertext=ct)
        values = relay.combine_test(ct, shares, key_fingerprint(public_key))
    confirmed = td._all("refused the test decryption",
                          lambda c: c.key_setup("confirm", session, names, values=values.tolist()))
    if join_version:
        if join_keys is None:  # N-of-N: the rounds run on the active key's s_i
            join_keys = join_rounds(td, relay, step, session, seed, join_version)
        fingerprint = context_fingerprint(join_public_bytes(join_version, public_key, *join_keys))
        confirmed = test_product(td, relay, session, public_key, seed, join_keys[0], int(threshold))
    if any(r.fingerprint != fingerprint for r in confirmed):
        raise FailedPreconditionError("a holder activated another collective key: setup stopped")
    log.info("study %s: collective key %s set up by holders %s", study_id, fingerprint[:16], ", ".join(names))
    return fingerprint


def join_rounds(td: HolderRelay, relay: SetupRelay, step: Any, session: bytes, seed: bytes,
                join_version: int) -> tuple[bytes, bytes]:
    """A join key's collective Galois and relinearization rounds, relayed: (relinearization keys, Galois keys) as
    this server builds them from the checked reveals; every holder must report the same digests of both."""
    ctx = relay.ctx
    elements = galois_elements(ctx, rotation_steps(JoinParams.for_version(join_version).slots))
    commits = step("commit_galois")
    reveals = step("reveal_galois", commits)
    galois = collective_galois_keys(ctx, seed, elements, commits, reveals)
    for i, share in reveals.items():  # one share per message (about 10 MB each at the join's parameters)
        one_share = {i: share}
        td._all("refused a Galois key share",
                lambda c, m=one_share: c.key_setup("take_galois", session, td.names, m))
    built = set(step("build_galois").values())
    one_commits = step("commit_relin_one")
    one = step("reveal_relin_one", one_commits)
    two_commits = step("commit_relin_two", one)
    two = step("reveal_relin_two", two_commits)
    relin = collective_relin_keys(ctx, seed, (one_commits, one), two_commits, two)
    built_relin = set(step("build_relin", two).values())
    if len(built) != 1 or len(built_relin) != 1:
        raise FailedPreconditionError("the holders built different Galois or relinearization keys: setup stopped")
    return relin, galois


def test_product(td: HolderRelay, relay: SetupRelay, session: bytes, public_key: bytes, seed: bytes,
                 relin: bytes, threshold: int) -> list[Any]:
    """The join key's closing check: the test ciphertext squared and relinearized (each holder computes it itself),
    decrypted by every participant set; each holder keeps and files the key only if it equals the test vector
    squared. The holders' replies to "confirm_product"."""
    names = td.names
    product = setup_test_product(relay.ctx, public_key, seed, relin)
    fp = key_fingerprint(public_key)
    parts: list[int] = []
    for p in (subsets(range(td.k), threshold) if threshold else [tuple(range(td.k))]):
        got = td._all("refused a test product share", lambda c, p=p: c.key_setup(
            "product_share", session, names, participants=p if threshold else ()), p)
        shares = {i: r.message for i, r in zip(p, got)}
        parts += relay.combine_test(product, shares, fp, p).tolist()
    replies: list[Any] = td._all("refused the test product",
                                 lambda c: c.key_setup("confirm_product", session, names, values=parts))
    return replies
