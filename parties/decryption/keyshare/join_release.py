"""A key-share holder's side of a join study's release: the owners' signed planes, the check, the value shares.

With K key holders nobody holds the join key, and the combiner (the computation server) reads the whole
phase of what it combines, so a holder never shares a ciphertext the CS sends (he_partition.join.holders):

1. **Planes** (`receive`): the CS forwards both owners' committed uploads whole; the holder writes them to files
   as they arrive and keeps them only under each owner's upload signature (`join_planes.accept_planes`), under
   its data directory (`join_planes/<study>/<side>.<index>`), read by its evaluator group by group.
2. **The check** (`check`): the holders fix the check's seed together (each commits to 32 bytes it derives
   from its noise key and the planes, then reveals them; the seed is their hash, so one honest holder makes it
   unpredictable to the owners and the CS, and a CS that aborts the check after seeing the seed and starts it
   again gets the same seed: it cannot grind for one under which a malformed upload passes), each computes both owners' well-formedness residues from the planes, commits to its shares of
   them, reveals them once every commitment is in, and combines everyone's itself. Both owners must pass
   before any value share leaves; the holder records that for the planes it holds.
3. **Shares** (`shares`): for each measured value, the holder computes the value from the planes itself and
   returns its share: c1 s_i + smudging on [-2^110, 2^110) + its DP share in slot 0 and a uniform pad in every
   other slot, bound to the value's c1. It charges its own ledger first; with a t-of-N key the measurement's
   charge must be in the study's signed charge log with this request's participants (`ChargeBook.authorize`),
   and the share uses this holder's Lagrange-weighted key share for that set.

What a holder sees: the owners' ciphertexts (under the collective key), the other holders' seed
contributions and check shares (the residues of an honest upload are 0 in every slot), the measurement
the CS asks for. Nothing it returns depends on its key share beyond the shares themselves, each smudged.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import Measurement
from he_partition.core.noise import KeyedRandom
from he_partition.core.noise_shares import holder_noise_source, tolerant_share
from he_partition.he.threshold.shamir import participant_secret
from he_partition.join.holders import HolderJoinValues, check_commitment, check_passes
from he_partition.join.parallel import UploadFiles
from he_partition.join.release import bin_cells

from ...common.contract import StudyContract, check_id
from ...common.convert import measurement_json
from ...common.errors import FailedPreconditionError
from ...common.util import ReadOnDemand
from ..ledger import Charge
from .charges import charge_epsilon, charge_request, load_log
from .join_planes import OwnerPlanes, accept_planes
from .study_keys import ActiveKey, join_template

__all__ = ["JoinHolder", "HolderJoins", "CHECK_STEPS"]

log = logging.getLogger("dpagg.decryption.keyshare")

#: A join of at least this many groups has its products computed on the holder's local worker processes.
POOLED_GROUPS = 4
#: The steps of the check at the holders, in order (`HolderJoins.check`).
CHECK_STEPS = ("seed_commit", "seed_reveal", "check_commit", "check_reveal", "verdict")
_SEED = b"dpagg/join-holders/check-seed/v1|"
_SEED_COMMIT = b"dpagg/join-holders/check-seed-commit/v1|"
_CONTRIBUTION = b"dpagg/join-holders/check-contribution/v1|"


class JoinHolder(Protocol):
    """What a holder's join release needs of its holder (`KeyShareService` is one)."""

    name: str
    holders: tuple[str, ...]
    index: int
    threshold: int | None
    noise_key: bytes
    charges: Any  # the t-of-N charge book (`charges.ChargeBook`), None for an N-of-N key
    pool: Any  # the holder's local worker pool (`share_workers.holder_pool`): its `workers` count is used here

    def require_active(self) -> Any: ...

    def named_study(self, study_id: str, contract_hash: str, who: str) -> StudyContract: ...

    def key_of(self, contract: StudyContract) -> ActiveKey: ...

    def retire_if_ended(self, study_id: str) -> bool: ...


@dataclass
class _Study:
    """One join study's planes at this holder, its check's state and the values computed from the planes."""

    digest: bytes  # SHA-256 over the owners' upload keys and signatures: which planes these are
    a: UploadFiles
    b: UploadFiles
    contribution: bytes = b""
    seed_commits: dict[int, bytes] = field(default_factory=dict)
    seed: bytes = b""
    commits: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    own_shares: tuple[list[bytes], list[bytes]] | None = None
    passed: bool = False
    values: HolderJoinValues | None = None


class HolderJoins:
    """The join studies this holder releases (see the module docstring); planes under `root`."""

    def __init__(self, holder: JoinHolder, root: Path) -> None:
        self.holder, self.root = holder, Path(root)
        self._studies: dict[str, _Study] = {}
        self._lock = threading.Lock()
        self._executor: Any = None  # the join's products on `workers` local processes, started when first needed

    def _products_executor(self, groups: int) -> Any:
        """Where a join's products run: this holder's `--decrypt-workers` local processes for a join of at least
        POOLED_GROUPS groups (each reads its block of the planes from this holder's files), else this process."""
        workers = int(getattr(self.holder.pool, "workers", 0) or 0)
        if workers <= 1 or groups < POOLED_GROUPS:
            return None
        if self._executor is None:
            from he_partition.execution.processes import ProcessExecutor

            self._executor = ProcessExecutor(workers)
            self._executor.start()
        return self._executor

    def close(self) -> None:
        """Stop the join's worker processes (the holder stops)."""
        with self._lock:
            for study_id in list(self._studies):
                held = self._studies.pop(study_id)
                if held.values is not None:
                    held.values.close()
            if self._executor is not None:
                self._executor.close()
                self._executor = None

    def _contract(self, study_id: str, contract_hash: str) -> StudyContract:
        contract = self.holder.named_study(check_id("study_id", study_id), contract_hash, "the request names")
        if not contract.is_join:
            raise FailedPreconditionError(f"study {study_id} is no join study")
        return contract

    # -- 1. planes ----------------------------------------------------------------------------
    def receive(self, study_id: str, contract_hash: str, messages: Iterable[Any]) -> int:
        """Take a ForwardUploads stream of a join's whole planes; the number of planes. Each plane is written to a
        file as it arrives (in order, one upload key and signature per owner, owners of the contract only), in
        the layout the evaluator reads (`<side>.<index>`); then `accept_planes` checks the owners' signatures
        over the files, and the folder becomes the study's planes (other planes held, another upload, are
        replaced and the check runs again). The incoming files are removed if anything is refused. Memory
        holds one plane at a time, however large the join."""
        contract = self._contract(study_id, contract_hash)
        incoming = self.root / ".incoming" / f"{study_id}-{secrets.token_hex(8)}"
        incoming.mkdir(parents=True, mode=0o700)
        owners: dict[str, tuple[str, bytes, int]] = {}
        try:
            for msg in messages:
                if (msg.study_id, msg.contract_hash) != (study_id, contract_hash):
                    raise InvalidInputError("ForwardUploads carries the planes of one study under one contract")
                if msg.owner_id not in contract.expected_owners:
                    raise FailedPreconditionError(f"planes for {msg.owner_id!r}, who is not an owner of join study "
                                                  f"{study_id}: refused, nothing was computed")
                key, sig, count = owners.get(msg.owner_id, (msg.idempotency_key, bytes(msg.signature), 0))
                if (msg.idempotency_key, bytes(msg.signature)) != (key, sig) or int(msg.index) != count \
                        or not msg.plane:
                    raise InvalidInputError(f"owner {msg.owner_id!r}'s planes must come whole, in chunk order, under "
                                            "one upload key and signature")
                (incoming / f"{contract.expected_owners.index(msg.owner_id)}.{count}").write_bytes(msg.plane)
                owners[msg.owner_id] = (key, sig, count + 1)
            uploads = [OwnerPlanes(o, key, sig, ReadOnDemand(partial(_read_plane, incoming,
                                                                     contract.expected_owners.index(o)), n))
                       for o, (key, sig, n) in owners.items()]
            planes = accept_planes(contract, uploads)
            digest = hashlib.sha256(b"".join(
                f"{o}|{key}|".encode() + sig for o in contract.expected_owners for key, sig, _ in [owners[o]])).digest()
            count = sum(n for _, _, n in owners.values())
            with self._lock:
                held = self._studies.get(study_id)
                if held is not None and held.digest == digest:
                    return count
                self._drop(study_id)
                folder = self.root / study_id
                incoming.rename(folder)
                a, b = (UploadFiles(str(folder / f"{side}.{{index}}"), len(groups), len(groups[0]) if groups else 0)
                        for side, groups in enumerate(planes))
                self._studies[study_id] = _Study(digest, a, b)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        log.info("holder %s, study %s: both owners' signed join planes kept (%d planes)", self.holder.name, study_id,
                 count)
        return count

    def _drop(self, study_id: str) -> None:
        held = self._studies.pop(study_id, None)
        if held is not None and held.values is not None:
            held.values.close()
        shutil.rmtree(self.root / study_id, ignore_errors=True)

    def forget(self, study_id: str) -> None:
        """Delete a study's planes and what was computed from them (the study ended)."""
        with self._lock:
            self._drop(study_id)

    def _study(self, study_id: str) -> _Study:
        held = self._studies.get(study_id)
        if held is None:
            raise FailedPreconditionError(f"holder {self.holder.name} holds no join planes of study {study_id}: the "
                                          "computation server forwards both owners' signed uploads first")
        return held

    def _values(self, contract: StudyContract, held: _Study) -> HolderJoinValues:
        """The values computed from the planes (the products: the CS's join work), once per set of planes."""
        if held.values is None:
            key = self.holder.key_of(contract)
            held.values = HolderJoinValues(join_template(key.join_version), key.secret,
                                           bytes.fromhex(contract.context_fingerprint), key.context, held.a, held.b,
                                           [int(c) for c in bin_cells(contract.join_terms())],
                                           executor=self._products_executor(len(held.a)))
        return held.values

    def _secret(self, contract: StudyContract, participants: Sequence[int]) -> Any:
        """This holder's key share for the participant set (t-of-N: Lagrange-weighted), after checking the set."""
        parts = sorted(int(p) for p in participants)
        k = len(self.holder.holders)
        t = self.holder.threshold or k
        if len(parts) != t or len(set(parts)) != t or self.holder.index not in parts or any(
                not 0 <= p < k for p in parts):
            raise InvalidInputError(f"the participants {parts} are not {t} distinct holders including holder "
                                    f"{self.holder.index}: refused")
        key = self.holder.key_of(contract)
        if self.holder.threshold is None:
            return key.secret
        return participant_secret(join_template(key.join_version), key.secret, parts)

    # -- 2. the check ---------------------------------------------------------------------------
    def check(self, study_id: str, contract_hash: str, step: str, messages: Mapping[int, bytes],
              participants: Sequence[int]) -> bytes:
        """One step of the check (`CHECK_STEPS`): this holder's message. Spends nothing, adds no DP noise."""
        contract = self._contract(study_id, contract_hash)
        parts = sorted(int(p) for p in participants)
        secret = self._secret(contract, parts)
        with self._lock:
            held = self._study(study_id)
            me = self.holder.index

            def complete(what: str) -> None:
                if sorted(messages) != parts:
                    raise InvalidInputError(f"the {what} must come from holders {parts}, got {sorted(messages)}")

            if step == "seed_commit":  # the same contribution for the same planes: a restarted check grinds nothing
                held.contribution = hmac.new(self.holder.noise_key, _CONTRIBUTION + study_id.encode() + b"|"
                                             + held.digest, hashlib.sha256).digest()
                held.seed, held.passed, held.commits = b"", False, {}
                return _seed_commitment(study_id, me, held.contribution)
            if step == "seed_reveal":
                complete("seed commitments")
                if not held.contribution or not hmac.compare_digest(
                        messages[me], _seed_commitment(study_id, me, held.contribution)):
                    raise InvalidInputError(f"holder {me}'s seed commitment was not relayed as it sent it: refused")
                held.seed_commits = dict(messages)
                return held.contribution
            if step == "check_commit":
                complete("seed contributions")
                if held.contribution != messages.get(me) or not held.seed_commits:
                    raise InvalidInputError("this holder's seed contribution was not relayed as it sent it: refused")
                for h, c in messages.items():
                    if not hmac.compare_digest(_seed_commitment(study_id, h, c), held.seed_commits.get(h, b"")):
                        raise InvalidInputError(f"holder {h}'s seed contribution does not match its commitment: "
                                                "refused")
                held.seed = hashlib.sha256(_SEED + b"".join(messages[h] for h in parts)).digest()
                values = self._values(contract, held)
                rng = KeyedRandom(self.holder.noise_key, b"dpagg/join-holders/check/v1|" + held.seed)
                held.own_shares = tuple(values.check_shares(side, owner, held.seed, rng, secret=secret)  # type: ignore[assignment]
                                        for side, owner in enumerate(contract.expected_owners))
                assert held.own_shares is not None
                return b"".join(check_commitment(me, held.seed, s) for s in held.own_shares)
            if step == "check_reveal":
                complete("check commitments")
                if held.own_shares is None:
                    raise InvalidInputError("this holder has committed to no check shares: refused")
                own = b"".join(check_commitment(me, held.seed, s) for s in held.own_shares)
                if not hmac.compare_digest(messages[me], own):
                    raise InvalidInputError("this holder's check commitment was not relayed as it sent it: refused")
                held.commits = {h: (m[:32], m[32:]) for h, m in messages.items()}
                return _pack(held.own_shares)
            if step == "verdict":
                complete("check shares")
                if not held.commits:
                    raise InvalidInputError("the check's commitments were not relayed before its shares: refused")
                shares = {h: _unpack(m) for h, m in messages.items()}
                values = self._values(contract, held)
                failed = [owner for side, owner in enumerate(contract.expected_owners)
                          if not check_passes(values.ctx, values.scheme, (held.a, held.b)[side], held.seed, owner,
                                              {h: c[side] for h, c in held.commits.items()},
                                              {h: s[side] for h, s in shares.items()},
                                              bytes.fromhex(contract.context_fingerprint))]
                if failed:
                    raise FailedPreconditionError(
                        f"join study {study_id}: the upload of owner {', '.join(failed)} is not well formed (its "
                        "indicator planes are not one-hot or empty 0/1 planes, checked by this key-share holder): "
                        "no value of the study is shared")
                held.passed = True
                log.info("holder %s, study %s: both owners' join planes passed the check", self.holder.name, study_id)
                return b"\x01"
            raise InvalidInputError(f"unknown join check step {step!r} (known: {', '.join(CHECK_STEPS)})")

    # -- 3. shares ------------------------------------------------------------------------------
    def shares(self, *, study_id: str, release_id: str, release_epsilon: float, contract_hash: str,
               measurement: Measurement | None, count: int, participants: Sequence[int],
               charge_log: str = "") -> tuple[list[bytes], Charge, float]:
        """This holder's share of each value the measurement measures, after its charge; (shares, charge, left).

        Privacy: charges `measurement.epsilon` to this holder's ledger (L1 sensitivity
        `measurement.sensitivity`; neighbouring relation add/remove of one shared customer, who changes one cell
        by 1)
        before any share leaves. Its DP share per value is `tolerant_share` of the measurement's scale for
        the combined holders (any of them short of the contract's noise_tolerates sum to a full discrete
        Laplace draw), drawn from this holder's noise key keyed by the request: only it knows the share;
        the combiner sees the sum. Each share also carries smudging on [-2^110, 2^110) and a uniform pad in
        every slot but slot 0 (`HolderJoinValues.shares`). t-of-N key: the measurement's charge must be in the
        study's signed `charge_log` at exactly `measurement.epsilon`, with `participants` as its participant set
        (`ChargeBook.authorize`): the signed log is the budget check, this ledger records what this holder
        answered."""
        handler = self.holder.require_active()
        contract = self._contract(study_id, contract_hash)
        eps = float(release_epsilon)
        m = handler.join_measurement(contract, release_id, eps, contract_hash, measurement, count)
        secret = self._secret(contract, participants)
        tofn = self.holder.threshold is not None
        if tofn:
            signed = self.holder.charges.authorize(study_id, charge_request(study_id, release_id, eps,
                                                                            measurement_json(m)), load_log(charge_log))
            if sorted(signed.entry.participants) != sorted(int(p) for p in participants):
                raise FailedPreconditionError(f"the request names participants {sorted(participants)}; its charge "
                                              f"fixed {list(signed.entry.participants)}: nothing was shared")
            if signed.entry.epsilon != charge_epsilon(m.epsilon):
                raise FailedPreconditionError(f"the request's charge spends {float(signed.entry.epsilon):.12g}; this "
                                              f"measurement costs {m.epsilon:.12g}: nothing was shared")
        elif charge_log:
            raise InvalidInputError(f"key-share holder {self.holder.name} holds an N-of-N key share: a request names "
                                    "no charge log")
        with self._lock:
            held = self._study(study_id)
            if not held.passed:
                raise FailedPreconditionError(f"holder {self.holder.name} has not seen both owners' planes of study "
                                              f"{study_id} pass its check: nothing was charged or shared")
            values = self._values(contract, held)
            label = (f"join|{study_id}|{release_id}|{eps!r}|".encode() + measurement_json(m).encode() + b"|"
                     + held.digest + b"|" + ",".join(map(str, sorted(participants))).encode())
            k = len(participants)
            dp = (tolerant_share(m.scale, k, contract.noise_tolerates, m.count,
                                 holder_noise_source(self.holder.noise_key, self.holder.index,
                                                     len(self.holder.holders), b"dp/" + label))
                  if contract.noise_parties == 2 else np.zeros(m.count, dtype=np.int64))
            charge = handler.charge_join(contract, release_id, eps, m, hashlib.sha256(label).hexdigest(),
                                         reserve=not tofn)
            rng = KeyedRandom(self.holder.noise_key, b"dpagg/join-holders/shares/v1|" + hashlib.sha256(label).digest())
            out = values.shares(m, dp, rng, secret=secret)
        left = handler.budget(study_id).remaining
        try:  # the study's budget spent: its key share and planes are erased (the shares are computed already)
            self.holder.retire_if_ended(study_id)
        except OSError as exc:
            log.warning("holder %s: study %s ended but its key share was not erased: %s", self.holder.name, study_id,
                        exc)
        log.info("holder %s, study %s, release %s: %d join value shares of %s, charged %.6g", self.holder.name,
                 study_id, release_id, len(out), m.kind, charge.epsilon)
        return out, charge, left


def _read_plane(folder: Path, side: int, index: int) -> bytes:
    return (folder / f"{side}.{index}").read_bytes()


def _seed_commitment(study_id: str, holder: int, contribution: bytes) -> bytes:
    return hashlib.sha256(_SEED_COMMIT + study_id.encode() + b"|" + holder.to_bytes(4, "big") + contribution).digest()


def _pack(shares: Sequence[Sequence[bytes]]) -> bytes:
    """Both owners' lists of round shares as one message (a JSON header of lengths, then the bytes)."""
    lengths = [[len(x) for x in side] for side in shares]
    head = json.dumps(lengths).encode()
    return len(head).to_bytes(4, "big") + head + b"".join(x for side in shares for x in side)


def _unpack(data: bytes) -> tuple[list[bytes], list[bytes]]:
    try:
        n = int.from_bytes(data[:4], "big")
        lengths = json.loads(data[4:4 + n])
        pos, out = 4 + n, []
        for side in lengths:
            got = []
            for ln in side:
                got.append(data[pos:pos + int(ln)])
                pos += int(ln)
            out.append(got)
        if len(out) != 2 or pos != len(data):
            raise ValueError("length mismatch")
    except (ValueError, TypeError) as exc:
        raise InvalidInputError(f"a holder's check shares do not parse: {exc}") from None
    return out[0], out[1]


