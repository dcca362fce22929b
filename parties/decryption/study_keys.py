"""Which key a study's operations use at the decryption server: the study's own (a key per study) or the server key."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, TypeVar

from he_partition.he.bfv import BfvBackend, context_fingerprint
from he_partition.he.join_scheme import JoinParams, JoinScheme

from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError
from .keys import KeyMaterial, StudyKeyStore
from .workers import KeyRef

__all__ = ["StudyKeys", "MAX_LOADED_STUDY_KEYS", "KeyRef"]

#: Most studies' keys kept loaded at once (of each kind); others are loaded from the key store when used.
MAX_LOADED_STUDY_KEYS = 16

_E = TypeVar("_E")


class StudyKeys:
    """The keys a study's contract names, and nothing else.

    `server`: the server key (`keys/secret_context.bin`): the key of every study when there is no
    `store`, and of the studies opened before keys were per study (their contracts name it).
    `store`: the studies' own keys (`StudyKeyStore`); None (key-share holders, in-memory tests):
    every study is on `server`. `shared_join(version)`: the key holder's join key of a version,
    the key of join studies opened before join keys were per study.

    Every lookup compares the fingerprint the contract names with the key found, and refuses
    (FailedPreconditionError, nothing decrypted) a key that was erased (the study ended), is
    missing, or is another one.
    """

    def __init__(self, server: KeyMaterial, server_backend: BfvBackend, store: StudyKeyStore | None,
                 shared_join: Callable[[int], JoinScheme]) -> None:
        self.server = server
        self.server_backend = server_backend
        self.store = store
        self._shared_join = shared_join
        self._shared_join_fp: dict[int, str] = {}
        self._loaded: OrderedDict[str, tuple[KeyMaterial, BfvBackend]] = OrderedDict()
        self._loaded_join: OrderedDict[str, tuple[str, JoinScheme]] = OrderedDict()  # study -> (fingerprint, key)
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()

    # -- lookups --------------------------------------------------------------------
    def entry(self, contract: StudyContract) -> tuple[KeyMaterial, BfvBackend]:
        """(key, secret-key backend) of the BFV key `contract` names."""
        want = contract.context_fingerprint
        if want == self.server.fingerprint:
            return self.server, self.server_backend
        sid = contract.study_id
        with self._lock:
            entry = self._loaded.get(sid)
            if entry is not None and entry[0].fingerprint == want:
                self._loaded.move_to_end(sid)
                return entry
            key = self.store.load(sid) if self.store is not None else None
            if key is None:
                raise self._missing(contract, "")
            if key.fingerprint != want:
                raise FailedPreconditionError(
                    f"the key in study {sid}'s key directory ({key.fingerprint[:16]}) is not the key its contract "
                    f"names ({want[:16]}): restore the study's key from a backup; nothing was decrypted")
            entry = (key, BfvBackend(key.secret_context))
            self._remember(self._loaded, sid, entry)
            return entry

    def join(self, contract: StudyContract) -> JoinScheme:
        """The join key `contract` names: the join study's own, or the shared join key of its scheme version."""
        sid, want, version = contract.study_id, contract.context_fingerprint, contract.join_terms().version
        with self._lock:
            entry = self._loaded_join.get(sid)
            if entry is not None and entry[0] == want:
                self._loaded_join.move_to_end(sid)
                return entry[1]
        own = self.store.load_join(sid, version) if self.store is not None else None
        if own is not None and context_fingerprint(own.public_bytes()) == want:
            with self._lock:
                self._remember(self._loaded_join, sid, (want, own))
            return own
        if self.store is not None and self.store.erased(sid):
            raise self._missing(contract, "join ")
        shared = self._shared_join(version)
        if version not in self._shared_join_fp:
            self._shared_join_fp[version] = context_fingerprint(shared.public_bytes())
        if self._shared_join_fp[version] != want:
            raise self._missing(contract, "join ")
        return shared

    def worker_key(self, contract: StudyContract | None) -> KeyRef:
        """What the local decrypt workers load `contract`'s secret key from (None: the server key they start with)."""
        if contract is None or contract.context_fingerprint == self.server.fingerprint or self.store is None:
            return None
        self.entry(contract)  # refused here when the key is erased, missing or not the contract's
        return self.store.secret_ref(contract.study_id)

    def _missing(self, contract: StudyContract, kind: str) -> FailedPreconditionError:
        sid, want = contract.study_id, contract.context_fingerprint[:16]
        why = self.store.erased(sid) if self.store is not None else ""
        if why:
            return FailedPreconditionError(f"{kind}study {sid}'s key ({want}) was erased when the study ended "
                                           f"({why}): nothing of it can be decrypted any more")
        return FailedPreconditionError(f"{kind}study {sid}'s key ({want}) is not in this key holder's key store: "
                                       "restore its key directory from a backup; nothing was decrypted")

    @staticmethod
    def _remember(cache: "OrderedDict[str, _E]", sid: str, entry: _E) -> None:  # caller holds the lock
        cache[sid] = entry
        cache.move_to_end(sid)
        while len(cache) > MAX_LOADED_STUDY_KEYS:
            cache.popitem(last=False)

    # -- a new study's key ----------------------------------------------------------------
    def fresh(self, study_id: str, join_version: int | None) -> tuple[str, Callable[[], None]] | None:
        """For a study that does not exist yet: (fingerprint of a fresh key, `keep` that writes it); None without
        a store (the study is on the server key or the shared join key). `join_version`: a join study's version.

        The key is made now and written only by `keep`, once the study's terms are accepted; a key left by an
        open that failed after `keep` is taken again."""
        store = self.store
        if store is None:
            return None
        if join_version is not None:
            version = join_version
            scheme = store.load_join(study_id, version) or JoinScheme.generate(JoinParams.for_version(version))
            fingerprint = context_fingerprint(scheme.public_bytes())

            def keep_join() -> None:
                store.keep_join(study_id, scheme, version)
                with self._lock:  # its first use needs not load it again
                    self._remember(self._loaded_join, study_id, (fingerprint, scheme))
            return fingerprint, keep_join
        key = store.load(study_id) or store.generate()

        def keep() -> None:
            store.keep(study_id, key)
            with self._lock:
                self._remember(self._loaded, study_id, (key, BfvBackend(key.secret_context)))
        return key.fingerprint, keep

    @property
    def open_lock(self) -> threading.Lock:
        """Held from the check that a study is new to its ledger row, so one study id gets one key."""
        return self._open_lock

    # -- the end of a study ---------------------------------------------------------------
    def erase(self, contract: StudyContract, reason: str) -> bool:
        """Erase the study's own key (BFV or join; never the server key or a shared join key); True when erased."""
        if self.store is None or contract.context_fingerprint == self.server.fingerprint:
            return False
        with self._lock:
            self._loaded.pop(contract.study_id, None)
            self._loaded_join.pop(contract.study_id, None)
            return self.store.erase(contract.study_id, reason)
