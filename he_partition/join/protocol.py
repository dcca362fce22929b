"""Cross-organization join: the DP cross-tabulation of (a, b) over the customers two organizations share.

Owner A knows attribute a of its customers, owner B attribute b of its customers; the
analysts want the DP histogram of (a, b) over the customers both have. The protocol:

1. Pseudonyms (`JoinKeyPair`, `oblivious_pseudonyms`): the owners agree a join key by X25519
   (their public halves relayed by the computation server, which cannot compute the key),
   HKDF-SHA256 bound to the study, and replace each identifier by HMAC-SHA256(key, F(k, x)),
   F the oblivious PRF of `he_partition.join.oprf` under the key holder's per-study key k,
   evaluated blindly within each owner's quota (`JoinTerms.evaluation_quota`), so no owner
   computes a pseudonym alone (contracts from before: HMAC-SHA256(key, x), `pseudonyms`).
   One record per identifier per owner (the contribution bound). Both also
   derive the same `shared_dummies`: pseudonyms that match each other and encode nothing,
   their number a discrete-Laplace draw only the owners know, so the intersection size the
   computation server sees is DP (`dummy_count`).
2. Placement (`place`): each owner sends its pseudonyms only; the computation server
   matches them and maps the union into `capacity` slot positions uniformly at random
   (matched pairs share a position; an unmatched record's position is empty on the other
   side). Each owner receives the positions of all its own pseudonyms: a uniformly random
   subset of the public capacity, whatever matched (`check_placement` refuses anything else).
3. Encoding (`encode_indicators`): per group of `slots` positions, A encrypts one
   ciphertext per value of a (slot = 1 where its record there has that value) and B one
   per value of b. The server multiplies A's ciphertext for a by B's for b and sums all
   slots (`joint_totals`): the count of shared customers with (a, b) — unmatched and dummy
   positions contribute 0. Cost: groups x d_a x d_b ciphertext products.
4. Release (`he_partition.join.release`): the table, flattened into bins (row-major or along
   the Hilbert curve), goes through a DP strategy like any study's histogram: identity
   ("cells"), or gap, hier, dawa, privelet, auto. Every measured value is a +-1 sum of cell
   totals; it leaves the computation server as a ciphertext with its discrete Laplace draw
   in slot 0, pads in every other slot, and flooding (`he_partition.he.join_scheme`); the
   decryption server decrypts slot 0 and adds its own draw. A shared customer added or
   removed changes one cell by 1 (contribution bound 1).

What the computation server learns: both owners' set sizes (dummies included), and which
pseudonyms match, i.e. the intersection size plus the owners' shared dummy count (DP, at
the padding epsilon). It never sees identifiers, attributes, or the join key.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..core.errors import InvalidInputError
from ..he.join_scheme import CURRENT_JOIN_VERSION, JOIN_VERSIONS, JoinParams, JoinScheme, join_plain_modulus
from ..core.noise import RandomSource, SeededRandom, discrete_laplace, laplace_scale

__all__ = ["JOIN_STRATEGY", "JOIN_RELEASES", "DEFAULT_JOIN_RELEASE", "JOIN_ORDERS", "JOIN_PSEUDONYMS", "JoinTerms", "JoinKeyPair", "PSEUDONYM_BYTES",
           "MAX_PADDING_DELTA", "JOIN_PLAIN_MODULUS", "padding_delta", "min_padding_offset", "max_join_capacity", "capacity_for",
           "join_capacity_limit", "CURRENT_JOIN_VERSION",
           "pseudonyms", "oprf_input", "oblivious_pseudonyms", "shared_dummies", "private_dummies", "dummy_count", "posted_pseudonyms", "place",
           "check_placement", "encode_indicators", "joint_totals", "groups_for"]

PSEUDONYM_BYTES = 32
_KDF_INFO = b"dpagg/join-key/v1"
_PRIVATE_INFO = b"dpagg/join-private-dummies/v1"
#: The strategy name of a join study in its contract.
JOIN_STRATEGY = "join"
#: How a join study releases its table (he_partition.join.release): "cells" measures every cell
#: (the identity), the others run that DP strategy over the flattened table.
JOIN_RELEASES = ("cells", "gap", "hier", "dawa", "privelet", "auto")
#: What `dpagg open-join` releases with unless told otherwise (docs/join.md: accuracy by release).
DEFAULT_JOIN_RELEASE = "cells"
#: How identifiers become pseudonyms (JoinTerms.pseudonyms): oblivious PRF values, or the legacy HMAC.
JOIN_PSEUDONYMS = ("oprf", "hmac")
#: How the table is flattened into bins: row-major, or along the Hilbert curve (square 2^k tables),
#: so that a strategy's contiguous partitions are compact 2-D regions.
JOIN_ORDERS = ("row", "hilbert")
#: Largest joint table (cells); each cell costs one rotation-sum and one ciphertext to the key holder.
MAX_JOIN_CELLS = 4096
#: Join scheme version 1's plain modulus t (he_partition.he.join_scheme: the 20-bit batching prime for
#: N = 8192; `join_plain_modulus(version)` gives every version's). Counts are decoded centred, so only
#: values of absolute value at most (t - 1) / 2 come back right.
JOIN_PLAIN_MODULUS = 1_032_193
#: The largest delta a join's padding may have (`padding_delta`); terms above it are refused.
MAX_PADDING_DELTA = 1e-6
#: The padding draws three discrete Laplace counts (shared dummies D, each owner's private dummies
#: P_A, P_B), each at padding_epsilon / 3 (`dummy_count`, `private_dummies`).
_PADDING_DRAWS = 3


def max_join_capacity(plain_modulus: int = JOIN_PLAIN_MODULUS, slots: int = 8192) -> int:
    """The largest capacity whose every measured value still decodes: a multiple of `slots` at most
    (t - 1) / 2 - slots.

    A measured value is a +-1 sum of disjoint cells, so its size is at most the number of
    shared customers, at most the capacity; the margin of one group (8,192) leaves room for
    the computation server's noise draw (it would have to exceed 8,192 / scale Laplace
    scales to wrap: probability exp(-8192 eps / sensitivity), below 1e-30 for eps/sens >= 0.01).
    """
    return ((plain_modulus - 1) // 2 - slots) // slots * slots


def join_capacity_limit(version: int = CURRENT_JOIN_VERSION, slots: int = 8192) -> int:
    """The largest capacity a study of join scheme `version` may declare (`max_join_capacity` of its t)."""
    return max_join_capacity(join_plain_modulus(version), slots)


#: Largest capacity (positions) a new join study may declare: 4,128,768 for version 2's t = 8,314,881
#: (version 1, t = 1,032,193: 507,904).
MAX_JOIN_CAPACITY = join_capacity_limit()


def capacity_for(records: Sequence[int], padding_epsilon: float, padding_offset: int, slots: int = 8192,
                 version: int = CURRENT_JOIN_VERSION) -> int:
    """The capacity for two owners of at most `records` = (n_a, n_b) records: room for both and the three
    paddings (each at most 2 x offset, except with probability below the padding's delta), rounded up to
    whole groups. Refuses (before anything is booked) when that exceeds what the plain modulus decodes."""
    if len(records) != 2 or any(int(n) < 1 for n in records):
        raise InvalidInputError(f"the capacity needs both owners' largest record counts (two numbers >= 1), got "
                                f"{list(records)}")
    if padding_offset < 1:
        raise InvalidInputError(f"padding_offset must be >= 1, got {padding_offset}")
    need = int(records[0]) + int(records[1]) + _PADDING_DRAWS * 2 * padding_offset
    capacity = groups_for(need, slots) * slots
    top = join_capacity_limit(version, slots)
    if capacity > top:
        raise InvalidInputError(f"{records[0]} + {records[1]} records and the padding need a join capacity of "
                                f"{capacity}, above the {top} whose counts still decode (join scheme version "
                                f"{version}, mod t = {join_plain_modulus(version)}): split the study or bound "
                                "the records")
    return capacity


def padding_delta(epsilon: float, offset: int) -> float:
    """The delta of a join's padding: each of the three clamped draws max(0, offset + X), X discrete
    Laplace with parameter epsilon / 3, breaks the shift argument only where the clamp acts,
    P(X <= -offset) = exp(-epsilon offset / 3) / (1 + exp(-epsilon / 3)); delta is the sum over the three.
    """
    a = epsilon / _PADDING_DRAWS
    return _PADDING_DRAWS * math.exp(-a * offset) / (1.0 + math.exp(-a))


def min_padding_offset(epsilon: float, max_delta: float = MAX_PADDING_DELTA) -> int:
    """The smallest padding offset whose `padding_delta` at `epsilon` is at most `max_delta`."""
    if not epsilon > 0 or not 0 < max_delta < 1:
        raise InvalidInputError(f"padding needs epsilon > 0 and 0 < delta < 1, got {epsilon}, {max_delta}")
    a = epsilon / _PADDING_DRAWS
    offset = max(1, math.ceil(math.log(_PADDING_DRAWS / (max_delta * (1.0 + math.exp(-a)))) / a))
    while offset > 1 and padding_delta(epsilon, offset - 1) <= max_delta:
        offset -= 1
    while padding_delta(epsilon, offset) > max_delta:
        offset += 1
    return offset


@dataclass(frozen=True)
class JoinTerms:
    """A join study's terms (its contract's strategy_params): the table shape, each owner's binning, the
    public capacity of positions, and the padding that makes the intersection size DP.

    `row_spec` bins owner A's attribute (rows, the first expected owner), `col_spec` owner
    B's (columns, the second); both use the domain-spec grammar of StudyContract.domain_spec.
    """

    rows: int
    cols: int
    capacity: int
    padding_epsilon: float
    padding_offset: int
    row_spec: str = ""
    col_spec: str = ""
    identifier: str = "id"
    release: str = "cells"
    order: str = "row"
    version: int = 1
    #: How identifiers become pseudonyms: "oprf" (oblivious: a PRF whose key only the key holder has,
    #: he_partition.join.oprf; what every study opened since has) or "hmac" (an HMAC under the owners' join
    #: key: contracts that predate oblivious pseudonyms, absent the field).
    pseudonyms: str = "hmac"
    #: Each owner's largest record count (optional, `dpagg open-join --max-records`): bounds the oblivious
    #: evaluations the key holder grants it (`evaluation_quota`).
    max_records: tuple[int, int] | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, domain_size: int, slots: int = 8192) -> "JoinTerms":
        try:
            shape = params["shape"]
            terms = cls(int(shape[0]), int(shape[1]), int(params["capacity"]), float(params["padding_epsilon"]),
                        int(params["padding_offset"]), str(params.get("row_spec", "")),
                        str(params.get("col_spec", "")), str(params.get("identifier", "id")),
                        str(params.get("release", "cells")), str(params.get("order", "row")),
                        _version(params.get("join_version", 1)), str(params.get("pseudonyms", "hmac")),
                        _max_records(params.get("max_records")))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InvalidInputError(
                'a join study needs strategy_params {"shape": [rows, cols], "capacity": N, "padding_epsilon": e, '
                '"padding_offset": k} (optional "row_spec", "col_spec", "identifier", "release", "order", '
                '"join_version"): ' + str(exc)) from exc
        if terms.version not in JOIN_VERSIONS:
            raise InvalidInputError(f"join_version {terms.version} is unknown (known: "
                                    f"{', '.join(map(str, sorted(JOIN_VERSIONS)))}; new studies use "
                                    f"{CURRENT_JOIN_VERSION})")
        if terms.rows < 1 or terms.cols < 1 or terms.rows * terms.cols != domain_size:
            raise InvalidInputError(f"join shape {terms.rows} x {terms.cols} must have domain_size {domain_size} cells")
        if terms.rows * terms.cols > MAX_JOIN_CELLS:
            raise InvalidInputError(f"a join table has at most {MAX_JOIN_CELLS} cells, got {domain_size}")
        top = join_capacity_limit(terms.version, slots)
        if not 0 < terms.capacity <= top or terms.capacity % slots:
            raise InvalidInputError(f"join capacity must be a positive multiple of {slots} up to {top} (join scheme "
                                    f"version {terms.version}: counts are mod t = {join_plain_modulus(terms.version)}, "
                                    f"a larger capacity could wrap), got {terms.capacity}")
        if not (0 < terms.padding_epsilon < float("inf")) or terms.padding_offset < 1:
            raise InvalidInputError(f"join padding needs padding_epsilon > 0 and padding_offset >= 1, got "
                                    f"{terms.padding_epsilon:g} and {terms.padding_offset}")
        if terms.delta > MAX_PADDING_DELTA:
            raise InvalidInputError(
                f"join padding offset {terms.padding_offset} at padding_epsilon {terms.padding_epsilon:g} has delta "
                f"{terms.delta:.3g}, above the bound {MAX_PADDING_DELTA:g}: use padding_offset >= "
                f"{min_padding_offset(terms.padding_epsilon)}")
        stated = params.get("padding_delta")
        if stated is not None and not (isinstance(stated, (int, float)) and math.isclose(float(stated), terms.delta,
                                                                                          rel_tol=1e-9)):
            raise InvalidInputError(f"the contract states padding_delta {stated!r}, but padding_epsilon "
                                    f"{terms.padding_epsilon:g} and offset {terms.padding_offset} give {terms.delta!r}")
        if terms.pseudonyms not in JOIN_PSEUDONYMS:
            raise InvalidInputError(f"join pseudonyms {terms.pseudonyms!r} are none of {', '.join(JOIN_PSEUDONYMS)}")
        if terms.max_records is not None and sum(terms.max_records) > terms.capacity:
            raise InvalidInputError(f"max_records {list(terms.max_records)} exceed the join capacity {terms.capacity}")
        if terms.release not in JOIN_RELEASES:
            raise InvalidInputError(f"join release {terms.release!r} is none of {', '.join(JOIN_RELEASES)}")
        if terms.order not in JOIN_ORDERS:
            raise InvalidInputError(f"join order {terms.order!r} is none of {', '.join(JOIN_ORDERS)}")
        side = terms.rows
        if terms.order == "hilbert" and (terms.rows != terms.cols or side & (side - 1)):
            raise InvalidInputError(f"a Hilbert order needs a square table with a power-of-two side, got "
                                    f"{terms.rows} x {terms.cols}: use order \"row\"")
        return terms

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def scheme_params(self) -> JoinParams:
        """The parameters of the join scheme version the contract names (the key holder keeps a key per version)."""
        return JoinParams.for_version(self.version)

    @property
    def delta(self) -> float:
        """The padding's delta (`padding_delta`): at most MAX_PADDING_DELTA for accepted terms."""
        return padding_delta(self.padding_epsilon, self.padding_offset)

    def groups(self, slots: int = 8192) -> int:
        return groups_for(self.capacity, slots)

    @property
    def oblivious(self) -> bool:
        """True when the pseudonyms are oblivious PRF values (the key holder evaluates, `evaluation_quota`)."""
        return self.pseudonyms == "oprf"

    def dummy_allowance(self) -> int:
        """How many private dummies an owner pads its evaluations with at most: 2 x offset, the bound
        `capacity_for` sizes the capacity with (a draw above it, probability below the padding's delta, is cut)."""
        return 2 * self.padding_offset

    def evaluation_quota(self, side: int) -> int:
        """The most oblivious evaluations the key holder answers owner `side` (0: A, 1: B) in this study: its
        declared largest record count plus its private dummies' allowance; without declared counts, the capacity
        (an owner's list alone must fit it). So an owner colluding with the computation server tests at most this
        many guessed identifiers, its own records included."""
        if self.max_records is None:
            return self.capacity
        return self.max_records[side] + self.dummy_allowance()

    def values_of(self, side: int) -> int:
        """Attribute values of owner `side` (0: A, rows; 1: B, columns)."""
        return self.rows if side == 0 else self.cols

    def spec_of(self, side: int) -> str:
        return self.row_spec if side == 0 else self.col_spec


def _max_records(value: Any) -> tuple[int, int] | None:
    """strategy_params' "max_records": [n_a, n_b], two integers >= 1 (absent: None)."""
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)):
        raise ValueError(f"max_records must be two integers >= 1, got {value!r}")
    return int(value[0]), int(value[1])


def _version(value: Any) -> int:
    """strategy_params' "join_version": an integer (absent: 1, the version of contracts that predate versions)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"join_version must be an integer, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------- pseudonyms
class JoinKeyPair:
    """One owner's X25519 key for a join study: the public half goes (through the computation server) to the
    other owner; `join_key` combines it with the other's public half into the shared 32-byte key."""

    def __init__(self, private: X25519PrivateKey | None = None) -> None:
        self._private = private or X25519PrivateKey.generate()

    @property
    def public_bytes(self) -> bytes:
        return self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def join_key(self, peer_public: bytes, *, study_id: str, contract_hash: str) -> bytes:
        """HKDF-SHA256 of the X25519 shared secret, bound to the study and its contract."""
        if not isinstance(peer_public, (bytes, bytearray)) or len(peer_public) != 32:
            raise InvalidInputError("the other owner's join public key must be 32 bytes (X25519)")
        if bytes(peer_public) == self.public_bytes:
            raise InvalidInputError("the other owner's join public key is this owner's own: a relay error or attack")
        shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        info = _KDF_INFO + b"|" + study_id.encode() + b"|" + contract_hash.encode()
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)

    def private_secret(self, study_id: str) -> bytes:
        """A key only this owner can derive (from its X25519 private key): seeds its private dummies."""
        raw = self._private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption())
        info = _PRIVATE_INFO + b"|" + study_id.encode()
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(raw)


def normalize_identifier(identifier: str) -> str:
    """NFKC, trimmed, case-folded, inner whitespace collapsed: " Alice@Example.COM " == "alice@example.com"."""
    if not isinstance(identifier, str):
        raise InvalidInputError(f"identifiers must be text, got {type(identifier).__name__}")
    text = " ".join(unicodedata.normalize("NFKC", identifier).split()).casefold()
    if not text:
        raise InvalidInputError("an identifier is empty after normalization")
    return text


def oprf_input(identifier: str) -> bytes:
    """The OPRF input of an identifier: its normalized text (`normalize_identifier`), UTF-8, domain-separated."""
    return b"id|" + normalize_identifier(identifier).encode()


def oblivious_pseudonyms(join_key: bytes, prf_outputs: Sequence[bytes]) -> list[bytes]:
    """HMAC-SHA256(join key, OPRF output) for each identifier's oblivious PRF value (he_partition.join.oprf).

    The PRF value is what no owner can compute alone; the HMAC under the owners' join key binds it to this
    pair of owners and this study, so the computation server, which lacks the join key, cannot link the
    pseudonyms of two studies either. Refuses duplicates (one record per identifier)."""
    out = [hmac.new(join_key, b"oprf|" + bytes(y), hashlib.sha256).digest() for y in prf_outputs]
    if len(set(out)) != len(out):
        raise InvalidInputError("an identifier appears twice (after normalization): keep one record per "
                                "identifier (the join's contribution bound)")
    return out


def pseudonyms(join_key: bytes, identifiers: Iterable[str]) -> list[bytes]:
    """HMAC-SHA256(join key, normalized identifier) for each identifier; refuses duplicates (one record each)."""
    out = [hmac.new(join_key, b"id|" + normalize_identifier(i).encode(), hashlib.sha256).digest()
           for i in identifiers]
    if len(set(out)) != len(out):
        raise InvalidInputError("an identifier appears twice (after normalization): keep one record per "
                                "identifier (the join's contribution bound)")
    return out


def dummy_count(join_key: bytes, epsilon: float, offset: int, *, label: bytes = b"dummy-count") -> int:
    """The number D of shared dummy pseudonyms: max(0, offset + discrete Laplace(3/epsilon)), drawn from the key.

    (`private_dummies` draws its count here too, from an owner's own key and another label.)

    Privacy: the computation server sees |A ∩ B| + D, |A| + D + P_A and |B| + D + P_B
    (P_A, P_B: `private_dummies`). Neighbouring relation: add/remove one shared customer
    (|A ∩ B|, |A|, |B| each change by 1; sensitivity 1 for each). Shifting D by one and
    P_A, P_B by one the other way explains the change, at epsilon/3 each: the three sizes
    are epsilon-DP together, even when |A| and |B| are public, with delta `padding_delta`
    (the clamps at 0). Only the two owners know D (it comes from their join key); the
    computation server knows only the sums.
    """
    if not epsilon > 0 or offset < 1:
        raise InvalidInputError(f"padding needs epsilon > 0 and offset >= 1, got {epsilon}, {offset}")
    seed = int.from_bytes(hmac.new(join_key, label, hashlib.sha256).digest()[:8], "big")
    draw = int(discrete_laplace(laplace_scale(1, epsilon / _PADDING_DRAWS), 1, SeededRandom(seed))[0])
    return max(0, offset + draw)


def shared_dummies(join_key: bytes, count: int) -> list[bytes]:
    """`count` pseudonyms both owners derive alike (they match each other and never a real identifier)."""
    return [hmac.new(join_key, b"dummy|" + str(i).encode(), hashlib.sha256).digest() for i in range(count)]


def private_dummies(owner_secret: bytes, epsilon: float, offset: int) -> list[bytes]:
    """One owner's private dummies: max(0, offset + discrete Laplace(3/epsilon)) pseudonyms that match nothing.

    Privacy: they hide the shared dummy count D from this owner's list size |A| + D + P_A
    (without them, a public |A| gives D and so |A ∩ B| exactly). epsilon/3 of the padding
    epsilon (`dummy_count` states the whole view's guarantee); sensitivity 1; neighbouring
    relation add/remove one customer; only this owner knows the draw: it and the values
    come from `owner_secret` (`JoinKeyPair.private_secret`), so a re-run posts the same list.
    """
    count = dummy_count(owner_secret, epsilon, offset, label=b"private-dummy-count")
    return [hmac.new(owner_secret, b"private-dummy|" + str(i).encode(), hashlib.sha256).digest()
            for i in range(count)]


def posted_pseudonyms(pair: "JoinKeyPair", join_key: bytes, identifiers: Sequence[str],
                      terms: JoinTerms, *, study_id: str,
                      prf_outputs: Sequence[bytes] | None = None) -> tuple[list[bytes], list[bytes]]:
    """(the list an owner posts, the pseudonyms of `identifiers` in their order).

    `prf_outputs`: the identifiers' oblivious PRF values, in their order (required when the terms'
    pseudonyms are "oprf"; `oblivious_pseudonyms`); without them, the legacy HMAC of each identifier.

    The posted list is its pseudonyms, the shared dummies and its private dummies, sorted:
    HMAC values under a key the computation server lacks, so sorted order is a uniformly
    random order, independent of the file's order and of which entries are dummies.
    Privacy: as `dummy_count` (padding_epsilon over the three draws, delta `padding_delta`).
    """
    if terms.oblivious:
        if prf_outputs is None or len(prf_outputs) != len(identifiers):
            raise InvalidInputError("this study's pseudonyms are oblivious: each identifier needs its OPRF value "
                                    "from the key holder (parties.data_owner.join)")
        real = oblivious_pseudonyms(join_key, prf_outputs)
    else:
        real = pseudonyms(join_key, identifiers)
    posted = real + shared_dummies(join_key, dummy_count(join_key, terms.padding_epsilon, terms.padding_offset))
    posted += private_dummies(pair.private_secret(study_id), terms.padding_epsilon, terms.padding_offset)
    return sorted(posted), real


# ---------------------------------------------------------------------------------------------- placement
def groups_for(capacity: int, slots: int) -> int:
    return -(-capacity // slots)


def _check_pseudonyms(name: str, values: Sequence[bytes]) -> None:
    if any(not isinstance(v, (bytes, bytearray)) or len(v) != PSEUDONYM_BYTES for v in values):
        raise InvalidInputError(f"{name}: every pseudonym must be {PSEUDONYM_BYTES} bytes")
    if len(set(map(bytes, values))) != len(values):
        raise InvalidInputError(f"{name}: a pseudonym appears twice (one record per identifier)")


def place(a: Sequence[bytes], b: Sequence[bytes], capacity: int,
          rng: RandomSource) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """The computation server's placement: the union of both owners' pseudonyms mapped injectively and
    uniformly at random into [0, capacity); matched pseudonyms get one position for both owners."""
    _check_pseudonyms("owner A's upload", a)
    _check_pseudonyms("owner B's upload", b)
    union = list(dict.fromkeys([*map(bytes, a), *map(bytes, b)]))
    if len(union) > capacity:
        # No sizes in the text: it reaches an owner, and the union size would tell it the other's list size.
        raise InvalidInputError(f"the two owners' pseudonyms do not fit the study's join capacity {capacity}: open "
                                "a new study with a larger capacity (up to the largest the plain modulus allows)")
    # A uniformly random injection: a Fisher-Yates prefix of [0, capacity) from the server's source.
    pool = np.arange(capacity, dtype=np.int64)
    n = len(union)
    jumps = np.arange(n, dtype=np.int64) + rng.integers(capacity - np.arange(n, dtype=np.int64), n)
    for i, j in enumerate(jumps.tolist()):
        pool[i], pool[j] = pool[j], pool[i]
    pos = {u: int(pool[i]) for i, u in enumerate(union)}
    return {bytes(p): pos[bytes(p)] for p in a}, {bytes(p): pos[bytes(p)] for p in b}


def check_placement(own: Sequence[bytes], placement: Mapping[bytes, int], capacity: int) -> None:
    """An owner's check of the placement it received: exactly its pseudonyms, distinct positions in range."""
    if set(placement) != set(map(bytes, own)) or len(placement) != len(own):
        missing = len(set(map(bytes, own)) - set(placement))
        extra = len(set(placement) - set(map(bytes, own)))
        raise InvalidInputError(f"the placement does not cover exactly this owner's pseudonyms ({missing} missing, "
                                f"{extra} foreign): refusing it")
    values = list(placement.values())
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < capacity
           for v in values):
        raise InvalidInputError(f"the placement has positions outside [0, {capacity}): refusing it")
    if len(set(map(int, values))) != len(values):
        raise InvalidInputError("the placement puts two records at one position: refusing it")


def encode_indicators(placement: Mapping[bytes, int], value_of: Mapping[bytes, int], n_values: int, capacity: int,
                      slots: int) -> npt.NDArray[np.uint8]:
    """Indicator planes (groups, n_values, slots): 1 at a record's position in the plane of its value.

    Pseudonyms without a value (the shared dummies) encode nothing.
    """
    planes = np.zeros((groups_for(capacity, slots), n_values, slots), dtype=np.uint8)
    for p, position in placement.items():
        v = value_of.get(p)
        if v is None:
            continue
        if not 0 <= v < n_values:
            raise InvalidInputError(f"attribute bin {v} outside [0, {n_values})")
        g, s = divmod(int(position), slots)
        planes[g, v, s] = 1
    return planes


# ---------------------------------------------------------------------------------------------- evaluation
def joint_totals(scheme: JoinScheme, a_cts: Sequence[Sequence[Any]], b_cts: Sequence[Sequence[Any]]) -> list[Any]:
    """Cell (i, j) at index i * d_b + j: a ciphertext whose every slot holds sum_g sum_slots A[g][i] * B[g][j]."""
    if len(a_cts) != len(b_cts) or not a_cts:
        raise InvalidInputError(f"owners sent {len(a_cts)} and {len(b_cts)} groups; the placement needs equal counts")
    d_a, d_b = len(a_cts[0]), len(b_cts[0])
    if any(len(g) != d_a for g in a_cts) or any(len(g) != d_b for g in b_cts):
        raise InvalidInputError("every group must hold one ciphertext per attribute value")
    acc: list[Any] = [None] * (d_a * d_b)
    for ga, gb in zip(a_cts, b_cts):
        for i in range(d_a):
            for j in range(d_b):
                acc[i * d_b + j] = scheme.multiply_accumulate(acc[i * d_b + j], ga[i], gb[j])
    return [scheme.total(c) for c in acc]
