"""One key-share holder's side of each study's key setup, run when the computation server opens the study.

The session of each step names the study (`he_partition.he.threshold.setup.study_session`); the
holder runs the rounds of `HolderSetup` for that study alone and files the key under it once the
test decryption succeeded (`StudyKeyStore.put_study`). With a t-of-N deployment, "deal" seals this
holder's sub-shares to the identity keys the deployment recorded (a relay's list that differs stops
the setup) and signs them; "receive" opens every dealer's sub-share for this holder.
"""
from __future__ import annotations

import hmac
import logging
from typing import Any, Protocol, Sequence

from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import context_fingerprint
from he_partition.he.threshold.context import collective_context_bytes
from he_partition.he.threshold.setup import HolderSetup, session_study

from ...common.contract import check_id
from ...common.errors import FailedPreconditionError, NotFoundError
from ...common.sealing import SealKeyPair
from ..receipts import ReceiptSigner
from .resharing import HolderIdentity, deal_message, identities_digest, open_deal_message
from .study_keys import StudyKeyStore

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


class StudySetups:
    """The running setups of one holder's study keys, by study id (one each; a new session for a study replaces it)."""

    def __init__(self, holder: SetupHolder) -> None:
        self.holder = holder
        self.running: dict[str, HolderSetup] = {}

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
             threshold: int = 0, participants: Sequence[int] = ()) -> tuple[bytes, str, str]:
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
            setup = HolderSetup(h.template, session, h.index, list(range(len(h.holders))), h.threshold)
            self.running[study_id] = setup
            return setup.commit_seed(), "", setup.state
        s = self.running.get(study_id)
        if s is None or not hmac.compare_digest(s.session, session):
            raise InvalidInputError(f"holder {h.name} has no setup session {session.hex()[:16]}: setup stopped")
        if step == "reveal_seed":
            return s.reveal_seed(messages), "", s.state
        if step == "commit_key":
            return s.commit_key(messages), "", s.state
        if step == "reveal_key":
            return s.reveal_key(messages), "", s.state
        if step == "build_key":
            s.build_key(messages)
            return s.fingerprint, context_fingerprint(collective_context_bytes(s.public_key)), s.state
        if step == "deal":
            idents = {i: HolderIdentity.from_bytes(m, i) for i, m in messages.items()}
            if idents != h.identities:
                raise InvalidInputError(f"the setup's identity list differs from the deployment's holder {h.name} "
                                        "keeps: setup stopped (the relay swapped keys)")
            return deal_message(s.deal_subshares(), idents, session, h.index, h.signer._private), "", s.state
        if step == "receive":
            subs = {dealer: open_deal_message(h.template, m, session=session, dealer=dealer,
                                              recipient=h.index, identities=h.identities,
                                              own_seal=h.seal) for dealer, m in messages.items()}
            s.receive_subshares(subs)
            return b"", "", s.state
        if step == "test_share":
            return s.test_share(ciphertext, [int(p) for p in participants] or None), "", s.state
        if step == "confirm":
            s.confirm([int(v) for v in values])
            try:
                handler.get_study(study_id)
                raise FailedPreconditionError(f"study {study_id} was opened during its key setup: its key is not "
                                              "replaced")
            except NotFoundError:
                pass
            key = h.store.put_study(study_id, s)
            del self.running[study_id]
            log.info("holder %s: study %s's key %s active", h.name, study_id, key.fingerprint[:16])
            return b"", key.fingerprint, "active"
        raise InvalidInputError(f"unknown key setup step {step!r}")

