"""Build and run the decryption server: key store + SQLite ledger + the Decryption service."""

from __future__ import annotations

import logging

from parties.wire.v1 import decryption_pb2_grpc

from ..common.access import AccessPolicy
from ..common.approval import ApprovalBook
from ..common.config import DecryptionConfig
from ..common.limits import DECRYPTION_MAX_RECEIVE, server_options
from ..common.server import ServerHandle, create_server
from ..common.errors import FailedPreconditionError
from ..common.util import lock_data_dir, noise_source
from ..common.sealing import SealKeyPair
from .handler import DecryptionHandler
from .arrivals import ARRIVALS_FILE, ArrivalLog
from .oprf import EVALUATIONS_FILE, EvaluationLog, load_or_create_oprf_key
from .keys import STUDY_KEYS_DIR, KeyStore, StudyKeyStore, load_or_create_noise_key
from .workers import DecryptPool, default_decrypt_workers
from .ledger import LedgerStore, SqliteLedgerStore
from .receipts import ReceiptSigner
from .servicer import SERVICE_NAME, DecryptionServicer

__all__ = ["create_decryption_server", "serve_decryption", "LEDGER_FILE", "KEYS_DIR"]

log = logging.getLogger("dpagg.decryption")

LEDGER_FILE = "ledger.sqlite3"
KEYS_DIR = "keys"
#: The owners' expected aggregate c1 per signed study (`UploadC1Book`: c1/STUDY.npy).
C1_DIR = "c1"
#: The operator's approval of each study this key holder opened (`ApprovalBook`: approvals/STUDY.json).
APPROVALS_DIR = "approvals"


def create_decryption_server(config: DecryptionConfig, *, ledger: LedgerStore | None = None) -> ServerHandle:
    """Load (or create) the key in `config.data_dir/keys`, open the ledger, build the server (not started).

    Every new study gets its own key (keys/studies/STUDY_ID/, `StudyKeyStore`); the server key in
    keys/ is served without a study id and stays the key of the studies opened before keys were
    per study; a study's own key is erased when the study ends (`DecryptionHandler.end_if_spent`).
    Restarting on the same data directory keeps the keys, every study and every charge.
    With `config.tls` the port is mutual TLS and every RPC checks the caller's role;
    with `config.insecure` it is plaintext and unchecked (a warning is logged).
    """
    unlock = lock_data_dir(config.data_dir, "decryption server")
    try:
        keys = KeyStore(config.data_dir / KEYS_DIR).load_or_create()
        noise_key = load_or_create_noise_key(config.data_dir / KEYS_DIR, seed=config.noise_seed)
        store = ledger or SqliteLedgerStore(config.data_dir / LEDGER_FILE)
        arrivals = ArrivalLog(config.data_dir / ARRIVALS_FILE)
        oprf_key = load_or_create_oprf_key(config.data_dir / KEYS_DIR, seed=config.noise_seed)
        evaluations = EvaluationLog(config.data_dir / EVALUATIONS_FILE)
    except BaseException:
        unlock()
        raise
    verify = getattr(store, "verify_chain", None)
    if verify is not None:
        try:
            log.info("ledger hash chain verified: %d charge rows", verify())
        except FailedPreconditionError as exc:  # started anyway, so operators can inspect; no decryption runs
            log.error("%s", exc)
    if config.noise_seed is not None:
        log.warning("decryption server noise is SEEDED (%d): predictable, for tests only", config.noise_seed)
    # Workers read the key file on this host themselves; they start with the server (`serve_decryption`) or at
    # the first measurement large enough to use them, and stay until it stops.
    workers = default_decrypt_workers() if config.decrypt_workers is None else config.decrypt_workers
    pool = DecryptPool(workers, secret_path=KeyStore(config.data_dir / KEYS_DIR).secret_path)
    handler = DecryptionHandler(store, keys, noise_source(config.noise_seed), require_signed=config.tls is not None,
                                join_keys_dir=config.data_dir / KEYS_DIR, noise_key=noise_key, arrivals=arrivals,
                                decrypt_pool=pool,
                                seal_key=SealKeyPair.load_or_create(config.data_dir / KEYS_DIR),
                                commitments_dir=config.data_dir / "commitments",
                                c1_dir=config.data_dir / C1_DIR, oprf_key=oprf_key, evaluations=evaluations,
                                approvals=ApprovalBook(config.operator_keys, config.data_dir / APPROVALS_DIR),
                                study_keys=StudyKeyStore(config.data_dir / KEYS_DIR / STUDY_KEYS_DIR))
    policy = AccessPolicy(config.tls is not None, server=f"decryption server ({config.data_dir})")
    servicer = DecryptionServicer(handler, policy, config.computation_ids,
                                  ReceiptSigner.load_or_create(config.data_dir / KEYS_DIR))
    try:
        server, port = create_server(
            [(decryption_pb2_grpc.add_DecryptionServicer_to_server, servicer, SERVICE_NAME)],
            host=config.host, port=config.port, max_workers=config.max_workers,
            credentials=config.tls.server_credentials() if config.tls is not None else None,
            options=server_options(DECRYPTION_MAX_RECEIVE),
        )
    except BaseException:
        pool.close()
        store.close()
        arrivals.close()
        evaluations.close()
        unlock()
        raise
    return ServerHandle(server, port, config.host, handler,
                        [pool.close, store.close, arrivals.close, evaluations.close, unlock])


def _identity(config: DecryptionConfig) -> str:
    tls = config.tls
    return f"{tls.identity.role} {tls.identity.party_id!r} (mutual TLS)" if tls else "INSECURE: no TLS, no identities"


def serve_decryption(config: DecryptionConfig, *, port_file: str | None = None) -> None:
    """Run the decryption server until SIGINT/SIGTERM."""
    handle = create_decryption_server(config)
    pool = handle.handler.decrypt_pool
    if pool is not None:  # the workers load the key now, not while the first large measurement waits
        pool.start()
    log.info("decryption server listening on %s as %s; data dir %s; key fingerprint %s; computation servers %s",
             handle.target, _identity(config), config.data_dir, handle.handler.fingerprint,
             ", ".join(config.computation_ids) or "any (no TLS)")
    handle.serve(port_file=port_file)
