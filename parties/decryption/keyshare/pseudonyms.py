"""A key-share holder's part of a join's oblivious pseudonyms: its share of the study's OPRF key, its quota and log.

The key is shared t-of-K as he_partition.join.toprf says: K-of-K from each holder's own master
secret (oprf_key.bin, as the single key holder's), (K-1)-of-K from the X25519 Diffie-Hellman
secret of each pair of holders' seal keys (`pair_secret`), so no dealer and no message: the
study's key exists in no place. The holder's peers' seal keys are the deployment's (fixed by
`dpagg setup-key`), and the contract must pin exactly those, in holder order, and the form (t)
the deployment has: the holder takes neither from the computation server.

Each holder books every page it answers in its own `EvaluationLog` (oprf.sqlite3), as the
single key holder does: each page index once per owner and study (the same elements again
are answered again, on any route), at most the owner's quota in all, and page p only for the
elements p x PAGE_ELEMENTS onwards of that quota (`page_fits`). With the route masks of
`toprf.route_scalar`, that bounds what an owner colluding with the computation server gets to
its quota q, however it routes pages through different t-sets of holders (docs/join.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from he_partition.join import toprf

from he_partition.core.errors import InvalidInputError

from ...common.contract import StudyContract, check_id
from ...common.errors import FailedPreconditionError, NotFoundError, QuotaExhaustedError
from ...common.sealing import SealKeyPair
from ..oprf import PAGE_ELEMENTS, EvaluationLog, load_or_create_oprf_key

__all__ = ["pair_secret", "key_form", "page_fits", "SharedPseudonyms", "holder_part", "evaluate_page", "PseudonymHolder"]

log = logging.getLogger("dpagg.decryption.keyshare")

_PAIR = b"dpagg/join-toprf/v1/pair|"


def pair_secret(seal: SealKeyPair, peer_public: bytes) -> bytes:
    """The 32-byte secret this holder and the holder with seal key `peer_public` both derive (X25519, then SHA-256
    over both public keys in a fixed order): what their shared part of every study's OPRF key comes from."""
    shared = seal._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    low, high = sorted([seal.public, bytes(peer_public)])
    return hashlib.sha256(_PAIR + low + high + shared).digest()


def key_form(contract: StudyContract, holders: int) -> int:
    """t of the study's OPRF key (its upload keys' split: `seal_threshold`, 0 meaning K-of-K)."""
    return contract.seal_threshold or holders


def page_fits(page: int, elements: int, quota: int, page_elements: int = PAGE_ELEMENTS) -> bool:
    """Whether page `page` of `elements` elements lies within the quota's positions: p x page_elements + n <= q."""
    return page >= 0 and 0 < elements <= page_elements and page * page_elements + elements <= quota


class SharedPseudonyms:
    """Holder `index` of `holders`: its answers to the owners' pages under its share of each join study's key
    (`page_elements`: the most elements per page, and where page p starts in the owner's quota)."""

    def __init__(self, index: int, holders: int, threshold: int, master: bytes, seal: SealKeyPair,
                 peers: Mapping[int, bytes], evaluations: EvaluationLog, *,
                 page_elements: int = PAGE_ELEMENTS) -> None:
        self.page_elements = page_elements
        self.index, self.holders, self.threshold = index, holders, threshold
        self._master = master
        self._seal = seal
        #: Every holder's seal key (the deployment's), this one's included.
        self.peers = dict(peers)
        self.evaluations = evaluations
        toprf.key_sets(holders, threshold)

    def check_contract(self, contract: StudyContract) -> None:
        """Refuse a contract whose OPRF key this holder cannot serve: no join with oblivious pseudonyms, another form
        than the deployment's, or seal keys other than the deployment's holders' in holder order."""
        if not contract.is_join or not contract.join_terms().oblivious:
            raise FailedPreconditionError(f"study {contract.study_id} is no join study with oblivious pseudonyms: "
                                          "nothing was evaluated")
        t = key_form(contract, self.holders)
        if t != self.threshold:
            raise FailedPreconditionError(f"study {contract.study_id} shares its keys {t}-of-{self.holders}; this "
                                          f"holder's deployment is {self.threshold}-of-{self.holders}: nothing was "
                                          "evaluated")
        pinned = tuple(k.lower() for k in contract.holder_seal_keys)
        ours = tuple(self.peers[h].hex() for h in range(self.holders)) if len(self.peers) == self.holders else ()
        if pinned != ours:
            raise FailedPreconditionError(f"study {contract.study_id} does not pin the {self.holders} key holders' seal "
                                          "keys of this deployment in holder order: its OPRF key would not be the "
                                          "one the holders share; nothing was evaluated")

    def key(self, contract: StudyContract) -> toprf.HolderKey:
        """This holder's part of the study's OPRF key (derived again at each call: nothing is stored)."""
        if self.threshold == self.holders:
            return toprf.holder_key(self.index, self.holders, self.threshold, contract.study_id,
                                    contract.contract_hash, own_seed=self._master)
        pairs = {h: pair_secret(self._seal, self.peers[h]) for h in range(self.holders) if h != self.index}
        return toprf.holder_key(self.index, self.holders, self.threshold, contract.study_id, contract.contract_hash,
                                pair_seeds=pairs)

    def evaluate(self, contract: StudyContract, *, owner_id: str, contract_hash: str, page: int,
                 route: Sequence[int], elements: Sequence[bytes]) -> tuple[list[bytes], int, int]:
        """This holder's answer to one page of `owner_id`'s blinded elements on `route`: (its answers, elements
        answered to the owner in the study so far, its quota).

        Refused, nothing evaluated: another contract hash or a contract this holder cannot serve
        (FAILED_PRECONDITION), an owner the contract does not list, a route without this holder or not t distinct
        holders, invalid elements (INVALID_ARGUMENT), a page index answered before with other elements
        (FAILED_PRECONDITION), a page past the owner's quota or outside its positions (RESOURCE_EXHAUSTED)."""
        if not hmac.compare_digest(contract_hash, contract.contract_hash):
            raise FailedPreconditionError(f"the request names another contract than study {contract.study_id}'s: "
                                          "nothing was evaluated")
        self.check_contract(contract)
        if owner_id not in contract.expected_owners:
            raise FailedPreconditionError(f"owner {owner_id!r} is not one of join study {contract.study_id}'s owners")
        key = self.key(contract)
        route = toprf.check_route(key, route)
        toprf.check_elements(elements)  # before anything is booked
        quota = contract.join_terms().evaluation_quota(contract.expected_owners.index(owner_id))
        if not page_fits(int(page), len(elements), quota, self.page_elements):
            raise QuotaExhaustedError(
                f"owner {owner_id!r} sent page {page} of {len(elements)} elements in study {contract.study_id}: "
                f"page p holds elements p x {self.page_elements} onwards of its quota {quota}, and this one ends past it; "
                "nothing was evaluated")
        digest = hashlib.sha256(b"".join(elements)).hexdigest()
        used = self.evaluations.admit(contract.study_id, owner_id, int(page), len(elements), digest, quota)
        answers = toprf.evaluate_share(key, route, owner_id, int(page), elements)
        log.info("study %s: holder %d answered page %d of owner %s on route %s (%d elements; %d of its quota %d)",
                 contract.study_id, self.index, page, owner_id, list(route), len(elements), used, quota)
        return answers, used, quota



def holder_part(index: int, holders: int, threshold: int, name: str, keys_dir: Path, seal: SealKeyPair,
                peers: Mapping[int, bytes], evaluations: EvaluationLog) -> SharedPseudonyms:
    """Holder `name`'s part of the join studies' shared OPRF keys over its own book (FAILED_PRECONDITION for a
    deployment without the holders' identity keys, or a t-of-N form whose shared OPRF key is not built)."""
    if not peers:
        raise FailedPreconditionError(f"key-share holder {name} has no record of the other holders' identity keys "
                                      "(a legacy deployment): nothing was evaluated")
    try:
        return SharedPseudonyms(index, holders, threshold, load_or_create_oprf_key(keys_dir), seal, peers,
                                evaluations)
    except InvalidInputError as exc:
        raise FailedPreconditionError(f"key-share holder {name}: {exc}; nothing was evaluated") from None


class PseudonymHolder(Protocol):
    """What answering a page needs of its holder (`KeyShareService` is one): its name, its active handler (the
    ledger of its studies) and its part of the shared OPRF keys."""

    name: str

    def require_active(self) -> Any: ...

    def shared_pseudonyms(self) -> SharedPseudonyms: ...


def evaluate_page(service: PseudonymHolder, *, study_id: str, owner_id: str, contract_hash: str, page: int,
                  route: Sequence[int], elements: Sequence[bytes]) -> tuple[list[bytes], int, int]:
    """Holder `service`'s answer to one page of a join owner's blinded elements on `route`, under its share of the
    study's OPRF key (`SharedPseudonyms.evaluate`: its own quota book and page log).

    Only for a join study in this holder's ledger, whose contract pins this deployment's holders and form."""
    handler = service.require_active()
    try:
        contract = handler.get_study(check_id("study_id", study_id))
    except NotFoundError:
        raise FailedPreconditionError(f"key-share holder {service.name} has no join study {study_id!r} in its "
                                      "ledger: nothing was evaluated") from None
    return service.shared_pseudonyms().evaluate(contract, owner_id=owner_id, contract_hash=contract_hash, page=page,
                                                route=route, elements=elements)
