"""The computation server's relay of the key-share holders' key setup: the deployment, then each study's key.

`fix_deployment` (`dpagg setup-key`) has every holder record t and every holder's identity keys,
once; no key is made. `setup_study_key` (run by `ThresholdDecryption.open_study` before the study
opens anywhere) relays the rounds of `he_partition.he.threshold.setup` for one study, in a session
that names it (`study_session`), through every holder: the CS builds the key itself from the checked
reveals, compares every holder's fingerprint with its own, relays the t-of-N dealing unread, and
combines the test shares of the setup's own test ciphertext (`SetupRelay.test_ciphertext`).
"""
from __future__ import annotations

import logging
import secrets
from typing import Any, Mapping

import numpy as np

from he_partition.he.bfv import context_fingerprint
from he_partition.he.threshold.context import collective_context_bytes
from he_partition.he.threshold.keys import collective_public_key, key_fingerprint
from he_partition.he.threshold.setup import SetupRelay, common_seed, study_session
from he_partition.he.threshold.shamir import check_threshold, subsets

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


def setup_study_key(td: HolderRelay, study_id: str) -> str:
    """Run the collective key setup for `study_id` through every holder (all K, also with a t-of-N key: the
    dealing needs every holder); the key's fingerprint. The session names the study
    (`study_session`), so each holder files the key under that study and no message of one study's
    setup serves another's.

    t-of-N: after the key is built, each holder deals its share to every holder (sealed to the
    recipient, signed; relayed here unread), and the test decryption runs once per participant set of
    t holders."""
    names = td.names
    threshold = td.tofn() or 0
    session = study_session(study_id, secrets.token_bytes(16))
    relay = SetupRelay(td._template, session, list(range(td.k)))

    def step(name: str, messages: Mapping[int, bytes] | None = None, **kw: Any) -> dict[int, bytes]:
        replies = td._all(f"refused setup step {name} of study {study_id}'s key",
                            lambda c: c.key_setup(name, session, names, messages, **kw))
        for i, r in enumerate(replies):
            relay.submit(name, i, r.message)
        return relay.collected(name)

    seed_commits = step("commit_seed", threshold=int(threshold))
    contributions = step("reveal_seed", seed_commits)
    key_commits = step("commit_key", contributions)
    reveals = step("reveal_key", key_commits)
    seed = common_seed(session, contributions)
    public_key = collective_public_key(td._template, seed, key_commits, reveals)
    fingerprint = context_fingerprint(collective_context_bytes(public_key))
    built = td._all("refused to build the key", lambda c: c.key_setup("build_key", session, names, reveals))
    if any(r.fingerprint != fingerprint for r in built):
        raise FailedPreconditionError("the holders built different collective keys: setup stopped (relay "
                                      f"{fingerprint[:16]}, holders {[r.fingerprint[:16] for r in built]})")
    ct = relay.test_ciphertext(public_key, seed)
    if threshold:
        status = td._all("did not report its key state", lambda c: c.key_setup("status", b"", names))
        identities = {i: HolderIdentity(bytes.fromhex(s.seal_public_key), bytes.fromhex(s.signing_public_key))
                      .to_bytes() for i, s in enumerate(status)}
        dealt = step("deal", identities)
        step("receive", dealt)
        parts: list[int] = []
        for p in subsets(range(td.k), int(threshold)):
            futures = [td._pool.submit(td.clients[i].key_setup, "test_share", session, names, ciphertext=ct,
                                         participants=p) for i in p]
            shares = {i: r.message for i, r in zip(p, td._collect("refused a test share", futures, p))}
            parts += relay.combine_test(ct, shares, key_fingerprint(public_key), p).tolist()
        values = np.array(parts, dtype=np.int64)
    else:
        shares = step("test_share", ciphertext=ct)
        values = relay.combine_test(ct, shares, key_fingerprint(public_key))
    confirmed = td._all("refused the test decryption",
                          lambda c: c.key_setup("confirm", session, names, values=values.tolist()))
    if any(r.fingerprint != fingerprint for r in confirmed):
        raise FailedPreconditionError("a holder activated another collective key: setup stopped")
    log.info("study %s: collective key %s set up by holders %s", study_id, fingerprint[:16], ", ".join(names))
    return fingerprint
