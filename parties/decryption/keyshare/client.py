"""Client of one key-share holder: the decryption client plus the key setup and share RPCs."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import grpc

from parties.wire.v1 import decryption_pb2
from he_partition.core.measurements import Measurement

from ...common.config import RELEASE_TIMEOUT
from ...common.convert import measurement_to_proto
from ...common.paging import measurement_requests
from ...common.errors import ServiceError
from ..client import DecryptionClient

__all__ = ["HolderShares", "KeyShareClient", "SetupReply"]

log = logging.getLogger("dpagg.decryption.keyshare_client")


@dataclass(frozen=True)
class SetupReply:
    """A holder's answer to one setup step."""

    message: bytes
    fingerprint: str
    state: str
    holder: int
    seal_public_key: str = ""
    signing_public_key: str = ""
    threshold: int = 0


@dataclass(frozen=True)
class HolderShares:
    """One holder's shares of one measurement's chunks, what it charged and what it has left."""

    shares: tuple[bytes, ...]
    charge_id: int
    epsilon_remaining: float
    repeated: bool


class KeyShareClient(DecryptionClient):
    """Client of a key-share holder (`dpagg serve-decryption --key-share NAME`); `name` is the holder's name."""

    def __init__(self, name: str, target: str, **kwargs: object) -> None:
        super().__init__(target, **kwargs)  # type: ignore[arg-type]
        self.name = name
        self.server_label = f"key-share holder {name}"

    def key_setup(self, step: str, session: bytes, holders: Sequence[str], messages: Mapping[int, bytes] | None = None,
                  *, ciphertext: bytes = b"", values: Sequence[int] = (), threshold: int = 0,
                  participants: Sequence[int] = (), join_version: int = 0, timeout: float | None = None,
                  retry: bool | None = None) -> SetupReply:
        """One step of the collective key setup at this holder (not retried: every step moves its state)."""
        req = decryption_pb2.KeySetupRequest(step=step, session=session, holders=list(holders),
                                             messages=dict(messages or {}), ciphertext=ciphertext,
                                             values=[int(v) for v in values], threshold=int(threshold),
                                             participants=[int(p) for p in participants],
                                             join_version=int(join_version))
        resp = self._unary(self._stub.KeySetup, req, method="Decryption/KeySetup", timeout=timeout or 120.0,
                           retry=step == "status" if retry is None else retry)
        return SetupReply(bytes(resp.message), resp.fingerprint, resp.state, int(resp.holder), resp.seal_public_key,
                          resp.signing_public_key, int(resp.threshold))

    def sign_charge(self, study_id: str, entry: str, charge_log: str, *, timeout: float | None = None) -> bytes:
        """This holder's signature on a t-of-N charge entry appended to the study's whole `charge_log` (JSON)."""
        req = decryption_pb2.SignChargeRequest(study_id=study_id, entry=entry, charge_log=charge_log)
        resp = self._unary(self._stub.SignCharge, req, method="Decryption/SignCharge", timeout=timeout or 30.0,
                           retry=True)  # a holder signs the same entry again (idempotent)
        return bytes(resp.signature)

    def issue_shares(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                     chunk_count: int, contract_hash: str, timeout: float | None = None,
                     chunks: Sequence[bytes] = (), on_share: Callable[[int, bytes], None] | None = None,
                     charge_log: str = "", participants: Sequence[int] = ()) -> HolderShares:
        """Ask for this holder's share of each of the measurement's `chunk_count` measured chunks.

        The holder computes every share on the chunk's c1 as the owners signed it: the request
        names the measurement, not its ciphertexts (`chunks` exists for tests of the refusal of
        a request that carries ciphertexts: the holder refuses it, INVALID_ARGUMENT).
        `on_share(j, share)` is called as each share arrives (the holder charged before its first
        one), so the caller can combine chunk j while the holder computes the next; after a retry
        it sees the same j again with identical bytes.

        Spends `measurement.epsilon` (times 1 + L) of this holder's ledger for the study, as
        DecryptMeasurement does at a single key holder; the holder adds its share of the DP
        noise inside its shares. An unreachable holder is retried for up to `outage_seconds`
        with the very same chunks (an identical request: a holder that answered before
        returns its stored shares, charged once).
        """
        header = decryption_pb2.DecryptMeasurementHeader(
            study_id=study_id, release_id=release_id, release_epsilon=release_epsilon, chunk_count=chunk_count,
            contract_hash=contract_hash, newest_receipt=self._shown(study_id), charge_log=charge_log,
            participants=[int(p) for p in participants])

        def requests() -> Iterator[decryption_pb2.DecryptMeasurementRequest]:
            return measurement_requests(header, measurement, chunks)

        deadline = (RELEASE_TIMEOUT if timeout is None else timeout) + 0.5 * chunk_count

        def call() -> HolderShares:
            shares: list[bytes] = []
            done = None
            try:
                for msg in self._stub.IssueShares(requests(), timeout=deadline):
                    if msg.WhichOneof("part") == "share":
                        shares.append(bytes(msg.share))
                        if on_share is not None and len(shares) <= chunk_count:
                            on_share(len(shares) - 1, shares[-1])
                    else:
                        done = msg.done
            except grpc.RpcError as err:
                raise ServiceError.from_rpc_error(err, "Decryption/IssueShares") from None
            if done is None or len(shares) != chunk_count:
                raise ServiceError(grpc.StatusCode.DATA_LOSS, f"holder {self.name} sent {len(shares)} shares for "
                                   f"{chunk_count} chunks and {'no' if done is None else 'a'} final message")
            self._keep(done.receipt)
            return HolderShares(tuple(shares), int(done.charge_id), float(done.epsilon_remaining), bool(done.repeated))

        return self.ride_out_outage(call, release_id, measurement.kind, f"key-share holder {self.name}")

    # -- a join study's release at the holders (parties.decryption.keyshare.join_release) --------------
    def join_check(self, study_id: str, contract_hash: str, step: str, messages: Mapping[int, bytes] | None,
                   participants: Sequence[int], *, timeout: float | None = None) -> bytes:
        """One step of a join study's check at this holder; its message (not retried: steps move its state)."""
        req = decryption_pb2.JoinCheckRequest(study_id=study_id, contract_hash=contract_hash, step=step,
                                              messages=dict(messages or {}),
                                              participants=[int(p) for p in participants])
        resp = self._unary(self._stub.JoinCheck, req, method="Decryption/JoinCheck",
                           timeout=timeout or RELEASE_TIMEOUT, retry=False)
        return bytes(resp.message)

    def join_shares(self, *, study_id: str, release_id: str, release_epsilon: float, contract_hash: str,
                    measurement: Measurement, participants: Sequence[int], charge_log: str = "",
                    timeout: float | None = None) -> HolderShares:
        """This holder's shares of the join measurement's values (it computes each value itself), after its charge."""
        header = decryption_pb2.DecryptJoinCellsHeader(study_id=study_id, release_id=release_id,
                                                       release_epsilon=release_epsilon, contract_hash=contract_hash,
                                                       cell_count=measurement.count,
                                                       measurement=measurement_to_proto(measurement))
        req = decryption_pb2.JoinSharesRequest(header=header, participants=[int(p) for p in participants],
                                               charge_log=charge_log)
        shares: list[bytes] = []
        done = None
        try:
            for msg in self._stub.JoinShares(req, timeout=(RELEASE_TIMEOUT if timeout is None else timeout)):
                if msg.WhichOneof("part") == "share":
                    shares.append(bytes(msg.share))
                else:
                    done = msg.done
        except grpc.RpcError as err:
            raise ServiceError.from_rpc_error(err, "Decryption/JoinShares") from None
        if done is None or len(shares) != measurement.count:
            raise ServiceError(grpc.StatusCode.DATA_LOSS, f"holder {self.name} sent {len(shares)} join shares for "
                               f"{measurement.count} values and {'no' if done is None else 'a'} final message")
        self._keep(done.receipt)
        return HolderShares(tuple(shares), int(done.charge_id), float(done.epsilon_remaining), False)
