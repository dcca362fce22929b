"""The study contract: the immutable terms of one study, its canonical JSON form and its SHA-256 hash."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import MAX_DECODED_MAGNITUDE
from he_partition.core.noise_shares import MAX_HOLDERS
from he_partition.join.protocol import JOIN_STRATEGY, JoinTerms
from he_partition.protocol import EPSILON_TOLERANCE, STRATEGIES, make_strategy

from .contract_checks import (MAX_CORRELATION_SOURCE, _canonical_owner_keys, _shown, _check_leakage, _check_seal_keys,
                              _check_source, _owner_key_pairs, _whole)
from .jcs import canonicalize

__all__ = [
    "CONTRACT_VERSION",
    "CONTRACT_VERSION_V1",
    "ID_PATTERN",
    "MAX_CORRELATION_SOURCE",
    "MAX_DOMAIN_SIZE",
    "StudyContract",
    "canonical_json",
    "check_id",
    "contract_hash",
]

#: The canonical encoding new contracts use: RFC 8785 (JCS) JSON of `to_dict`, hashed with SHA-256.
CONTRACT_VERSION = "dpagg.contract.v2"
#: Contracts written before v2 (kept in existing ledgers) hash Python's JSON (`canonical_json`); still read.
CONTRACT_VERSION_V1 = "dpagg.contract.v1"
CONTRACT_VERSIONS = (CONTRACT_VERSION, CONTRACT_VERSION_V1)

#: Ids end up in file names on the servers, so they are restricted to a safe alphabet.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: 2^24 bins = 4,096 ciphertexts per owner at 4,096 slots; larger domains need a
#: different deployment (and a different upload size budget).
MAX_DOMAIN_SIZE = 1 << 24

#: Most key-share holders a share can be drawn for: `noise_tolerates` is below it.
MAX_KEY_HOLDERS = MAX_HOLDERS


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def check_id(name: str, value: object) -> str:
    """Return `value` if it is a valid identifier, else raise InvalidInputError naming `name`."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise InvalidInputError(
            f"{name} must be 1-64 characters of ASCII letters, digits, '.', '_' or '-' (starting with a letter "
            f"or digit), got {_shown(value)}"
        )
    return value


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, ASCII only, no NaN/Infinity.

    Floats use Python's shortest round-trip repr (e.g. 0.1 -> "0.1"), so another
    language must format doubles the same way to recompute a hash; every dpagg server
    returns the hash alongside the contract.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _canonical_params(params: Mapping[str, Any] | str | None) -> str:
    if params is None or params == "":
        return "{}"
    if isinstance(params, str):
        try:
            parsed = json.loads(params)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"strategy_params must be a JSON object, got {params[:80]!r}: {exc}") from exc
    else:
        parsed = dict(params)
    if not isinstance(parsed, dict):
        raise InvalidInputError(f"strategy_params must be a JSON object, got {type(parsed).__name__}")
    try:
        return canonical_json(parsed)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"strategy_params must hold finite JSON values: {exc}") from exc


def join_terms_of(strategy_params: str, domain_size: int) -> JoinTerms:
    """A join study's terms from its strategy_params JSON, checked as the contract checks them (InvalidInputError)."""
    return JoinTerms.from_params(json.loads(_canonical_params(strategy_params)), domain_size=domain_size)


#: The largest study epsilon accepted: a Laplace guarantee at 1e3 already says nothing.
MAX_STUDY_EPSILON = 1000.0


@dataclass(frozen=True)
class StudyContract:
    """What every party agrees on before any data moves; validated at construction.

    `epsilon` is the study's total budget under add/remove of one person who contributes
    at most `contribution_bound` records over all owners; the decryption server's ledger
    never lets the releases of the study spend more. `context_fingerprint` binds the study
    to the decryption server's public key. `owner_keys` pairs every expected owner with
    its Ed25519 public key (64 hex digits), or is empty for an unsigned study (only
    servers run without TLS accept those). The hash covers every field, so two parties
    holding the same hash hold the same terms, including whose signatures count.

    Correlated records (seed 003, Yang-Sato-Nakagawa, Bayesian DP): `correlation_leakage`
    is the maximum leakage coefficient L = max_A l_A >= 0 of a Gaussian correlation model
    of the records (`he_partition.methods.bayesian.CorrelationModel.max_leakage`), and
    `correlation_source` says where it came from (e.g. "w_sha256=... tau=0.5 n=120";
    `he_partition.methods.bayesian.correlation_terms` builds both). With L > 0:

    * `epsilon` is a Bayesian-DP budget (seed 003, Def. 4.1) under that model: the
      neighbouring relation becomes "one person's records are added or removed (their
      contribution moves by at most the measurement's add/remove sensitivity M) while
      the records correlated with them follow the model, given whatever the adversary
      knows about the others".
    * Each measurement is calibrated at DP epsilon e / (1 + L) (noise scale (1 + L) M / e,
      exactly lambda >= (1 + L) M / eps of Sec. 5.4) and charged e = (1 + L) times its DP
      epsilon in the ledger, because BDPL <= (1 + L) M / lambda (Theorems 5.1, 5.2).
      `noise_multiplier` is 1 + L; `validate_strategy` builds the strategy at
      epsilon / (1 + L).
    * Assumed: the Gaussian correlation model (and so L) is correct and public; the
      guarantee is no better than the model. With L = 0 (the default) `epsilon` is plain
      DP under add/remove and nothing changes.

    Threshold decryption (K key-share holders): `noise_tolerates` T (0 <= T <= K - 1) is
    how many holders may collude with the computation server while the holders' noise
    still protects every value with one full discrete Laplace draw. Each holder draws its
    share with NB(1/(K - T)) (`discrete_laplace_share(scale, K - T, ...)`), so any K - T
    holders' shares sum to at least one full draw; the cost is that all K shares sum to
    K/(K - T) draws' worth of variance (`holder_noise_variance`). The threshold computation
    server fills K - 1 when the operator gives none; a holder refuses T >= K and the single
    decryption server (K = 1) any T > 0. T = 0 (the field's default, the single server's
    only value) leaves the canonical form and hash unchanged.

    `seal_threshold` t (sealed studies, `parties.common.sealing`): 0 splits each owner's upload
    key by XOR across all N key holders (every holder must be up to close the uploads); t with
    N/2 < t < N splits it t-of-N (Shamir, `parties.common.key_split`), so any t holders close
    them. Each key-share holder of a t-of-N deployment fills in its t at open-study (the CS
    relays it, never authors it; the approval does not cover it, as it does not cover the seal
    keys) and refuses any value but its t or 0 (XOR, the stricter split of studies opened before);
    0 leaves the canonical form and hash unchanged.
    """

    study_id: str
    domain_size: int
    epsilon: float
    expected_owners: tuple[str, ...]
    context_fingerprint: str
    strategy: str = "auto"
    contribution_bound: int = 1
    noise_parties: int = 2
    strategy_params_json: str = "{}"
    domain_spec: str = ""
    owner_keys: tuple[tuple[str, str], ...] = ()
    correlation_leakage: float = 0.0
    correlation_source: str = ""
    max_organizations: int = 1
    holder_seal_keys: tuple[str, ...] = ()
    noise_tolerates: int = 0
    seal_threshold: int = 0
    version: str = CONTRACT_VERSION

    def __post_init__(self) -> None:
        check_id("study_id", self.study_id)
        if isinstance(self.domain_size, bool) or not isinstance(self.domain_size, int):
            raise InvalidInputError(f"domain_size must be an integer, got {self.domain_size!r}")
        if not 1 <= self.domain_size <= MAX_DOMAIN_SIZE:
            raise InvalidInputError(f"domain_size must be in [1, {MAX_DOMAIN_SIZE}], got {self.domain_size}")
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)):
            raise InvalidInputError(f"epsilon must be a number, got {self.epsilon!r}")
        if not (math.isfinite(self.epsilon) and 0 < self.epsilon <= MAX_STUDY_EPSILON):
            raise InvalidInputError(
                f"epsilon must be > 0 and at most {MAX_STUDY_EPSILON:g} (beyond that DP promises nothing; see "
                f"`dpagg epsilon`), got {self.epsilon}"
            )
        if self.domain_spec:
            from ..data_owner.domain import DomainSpec

            try:
                bins = DomainSpec.count_bins(self.domain_spec, max_bins=MAX_DOMAIN_SIZE)
            except (InvalidInputError, ValueError) as exc:
                raise InvalidInputError(f"domain_spec {self.domain_spec!r} does not parse: {exc}") from exc
            if bins != self.domain_size:
                raise InvalidInputError(
                    f"domain_spec {self.domain_spec!r} has {bins} bins but domain_size is {self.domain_size}; "
                    "give the same domain twice or leave domain_spec empty"
                )
        object.__setattr__(self, "epsilon", float(self.epsilon))
        owners = tuple(self.expected_owners)
        if not owners:
            raise InvalidInputError("expected_owners must name at least one data owner")
        for o in owners:
            check_id("owner id", o)
        if len(set(owners)) != len(owners):
            dup = sorted({o for o in owners if owners.count(o) > 1})
            raise InvalidInputError(f"expected_owners has duplicates: {', '.join(dup)}")
        object.__setattr__(self, "expected_owners", tuple(sorted(owners)))
        if not isinstance(self.context_fingerprint, str) or not _HEX64.match(self.context_fingerprint):
            raise InvalidInputError(
                f"context_fingerprint must be 64 lowercase hex digits (a SHA-256), got {self.context_fingerprint!r}"
            )
        if self.strategy not in (*STRATEGIES, JOIN_STRATEGY):
            raise InvalidInputError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)} "
                                    f"(or {JOIN_STRATEGY} for a two-owner join study)")
        if isinstance(self.contribution_bound, bool) or not isinstance(self.contribution_bound, int) \
                or self.contribution_bound < 1:
            raise InvalidInputError(f"contribution_bound must be an integer >= 1, got {self.contribution_bound!r}")
        if isinstance(self.max_organizations, bool) or not isinstance(self.max_organizations, int) \
                or self.max_organizations < 1:
            raise InvalidInputError(f"max_organizations must be an integer >= 1, got {self.max_organizations!r}")
        if self.noise_parties == 1:
            raise InvalidInputError(
                "noise_parties must be 2 in a study: every release passes back through the computation server, "
                "which knows its own draw, so with one noise party it would hold the exact measurement. "
                "(release(..., noise_parties=1) in one process remains as a trusted-curator baseline.)"
            )
        if self.noise_parties != 2 or isinstance(self.noise_parties, bool):
            raise InvalidInputError(f"noise_parties must be 2, got {self.noise_parties!r}")
        if isinstance(self.noise_tolerates, bool) or not isinstance(self.noise_tolerates, int) \
                or not 0 <= self.noise_tolerates < MAX_KEY_HOLDERS:
            raise InvalidInputError(f"noise_tolerates must be an integer in [0, {MAX_KEY_HOLDERS - 1}] (the key "
                                    f"holders that may collude with the computation server), got "
                                    f"{_shown(self.noise_tolerates)}")
        object.__setattr__(self, "strategy_params_json", _canonical_params(self.strategy_params_json))
        object.__setattr__(self, "correlation_leakage", _check_leakage(self.correlation_leakage))
        object.__setattr__(self, "correlation_source", _check_source(self.correlation_source))
        self.validate_strategy()
        if not isinstance(self.domain_spec, str) or len(self.domain_spec) > 4096 or \
                any(ord(ch) < 32 for ch in self.domain_spec):
            raise InvalidInputError("domain_spec must be printable text of at most 4096 characters")
        object.__setattr__(self, "owner_keys", _canonical_owner_keys(self.owner_keys, owners))
        object.__setattr__(self, "holder_seal_keys", _check_seal_keys(self.holder_seal_keys, self.signed))
        if isinstance(self.seal_threshold, bool) or not isinstance(self.seal_threshold, int):
            raise InvalidInputError(f"seal_threshold must be an integer, got {_shown(self.seal_threshold)}")
        if self.seal_threshold:
            from .key_split import check_split_threshold

            if not self.holder_seal_keys:
                raise InvalidInputError("seal_threshold needs holder_seal_keys: it says how many of the key holders "
                                        "the owners' upload keys are split to")
            try:
                check_split_threshold(self.seal_threshold, len(self.holder_seal_keys))
            except InvalidInputError as exc:
                raise InvalidInputError(f"seal_threshold: {exc}") from None
        if self.version not in CONTRACT_VERSIONS:
            raise InvalidInputError(f"unsupported contract version {self.version!r}; this build reads "
                                    f"{' and '.join(CONTRACT_VERSIONS)}")

    @classmethod
    def create(
        cls,
        *,
        study_id: str,
        domain_size: int,
        epsilon: float,
        expected_owners: Iterable[str],
        context_fingerprint: str,
        strategy: str = "auto",
        contribution_bound: int = 1,
        noise_parties: int = 2,
        strategy_params: Mapping[str, Any] | str | None = None,
        domain_spec: str = "",
        owner_keys: Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]] | None = None,
        correlation_leakage: float = 0.0,
        correlation_source: str = "",
        max_organizations: int = 1,
        holder_seal_keys: Iterable[str] = (),
        noise_tolerates: int = 0,
        seal_threshold: int = 0,
    ) -> "StudyContract":
        """Build a contract from loosely typed inputs (e.g. a request), validating everything."""
        return cls(
            study_id=study_id,
            domain_size=int(domain_size),
            epsilon=float(epsilon),
            expected_owners=tuple(expected_owners),
            context_fingerprint=context_fingerprint,
            strategy=strategy or "auto",
            contribution_bound=int(contribution_bound),
            max_organizations=int(max_organizations or 1),
            noise_parties=int(noise_parties),
            strategy_params_json=_canonical_params(strategy_params),
            domain_spec=domain_spec or "",
            owner_keys=_owner_key_pairs(owner_keys),
            correlation_leakage=correlation_leakage,
            correlation_source=correlation_source or "",
            holder_seal_keys=tuple(holder_seal_keys or ()),
            noise_tolerates=_whole("noise_tolerates", noise_tolerates),
            seal_threshold=_whole("seal_threshold", seal_threshold),
        )

    @property
    def sealed(self) -> bool:
        """True when owners seal their uploads to the key holders and commit before anyone reads one
        (`parties.common.sealing`): the contract pins each key holder's X25519 seal key, in holder order."""
        return bool(self.holder_seal_keys)

    @property
    def seals_uploads(self) -> bool:
        """True when the owners' uploads travel sealed (`sealed`), except a join study's: a join at key-share
        holders pins their seal keys for its shared OPRF key's form, and its planes are signed uploads that every
        holder verifies itself (parties.decryption.keyshare.join_planes)."""
        return self.sealed and not self.is_join

    @property
    def signed(self) -> bool:
        """True when every owner's public key is part of the contract (submissions must be signed)."""
        return bool(self.owner_keys)

    @property
    def person_bound(self) -> int:
        """Records one person may add to the combined data: contribution_bound x max_organizations.

        Every sensitivity is a multiple of it: contribution bounding happens at each owner,
        so a person present at k owners contributes up to k x c records.
        """
        return self.contribution_bound * self.max_organizations

    @property
    def max_records_per_owner(self) -> int:
        """The most records (sum of counts) one owner may submit: 2^44 / (2 x expected owners).

        Decoded values are sums and differences of the owners' prefix sums plus noise, and a
        decoded value above 2^44 (MAX_DECODED_MAGNITUDE) is refused as corrupt while one
        past the plaintext modulus wraps silently. With every owner within this bound the
        grand total stays below 2^43, leaving half the decode range for the noise. Data
        owners check it before encrypting (`DataOwnerClient.encrypt`).
        """
        return MAX_DECODED_MAGNITUDE // (2 * max(1, len(self.expected_owners)))

    def owner_public_key(self, owner_id: str) -> bytes | None:
        """The raw 32-byte Ed25519 key of `owner_id` (None for an unsigned study or an unknown owner)."""
        for o, k in self.owner_keys:
            if o == owner_id:
                return bytes.fromhex(k)
        return None

    @property
    def strategy_params(self) -> dict[str, Any]:
        params: dict[str, Any] = json.loads(self.strategy_params_json)
        return params

    @property
    def correlated(self) -> bool:
        """True when the study's epsilon is a Bayesian-DP budget for correlated records (L > 0)."""
        return self.correlation_leakage > 0

    @property
    def noise_multiplier(self) -> float:
        """1 + L: every measurement's noise scale, and its ledger charge per DP epsilon, are multiplied by it."""
        return 1.0 + self.correlation_leakage

    def check_key_holders(self, holders: int) -> None:
        """Refuse (InvalidInputError) a contract whose `noise_tolerates` T this deployment of K = `holders`
        key holders cannot honour: T must be below K (the single decryption server, K = 1, needs T = 0)."""
        if self.noise_tolerates >= holders:
            raise InvalidInputError(
                f"noise_tolerates is {self.noise_tolerates} but there are K = {holders} key holder(s): it must be at "
                f"most K - 1 = {holders - 1} (at least one holder outside any coalition must draw a full share"
                + ("; the single decryption server adds its whole draw itself, so only 0 is possible)"
                   if holders == 1 else ")"))

    def holder_noise_variance(self, holders: int) -> float:
        """Variance of the K = `holders` key holders' summed noise, in units of one discrete Laplace draw's:
        K / (K - T) (1 for the single decryption server and for T = 0). Adds no noise."""
        self.check_key_holders(holders)
        return holders / (holders - self.noise_tolerates)

    def dp_epsilon(self, epsilon: float) -> float:
        """The DP epsilon a release of `epsilon` (study units: Bayesian DP when L > 0) is noised at: eps / (1 + L)."""
        return float(epsilon) / self.noise_multiplier

    def validate_strategy(self) -> None:
        """Check that the strategy exists and accepts `strategy_params` (InvalidInputError otherwise).

        The strategy is built at `dp_epsilon(epsilon)`, the epsilon its measurements are
        calibrated at (epsilon itself unless the study has correlated records).
        """
        if self.is_join:
            self.join_terms()
            if len(self.expected_owners) != 2 or self.contribution_bound != 1 or self.max_organizations != 1:
                raise InvalidInputError("a join study has exactly two owners (rows, then columns), contribution "
                                        "bound 1 (one record per identifier) and max_organizations 1")
            if self.correlation_leakage or self.correlation_source:
                raise InvalidInputError("a join study cannot declare correlated records")
            return
        make_strategy(self.strategy, self.domain_size, self.dp_epsilon(self.epsilon), noise_parties=self.noise_parties,
                      contribution_bound=self.person_bound, params=self.strategy_params or None)

    @property
    def is_join(self) -> bool:
        """A cross-organization join study (he_partition.join.protocol): two owners, a joint table."""
        return self.strategy == JOIN_STRATEGY

    def join_terms(self) -> JoinTerms:
        """The join's terms from strategy_params (InvalidInputError if this is no join study or they are bad)."""
        if not self.is_join:
            raise InvalidInputError(f"study {self.study_id} is not a join study (strategy {self.strategy})")
        return JoinTerms.from_params(self.strategy_params, domain_size=self.domain_size)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON types (the input of the hash).

        "owner_keys" appears only for a signed study, and "correlation_leakage" /
        "correlation_source" only for a study that sets either, so the canonical form (and
        hash) of every other contract is unchanged from before those fields existed; likewise
        "max_organizations" only when > 1, "noise_tolerates" and "seal_threshold" only when > 0.
        """
        d = {
            "version": self.version,
            "study_id": self.study_id,
            "domain_size": self.domain_size,
            "epsilon": self.epsilon,
            "strategy": self.strategy,
            "contribution_bound": self.contribution_bound,
            "noise_parties": self.noise_parties,
            "expected_owners": list(self.expected_owners),
            "context_fingerprint": self.context_fingerprint,
            "strategy_params": self.strategy_params,
            "domain_spec": self.domain_spec,
        }
        if self.owner_keys:
            d["owner_keys"] = dict(self.owner_keys)
        if self.correlation_leakage or self.correlation_source:
            d["correlation_leakage"] = self.correlation_leakage
            d["correlation_source"] = self.correlation_source
        if self.max_organizations != 1:
            d["max_organizations"] = self.max_organizations
        if self.holder_seal_keys:
            d["holder_seal_keys"] = list(self.holder_seal_keys)
        if self.noise_tolerates:
            d["noise_tolerates"] = self.noise_tolerates
        if self.seal_threshold:
            d["seal_threshold"] = self.seal_threshold
        return d

    def canonical_json(self) -> str:
        """The text the contract hash is taken over: RFC 8785 (JCS) JSON of `to_dict` for v2, Python's
        deterministic JSON (`canonical_json`) for contracts written as v1."""
        if self.version == CONTRACT_VERSION_V1:
            return canonical_json(self.to_dict())
        return canonicalize(self.to_dict())

    @property
    def contract_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of every field."""
        return contract_hash(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StudyContract":
        try:
            return cls(
                version=str(d.get("version", CONTRACT_VERSION_V1)),
                study_id=d["study_id"],
                domain_size=int(d["domain_size"]),
                epsilon=float(d["epsilon"]),
                strategy=str(d["strategy"]),
                contribution_bound=int(d["contribution_bound"]),
                max_organizations=int(d.get("max_organizations", 1)),
                noise_parties=int(d["noise_parties"]),
                expected_owners=tuple(d["expected_owners"]),
                context_fingerprint=str(d["context_fingerprint"]),
                strategy_params_json=_canonical_params(d.get("strategy_params")),
                domain_spec=str(d.get("domain_spec", "")),
                owner_keys=_owner_key_pairs(d.get("owner_keys")),
                correlation_leakage=d.get("correlation_leakage", 0.0),
                correlation_source=d.get("correlation_source", ""),
                holder_seal_keys=tuple(d.get("holder_seal_keys", ())),
                noise_tolerates=_whole("noise_tolerates", d.get("noise_tolerates", 0)),
                seal_threshold=_whole("seal_threshold", d.get("seal_threshold", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidInputError):
                raise
            raise InvalidInputError(f"malformed study contract: {exc!r}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> "StudyContract":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"study contract is not valid JSON: {exc}") from exc
        if not isinstance(d, dict):
            raise InvalidInputError("study contract JSON must be an object")
        return cls.from_dict(d)


def contract_hash(contract: StudyContract) -> str:
    """SHA-256 (hex, lowercase) of `contract.canonical_json()` encoded as UTF-8 (proto/test-vectors.json)."""
    return hashlib.sha256(contract.canonical_json().encode("utf-8")).hexdigest()


def scaled_charge(epsilon: float, multiplier: float, release_epsilon: float) -> float:
    """epsilon x multiplier (1 + L), a product within EPSILON_TOLERANCE above `release_epsilon` counted as it."""
    charge = float(epsilon) * multiplier
    # (e / (1 + L)) * (1 + L) can exceed e by an ulp, and the ledger refuses a charge above
    # its release's epsilon without slack: within EPSILON_TOLERANCE (the slack the ledger
    # allows every sum) it is the release's epsilon.
    if multiplier != 1.0 and release_epsilon < charge <= release_epsilon * (1 + EPSILON_TOLERANCE):
        return release_epsilon
    return charge


def charged_epsilon(contract: "StudyContract", m: Any, release_epsilon: float = math.inf) -> float:
    """What the ledger charges for a strategy measurement `m`: its DP epsilon times the noise multiplier 1 + L.

    For a plain study (L = 0) that is `m.epsilon` (DP under add/remove of one person). For
    a study with correlated records, `m` is noised at scale sensitivity / m.epsilon, so by
    seed 003 (Theorems 5.1, 5.2) its Bayesian-DP leakage is at most (1 + L) * m.epsilon:
    that is what it costs in the study's (Bayesian-DP) budget (a product within
    EPSILON_TOLERANCE above `release_epsilon` counts as `release_epsilon`).
    """
    return scaled_charge(m.epsilon, contract.noise_multiplier, release_epsilon)
