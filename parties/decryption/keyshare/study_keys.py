"""A key-share holder's key store: its deployment, each study's own key share, the legacy collective key.

In the holder's `keys/` directory (mode 0700):

- `deployment.json`: what `dpagg setup-key` fixed: the holder list, this holder's index, t of a
  t-of-N deployment (null: N-of-N) and every holder's identity keys (seal and signing) with their
  digest (`resharing.identities_digest`);
- `studies/<study>/` (mode 0700), one per study, written when the study's setup test decryption
  succeeded: `secret.bin` (mode 0600), this holder's share of the study's own collective key (s_i,
  or S_j with a t-of-N deployment), never served; `public_key.bin`, the study's collective public
  key; `key.json`, the study id and the key's fingerprint. A join study's key (at the join scheme's
  own parameters, `join_version` in key.json) adds the collective `relin_keys.bin` and
  `galois_keys.bin`, and its fingerprint is that of the join's public key material
  (`holders.join_public_bytes`). Erased when the study ends;
- a legacy collective key (`threshold_secret.bin`, `collective_key.bin`, `collective.json`) where the
  holder set one up before keys were made per study: the studies opened under it keep it.

A key's fingerprint is the SHA-256 of the public TenSEAL context built around it
(`threshold.context.collective_context_bytes`), what every contract names.
"""
from __future__ import annotations

import json
import shutil
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import context_fingerprint
from he_partition.he.threshold.context import collective_context_bytes
from he_partition.he.threshold.keys import HolderSecret
from he_partition.he.threshold.relin import join_context
from he_partition.he.threshold.setup import HolderSetup
from he_partition.join.holders import join_public_bytes

from ...common.contract import check_id
from ...common.errors import FailedPreconditionError
from ...common.util import write_file_atomic, write_private_file
from .resharing import HolderIdentity, identities_digest

__all__ = ["ActiveKey", "StudyKeyStore"]

SECRET_FILE = "threshold_secret.bin"
PUBLIC_FILE = "collective_key.bin"
META_FILE = "collective.json"
DEPLOYMENT_FILE = "deployment.json"
STUDIES_DIR = "studies"
STUDY_SECRET, STUDY_PUBLIC, STUDY_META = "secret.bin", "public_key.bin", "key.json"
STUDY_RELIN, STUDY_GALOIS = "relin_keys.bin", "galois_keys.bin"


@lru_cache(maxsize=4)
def join_template(version: int) -> Any:
    """The TenSEAL context at join scheme `version`'s parameters (parameters only: its own keys are never used)."""
    return join_context(version)


@dataclass(frozen=True)
class ActiveKey:
    """A collective key as one holder keeps it: a study's own key, or the legacy key (`study_id` "")."""

    holders: tuple[str, ...]
    index: int
    public_key: bytes
    context: bytes
    fingerprint: str
    secret: HolderSecret
    study_id: str = ""
    #: The join scheme version of a join study's key (its context is then the join's public key material); 0 else.
    join_version: int = 0
    relin_keys: bytes = b""
    galois_keys: bytes = b""


class StudyKeyStore:
    """The key files of holder `index` of `holders` under `keys_dir` (see the module docstring)."""

    def __init__(self, keys_dir: Path, template: Any, holders: Sequence[str], index: int, name: str) -> None:
        self.keys_dir, self.template, self.holders, self.index, self.name = keys_dir, template, tuple(holders), index, name
        self.studies_dir = keys_dir / STUDIES_DIR
        self._lock = threading.Lock()
        self._cache: dict[str, ActiveKey] = {}

    def key(self, public_key: bytes, secret: HolderSecret, study_id: str = "", join_version: int = 0,
            relin_keys: bytes = b"", galois_keys: bytes = b"") -> ActiveKey:
        data = (join_public_bytes(join_version, public_key, relin_keys, galois_keys) if join_version
                else collective_context_bytes(public_key))
        return ActiveKey(self.holders, self.index, public_key, data, context_fingerprint(data), secret, study_id,
                         join_version, relin_keys, galois_keys)

    def _meta(self, file: str, what: str) -> dict[str, Any] | None:
        path = self.keys_dir / file
        if not path.exists():
            return None
        meta: dict[str, Any] = json.loads(path.read_text())
        if tuple(meta["holders"]) != self.holders or int(meta["index"]) != self.index:
            raise InvalidInputError(f"the {what} in {self.keys_dir} is for holders {meta['holders']} (this one "
                                    f"index {meta['index']}), not the configured {list(self.holders)}")
        return meta

    def deployment(self) -> dict[str, Any] | None:
        """`deployment.json`, or the legacy key's `collective.json` (its t and identities stand as the deployment);
        None before `setup-key`."""
        got = self._meta(DEPLOYMENT_FILE, "deployment")
        return got if got is not None else self._meta(META_FILE, "collective key")

    @property
    def deployment_recorded(self) -> bool:
        return (self.keys_dir / DEPLOYMENT_FILE).exists()

    def legacy(self) -> ActiveKey | None:
        """The legacy collective key (checked against its recorded fingerprint), or None."""
        meta = self._meta(META_FILE, "collective key")
        if meta is None:
            return None
        secret = HolderSecret.from_bytes(self.template, (self.keys_dir / SECRET_FILE).read_bytes())
        key = self.key((self.keys_dir / PUBLIC_FILE).read_bytes(), secret)
        if key.fingerprint != meta["fingerprint"]:
            raise InvalidInputError(f"the collective key in {self.keys_dir} does not match its recorded fingerprint")
        return key

    def write_deployment(self, threshold: int | None, identities: Mapping[int, HolderIdentity]) -> str:
        """Record the deployment; the identities' digest."""
        digest = identities_digest(identities)
        meta = {"holders": list(self.holders), "index": self.index, "threshold": threshold,
                "identities_sha256": digest,
                "identities": {str(h): i.to_bytes().hex() for h, i in sorted(identities.items())}}
        self.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_file_atomic(self.keys_dir / DEPLOYMENT_FILE, json.dumps(meta).encode())
        return digest

    def study(self, study_id: str) -> ActiveKey | None:
        """This holder's key of `study_id` (from memory, or from disk after a restart); None when it has none."""
        with self._lock:
            got = self._cache.get(study_id)
            if got is not None:
                return got
            folder = self.studies_dir / check_id("study_id", study_id)
            if not (folder / STUDY_META).exists():
                return None
            meta = json.loads((folder / STUDY_META).read_text())
            version = int(meta.get("join_version") or 0)
            template = join_template(version) if version else self.template
            secret = HolderSecret.from_bytes(template, (folder / STUDY_SECRET).read_bytes())
            extra = ((folder / STUDY_RELIN).read_bytes(), (folder / STUDY_GALOIS).read_bytes()) if version else (
                b"", b"")
            got = self.key((folder / STUDY_PUBLIC).read_bytes(), secret, study_id, version, *extra)
            if meta.get("study_id") != study_id or got.fingerprint != meta.get("fingerprint"):
                raise FailedPreconditionError(f"holder {self.name}'s key store for study {study_id} does not match its "
                                              "recorded study and fingerprint: nothing was decrypted")
            self._cache[study_id] = got
            return got

    def secret_file(self, study_id: str) -> Path:
        """The file of this holder's share of `study_id`'s key (mode 0600); "" names the legacy key's."""
        if not study_id:
            return self.keys_dir / SECRET_FILE
        return self.studies_dir / check_id("study_id", study_id) / STUDY_SECRET

    def put_study(self, study_id: str, setup: HolderSetup, join_version: int = 0) -> ActiveKey:
        """File the key `setup` built (its test decryption succeeded; a join key's test product too) under
        `study_id`; the secret mode 0600."""
        assert setup.secret is not None
        key = self.key(setup.public_key, setup.secret, study_id, join_version, setup.relin_keys, setup.galois_keys)
        folder = self.studies_dir / check_id("study_id", study_id)
        self.studies_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.mkdir(exist_ok=True, mode=0o700)
        write_private_file(folder / STUDY_SECRET, setup.secret.to_bytes())
        write_file_atomic(folder / STUDY_PUBLIC, setup.public_key)
        if join_version:
            write_file_atomic(folder / STUDY_RELIN, setup.relin_keys)
            write_file_atomic(folder / STUDY_GALOIS, setup.galois_keys)
        write_file_atomic(folder / STUDY_META, json.dumps({"study_id": study_id, "fingerprint": key.fingerprint,
                                                          "threshold": setup.threshold,
                                                          "join_version": join_version}).encode())
        with self._lock:
            self._cache[study_id] = key
        return key

    def erase_study(self, study_id: str) -> tuple[bool, ActiveKey | None]:
        """Remove `study_id`'s key files and cached key: (whether there was one, the key if it was loaded)."""
        with self._lock:
            key = self._cache.pop(study_id, None)
            folder = self.studies_dir / check_id("study_id", study_id)
            existed = folder.exists() or key is not None
            shutil.rmtree(folder, ignore_errors=True)
        return existed, key

    def study_ids(self) -> list[str]:
        """The studies whose key folders are on disk."""
        return sorted(p.name for p in self.studies_dir.iterdir()) if self.studies_dir.exists() else []
