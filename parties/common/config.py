"""Configuration of the servers and clients: frozen dataclasses validated at construction, and wire limits."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from he_partition.core.errors import InvalidInputError

from .contract import check_id
from .tls import TlsConfig

__all__ = [
    "MAX_MESSAGE_BYTES",
    "CONTEXT_CHUNK_BYTES",
    "DEFAULT_TIMEOUT",
    "RELEASE_TIMEOUT",
    "GRPC_OPTIONS",
    "ENV_COMPUTATION",
    "ENV_DECRYPTION",
    "ENV_ANALYST",
    "TlsConfig",
    "DecryptionConfig",
    "ComputationConfig",
    "AnalystConfig",
    "RetryPolicy",
    "default_target",
]

#: Largest single gRPC message either side accepts, raised deliberately from gRPC's 4 MB
#: default: a 1,048,576-bin measurement answer is ~1M sint64 values (3-5 MB) and a
#: partition-sum request carries up to 1M partition starts. Ciphertexts (~370 KB each) and
#: the public context (~0.5 MB, > 4 MB with Galois keys) are streamed in chunks anyway.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Size of each public-context chunk on the wire.
CONTEXT_CHUNK_BYTES = 1024 * 1024

#: Deadline of an ordinary client call, seconds.
DEFAULT_TIMEOUT = 30.0

#: Deadline of a blocking RunRelease call, seconds (1M bins x 10 owners takes tens of seconds).
RELEASE_TIMEOUT = 900.0

GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Bind exclusively: with SO_REUSEPORT (gRPC's default on Linux) a second server on a port in use
    # starts silently and the kernel splits the traffic between two keys and ledgers.
    ("grpc.so_reuseport", 0),
    # Reconnect within 2 s of a restarted peer (gRPC's default backoff grows to 120 s), so a release
    # rides out a short restart of the key holder (DecryptionClient.outage_seconds).
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)

ENV_COMPUTATION = "DPAGG_COMPUTATION"
ENV_DECRYPTION = "DPAGG_DECRYPTION"
ENV_ANALYST = "DPAGG_ANALYST"

_DEFAULT_TARGETS = {ENV_DECRYPTION: "127.0.0.1:50051", ENV_COMPUTATION: "127.0.0.1:50052", ENV_ANALYST: ""}


def default_target(env: str) -> str:
    """The address in environment variable `env`, or the loopback default for that role."""
    value = os.environ.get(env) or _DEFAULT_TARGETS.get(env, "")
    if env == ENV_ANALYST and not value:
        return default_target(ENV_COMPUTATION)  # the analyst service lives in the computation server
    return value


def _check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise InvalidInputError(f"port must be in [0, 65535] (0 = any free port), got {port}")


def _check_workers(n: int) -> None:
    if n < 1:
        raise InvalidInputError(f"max_workers must be >= 1, got {n}")


def _check_transport(server: str, tls: TlsConfig | None, insecure: bool, roles: tuple[str, ...]) -> None:
    """Mutual TLS unless the caller explicitly chose insecure; never both, never neither."""
    if tls is not None and insecure:
        raise InvalidInputError(f"the {server} got both TLS files and insecure=True; choose one")
    if tls is None and not insecure:
        raise InvalidInputError(
            f"the {server} needs mutual TLS: pass tls=TlsConfig(ca_cert, cert, key) (create them with "
            "`dpagg certs`), or insecure=True for a local test setup without TLS, identities or role checks"
        )
    if tls is not None:
        tls.require_role(*roles)


@dataclass(frozen=True)
class DecryptionConfig:
    """Decryption server. `data_dir` holds the key files (secret one mode 0600) and the SQLite ledger.

    `tls`: its certificate (role ``decryption``) and the CA; every caller must present a
    certificate from that CA. `computation_ids`: the party ids of computation servers
    allowed to open studies and request decryptions (empty: any ``computation``
    certificate of the CA). `insecure=True` instead of `tls`: plaintext, no identities,
    no role checks, unsigned studies accepted (local tests only; must be explicit).
    `noise_seed` is for tests only: it makes the server's discrete Laplace draws
    reproducible (and therefore predictable to whoever knows the seed). None draws from
    the OS CSPRNG.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    max_workers: int = 8
    noise_seed: int | None = None
    tls: TlsConfig | None = None
    insecure: bool = False
    computation_ids: tuple[str, ...] = ()
    #: Local processes checking and decrypting a measurement's chunks on this host as they arrive (0 or 1:
    #: in-process; None, the default: min(cores, 8), in-process on one core; docs/scaling.md).
    decrypt_workers: int | None = None
    #: The operator approval keys this key holder accepts (raw 32-byte Ed25519 public keys,
    #: `parties.common.approval`): it opens only studies one of them signed. Required with `tls`;
    #: an insecure server without any opens unapproved studies (tests only).
    operator_keys: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        _check_port(self.port)
        _check_workers(self.max_workers)
        if self.decrypt_workers is not None and self.decrypt_workers < 0:
            raise InvalidInputError(f"decrypt_workers must be >= 0 (0 or 1: in-process), got {self.decrypt_workers}")
        _check_transport("decryption server", self.tls, self.insecure, ("decryption",))
        object.__setattr__(self, "operator_keys", tuple(bytes(k) for k in self.operator_keys))
        if any(len(k) != 32 for k in self.operator_keys):
            raise InvalidInputError("operator_keys must be raw 32-byte Ed25519 public keys")
        if self.tls is not None and not self.operator_keys:
            raise InvalidInputError(
                "a key holder with TLS needs the operator's approval key (--operator-key FILE.pub, repeatable): it "
                "opens only studies the operator signed, so the computation server cannot author one. Make it with "
                "`dpagg keygen --out ops.approval.key` at the operator and pin ops.approval.pub here")
        object.__setattr__(self, "computation_ids", tuple(self.computation_ids))
        for cid in self.computation_ids:
            check_id("computation id", cid)


@dataclass(frozen=True)
class ComputationConfig:
    """Computation server (and, by default, the analyst service in the same process).

    `data_dir` holds the SQLite state, the received ciphertext chunks and the released
    summaries. `decryption_target` is where the decryption server listens.
    `tls`: its certificate (role ``computation``), presented to its callers and to the
    decryption server; `insecure=True` instead: plaintext, no role checks (tests only).
    `noise_seed`: tests only, as in DecryptionConfig.
    `executor`: where the release's chunk work runs (he_partition.execution): "processes"
    (local workers, `chunk_workers` of them, 0 = one per core), "inprocess", or "ray" on the
    cluster at `cluster` (HOST:PORT or ray://HOST:PORT; empty: a private local Ray);
    `ray_node_ip`: the address this server's Ray processes bind to and advertise.
    """

    data_dir: Path
    decryption_target: str
    host: str = "127.0.0.1"
    port: int = 0
    max_workers: int = 16
    noise_seed: int | None = None
    serve_analyst: bool = True
    tls: TlsConfig | None = None
    insecure: bool = False
    executor: str = "processes"
    chunk_workers: int = 0
    cluster: str = ""
    ray_node_ip: str = "127.0.0.1"
    #: Threshold mode: the key-share holders as NAME=HOST:PORT (K >= 2); then no decryption_target.
    holders: tuple[str, ...] = ()
    #: Places in the upload queue: uploads past the running ones wait here, each on a thread of its own.
    upload_queue: int = 64
    #: Processes that share the public port and take the owners' upload streams themselves (0: this process
    #: serves the port alone). docs/scaling.md, "Ingest on several processes".
    ingest_processes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "holders", tuple(self.holders))
        if not 0 <= self.ingest_processes <= 64:
            raise InvalidInputError(f"ingest_processes must be between 0 and 64, got {self.ingest_processes}")
        _check_port(self.port)
        _check_workers(self.max_workers)
        if self.executor not in ("processes", "inprocess", "ray"):
            raise InvalidInputError(f"executor must be one of processes, inprocess, ray, got {self.executor!r}")
        if self.upload_queue < 0:
            raise InvalidInputError(f"upload_queue must be >= 0 (0: refuse uploads past the running ones), got "
                                    f"{self.upload_queue}")
        if self.chunk_workers < 0:
            raise InvalidInputError(f"chunk_workers must be >= 0 (0: one per core), got {self.chunk_workers}")
        if self.cluster and self.executor != "ray":
            raise InvalidInputError(f"cluster {self.cluster!r} is a Ray address; it needs executor 'ray', "
                                    f"got {self.executor!r}")
        _check_transport("computation server", self.tls, self.insecure, ("computation",))
        if self.holders and self.decryption_target:
            raise InvalidInputError("give either one decryption server (--decryption) or key-share holders "
                                    "(--holder NAME=HOST:PORT, K >= 2), not both")
        if not self.decryption_target and len(self.holders) < 2:
            raise InvalidInputError("decryption_target must be host:port of the decryption server (or give K >= 2 "
                                    "key-share holders)")


@dataclass(frozen=True)
class AnalystConfig:
    """A stand-alone analyst server reading the computation server's data directory.

    `tls`: a ``computation`` certificate (the analyst server is run by the computation
    server's operator, next to its data); `insecure=True` instead for tests.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    max_workers: int = 8
    tls: TlsConfig | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        _check_port(self.port)
        _check_workers(self.max_workers)
        _check_transport("analyst server", self.tls, self.insecure, ("computation",))


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of client calls that fail with UNAVAILABLE: exponential backoff with full jitter.

    Attempt k (k = 1, 2, ...) waits uniform(0, min(max_delay, initial_delay * multiplier**(k-1))).
    """

    attempts: int = 5
    initial_delay: float = 0.2
    max_delay: float = 5.0
    multiplier: float = 2.0
    retry_codes: tuple[str, ...] = field(default=("UNAVAILABLE",))

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise InvalidInputError(f"attempts must be >= 1, got {self.attempts}")
        if not (self.initial_delay >= 0 and self.max_delay >= 0 and self.multiplier >= 1):
            raise InvalidInputError("delays must be >= 0 and multiplier >= 1")
