"""One key-share holder's side of each study's key setup, run when the computation server opens the study.

The session of each step names the study (`he_partition.he.threshold.setup.study_session`); the
holder runs the rounds of `HolderSetup` for that study alone and files the key under it once the
test decryption succeeded (`StudyKeyStore.put_study`). With a t-of-N deployment, "deal" seals this
holder's sub-shares to the identity keys the deployment recorded (a relay's list that differs stops
the setup) and signs them; "receive" opens every dealer's sub-share for this holder.

A join study's key (`join_version` at "commit_seed") is made at the join scheme's own parameters
(`threshold.relin.join_context`) and adds the collective Galois keys (for the rotations the join's
rotation-sum needs: this holder computes the elements itself, `holders.rotation_steps`) and the two
relinearization rounds, then a test product each holder computes itself; it is filed only once that
product decrypted to the test vector squared ("confirm_product"). The Galois and relinearization
keys need every holder's N-of-N share s_i, so a t-of-N setup runs their rounds between "build_key"
and "deal" (`HolderSetup._additive`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
import hmac
import logging
from typing import Any, Protocol, Sequence

from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import context_fingerprint
from he_partition.he.join_scheme import JoinParams
from he_partition.he.threshold.context import collective_context_bytes
from he_partition.he.threshold.galois import galois_elements
from he_partition.he.threshold.setup import HolderSetup, session_study
from he_partition.join.holders import rotation_steps

from ...common.contract import check_id
from ...common.errors import FailedPreconditionError, NotFoundError
from ...common.sealing import SealKeyPair
from ..receipts import ReceiptSigner
from .resharing import HolderIdentity, deal_message, identities_digest, open_deal_message
from .study_keys import StudyKeyStore, join_template

__all__ = ["StudySetups", "SetupHolder"]

log = logging.getLogger("dpagg.decryption.keyshare")


class SetupHolder(Protocol):
    """What a study's key setup needs of its holder (`KeyShareService` is one): who it is among the holders, its
    seal and signing keys, its key store and BFV parameters, and the deployment it belongs to."""

    name: str
    holders: tuple[str, ...]
    index: int
    seal: SealKeyPair
    signer: ReceiptSigner
    store: StudyKeyStore
    template: Any  # a TenSEAL context: BFV parameters only
    deployed: bool
    threshold: int | None
    identities: dict[int, HolderIdentity]

    @property
    def identity(self) -> HolderIdentity: ...

    def activate_deployment(self) -> None: ...

    def require_active(self) -> Any: ...


@dataclass
class _Running:
    """One study's running setup: its rounds, the join scheme version of a join key (0: a study key) and the Galois
    key shares relayed so far (one holder's per "take_galois" call)."""

    setup: HolderSetup
    join_version: int = 0
    galois_shares: dict[int, bytes] = field(default_factory=dict)


class StudySetups:
    """The running setups of one holder's study keys, by study id (one each; a new session for a study replaces it)."""

    def __init__(self, holder: SetupHolder) -> None:
        self.holder = holder
        self.running: dict[str, _Running] = {}

    def deploy(self, threshold: int, identities: dict[int, HolderIdentity]) -> tuple[str, bool]:
        """Fix this deployment's t (0: N-of-N) and holders' identity keys, once; (identities digest, already)."""
        h = self.holder
        t = int(threshold) or None
        if identities.get(h.index) != h.identity:
            raise InvalidInputError(f"the deployment's identity list names other keys for holder {h.name} than "
                                    "its own: refused (the relay swapped keys)")
        if sorted(identities) != list(range(len(h.holders))):
            raise InvalidInputError(f"the deployment's identity list covers holders {sorted(identities)}, not all "
                                    f"{len(h.holders)}: refused")
        digest = identities_digest(identities)
        if h.deployed:
            have = h.threshold or len(h.holders)
            if have != (t or len(h.holders)):
                raise FailedPreconditionError(f"holder {h.name} is deployed with threshold {have} of "
                                              f"{len(h.holders)}, not {t or len(h.holders)}: it is not replaced")
            if h.store.deployment_recorded:
                if identities_digest(h.identities) != digest:
                    raise FailedPreconditionError(f"holder {h.name} is deployed with other holders' identity "
                                                  "keys: the deployment is not replaced")
                return digest, True
            if h.threshold is not None and identities_digest(h.identities) != digest:
                raise FailedPreconditionError(f"holder {h.name}'s legacy t-of-N key names other holders' identity "
                                              "keys: the deployment is not replaced")
        h.store.write_deployment(t, identities)
        if not h.deployed:
            h.threshold, h.identities = t, dict(identities)
            h.activate_deployment()
        else:
            h.identities = dict(identities)
        log.info("holder %s: deployment fixed (%s of %d holders, identities %s)", h.name,
                 f"any {t}" if t else "all", len(h.holders), digest[:16])
        return digest, False

    def step(self, step: str, session: bytes, messages: dict[int, bytes], ciphertext: bytes, values: Sequence[int], *,
             threshold: int = 0, participants: Sequence[int] = (), join_version: int = 0) -> tuple[bytes, str, str]:
        """One step of the setup of the study `session` names: (this holder's message, fingerprint, state).

        Refused before the deployment, for a study already open here ("not replaced"), and with
        another t than the deployment's. "confirm" files the key under the study (mode 0600).
        The caller holds the holder's lock."""
        h = self.holder
        study_id = session_study(session)
        if not study_id:
            raise InvalidInputError(f"setup session {session.hex()[:16]} names no study: each study's key is set "
                                    "up when the study is opened")
        check_id("study_id", study_id)
        handler = h.require_active()
        if step == "commit_seed":
            try:
                handler.get_study(study_id)
                raise FailedPreconditionError(f"study {study_id} is open at holder {h.name}: its key is not "
                                              "replaced")
            except NotFoundError:
                pass
            if (int(threshold) or None) != h.threshold:
                raise FailedPreconditionError(f"the setup asks for threshold {int(threshold) or 'N'}; holder "
                                              f"{h.name} is deployed with {h.threshold or 'N'}: refused")
            template = h.template
            if join_version:
                JoinParams.for_version(int(join_version))  # an unknown version is refused by name
                template = join_template(int(join_version))
            setup = HolderSetup(template, session, h.index, list(range(len(h.holders))), h.threshold)
            self.running[study_id] = _Running(setup, int(join_version))
            return setup.commit_seed(), "", setup.state
        run = self.running.get(study_id)
        if run is None or not hmac.compare_digest(run.setup.session, session):
            raise InvalidInputError(f"holder {h.name} has no setup session {session.hex()[:16]}: setup stopped")
        s, version = run.setup, run.join_version
        if step == "reveal_seed":
            return s.reveal_seed(messages), "", s.state
        if step == "commit_key":
            return s.commit_key(messages), "", s.state
        if step == "reveal_key":
            return s.reveal_key(messages), "", s.state
        if step == "build_key":
            s.build_key(messages)
            if version:  # a join key's public context needs its Galois and relinearization keys: its key's digest
                return s.fingerprint, hashlib.sha256(s.public_key).hexdigest(), s.state
            return s.fingerprint, context_fingerprint(collective_context_bytes(s.public_key)), s.state
        if step == "deal":
            idents = {i: HolderIdentity.from_bytes(m, i) for i, m in messages.items()}
            if idents != h.identities:
                raise InvalidInputError(f"the setup's identity list differs from the deployment's holder {h.name} "
                                        "keeps: setup stopped (the relay swapped keys)")
            return deal_message(s.deal_subshares(), idents, session, h.index, h.signer._private), "", s.state
        if step == "receive":
            subs = {dealer: open_deal_message(s.ctx, m, session=session, dealer=dealer,
                                              recipient=h.index, identities=h.identities,
                                              own_seal=h.seal) for dealer, m in messages.items()}
            s.receive_subshares(subs)
            return b"", "", s.state
        if step == "test_share":
            return s.test_share(ciphertext, [int(p) for p in participants] or None), "", s.state
        if step == "confirm":
            s.confirm([int(v) for v in values])
            if version:  # a join key is filed once its relinearization keys decrypted the test product
                return b"", "", s.state
            return self._file(study_id, s, 0)
        if step in _JOIN_STEPS:
            if not version:
                raise InvalidInputError(f"step {step!r} belongs to a join key's setup; study {study_id}'s is not one")
            return self._join_step(step, study_id, run, messages, values, participants)
        raise InvalidInputError(f"unknown key setup step {step!r}")

    def _join_step(self, step: str, study_id: str, run: _Running, messages: dict[int, bytes],
                   values: Sequence[int], participants: Sequence[int]) -> tuple[bytes, str, str]:
        """One of a join key's extra rounds (Galois, relinearization, test product); "confirm_product" files it."""
        s, version = run.setup, run.join_version
        if step == "commit_galois":  # the elements are this holder's own: the rotations the join's circuit needs
            slots = JoinParams.for_version(version).slots
            return s.commit_galois(galois_elements(s.ctx, rotation_steps(slots))), "", s.galois_state
        if step == "take_galois":  # one holder's Galois share per call: K of them exceed one message's limit
            for i, m in messages.items():
                if run.galois_shares.setdefault(i, m) != m:
                    raise InvalidInputError(f"a second, different Galois key share of holder {i}: setup stopped")
            return b"", "", s.galois_state
        if step == "build_galois":
            shares = {**run.galois_shares, **messages}
            run.galois_shares.clear()  # about 10 MB a holder: not kept past the build
            return s.build_galois(shares), "", s.galois_state
        if step == "commit_relin_one":
            return s.commit_relin_one(), "", s.relin_state
        if step in _RELAYED:  # a round that takes the previous round's relayed messages
            state = "galois_state" if "galois" in step else "relin_state"
            return getattr(s, step)(messages), "", getattr(s, state)
        if step == "product_share":
            return s.product_share([int(p) for p in participants] or None), "", s.relin_state
        assert step == "confirm_product"
        if s.galois_state != "galois built":
            raise InvalidInputError(f"holder {self.holder.name}: study {study_id}'s join key has no Galois keys yet: "
                                    "not filed")
        s.confirm_product([int(v) for v in values])
        return self._file(study_id, s, version)

    def _file(self, study_id: str, s: HolderSetup, version: int) -> tuple[bytes, str, str]:
        """File the key under `study_id` (refused if the study was opened meanwhile) and end its setup."""
        h = self.holder
        try:
            h.require_active().get_study(study_id)
            raise FailedPreconditionError(f"study {study_id} was opened during its key setup: its key is not "
                                          "replaced")
        except NotFoundError:
            pass
        key = h.store.put_study(study_id, s, version)
        del self.running[study_id]
        log.info("holder %s: study %s's %skey %s active", h.name, study_id, "join " if version else "",
                 key.fingerprint[:16])
        return b"", key.fingerprint, "active"


#: The join key's steps that take the previous round's messages, each `HolderSetup`'s method of that name.
_RELAYED = ("reveal_galois", "reveal_relin_one", "commit_relin_two", "reveal_relin_two", "build_relin")
#: A join key's setup steps beyond a study key's (`StudySetups._join_step`).
_JOIN_STEPS = ("commit_galois", "reveal_galois", "take_galois", "build_galois", "commit_relin_one", "reveal_relin_one",
               "commit_relin_two", "reveal_relin_two", "build_relin", "product_share", "confirm_product")

