"""The decryption server's key store on disk: the secret BFV context (mode 0600, never served) and its public part."""

from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import logging
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from he_partition.he.bfv import BfvParams, context_fingerprint, generate_secret_context, load_context, public_context_bytes
from he_partition.core.errors import InvalidInputError

from ..common.contract import check_id
from ..common.util import write_file_atomic, write_private_file

__all__ = ["KeyMaterial", "KeyStore", "StudyKeyStore", "load_or_create_noise_key"]

log = logging.getLogger("dpagg.decryption.keys")

SECRET_FILE = "secret_context.bin"
PUBLIC_FILE = "public_context.bin"
#: Under the key directory: one directory per study with its own key (`StudyKeyStore`).
STUDY_KEYS_DIR = "studies"
#: Left in a study's key directory when its key is erased (`StudyKeyStore.erase`): why and when, no secret.
ERASED_FILE = "erased.txt"


@dataclass(frozen=True)
class KeyMaterial:
    """The loaded key: `secret_context` stays in this process; `public_bytes` may be served."""

    secret_context: Any
    public_bytes: bytes

    @property
    def fingerprint(self) -> str:
        return context_fingerprint(self.public_bytes)


class KeyStore:
    """Keys in `directory` (mode 0700): secret_context.bin (0600) and public_context.bin.

    The first `load_or_create` generates a key pair; later ones (server restarts) load it,
    refusing a secret file that other users can read. The public file is re-derived from
    the secret context and compared, so a swapped public file is noticed.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    @property
    def secret_path(self) -> Path:
        return self.directory / SECRET_FILE

    @property
    def public_path(self) -> Path:
        return self.directory / PUBLIC_FILE

    def load_or_create(self, params: BfvParams = BfvParams()) -> KeyMaterial:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.secret_path.exists():
            return self._load()
        secret = generate_secret_context(params)
        # The only place a secret key is serialized: straight into a 0600 file.
        write_private_file(self.secret_path, bytes(secret.serialize(save_secret_key=True)))
        public = public_context_bytes(secret)
        write_file_atomic(self.public_path, public)
        log.info("generated a new BFV key pair in %s (fingerprint %s)", self.directory,
                 context_fingerprint(public)[:16])
        return KeyMaterial(secret, public)

    def _load(self) -> KeyMaterial:
        mode = stat.S_IMODE(os.stat(self.secret_path).st_mode)
        if mode & 0o077:
            raise InvalidInputError(
                f"{self.secret_path} has mode {mode:04o}: other users could read the secret key. "
                f"Run: chmod 600 {self.secret_path}"
            )
        secret = load_context(self.secret_path.read_bytes())
        if not secret.is_private():
            raise InvalidInputError(f"{self.secret_path} holds no secret key; restore it from a backup")
        public = public_context_bytes(secret)
        if self.public_path.exists() and self.public_path.read_bytes() != public:
            raise InvalidInputError(
                f"{self.public_path} does not match the secret key in {self.secret_path}; delete the public file "
                "to re-derive it"
            )
        if not self.public_path.exists():
            write_file_atomic(self.public_path, public)
        return KeyMaterial(secret, public)


class StudyKeyStore:
    """A fresh BFV key per study: `directory`/STUDY_ID/ (mode 0700) holds that study's secret_context.bin
    (0600) and public_context.bin, each as in `KeyStore`, or, for a join study, its own join key pair
    (`join_key_files`, `keep_join`). `directory` None: the keys live in memory (tests).

    A key is made (`generate`) and kept (`keep`) when its study opens, found again (`load`) on
    every later use of the study, and erased (`erase`) when the study ends; the erased study's
    directory keeps ERASED_FILE (why and when) so a later request is told what happened.
    Every key has the same parameters (`BfvParams`): only the secret and public keys differ.
    """

    def __init__(self, directory: Path | str | None, params: BfvParams = BfvParams()) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.params = params
        self._memory: dict[str, KeyMaterial] = {}
        self._memory_join: dict[str, "JoinScheme"] = {}
        self._erased: dict[str, str] = {}

    def _store(self, study_id: str) -> KeyStore:
        assert self.directory is not None
        return KeyStore(self.directory / check_id("study_id", study_id))

    def generate(self) -> KeyMaterial:
        """A fresh key pair, not yet kept anywhere (kept by `keep` once the study's terms are accepted)."""
        secret = generate_secret_context(self.params)
        return KeyMaterial(secret, public_context_bytes(secret))

    def keep(self, study_id: str, material: KeyMaterial) -> None:
        """Write `study_id`'s key: the secret context straight into a 0600 file, the public one next to it."""
        if self.directory is None:
            self._memory[study_id] = material
            self._erased.pop(study_id, None)
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        store = self._store(study_id)
        store.directory.mkdir(exist_ok=True, mode=0o700)
        write_private_file(store.secret_path, bytes(material.secret_context.serialize(save_secret_key=True)))
        write_file_atomic(store.public_path, material.public_bytes)
        (store.directory / ERASED_FILE).unlink(missing_ok=True)
        log.info("generated study %s's BFV key pair (fingerprint %s)", study_id, material.fingerprint[:16])

    def load(self, study_id: str) -> KeyMaterial | None:
        """`study_id`'s key, or None when it has none (never made, or erased: `erased` says why)."""
        if self.directory is None:
            return self._memory.get(study_id)
        store = self._store(study_id)
        if not store.secret_path.exists():
            return None
        return store.load_or_create(self.params)

    def keep_join(self, study_id: str, scheme: "JoinScheme", version: int) -> None:
        """Write join study `study_id`'s own join key of scheme `version` (secret 0600; `join_key_files` names)."""
        if self.directory is None:
            self._memory_join[study_id] = scheme
            self._erased.pop(study_id, None)
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        d = self._store(study_id).directory
        d.mkdir(exist_ok=True, mode=0o700)
        secret_name, public_name = join_key_files(version)
        write_file_atomic(d / public_name, scheme.public_bytes())
        write_private_file(d / secret_name, scheme.secret_bytes())
        (d / ERASED_FILE).unlink(missing_ok=True)
        log.info("generated join study %s's join key pair (version %d)", study_id, version)

    def load_join(self, study_id: str, version: int) -> "JoinScheme | None":
        """Join study `study_id`'s own join key of `version`, or None (a study on the shared key, or erased)."""
        if self.directory is None:
            return self._memory_join.get(study_id)
        d = self._store(study_id).directory
        if not (d / join_key_files(version)[0]).exists():
            return None
        from he_partition.he.join_scheme import JoinParams, JoinScheme

        secret_path, public_path = (d / name for name in join_key_files(version))
        try:
            mode = stat.S_IMODE(os.stat(secret_path).st_mode)
            if mode & 0o077:
                raise InvalidInputError(f"{secret_path} has mode {mode:04o}: other users could read the secret key. "
                                        f"Run: chmod 600 {secret_path}")
            return JoinScheme.from_secret(public_path.read_bytes(), secret_path.read_bytes(),
                                          JoinParams.for_version(version))
        except FileNotFoundError:  # erased while it was read: never made again here
            return None

    def secret_ref(self, study_id: str) -> str | bytes:
        """What a local decrypt worker loads `study_id`'s secret key from: its file on this host, or (in memory)
        the serialized secret context, handed over the worker's spawn pipe."""
        if self.directory is None:
            return bytes(self._memory[study_id].secret_context.serialize(save_secret_key=True))
        return str(self._store(study_id).secret_path)

    def erased(self, study_id: str) -> str:
        """Why and when `study_id`'s key was erased ("" when it was not)."""
        if self.directory is None:
            return self._erased.get(study_id, "")
        marker = self._store(study_id).directory / ERASED_FILE
        return marker.read_text(encoding="utf-8").strip() if marker.exists() else ""

    def erase(self, study_id: str, reason: str) -> bool:
        """Delete `study_id`'s secret and public key files (False when there were none) and leave ERASED_FILE.

        The files are unlinked, not overwritten: what the file system, its snapshots or a backup
        of the key directory kept is outside this store (docs/threat-model.md, retention).
        """
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if self.directory is None:
            had = (self._memory.pop(study_id, None) is not None) | (self._memory_join.pop(study_id, None) is not None)
            if had:
                self._erased[study_id] = f"{when} {reason}"
            return had
        store = self._store(study_id)
        files = [p for p in (store.secret_path, store.public_path, *_join_files(store.directory)) if p.exists()]
        if not files:
            return False
        write_file_atomic(store.directory / ERASED_FILE, f"{when} {reason}\n".encode())
        for p in files:
            p.unlink()
        log.info("erased study %s's BFV key: %s", study_id, reason)
        return True

    def size_on_disk(self, study_id: str) -> int:
        """Bytes of `study_id`'s key files (0 in memory or when erased)."""
        if self.directory is None:
            return 0
        store = self._store(study_id)
        return sum(p.stat().st_size for p in (store.secret_path, store.public_path, *_join_files(store.directory))
                   if p.exists())


def _join_files(directory: Path) -> list[Path]:
    """The join key files (every version) in a study's key directory."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith("join_") and p.suffix == ".bin")


if TYPE_CHECKING:
    from he_partition.he.join_scheme import JoinScheme

JOIN_SECRET_FILE = "join_secret.bin"
JOIN_PUBLIC_FILE = "join_public.bin"


def join_key_files(version: int) -> tuple[str, str]:
    """(secret, public) file names of join scheme `version`'s key pair: version 1 keeps the names it had
    before versions existed, later ones are join_v<N>_secret.bin and join_v<N>_public.bin."""
    if version == 1:
        return JOIN_SECRET_FILE, JOIN_PUBLIC_FILE
    return f"join_v{version}_secret.bin", f"join_v{version}_public.bin"


def load_or_create_join_keys(directory: Path | str, version: int = 1) -> "JoinScheme":
    """The key holder's join key of `version` (he_partition.he.join_scheme): its secret (0600) and public files
    (`join_key_files`) in `directory`, generated on first use (the first join study of that version) and
    loaded on every later one."""
    from he_partition.he.join_scheme import JoinParams, JoinScheme

    params = JoinParams.for_version(version)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret_name, public_name = join_key_files(version)
    secret_path, public_path = d / secret_name, d / public_name
    if secret_path.exists():
        mode = stat.S_IMODE(os.stat(secret_path).st_mode)
        if mode & 0o077:
            raise InvalidInputError(f"{secret_path} has mode {mode:04o}: other users could read the secret key. "
                                    f"Run: chmod 600 {secret_path}")
        return JoinScheme.from_secret(public_path.read_bytes(), secret_path.read_bytes(), params)
    scheme = JoinScheme.generate(params)
    write_file_atomic(public_path, scheme.public_bytes())
    write_private_file(secret_path, scheme.secret_bytes())
    log.info("generated the join key pair of version %d in %s", version, d)
    return scheme


NOISE_KEY_FILE = "noise_key.bin"


def load_or_create_noise_key(directory: Path | str, *, seed: int | None = None) -> bytes:
    """The 32-byte secret that fixes this server's noise draw per request (noise_key.bin, mode 0600).

    Kept next to the release key so that a request repeated after a restart gets the same
    draw (it cannot average fresh ones). Generated on first use from the OS CSPRNG, or,
    for a seeded test server (`seed`), from the seed, so test runs are reproducible.
    """
    return load_or_create_secret(directory, NOISE_KEY_FILE, "noise key", seed=seed)


def load_or_create_secret(directory: Path | str, file_name: str, what: str, *, seed: int | None = None) -> bytes:
    """A 32-byte secret of this key holder in `directory`/`file_name` (mode 0600, refused if others may read it),
    generated on first use from the OS CSPRNG, or from `seed` for a seeded test server.

    Created once even when several calls (threads or processes) find it missing at once: the new secret is
    written to a file of its own and linked into place, which fails if another call linked first; every
    caller then uses the one secret in the file."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / file_name
    if not path.exists():
        key = os.urandom(32) if seed is None else hashlib.sha256(f"dpagg test {what} {seed}".encode()).digest()
        fresh = d / f".{file_name}.{os.getpid()}.{secrets.token_hex(8)}"
        write_private_file(fresh, key)
        try:
            os.link(fresh, path)  # atomic, and never replaces a secret another call created meanwhile
            log.info("generated the %s in %s", what, d)
        except FileExistsError:
            pass
        finally:
            fresh.unlink(missing_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise InvalidInputError(f"{path} has mode {mode:04o}: other users could read the {what}. "
                                f"Run: chmod 600 {path}")
    key = path.read_bytes()
    if len(key) != 32:
        raise InvalidInputError(f"{path} holds {len(key)} bytes, not 32: restore it from a backup")
    return key
