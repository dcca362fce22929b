"""The t-of-N setup's dealing round on the wire: each sub-share sealed to its recipient and signed by its dealer.

Holder i's sub-shares f_i(x_j) (`he_partition.he.threshold.shamir.deal`) are secrets: sub-shares from
t holders' polynomials at one point would give S_j. The computation server relays them, so each
travels as (`deal_message`):

- sealed to recipient j's X25519 seal key (`parties.common.sealing.seal_to`, bound to the setup
  session, dealer and recipient): the relay and the other holders read nothing;
- signed by dealer i's Ed25519 key (its receipt key) over the session, dealer, recipient, the
  recipient's seal key and the sealed bytes: the relay cannot swap, replay from another session or
  re-address a sub-share, and the recipient checks the seal key named is its own.

The holders' identity keys (seal and signing) are those each holder reported when `dpagg setup-key`
fixed the deployment: the computation server relays them, like every setup message. Each holder
keeps the whole list (`deployment.json`; a legacy key's `collective.json`) and `dpagg setup-key`
prints its digest, so the operators can compare it out of band; a relay that swapped keys then is
seen. Every study's dealing is sealed to and checked under that recorded list.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from he_partition.core.errors import InvalidInputError
from he_partition.he.threshold.shamir import SubShare

from ...common.sealing import SealKeyPair, seal_to

__all__ = ["HolderIdentity", "deal_message", "identities_digest", "open_deal_message"]

_TAG = b"dpagg/tofn-deal/v1"


@dataclass(frozen=True)
class HolderIdentity:
    """A holder's public identity keys: X25519 seal key and Ed25519 signing key (32 bytes each)."""

    seal: bytes
    signing: bytes

    def to_bytes(self) -> bytes:
        return self.seal + self.signing

    @classmethod
    def from_bytes(cls, data: bytes, holder: int) -> "HolderIdentity":
        if len(data) != 64:
            raise InvalidInputError(f"holder {holder}'s identity keys have {len(data)} bytes, expected 64")
        return cls(bytes(data[:32]), bytes(data[32:]))


def identities_digest(identities: Mapping[int, HolderIdentity]) -> str:
    """SHA-256 (hex) of every holder's identity keys, in holder order: what operators compare."""
    h = hashlib.sha256(b"dpagg/tofn-identities/v1")
    for holder in sorted(identities):
        h.update(struct.pack(">I", holder) + identities[holder].to_bytes())
    return h.hexdigest()


def _context(session: bytes, dealer: int, recipient: int) -> bytes:
    return _TAG + struct.pack(">H", len(session)) + session + struct.pack(">II", dealer, recipient)


def _statement(session: bytes, dealer: int, recipient: int, recipient_seal: bytes, sealed: bytes) -> bytes:
    return (_context(session, dealer, recipient) + recipient_seal
            + hashlib.sha256(sealed).digest())


def deal_message(subshares: Mapping[int, SubShare], identities: Mapping[int, HolderIdentity], session: bytes,
                 dealer: int, signing_key: bytes) -> bytes:
    """The dealer's one setup message: per recipient (holder order) its index, the sealed sub-share and the
    dealer's signature. Holds no secret in the clear."""
    key = Ed25519PrivateKey.from_private_bytes(signing_key)
    out = [struct.pack(">I", len(subshares))]
    for recipient in sorted(subshares):
        ident = identities.get(recipient)
        if ident is None:
            raise InvalidInputError(f"no identity keys for holder {recipient}: cannot seal its sub-share")
        sealed = seal_to(ident.seal, subshares[recipient].to_bytes(), _context(session, dealer, recipient))
        sig = key.sign(_statement(session, dealer, recipient, ident.seal, sealed))
        out.append(struct.pack(">IQ", recipient, len(sealed)) + sealed + sig)
    return b"".join(out)


def open_deal_message(ctx: Any, message: bytes, *, session: bytes, dealer: int, recipient: int,
                      identities: Mapping[int, HolderIdentity], own_seal: SealKeyPair) -> SubShare:
    """The sub-share `dealer` sealed to `recipient` in its `message`, after checking the dealer's signature and
    that it was sealed to this holder's own seal key; InvalidInputError naming the dealer otherwise."""
    ident = identities.get(dealer)
    if ident is None:
        raise InvalidInputError(f"no identity keys for dealer {dealer}: setup stopped")
    if identities.get(recipient, HolderIdentity(b"", b"")).seal != own_seal.public:
        raise InvalidInputError(f"the setup's identity list names another seal key for holder {recipient} than its "
                                "own: setup stopped (the relay swapped keys)")
    data = bytes(message)
    try:
        (count,) = struct.unpack(">I", data[:4])
        at = 4
        for _ in range(count):
            who, size = struct.unpack(">IQ", data[at:at + 12])
            sealed, sig = data[at + 12:at + 12 + size], data[at + 12 + size:at + 12 + size + 64]
            at += 12 + size + 64
            if who == recipient:
                break
        else:
            raise InvalidInputError(f"holder {dealer}'s dealing holds no sub-share for holder {recipient}: setup "
                                    "stopped")
    except struct.error:
        raise InvalidInputError(f"holder {dealer}'s dealing message is truncated: setup stopped") from None
    try:
        Ed25519PublicKey.from_public_bytes(ident.signing).verify(
            sig, _statement(session, dealer, recipient, own_seal.public, sealed))
    except (InvalidSignature, ValueError):
        raise InvalidInputError(f"holder {dealer}'s sub-share for holder {recipient} is not signed by holder "
                                f"{dealer}'s key (altered or re-addressed on the way): setup stopped") from None
    plain = own_seal.open(sealed, _context(session, dealer, recipient), f"holder {dealer}'s sub-share")
    sub = SubShare.from_bytes(ctx, plain)
    if sub.dealer != dealer or sub.recipient != recipient:
        raise InvalidInputError(f"holder {dealer}'s sub-share names dealer {sub.dealer} and recipient "
                                f"{sub.recipient}: setup stopped")
    return sub
