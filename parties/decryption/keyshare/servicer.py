"""The Decryption service of a key-share holder and the server that runs it.

Same service as the single decryption server (`dpagg.v1.Decryption`): GetPublicContext (the
collective public context of the study named: each study has its own key), OpenStudy (a new study
only under the key this holder built for it) / GetStudy / BudgetStatus / ChargeDirectQueries over this
holder's own ledger, with receipts signed by this holder's own key. DecryptMeasurement,
DecryptJoinCells and the join check (JoinCheckSeed, CheckJoinUpload) need the whole key and answer
FAILED_PRECONDITION; EvaluatePseudonyms answers a join owner's page with this holder's share of the
study's OPRF key (docs/join.md, "Oblivious pseudonyms with key holders"); KeySetup runs this holder's
side of the deployment (`setup-key`) and of each study's key setup, and IssueShares its decryption shares of one measurement.
"""
from __future__ import annotations

import itertools
import logging
from fractions import Fraction
from typing import Any, Iterator

import grpc

from parties.wire.v1 import decryption_pb2, decryption_pb2_grpc
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.join.oprf import ELEMENT_BYTES

from ...common.access import ANY_ROLE, AccessPolicy
from ...common.config import DecryptionConfig
from ...common.contract import check_id
from ...common.convert import context_to_chunks, contract_to_proto, measurement_from_proto, open_study_kwargs
from ...common.paging import read_measurement_header
from ...common.errors import FailedPreconditionError
from ...common.limits import DECRYPTION_MAX_RECEIVE, server_options
from ...common.server import ServerHandle, create_server
from ...common.util import lock_data_dir
from ..handler import DecryptionHandler
from .pseudonyms import evaluate_page
from ..keys import load_or_create_noise_key
from .charges import below, charge_epsilon, log_budget
from .service import JOINS_SINGLE_HOLDER, KeyShareService
from ...common.sealing import Commitment
from .uploads import OwnerC1Parts
from ..receipts import ReceiptSigner, reconcile_charges
from ..servicer import SERVICE_NAME, DecryptionServicer
from ..workers import default_decrypt_workers

__all__ = ["KeyShareServicer", "create_keyshare_server"]

log = logging.getLogger("dpagg.decryption.keyshare")


class KeyShareServicer(DecryptionServicer):
    """A key-share holder's Decryption service: the single server's study RPCs; setup and shares, no decryption."""

    def __init__(self, service: KeyShareService, policy: AccessPolicy | None = None,
                 computation_ids: tuple[str, ...] = (), receipts: ReceiptSigner | None = None) -> None:
        self.service = service
        self.receipts = receipts if receipts is not None else ReceiptSigner.load_or_create(None)
        self.policy = policy if policy is not None else AccessPolicy()
        self.computation_ids = tuple(computation_ids) or None

    @property
    def handler(self) -> DecryptionHandler:  # type: ignore[override]
        return self.service.require_active()

    def OpenStudy(self, request: decryption_pb2.OpenStudyRequest,
                  context: grpc.ServicerContext) -> decryption_pb2.OpenStudyResponse:
        self._computation_only(context, "open a study at a key-share holder")
        seals = list(request.holder_seal_keys)
        if request.owner_keys and (len(seals) != len(self.service.holders)
                                   or seals[self.service.index].lower() != self.service.seal.public_hex):
            raise FailedPreconditionError(
                f"a signed study must pin every key holder's seal key in holder order, with key holder "
                f"{self.service.name}'s own ({self.service.seal.public_hex[:16]}) at place {self.service.index}: "
                "the study was not opened")
        contract, existed = self.service.open_study(**open_study_kwargs(request))
        return decryption_pb2.OpenStudyResponse(contract=contract_to_proto(contract), already_existed=existed)

    def GetPublicContext(self, request: decryption_pb2.GetPublicContextRequest,
                         context: grpc.ServicerContext) -> Iterator[decryption_pb2.PublicContextChunk]:
        """The collective public context of the study named (each study has its own key); without a study, the
        legacy collective key's, where this holder has one."""
        self.policy.require(context, ANY_ROLE, action="download the public context")
        data, fingerprint = self.service.public_context(request.study_id)
        yield from context_to_chunks(data, fingerprint)

    def DecryptMeasurement(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self._computation_only(context, "ask for a decryption")
        raise FailedPreconditionError(f"this server is key-share holder {self.service.name!r} of "
                                      f"{len(self.service.holders)}: it holds no whole key and decrypts nothing; the "
                                      "computation server asks every holder for shares (IssueShares)")

    def DecryptJoinCells(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self._computation_only(context, "ask for a join decryption")
        raise FailedPreconditionError(f"this server is key-share holder {self.service.name!r}: {JOINS_SINGLE_HOLDER}")

    def EvaluatePseudonyms(self, request: decryption_pb2.EvaluatePseudonymsRequest,
                           context: grpc.ServicerContext) -> decryption_pb2.EvaluatePseudonymsResponse:
        """gRPC: one page of a join owner's blinded identifiers (ristretto255), answered with this holder's share of
        the study's OPRF key for the request's route (a data owner of the study, for its own id;
        `pseudonyms.evaluate_page` checks the contract, the quota and logs the page)."""
        caller = self.policy.require(context, ["data_owner"], action="evaluate join pseudonyms")
        self.policy.same_party(caller, request.owner_id, what="owner_id of the request")
        data = bytes(request.blinded_elements)
        if len(data) % ELEMENT_BYTES or not data:
            raise InvalidInputError(f"blinded_elements must be 1 or more {ELEMENT_BYTES}-byte elements")
        if not request.route:
            raise InvalidInputError(f"key-share holder {self.service.name!r} answers with its share of the key: the "
                                    "request names its route (the t holders the page goes to); nothing was evaluated")
        elements = [data[i:i + ELEMENT_BYTES] for i in range(0, len(data), ELEMENT_BYTES)]
        answers, used, quota = evaluate_page(
            self.service, study_id=request.study_id, owner_id=request.owner_id, contract_hash=request.contract_hash,
            page=int(request.page), route=[int(h) for h in request.route], elements=elements)
        return decryption_pb2.EvaluatePseudonymsResponse(evaluated_elements=b"".join(answers),
                                                         evaluations_used=used, evaluation_quota=quota)

    def JoinCheckSeed(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._computation_only(context, "ask for a join check seed")
        raise FailedPreconditionError(f"this server is key-share holder {self.service.name!r}: {JOINS_SINGLE_HOLDER}")

    def CheckJoinUpload(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._computation_only(context, "check a join upload")
        raise FailedPreconditionError(f"this server is key-share holder {self.service.name!r}: {JOINS_SINGLE_HOLDER}")

    def BudgetStatus(self, request: decryption_pb2.BudgetStatusRequest,
                     context: grpc.ServicerContext) -> decryption_pb2.BudgetStatusResponse:
        """This holder's ledger, and with a t-of-N key its view of the study's signed charge log."""
        resp = super().BudgetStatus(request, context)
        if self.service.charges is not None:
            view = self.service.charges.view(request.study_id)
            resp.key_threshold = int(self.service.threshold or 0)
            resp.charge_log_entries = int(view["charges"])
            resp.charge_log_spent = float(view["spent"])
            resp.charges_signed.extend(int(i) for i in view["signed"])
            # the one view of what is left (`charges.log_budget`): the log this holder verified, exact decimals;
            # its own ledger reserves nothing (a failed release holds nothing here), so neither does this view
            left = log_budget(resp.epsilon_total, [], Fraction(0))
            spent = max(Fraction(view["spent"]), charge_epsilon(resp.epsilon_spent))
            resp.epsilon_reserved = float(spent)
            resp.epsilon_available = below(max(Fraction(0), left.total - spent))
        return resp

    def ReconcileCharges(self, request: decryption_pb2.ReconcileChargesRequest,
                         context: grpc.ServicerContext) -> decryption_pb2.ReconcileChargesResponse:
        """Book the charges the other holders' signed receipts prove and this ledger lacks (operators only).

        Privacy: adds spend only (`parties.decryption.receipts.reconcile_charges`: the receipt's
        epsilon, for a measurement or direct-query batch of sensitivity c under add/remove of one
        person with at most c records, checked by the holders that charged it); draws no noise.
        """
        self.policy.require(context, ["operator"], action="reconcile a ledger")
        handler = self.handler
        study_id = check_id("study_id", request.study_id)
        handler.get_study(study_id)
        booked = reconcile_charges(handler.ledger, self.receipts.public_key, study_id,
                                   [(r.body, r.signature, r.public_key) for r in request.receipts])
        for c in booked:
            log.warning("study %s: booked charge #%d (release %s, %s, epsilon %.12g) that the other holders' signed "
                        "receipts prove and this ledger lacked (reconciled)", study_id, c.charge_id, c.release_id,
                        c.kind, c.epsilon)
        return decryption_pb2.ReconcileChargesResponse(
            booked=[decryption_pb2.LedgerCharge(charge_id=c.charge_id, release_id=c.release_id, kind=c.kind,
                                                epsilon=c.epsilon, created_at=c.created_at) for c in booked],
            epsilon_spent=handler.budget(study_id).spent)

    def KeySetup(self, request: decryption_pb2.KeySetupRequest,
                 context: grpc.ServicerContext) -> decryption_pb2.KeySetupResponse:
        self._computation_only(context, "run the collective key setup")
        message, fingerprint, state = self.service.key_setup(
            request.step, bytes(request.session), list(request.holders),
            {int(k): bytes(v) for k, v in request.messages.items()}, bytes(request.ciphertext), list(request.values),
            threshold=int(request.threshold), participants=[int(p) for p in request.participants],
            join_version=int(request.join_version))
        return decryption_pb2.KeySetupResponse(message=message, fingerprint=fingerprint, state=state,
                                               holder=self.service.index, seal_public_key=self.service.seal.public_hex,
                                               signing_public_key=self.service.signer.public_key.hex(),
                                               threshold=self.service.threshold or len(self.service.holders))

    def SignCharge(self, request: decryption_pb2.SignChargeRequest,
                   context: grpc.ServicerContext) -> decryption_pb2.SignChargeResponse:
        """This holder's signature on one charge of a t-of-N study's log (`KeyShareService.sign_charge`).

        Privacy: a signature is a holder's consent to spend the entry's epsilon (for a
        measurement of L1 sensitivity c under add/remove of one person with at most c records)
        from the study's budget; no noise, no decryption."""
        self._computation_only(context, "ask for a charge signature")
        study_id = check_id("study_id", request.study_id)
        signature = self.service.sign_charge(study_id, request.entry, request.charge_log)
        return decryption_pb2.SignChargeResponse(holder=self.service.index, signature=signature)

    def _close_uploads(self, study_id: str, contract_hash: str, commitments: list[Commitment]) -> tuple[list[bytes], int]:
        return self.service.close_uploads(study_id, contract_hash, commitments), self.service.index

    def IssueShares(self, request_iterator: Iterator[decryption_pb2.DecryptMeasurementRequest],
                    context: grpc.ServicerContext) -> Iterator[decryption_pb2.IssueSharesResponse]:
        self._computation_only(context, "ask for decryption shares")
        handler = self.handler
        header, measurement = read_measurement_header(request_iterator, "IssueShares")
        contract = handler.get_study(header.study_id)
        check_id("release_id", header.release_id)
        self.service.check_contract(contract)
        self._check_receipt(header.study_id, header.newest_receipt)
        try:  # the header against the contract before any chunk is read
            handler.check_measurement(contract, measurement, int(header.chunk_count),
                                      contract_hash=header.contract_hash, release_id=header.release_id,
                                      release_epsilon=float(header.release_epsilon))
        except BudgetExhaustedError:
            pass  # unless it repeats an answered request (its stored shares): `issue_shares` decides
        for _ in request_iterator:  # a holder computes on the owners' signed c1 only: it takes no ciphertext
            raise InvalidInputError("IssueShares carries the header only: a key-share holder computes its shares on "
                                    "the owners' signed c1 parts (forwarded with ForwardUploads), never on a "
                                    "ciphertext the computation server sends; nothing was charged or decrypted")
        result, charge = self.service.issue_shares(
            study_id=header.study_id, release_id=header.release_id, release_epsilon=float(header.release_epsilon),
            measurement=measurement, contract_hash=header.contract_hash, chunk_count=int(header.chunk_count),
            charge_log=header.charge_log, participants=[int(p) for p in header.participants])
        for share in result.shares:
            yield decryption_pb2.IssueSharesResponse(share=share)
        remaining = handler.budget(header.study_id).remaining
        yield decryption_pb2.IssueSharesResponse(done=decryption_pb2.IssueSharesDone(
            charge_id=charge.charge_id if charge else 0, epsilon_remaining=remaining, receipt=self._receipt(charge),
            repeated=result.repeated))

    def ForwardUploads(self, request_iterator: Iterator[decryption_pb2.ForwardUploadsRequest],
                       context: grpc.ServicerContext) -> decryption_pb2.ForwardUploadsResponse:
        """gRPC: the owners' signed c1 parts of a study, or a join study's whole planes under the owners' upload
        signatures (`plane`), each written to a file as it arrives (`join_release.HolderJoins.receive`)."""
        self._computation_only(context, "forward the owners' uploads")
        first = next(request_iterator, None)
        if first is None:
            raise InvalidInputError("ForwardUploads needs at least one part")
        stream = itertools.chain([first], request_iterator)
        if first.plane:
            study_id = check_id("study_id", first.study_id)
            return decryption_pb2.ForwardUploadsResponse(
                chunks=self.service.joins.receive(study_id, first.contract_hash, stream))
        return super().ForwardUploads(stream, context)

    def _accept_uploads(self, study_id: str, contract_hash: str, uploads: list[OwnerC1Parts]) -> int:
        return self.service.accept_uploads(study_id, contract_hash, uploads)

    def JoinCheck(self, request: decryption_pb2.JoinCheckRequest,
                  context: grpc.ServicerContext) -> decryption_pb2.JoinCheckResponse:
        """One step of a join study's check at the holders (`join_release.HolderJoins.check`); spends nothing."""
        self._computation_only(context, "run a join check")
        message = self.service.joins.check(request.study_id, request.contract_hash, request.step,
                                           {int(k): bytes(v) for k, v in request.messages.items()},
                                           [int(p) for p in request.participants])
        return decryption_pb2.JoinCheckResponse(message=message)

    def JoinShares(self, request: decryption_pb2.JoinSharesRequest,
                   context: grpc.ServicerContext) -> Iterator[decryption_pb2.IssueSharesResponse]:
        """This holder's shares of one join measurement's values (`join_release.HolderJoins.shares`).

        Privacy: charges the measurement's epsilon to this holder's ledger before any share leaves (sensitivity
        `measurement.sensitivity`, add/remove of one shared customer); each share carries this holder's DP
        share, known only to it, its smudging and pads."""
        self._computation_only(context, "ask for join value shares")
        header = request.header
        measurement = measurement_from_proto(header.measurement) if header.HasField("measurement") else None
        shares, charge, remaining = self.service.joins.shares(
            study_id=header.study_id, release_id=header.release_id, release_epsilon=float(header.release_epsilon),
            contract_hash=header.contract_hash, measurement=measurement, count=int(header.cell_count),
            participants=[int(p) for p in request.participants], charge_log=request.charge_log)
        for share in shares:
            yield decryption_pb2.IssueSharesResponse(share=share)
        yield decryption_pb2.IssueSharesResponse(done=decryption_pb2.IssueSharesDone(
            charge_id=charge.charge_id, epsilon_remaining=remaining, receipt=self._receipt(charge)))


def create_keyshare_server(config: DecryptionConfig, name: str, holders: tuple[str, ...]) -> ServerHandle:
    """A key-share holder on `config.data_dir` (its key share, noise key, ledger and receipt key), not started.

    Restarting on the same directory finds the active collective key, every study and charge.
    `config.decrypt_workers`: the local processes computing a large measurement's shares, as the decryption
    server's (default min(cores, 8); 0 or 1: in the server process); they start at the first such measurement
    (`serve_keyshare` starts them with the server) and end with it.
    """
    unlock = lock_data_dir(config.data_dir, f"key-share holder {name}")
    try:
        noise_key = load_or_create_noise_key(config.data_dir / "keys", seed=config.noise_seed)
        workers = default_decrypt_workers() if config.decrypt_workers is None else config.decrypt_workers
        service = KeyShareService(name, holders, config.data_dir, noise_key, require_signed=config.tls is not None,
                                  operator_keys=config.operator_keys, decrypt_workers=workers)
    except BaseException:
        unlock()
        raise
    policy = AccessPolicy(config.tls is not None, server=f"key-share holder {name} ({config.data_dir})")
    servicer = KeyShareServicer(service, policy, config.computation_ids, service.signer)
    try:
        server, port = create_server(
            [(decryption_pb2_grpc.add_DecryptionServicer_to_server, servicer, SERVICE_NAME)],
            host=config.host, port=config.port, max_workers=config.max_workers,
            credentials=config.tls.server_credentials() if config.tls is not None else None,
            options=server_options(DECRYPTION_MAX_RECEIVE))
    except BaseException:
        service.close()
        unlock()
        raise
    return ServerHandle(server, port, config.host, service, [service.close, unlock])


def serve_keyshare(config: DecryptionConfig, name: str, holders: tuple[str, ...], *,
                   port_file: str | None = None) -> None:
    """Run a key-share holder until SIGINT/SIGTERM."""
    handle = create_keyshare_server(config, name, holders)
    service: KeyShareService = handle.handler
    service.pool.start()  # the workers start now, not while the first large measurement waits
    log.info("key-share holder %s (%d of %d: %s) listening on %s; data dir %s; %s%s", name,
             service.index + 1, len(holders), ",".join(holders), handle.target, config.data_dir,
             "deployed, a key per study" if service.deployed else "not deployed yet (dpagg setup-key)",
             f"; legacy collective key {service.active.fingerprint}" if service.active else "")
    handle.serve(port_file=port_file)
