"""Collective key generation as a protocol state machine: holder side and relay side.

The arithmetic is `threshold.keys` (p_i, the collective key) and `threshold.decrypt` (shares,
combine); this module orders it into rounds so no party chooses the key and the setup stops
when any holder is missing or cheats. No network: each message is bytes, the relay (the
computation server in the deployment) carries them, and every holder checks them itself.

Rounds (K holders, `session` a unique id of this setup, e.g. 16 random bytes from the CS):

1. **commit seed**: holder i draws a 32-byte seed contribution r_i (OS CSPRNG) and sends
   c_i = SHA-256(domain || session || i || r_i).
2. **reveal seed**: once it holds all K commitments, holder i reveals r_i. Every holder checks
   every r_j against c_j and derives the common seed SHA-256(domain || session || r_1 || ... || r_K):
   no party, the relay included, can choose the common polynomial `a` (the last revealer is bound
   by its commitment).
3. **commit key share**: holder i computes p_i = -(a s_i) + e_i on the common seed and sends
   `key_share_commitment(i, seed, p_i)`. (The brief asked for hash(p_i) in round 1; p_i depends on
   the common seed, which exists only after round 2, so the key-share commitment is its own round.)
4. **reveal key share**: once it holds all K key-share commitments, holder i reveals p_i. Every
   holder checks every p_j against its commitment and builds the collective key p = sum p_j and
   its fingerprint (`key_fingerprint`) itself: the rogue-key defence (no holder can choose p_K as
   a function of the others' shares).
5. **test decryption**: the test vector (derived from the common seed, so every holder knows it)
   under p as (p + Delta m, a) (`setup_test_ciphertext`: every party computes it from public
   values, and a holder shares no other ciphertext at setup, so the relay chooses no c1 a holder
   decrypts); each holder issues one share for it (smudged, no DP noise:
   the plaintext is public), once per session; the relay combines and sends the result; each
   holder compares it with the test vector itself and only then marks the key active.
6. **Galois keys (optional, once)**: the relay names the Galois elements; holder i commits to its
   Galois key share (`threshold.galois.holder_galois_share`, over a common a per element and
   decomposition index from the same seed under its own domain tag), reveals it once every
   commitment is in, and every holder builds the collective GaloisKeys itself (two message rounds,
   one round of key material: Galois keys are linear in s).
7. **Relinearization keys (optional, once; joins)**: the two rounds of `threshold.relin` (Mouchet et
   al.), each commit-then-reveal; every holder sums the round-1 parts itself before its round 2 and
   builds the collective RelinKeys itself. The setup closes them with a test product: the test
   ciphertext times itself, relinearized, which every holder computes itself and shares once (per
   participant set with a t-of-N key); the keys are kept only if it decrypts to the test vector
   squared. Galois and relinearization keys need every holder's N-of-N share s_i, so with a t-of-N
   key they are made between the key's build and its test decryption.

t-of-N keys (`threshold` t > N/2, `threshold.shamir`): between rounds 4 and 5, holder i deals its
s_i (`deal_subshares`: one sub-share per holder, sealed and signed by the caller, relayed by the CS)
and, once it holds every dealer's sub-share, keeps S_j = sum_i f_i(x_j) (`receive_subshares`). The
test decryption then runs once per participant set of t holders (`subsets`), each holder sharing
with its Lagrange-weighted S_j for that set only, at most once per set; `confirm` takes every set's
combined decryption in order and activates S_j as the holder's secret only when each equals the
test vector, so inconsistent dealing stops the setup before the key is used.

A key per study: the computation server runs these rounds once per study when it opens it, with a
session that names the study (`study_session`: "study:" + the study id + a zero byte + 16 random
bytes). Every commitment, the common seed and every dealt sub-share are bound to the session, so a
message of one study's setup never serves another's, and each holder files the key under the study
the session names (`session_study`).

A holder refuses (InvalidInputError naming the holder and the round) a step out of order, a
message set missing a holder or naming a foreign one, a reveal not matching its commitment, and a
second test share. The test share is the one share a holder issues without a study contract: it
happens before the key's fingerprint can be in any contract (owners encrypt only under a
contract's fingerprint), and only once.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Sequence

import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError
from he_partition.he.seal_io import seal_ciphertext_bytes
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.galois import collective_galois_keys, holder_galois_share
from he_partition.he.seal_io import ciphertext_polys, seal_bytes, seal_version
from he_partition.he.threshold.keys import HolderSecret, collective_public_key, holder_keygen, key_fingerprint, load_seal
from he_partition.he.threshold.relin import RelinRoundOne, collective_relin_keys, relin_round_one, relin_round_two
from he_partition.he.threshold.shamir import SubShare, check_threshold, deal, participant_secret, receive, subsets
from he_partition.he.threshold.wire import key_share_commitment

_SEED_COMMIT = b"dpagg/keygen/seed-commit/v1"
_SEED = b"dpagg/keygen/common-seed/v1"
_TEST = b"dpagg/keygen/test-vector/v1"
#: The rounds in order; a holder is in the state named by the last round it completed.
ROUNDS = ("new", "seed committed", "seed revealed", "key committed", "key revealed", "dealt", "key received",
          "test share issued", "active")


_STUDY_SESSION = b"study:"


def study_session(study_id: str, nonce: bytes) -> bytes:
    """The setup session of study `study_id`'s key: "study:" + id + NUL + `nonce` (>= 16 random bytes)."""
    if len(nonce) < 16:
        raise InvalidInputError(f"a setup session nonce needs at least 16 bytes, got {len(nonce)}")
    return _STUDY_SESSION + study_id.encode("ascii") + b"\x00" + bytes(nonce)


def session_study(session: bytes) -> str:
    """The study a setup session names (`study_session`); "" for a session that names none."""
    head, sep, nonce = bytes(session).partition(b"\x00")
    if not head.startswith(_STUDY_SESSION) or not sep or len(nonce) < 16:
        return ""
    try:
        return head[len(_STUDY_SESSION):].decode("ascii")
    except UnicodeDecodeError:
        return ""


def seed_commitment(session: bytes, holder: int, contribution: bytes) -> bytes:
    """SHA-256 commitment to holder `holder`'s seed contribution in setup `session`."""
    return hashlib.sha256(_SEED_COMMIT + len(session).to_bytes(2, "big") + session + holder.to_bytes(2, "big")
                          + contribution).digest()


def common_seed(session: bytes, contributions: dict[int, bytes]) -> bytes:
    """The common seed from every holder's contribution, in holder order."""
    return hashlib.sha256(_SEED + len(session).to_bytes(2, "big") + session
                          + b"".join(contributions[h] for h in sorted(contributions))).digest()


def test_vector(seed: bytes, slots: int, plain_modulus: int) -> list[int]:
    """The setup's test plaintext: `slots` values below `plain_modulus`, from SHAKE-256(seed) (every holder knows it)."""
    stream = hashlib.shake_256(_TEST + seed).digest(8 * slots)
    return [int(v) % plain_modulus for v in np.frombuffer(stream, dtype="<u8").tolist()]


test_vector.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def _complete(what: str, messages: dict[int, bytes], holders: Sequence[int]) -> None:
    """Refuse a round's message set that misses a holder or names a foreign one: the setup stops."""
    foreign = sorted(set(messages) - set(holders))
    if foreign:
        raise InvalidInputError(f"{what} from holder {foreign[0]}, which is not in this setup: setup stopped")
    missing = [h for h in holders if h not in messages]
    if missing:
        raise InvalidInputError(f"holder {missing[0]} has not sent its {what}: setup stopped")


class HolderSetup:
    """One holder's side of the key setup: its secret s_i, its messages, and its own checks of everyone's."""

    def __init__(self, ctx: ts.Context, session: bytes, holder: int, holders: Sequence[int],
                 threshold: int | None = None) -> None:
        if len(session) < 16:
            raise InvalidInputError(f"a setup session id needs at least 16 bytes, got {len(session)}")
        if holder not in holders or len(set(holders)) != len(holders) or len(holders) < 2:
            raise InvalidInputError(f"holder {holder} must be one of >= 2 distinct holders, got {list(holders)}")
        if threshold is not None:
            check_threshold(threshold, holders)
        self.ctx, self.session, self.holder, self.holders = ctx, bytes(session), holder, list(holders)
        #: t of a t-of-N key; None for N-of-N.
        self.threshold = threshold
        self._tofn_share: HolderSecret | None = None
        self._test_sets: set[tuple[int, ...]] = set()
        self.state = "new"
        self._contribution = secrets.token_bytes(32)
        self._seed_commits: dict[int, bytes] = {}
        self._key_commits: dict[int, bytes] = {}
        self.seed = b""
        self.secret: HolderSecret | None = None
        self._key_share = b""
        self.public_key = b""
        self.fingerprint = b""
        self.galois_state = "none"
        self.galois_elements: list[int] = []
        self._galois_share = b""
        self._galois_commits: dict[int, bytes] = {}
        self.galois_keys = b""
        self.relin_state = "none"
        self._relin_one: RelinRoundOne | None = None
        self._relin_one_commits: dict[int, bytes] = {}
        self._relin_one_reveals: dict[int, bytes] = {}
        self._relin_two_commits: dict[int, bytes] = {}
        self._relin_two = b""
        self.relin_keys = b""
        self._product_sets: set[tuple[int, ...]] = set()

    def _at(self, expected: str) -> None:
        if self.state != expected:
            raise InvalidInputError(f"holder {self.holder} is at '{self.state}'; this step needs '{expected}'")

    def commit_seed(self) -> bytes:
        """Round 1: the commitment to this holder's seed contribution."""
        self._at("new")
        self.state = "seed committed"
        return seed_commitment(self.session, self.holder, self._contribution)

    def _kept(self, what: str, commitments: dict[int, bytes], own: bytes) -> dict[int, bytes]:
        """`commitments` once every holder's `what` is in and the relay kept this holder's own (`own`) as sent."""
        _complete(what, commitments, self.holders)
        if not hmac.compare_digest(commitments[self.holder], own):
            raise InvalidInputError(f"the relayed {what} of holder {self.holder} is not the one it sent")
        return dict(commitments)

    def _reveal(self, at: str, what: str, commitments: dict[int, bytes], own: bytes, to: str) -> dict[int, bytes]:
        """Move from `at` to `to` once every holder's `what` is in and the relay kept this holder's own as sent."""
        self._at(at)
        kept = self._kept(what, commitments, own)
        self.state = to
        return kept

    def reveal_seed(self, commitments: dict[int, bytes]) -> bytes:
        """Round 2: this holder's seed contribution, once every holder's commitment is in (its own unchanged)."""
        own = seed_commitment(self.session, self.holder, self._contribution)
        self._seed_commits = self._reveal("seed committed", "seed commitment", commitments, own, "seed revealed")
        return self._contribution

    def commit_key(self, contributions: dict[int, bytes]) -> bytes:
        """Round 3: check every seed contribution, derive the common seed, compute p_i and commit to it."""
        self._at("seed revealed")
        _complete("seed contribution", contributions, self.holders)
        for h in self.holders:
            if not hmac.compare_digest(seed_commitment(self.session, h, contributions[h]), self._seed_commits[h]):
                raise InvalidInputError(f"seed contribution of holder {h} does not match its commitment: setup stopped")
        self.state = "key committed"
        self.seed = common_seed(self.session, contributions)
        self.secret, self._key_share = holder_keygen(self.ctx, self.seed, self.holder)
        return key_share_commitment(self.holder, self.seed, self._key_share)

    def reveal_key(self, commitments: dict[int, bytes]) -> bytes:
        """Round 4: p_i, once every holder's key-share commitment is in (its own unchanged)."""
        own = key_share_commitment(self.holder, self.seed, self._key_share) if self._key_share else b""
        self._key_commits = self._reveal("key committed", "key-share commitment", commitments, own, "key revealed")
        return self._key_share

    def build_key(self, reveals: dict[int, bytes]) -> bytes:
        """Check every p_j against its commitment and build the collective key; returns its fingerprint."""
        self._at("key revealed")
        if self.fingerprint:
            raise InvalidInputError(f"holder {self.holder} has built its collective key already")
        _complete("key share", reveals, self.holders)
        self.public_key = collective_public_key(self.ctx, self.seed, self._key_commits, reveals)
        self.fingerprint = key_fingerprint(self.public_key)
        return self.fingerprint

    def deal_subshares(self) -> dict[int, SubShare]:
        """t-of-N, after the key is built: this holder's sub-share of s_i for every holder (itself included).

        Secret: the caller seals each to its recipient and signs it; the relay sees only sealed bytes."""
        self._at("key revealed")
        if self.threshold is None or not self.fingerprint:
            raise InvalidInputError(f"holder {self.holder}: dealing needs a t-of-N setup with its key built")
        assert self.secret is not None
        self.state = "dealt"
        return deal(self.ctx, self.secret, self.holders, self.threshold)

    def receive_subshares(self, subshares: dict[int, SubShare]) -> None:
        """t-of-N: S_j from every dealer's sub-share for this holder (refused: missing, foreign, misaddressed)."""
        self._at("dealt")
        assert self.threshold is not None
        self._tofn_share = receive(self.ctx, self.holder, self.holders, self.threshold, subshares)
        self.state = "key received"

    def test_share(self, ciphertext: bytes, participants: Sequence[int] | None = None) -> bytes:
        """Step 5: this holder's share of the setup's test ciphertext (smudged, no DP noise: the plaintext is public).

        N-of-N: once. t-of-N: once per participant set of t holders that holds this holder, with
        its Lagrange-weighted S_j for that set."""
        if not self.fingerprint:
            raise InvalidInputError(f"holder {self.holder} has no collective key yet: no test share")
        if not hmac.compare_digest(bytes(ciphertext), setup_test_ciphertext(self.ctx, self.public_key, self.seed)):
            raise InvalidInputError(f"holder {self.holder}: the ciphertext is not the setup's test ciphertext "
                                    "(p + Delta m, a), the only one a holder shares at setup: no test share")
        if self.threshold is None:
            self._at("key revealed")
            assert self.secret is not None
            self.state = "test share issued"  # before the share exists: a failure never allows a second try
            return decryption_share(self.ctx, self.secret, self.fingerprint, ciphertext)
        self._at("key received")
        assert self._tofn_share is not None
        p = self._own_set(participants, "test share")
        if p in self._test_sets:
            raise InvalidInputError(f"holder {self.holder} issued its test share for holders {list(p)} already")
        self._test_sets.add(p)  # before the share exists: a failure never allows a second try
        if len(self._test_sets) == len([s for s in subsets(self.holders, self.threshold) if self.holder in s]):
            self.state = "test share issued"
        return decryption_share(self.ctx, participant_secret(self.ctx, self._tofn_share, p), self.fingerprint,
                                ciphertext)

    def _own_set(self, participants: Sequence[int] | None, what: str) -> tuple[int, ...]:
        """t-of-N: `participants` as a sorted set of t holders that holds this holder (InvalidInputError otherwise)."""
        p = tuple(sorted(int(h) for h in participants or ()))
        assert self.threshold is not None
        if p not in [s for s in subsets(self.holders, self.threshold) if self.holder in s]:
            raise InvalidInputError(f"holder {self.holder}: a {what} is for a set of {self.threshold} holders that "
                                    f"holds it, got {list(p)}")
        return p

    def confirm(self, decrypted: Sequence[int]) -> None:
        """Mark the key active if the combined test decryption equals the test vector; else refuse (setup stopped).

        t-of-N: `decrypted` is every participant set's decryption in `subsets` order, concatenated;
        each must equal the test vector, then S_j becomes this holder's secret."""
        self._at("test share issued")
        expected = test_vector(self.seed, _slots(self.ctx), _plain_modulus(self.ctx))
        sets = subsets(self.holders, self.threshold) if self.threshold is not None else [tuple(self.holders)]
        got = [int(v) for v in decrypted]
        n = len(expected)
        for i, p in enumerate(sets):
            if got[i * n:(i + 1) * n] != expected:
                self.state = "failed"
                raise InvalidInputError(f"holder {self.holder}: the test decryption of holders {list(p)} does not "
                                        "equal the test vector: setup stopped, the key is not activated")
        if len(got) != n * len(sets):
            self.state = "failed"
            raise InvalidInputError(f"holder {self.holder}: {len(got)} test values for {len(sets)} participant sets")
        if self._tofn_share is not None:
            self.secret = self._tofn_share
        self.state = "active"

    # Optional Galois rounds (joins, rotations), after the key is active (t-of-N: before its test decryption);
    # their own state, once per setup.

    def _additive(self, what: str) -> HolderSecret:
        """s_i, the N-of-N share that collective Galois and relinearization keys are made from (they need all N
        holders): once the collective key is built, and with a t-of-N key only until it is active (the holder then
        keeps S_j alone, so those rounds run between the key's build and its test decryption)."""
        if not self.fingerprint or self.secret is None:
            raise InvalidInputError(f"holder {self.holder} has no collective key yet: no {what}")
        if self.threshold is not None and self.state in ("active", "failed"):
            raise InvalidInputError(f"holder {self.holder}: collective {what} need the N-of-N shares s_i; an active "
                                    "t-of-N key has none (make them before its test decryption)")
        return self.secret

    def commit_galois(self, elements: Sequence[int]) -> bytes:
        """Galois round 1: commit to this holder's Galois key share for `elements` (`threshold.galois`), once."""
        secret = self._additive("Galois keys")
        if self.threshold is None:
            self._at("active")
        if self.galois_state != "none":
            raise InvalidInputError(f"holder {self.holder} made its Galois key share already: one per setup")
        self._galois_share = holder_galois_share(self.ctx, secret, self.seed, elements)
        self.galois_elements = sorted(int(e) for e in elements)
        self.galois_state = "galois committed"
        return key_share_commitment(self.holder, self.seed, self._galois_share)

    def reveal_galois(self, commitments: dict[int, bytes]) -> bytes:
        """Galois round 2: the share, once every holder's Galois commitment is in (its own unchanged)."""
        if self.galois_state != "galois committed":
            raise InvalidInputError(f"holder {self.holder} is at '{self.galois_state}'; this step needs "
                                    "'galois committed'")
        self._galois_commits = self._kept("Galois key commitment", commitments,
                                          key_share_commitment(self.holder, self.seed, self._galois_share))
        self.galois_state = "galois revealed"
        return self._galois_share

    def build_galois(self, reveals: dict[int, bytes]) -> bytes:
        """Check every Galois share against its commitment and build the collective GaloisKeys; returns their SHA-256."""
        if self.galois_state != "galois revealed":
            raise InvalidInputError(f"holder {self.holder} is at '{self.galois_state}'; this step needs "
                                    "'galois revealed'")
        _complete("Galois key share", reveals, self.holders)
        self.galois_keys = collective_galois_keys(self.ctx, self.seed, self.galois_elements, self._galois_commits,
                                                  reveals)
        self.galois_state = "galois built"
        return hashlib.sha256(b"dpagg/collective-galois/v1" + self.fingerprint + self.galois_keys).digest()

    # Optional relinearization rounds (joins: `threshold.relin`), when Galois rounds may run; once per setup.

    def _relin_at(self, expected: str) -> None:
        if self.relin_state != expected:
            raise InvalidInputError(f"holder {self.holder} is at '{self.relin_state}'; this step needs '{expected}'")

    def commit_relin_one(self) -> bytes:
        """Relinearization round 1: commit to this holder's part (its ephemeral u_i stays in memory), once."""
        secret = self._additive("relinearization keys")
        if self.threshold is None:
            self._at("active")
        self._relin_at("none")
        self._relin_one = relin_round_one(self.ctx, secret, self.seed)
        self.relin_state = "relin one committed"
        return key_share_commitment(self.holder, self.seed, self._relin_one.share)

    def reveal_relin_one(self, commitments: dict[int, bytes]) -> bytes:
        """Relinearization round 1's part, once every holder's commitment is in (its own unchanged)."""
        self._relin_at("relin one committed")
        assert self._relin_one is not None
        own = self._relin_one.share
        self._relin_one_commits = self._kept("relinearization round-1 commitment", commitments,
                                             key_share_commitment(self.holder, self.seed, own))
        self.relin_state = "relin one revealed"
        return own

    def commit_relin_two(self, reveals: dict[int, bytes]) -> bytes:
        """Relinearization round 2: check and sum every round-1 part itself, then commit to this holder's part."""
        self._relin_at("relin one revealed")
        _complete("relinearization round-1 part", reveals, self.holders)
        assert self._relin_one is not None
        self._relin_one_reveals = dict(reveals)
        self._relin_two = relin_round_two(self.ctx, self._additive("relinearization keys"), self._relin_one,
                                          self.seed, self._relin_one_commits, reveals)
        self.relin_state = "relin two committed"
        return key_share_commitment(self.holder, self.seed, self._relin_two)

    def reveal_relin_two(self, commitments: dict[int, bytes]) -> bytes:
        """Relinearization round 2's part, once every holder's commitment is in (its own unchanged)."""
        self._relin_at("relin two committed")
        self._relin_two_commits = self._kept("relinearization round-2 commitment", commitments,
                                             key_share_commitment(self.holder, self.seed, self._relin_two))
        self.relin_state = "relin two revealed"
        return self._relin_two

    def build_relin(self, reveals: dict[int, bytes]) -> bytes:
        """Check both rounds' parts against their commitments and build the collective RelinKeys; returns their
        SHA-256. Close the setup with `product_share` and `confirm_product` before using them."""
        self._relin_at("relin two revealed")
        _complete("relinearization round-2 part", reveals, self.holders)
        self.relin_keys = collective_relin_keys(self.ctx, self.seed, (self._relin_one_commits, self._relin_one_reveals),
                                                self._relin_two_commits, reveals)
        self.relin_state = "relin built"
        return hashlib.sha256(b"dpagg/collective-relin/v1" + self.fingerprint + self.relin_keys).digest()

    def product_share(self, participants: Sequence[int] | None = None) -> bytes:
        """This holder's share of the setup's test product: the test ciphertext times itself, relinearized with the
        built keys, which every holder computes itself (`setup_test_product`; the relay sends no ciphertext).
        Smudged, no DP noise (the plaintext is public). N-of-N: once; t-of-N (active): once per participant set
        that holds this holder, with its Lagrange-weighted S_j."""
        self._relin_at("relin built")
        self._at("active")
        product = setup_test_product(self.ctx, self.public_key, self.seed, self.relin_keys)
        assert self.secret is not None
        if self.threshold is None:
            p: tuple[int, ...] = tuple(self.holders)
            secret = self.secret
        else:
            p = self._own_set(participants, "test product share")
            secret = participant_secret(self.ctx, self.secret, p)
        if p in self._product_sets:
            raise InvalidInputError(f"holder {self.holder} issued its test product share for holders {list(p)} already")
        self._product_sets.add(p)  # before the share exists: a failure never allows a second try
        return decryption_share(self.ctx, secret, self.fingerprint, product)

    def confirm_product(self, decrypted: Sequence[int]) -> None:
        """Keep the relinearization keys only if the combined test product equals the test vector squared (slot by
        slot mod t) for every participant set (t-of-N: each set's decryption in `subsets` order, concatenated, as
        `confirm` takes them); else refuse and drop them. A malformed round part gives keys SEAL loads but that do
        not relinearize: their product decrypts to noise, which the combine refuses or this check catches."""
        self._relin_at("relin built")
        t = _plain_modulus(self.ctx)
        expected = [v * v % t for v in test_vector(self.seed, _slots(self.ctx), t)]
        sets = len(subsets(self.holders, self.threshold)) if self.threshold is not None else 1
        got = [int(v) % t for v in decrypted]
        if got != expected * sets:
            self.relin_state, self.relin_keys = "failed", b""
            raise InvalidInputError(f"holder {self.holder}: the test product does not decrypt to the test vector "
                                    "squared for every participant set: the relinearization keys are not kept")
        self.relin_state = "relin checked"


def setup_test_ciphertext(ctx: ts.Context, public_key: bytes, seed: bytes) -> bytes:
    """The setup's test ciphertext: (p + Delta m, a) at the data level, m the test vector, (p, a) the collective key.

    Every holder and the relay compute it alike from public values (the key and the seed), and a
    holder shares no other at setup: its c1 is the common polynomial a, so the share a s_i + smudging
    shows nothing that p_i = -(a s_i) + e_i does not (e_i stays under the smudging), whereas a c1 the
    relay chose (floor(Delta / 3)) would show s_i whole. It decrypts as a fresh encryption with u = 1
    and no encryption error: c0 + c1 s = e + Delta m, e the collective key's error.
    """
    _, _, polys = ciphertext_polys(public_key)  # the PublicKey's (p, a): key level, NTT form
    sealctx = ctx.seal_context().data
    k = len(sealctx.first_context_data().parms().coeff_modulus())
    data = seal_ciphertext_bytes(seal_version(), [int(x) for x in sealctx.first_parms_id()],
                                 np.ascontiguousarray(polys[:, :k, :]), ntt=True)
    ct = load_seal(seal.Ciphertext, ctx, data, "test ciphertext")
    evaluator = seal.Evaluator(sealctx)
    evaluator.transform_from_ntt_inplace(ct)
    plain = seal.Plaintext()
    seal.BatchEncoder(sealctx).encode(test_vector(seed, _slots(ctx), _plain_modulus(ctx)), plain)
    evaluator.add_plain_inplace(ct, plain)
    return seal_bytes(ct)


def setup_test_product(ctx: ts.Context, public_key: bytes, seed: bytes, relin_keys: bytes) -> bytes:
    """The setup's test ciphertext times itself, relinearized with `relin_keys`: every party computes it alike."""
    ct = load_seal(seal.Ciphertext, ctx, setup_test_ciphertext(ctx, public_key, seed), "test ciphertext")
    evaluator = seal.Evaluator(ctx.seal_context().data)
    product = seal.Ciphertext()
    evaluator.multiply(ct, ct, product)
    evaluator.relinearize_inplace(product, load_seal(seal.RelinKeys, ctx, relin_keys, "relinearization keys"))
    return seal_bytes(product)


def _slots(ctx: ts.Context) -> int:
    return int(ctx.seal_context().data.first_context_data().parms().poly_modulus_degree())


def _plain_modulus(ctx: ts.Context) -> int:
    return int(ctx.seal_context().data.first_context_data().parms().plain_modulus().value())


class SetupRelay:
    """The relay's (computation server's) side: collects each round's messages, refuses to advance with one missing."""

    def __init__(self, ctx: ts.Context, session: bytes, holders: Sequence[int]) -> None:
        self.ctx, self.session, self.holders = ctx, bytes(session), list(holders)
        self.rounds: dict[str, dict[int, bytes]] = {}

    def submit(self, what: str, holder: int, message: bytes) -> None:
        """Record holder `holder`'s message of round `what`; a second, different one is refused."""
        if holder not in self.holders:
            raise InvalidInputError(f"{what} from holder {holder}, which is not in this setup")
        got = self.rounds.setdefault(what, {})
        if holder in got and got[holder] != message:
            raise InvalidInputError(f"holder {holder} sent a second, different {what}")
        got[holder] = bytes(message)

    def collected(self, what: str) -> dict[int, bytes]:
        """Every holder's message of round `what`, or InvalidInputError naming the first missing holder."""
        got = self.rounds.get(what, {})
        _complete(what, got, self.holders)
        return dict(got)

    def test_ciphertext(self, public_key: bytes, seed: bytes) -> bytes:
        """The test vector under the collective key, as every holder computes it (`setup_test_ciphertext`)."""
        return setup_test_ciphertext(self.ctx, public_key, seed)

    def combine_test(self, ciphertext: bytes, shares: dict[int, bytes], fingerprint: bytes,
                     participants: Sequence[int] | None = None) -> npt.NDArray[np.int64]:
        """The combined test decryption of the participant set (default every holder: n-of-n); refuses a missing
        or misbound share."""
        p = list(participants) if participants is not None else self.holders
        _complete("test share", shares, p)
        return combine(self.ctx, ciphertext, [shares[h] for h in p], p, fingerprint)
