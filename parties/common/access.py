"""Who may call which RPC: the role checks every servicer runs first, before it reads or stores anything.

Identities come from the caller's CA-verified TLS client certificate (`tls.peer_identity`).
A server started with mutual TLS enforces the checks; a server started explicitly
insecure (`--insecure`, local tests) has no identities to check, skips them and says so
once in its log. The rules, per service (see docs/threat-model.md):

- Decryption: GetPublicContext, GetStudy: any party. OpenStudy, DecryptMeasurement: only
  the computation server (role ``computation``; with ``--computation-id`` only those ids).
  BudgetStatus: computation, operator, analyst. ReconcileCharges (key-share holders): operator.
  EvaluatePseudonyms (a join's oblivious pseudonyms): a data owner, for its own id only, and only if
  the study lists it.
- Computation: OpenStudy, RunRelease: operator. SubmitHistogram: a data owner, for its own
  id only, and only if the study lists it. UploadStatus: that owner, or an operator.
  StudyStatus: any party. ReleaseStatus: operator, computation, analyst. LedgerReceipts: operator,
  analyst.
- Analyst: analyst, operator.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import grpc

from .tls import ROLES, AccessDeniedError, PeerIdentity, authorize, peer_identity

__all__ = ["AccessPolicy", "ANY_ROLE", "AccessDeniedError"]

log = logging.getLogger("dpagg.access")

#: Every role: "any verified party of this deployment".
ANY_ROLE: tuple[str, ...] = ROLES


class AccessPolicy:
    """Role checks of one server. `enabled` is False only for an explicitly insecure server.

    `require` returns the caller's verified identity, or raises AccessDeniedError
    (UNAUTHENTICATED without a verified identity, PERMISSION_DENIED for a role or id that
    may not do `action`); the error-mapping interceptor turns it into the status code.
    With checks disabled it returns None and lets the call through.
    """

    def __init__(self, enabled: bool = True, *, server: str = "server") -> None:
        self.enabled = enabled
        self.server = server
        if not enabled:
            log.warning(
                "%s runs WITHOUT mutual TLS (--insecure): traffic is plaintext and every caller may call every "
                "method (no party identities, no role checks, unsigned studies accepted). Use this only on a "
                "trusted machine for tests; deploy with certificates from `dpagg certs`", server)

    @classmethod
    def disabled(cls, server: str = "server") -> "AccessPolicy":
        return cls(False, server=server)

    def require(self, context: Any, roles: Iterable[str], ids: Iterable[str] | None = None, *,
                action: str) -> PeerIdentity | None:
        """The caller's identity if it may do `action`; AccessDeniedError otherwise (None when disabled)."""
        if not self.enabled:
            return None
        return authorize(peer_identity(context), roles, ids, action=action)

    def same_party(self, identity: PeerIdentity | None, party_id: str, *, what: str) -> None:
        """Refuse (PERMISSION_DENIED) a request that names another party than the caller's certificate."""
        if identity is None or identity.party_id == party_id:
            return
        raise AccessDeniedError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"party {identity.party_id!r} may not act as {party_id!r}: the {what} must be the id in your "
            f"certificate ({identity.party_id!r})",
        )
