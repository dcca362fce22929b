"""The operator's approval of a study: an Ed25519 signature on its terms, which every key holder checks.

A key holder takes no study from the computation server on trust. The operator signs the terms it
asks for (domain, epsilon, strategy, owners and their signing keys, the noise terms) with its
approval key; each key holder pins the approval keys it accepts in its own configuration
(`--operator-key`, `DecryptionConfig.operator_keys`) and opens a study only when one of them signed
exactly the terms in the request. So a computation server cannot invent an owner whose signing key
it made, widen a budget or change a bound: it relays the approval and authors nothing.

What is signed: `APPROVAL_TAG` followed by the canonical JSON (`canonical_json`) of `study_terms`,
the fields of the open-study request as the operator sent them. The key holders' seal keys are not
in it (the computation server fills them in; each holder checks its own place) and neither is the
key fingerprint (the holders make the study's key). The approval travels as `StudyApproval` (the
terms text, the signer's public key, the signature) and each holder keeps it with the study
(`ApprovalBook`), so a study opened before its holder pinned a key, or approved by a key the holder
no longer pins, is refused until the operator approves it again.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from he_partition.core.errors import InvalidInputError

from .contract import canonical_json, check_id
from .errors import FailedPreconditionError, PermissionDeniedError
from .signing import KEY_SIZE, SIGNATURE_SIZE, key_fingerprint, public_key_of
from .util import write_file_atomic

__all__ = ["APPROVAL_TAG", "ApprovalBook", "StudyApproval", "approve_study", "load_operator_keys", "study_terms"]

APPROVAL_TAG = b"dpagg/study-approval/v1\x00"


def study_terms(*, study_id: str, domain_size: int, epsilon: float, expected_owners: Iterable[str],
                strategy: str = "", contribution_bound: int = 0, noise_parties: int = 0,
                strategy_params_json: str = "", domain_spec: str = "",
                owner_keys: Mapping[str, str | bytes] | None = None, correlation_leakage: float = 0.0,
                correlation_source: str = "", max_organizations: int = 0,
                noise_tolerates: int | None = None, **_relayed: Any) -> dict[str, Any]:
    """The terms an approval covers, as plain JSON values, from open-study arguments (the request's fields).

    The same function runs at the operator (before signing) and at each key holder (on the request it
    received), so both see the same dictionary; an unset field (0 or "") reads as the default the key holder
    fills in (strategy auto, bound 1, two noise parties, one organization). `_relayed` takes what the
    computation server adds and the approval does not cover (the holders' seal keys, the approval itself, a
    timeout)."""
    keys = {str(o): (k.hex() if isinstance(k, (bytes, bytearray)) else str(k)).lower()
            for o, k in (owner_keys or {}).items()}
    return {"study_id": str(study_id), "domain_size": int(domain_size), "epsilon": _number(epsilon),
            "expected_owners": sorted(str(o) for o in expected_owners), "strategy": str(strategy or "auto"),
            "contribution_bound": int(contribution_bound or 1), "noise_parties": int(noise_parties or 2),
            "strategy_params_json": str(strategy_params_json or ""), "domain_spec": str(domain_spec or ""),
            "owner_keys": keys, "correlation_leakage": _number(correlation_leakage or 0.0),
            "correlation_source": str(correlation_source or ""),
            "max_organizations": int(max_organizations or 1),
            "noise_tolerates": None if noise_tolerates is None else int(noise_tolerates)}


def _number(value: float) -> float | str:
    """A float as JSON carries it; NaN and the infinities as text, so that terms a key holder will refuse by name
    can still be signed and sent (JSON has no such numbers)."""
    f = float(value)
    return f if math.isfinite(f) else repr(f)


@dataclass(frozen=True)
class StudyApproval:
    """The operator's signature on one study's terms: `terms_json` (the signed text), the signer's raw
    Ed25519 public key and the 64-byte signature over APPROVAL_TAG + terms_json."""

    terms_json: str
    operator_key: bytes
    signature: bytes

    @property
    def terms(self) -> dict[str, Any]:
        try:
            terms = json.loads(self.terms_json)
        except ValueError as exc:
            raise InvalidInputError(f"approval.terms_json is not JSON: {exc}") from exc
        if not isinstance(terms, dict):
            raise InvalidInputError("approval.terms_json must be a JSON object of study terms")
        return terms

    @property
    def signer(self) -> str:
        """A short printable name of the approval key (first 16 hex digits of its SHA-256)."""
        return key_fingerprint(self.operator_key) if len(self.operator_key) == KEY_SIZE else "(malformed key)"

    def verify(self, pinned: Iterable[bytes]) -> dict[str, Any]:
        """The signed terms, once the signature verifies under one of the `pinned` approval keys.

        Refused (PermissionDeniedError): a key this holder does not pin, a signature that does not verify."""
        pins = {bytes(k) for k in pinned}
        if bytes(self.operator_key) not in pins:
            raise PermissionDeniedError(
                f"the study is approved by key {self.signer}, which this key holder does not pin (it accepts "
                f"{', '.join(sorted(key_fingerprint(k) for k in pins)) or 'no key'}): the study was not opened")
        if len(self.signature) != SIGNATURE_SIZE:
            raise PermissionDeniedError(f"approval.signature must be {SIGNATURE_SIZE} bytes, got "
                                        f"{len(self.signature)}: the study was not opened")
        try:
            Ed25519PublicKey.from_public_bytes(bytes(self.operator_key)).verify(
                bytes(self.signature), APPROVAL_TAG + self.terms_json.encode("utf-8"))
        except (InvalidSignature, ValueError) as exc:
            raise PermissionDeniedError(f"the approval's signature does not verify under key {self.signer}: the "
                                        "terms differ from what the operator signed; the study was not opened"
                                        ) from exc
        return self.terms

    def check_request(self, pinned: Iterable[bytes], requested: Mapping[str, Any], *,
                      default_tolerates: int | None = None) -> None:
        """Verify the approval and that the request asks for exactly the signed terms (`study_terms(**requested)`);
        a field that differs is named (PermissionDeniedError), so a relay that changed anything opens nothing.

        `default_tolerates`: the noise_tolerates this holder fills in itself. When the operator approved none
        (null), a relay may send only that one (the computation server fills the same default for every holder),
        never a smaller coalition than the holder's own default."""
        signed = self.verify(pinned)
        asked = json.loads(canonical_json(study_terms(**requested)))
        if signed.get("noise_tolerates") is None and asked.get("noise_tolerates") == default_tolerates:
            asked["noise_tolerates"] = None
        for field in sorted(set(signed) | set(asked)):
            if signed.get(field) != asked.get(field):
                raise PermissionDeniedError(
                    f"the request's {field} ({_short(asked.get(field))}) is not what the operator approved "
                    f"({_short(signed.get(field))}): the study was not opened")

    def to_dict(self) -> dict[str, str]:
        return {"terms_json": self.terms_json, "operator_key": self.operator_key.hex(),
                "signature": self.signature.hex()}

    @classmethod
    def from_dict(cls, d: Mapping[str, str]) -> "StudyApproval":
        return cls(str(d["terms_json"]), bytes.fromhex(d["operator_key"]), bytes.fromhex(d["signature"]))


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def approve_study(private_key: bytes, **terms: Any) -> StudyApproval:
    """The operator's approval of open-study `terms` (what `ComputationClient.open_study` sends) with its
    Ed25519 approval key (from `dpagg keygen`). Signs; spends and draws nothing."""
    if not terms.get("study_id"):
        raise InvalidInputError("an approved study needs its study_id (the signature covers it)")
    text = canonical_json(study_terms(**terms))
    key = Ed25519PrivateKey.from_private_bytes(bytes(private_key))
    return StudyApproval(text, public_key_of(private_key), key.sign(APPROVAL_TAG + text.encode("utf-8")))


def load_operator_keys(values: Iterable[str]) -> tuple[bytes, ...]:
    """Pinned approval keys from configuration: each a 64-hex-digit Ed25519 public key or a file holding one
    (the `.pub` file `dpagg keygen` writes). Refused with a message naming the entry."""
    out: list[bytes] = []
    for v in values:
        text = str(v).strip()
        path = Path(text)
        if not _is_hex_key(text) and path.exists():
            text = path.read_text().strip()
        if not _is_hex_key(text):
            raise InvalidInputError(f"--operator-key {v!r}: give the operator's approval public key as 64 hex digits "
                                    "or the .pub file `dpagg keygen` wrote")
        out.append(bytes.fromhex(text))
    return tuple(out)


def _is_hex_key(text: str) -> bool:
    return len(text) == 2 * KEY_SIZE and all(c in "0123456789abcdefABCDEF" for c in text)


class ApprovalBook:
    """The approvals a key holder accepted, one per study (kept as STUDY.json under `directory`, or in memory).

    With pinned keys, a study without an approval by a key still pinned is refused for everything after
    open-study (`require`): commitments, c1 parts, measurements, direct queries, join pages."""

    def __init__(self, pinned: Iterable[bytes], directory: Path | None = None) -> None:
        self.pinned = tuple(bytes(k) for k in pinned)
        self._dir = directory
        self._kept: dict[str, StudyApproval] = {}
        self._lock = threading.Lock()

    @property
    def enforced(self) -> bool:
        return bool(self.pinned)

    def keep(self, study_id: str, approval: StudyApproval) -> None:
        check_id("study_id", study_id)
        with self._lock:
            self._kept[study_id] = approval
            if self._dir is not None:
                self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                write_file_atomic(self._dir / f"{study_id}.json", canonical_json(approval.to_dict()).encode())

    def get(self, study_id: str) -> StudyApproval | None:
        with self._lock:
            if study_id in self._kept:
                return self._kept[study_id]
            path = None if self._dir is None else self._dir / f"{check_id('study_id', study_id)}.json"
            if path is None or not path.exists():
                return None
            approval = StudyApproval.from_dict(json.loads(path.read_text()))
            self._kept[study_id] = approval
            return approval

    def require(self, study_id: str) -> None:
        """Refuse (FailedPreconditionError) a study this holder holds no approval for by a key it still pins."""
        if not self.enforced:
            return
        approval = self.get(study_id)
        if approval is None or approval.operator_key not in self.pinned:
            why = ("was opened without the operator's approval" if approval is None
                   else f"was approved by key {approval.signer}, which this key holder no longer pins")
            raise FailedPreconditionError(
                f"study {study_id} {why}: this key holder serves it nothing; the operator approves it by opening "
                "it again with the same terms and its approval key (dpagg open-study ... --approval-key FILE)")
