"""A key holder's record of a sealed study's closed set of upload commitments (`parties.common.sealing`).

`CommitmentBook.close` is the one moment a key holder gives out its shares of the owners'
upload keys: it verifies every owner's signed commitment against its own copy of the contract,
refuses two owners committing to the same c1 (a copy of another owner's commitment would add
that owner's data twice), records the set durably, and only then returns its shares. Once a
study is closed the same set is answered the same and any other set is refused, so no owner
can commit after anyone has read an upload. With a t-of-N split (`StudyContract.seal_threshold`)
the CS needs any t holders' shares: every two sets of t > N/2 holders share one, which refuses
the second set, so the CS cannot open two different sets (docs/threshold.md, section 10); a
holder that was down at the close is closed later on the same set. `UploadC1Book.accept` then takes c1 parts only
from the closed set's owners, each matching its committed digest.

Nothing here adds noise or spends budget.
"""
from __future__ import annotations

import hmac
import json
import threading
from pathlib import Path

from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError
from ..common.sealing import Commitment, SealKeyPair, share_bytes
from ..common.util import write_file_atomic
from he_partition.core.errors import InvalidInputError

__all__ = ["CommitmentBook"]


class CommitmentBook:
    """Per sealed study: the closed set of commitments (JSON under `directory`, or memory only)."""

    def __init__(self, seal: SealKeyPair, holder: int, holders: int, directory: Path | None = None) -> None:
        self.seal = seal
        self.holder = int(holder)
        self.holders = int(holders)
        self.directory = Path(directory) if directory is not None else None
        self._closed: dict[str, dict[str, Commitment]] = {}
        self._lock = threading.Lock()

    def check_contract(self, contract: StudyContract) -> None:
        """Refuse a sealed contract that does not pin this holder's seal key at its place."""
        keys = contract.holder_seal_keys
        if len(keys) != self.holders:
            raise FailedPreconditionError(f"study {contract.study_id} pins {len(keys)} key holder seal keys; this "
                                          f"deployment has {self.holders} key holder(s)")
        if not hmac.compare_digest(keys[self.holder], self.seal.public_hex):
            raise FailedPreconditionError(f"study {contract.study_id} pins seal key {keys[self.holder][:16]} for key "
                                          f"holder {self.holder}, not this holder's {self.seal.public_hex[:16]}")

    def closed(self, study_id: str) -> dict[str, Commitment] | None:
        """The closed set of `study_id` by owner (None while the study is not closed here)."""
        with self._lock:
            return self._held(study_id)

    def _held(self, study_id: str) -> dict[str, Commitment] | None:
        """`closed` with the lock held: from memory, else from the study's file (then kept in memory)."""
        got = self._closed.get(study_id)
        if got is None and self.directory is not None:
            path = self.directory / f"{study_id}.json"
            if path.exists():
                got = {c.owner_id: c for c in map(Commitment.from_json, json.loads(path.read_text()))}
                self._closed[study_id] = got
        return got

    def close(self, contract: StudyContract, commitments: list[Commitment]) -> list[bytes]:
        """Verify, record for good, then open this holder's share of each commitment's upload key (same order).

        FailedPreconditionError: not a sealed study here, no commitments, an owner not in the
        contract or named twice, two owners with one c1 digest, or a study already closed on
        another set. SignatureError: a commitment the owner's contract key did not sign.
        InvalidInputError: a malformed commitment or a share not made for this holder.
        """
        if not contract.sealed:
            raise FailedPreconditionError(f"study {contract.study_id} is not sealed (its contract pins no key holder "
                                          "seal keys): its uploads have nothing to close")
        self.check_contract(contract)
        if not commitments:
            raise FailedPreconditionError(f"study {contract.study_id}: no owner's commitment to close the uploads on")
        names = [c.owner_id for c in commitments]
        unknown = sorted(set(names) - set(contract.expected_owners))
        twice = sorted({n for n in names if names.count(n) > 1})
        if unknown or twice:
            raise FailedPreconditionError(f"study {contract.study_id}: the commitments name owners not in the contract "
                                          f"{unknown} or twice {twice}: refused")
        digests = [c.c1_parts_digest for c in commitments]
        if len(set(digests)) != len(digests):
            raise FailedPreconditionError(f"study {contract.study_id}: two owners committed to the same c1 parts (a "
                                          "copy of another owner's commitment would count that owner's data twice): "
                                          "refused")
        for c in commitments:
            if len(c.c1_parts_digest) != 32 or len(c.key_shares) != self.holders:
                raise InvalidInputError(f"owner {c.owner_id!r}'s commitment has a {len(c.c1_parts_digest)}-byte c1 "
                                        f"digest and {len(c.key_shares)} key shares; expected 32 and {self.holders}")
            c.verify(contract, "the study's uploads were not closed")
        # Open every share before recording anything: a share not made for this holder is refused, nothing closed.
        shares = [self.seal.open_share(c.key_shares[self.holder], self.holder, study_id=contract.study_id,
                                       owner_id=c.owner_id, idempotency_key=c.idempotency_key,
                                       contract_hash=contract.contract_hash) for c in commitments]
        split = "t-of-N" if contract.seal_threshold else "XOR"
        wrong = [c.owner_id for c, s in zip(commitments, shares) if len(s) != share_bytes(contract.seal_threshold)]
        if wrong:
            raise InvalidInputError(f"the upload key shares of owners {wrong} are not {split} shares, as study "
                                    f"{contract.study_id}'s contract splits them: nothing closed")
        with self._lock:
            held = self._held(contract.study_id)
            if held is not None:
                if sorted(held) != sorted(names) or not all(held[c.owner_id].same(c) for c in commitments):
                    raise FailedPreconditionError(
                        f"study {contract.study_id}'s uploads are closed on the commitments of {sorted(held)}: a "
                        "different set is refused (no owner commits after the uploads may have been read)")
            else:
                held = {c.owner_id: c for c in commitments}
                if self.directory is not None:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    write_file_atomic(self.directory / f"{contract.study_id}.json",
                                      json.dumps([c.to_json() for c in commitments]).encode())
            self._closed[contract.study_id] = held
        return shares
