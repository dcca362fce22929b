"""A test double of a computation server that deviates: it speaks the real wire protocol to a real
decryption server but chooses its own noise draws, pads, epsilons, replays and ciphertexts (the attacks of
test_adversarial_cs.py).

Its studies are signed: the double plays the owners' clients too (it encrypts their histograms and
signs the c1 parts of their uploads with their keys) and forwards those signed parts to the
decryption server as an honest computation server does (`forward`). From then on it chooses c0
only: the decryption server decrypts every chunk with the owners' aggregate c1 it verified.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.backend import ChunkedVector, sum_vectors
from he_partition.core.measurements import MAX_DECODED_MAGNITUDE, Measurement, PartitionSums, owner_encoding
from he_partition.he.bfv import BfvBackend, load_context
from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError
from parties.decryption.client import DecryptionClient
from parties.decryption.keyshare.uploads import sign_c1_parts

from .sealed_helpers import close_and_send

IntArray = npt.NDArray[np.int64]


@dataclass
class AdversarialComputationServer:
    """Holds the owners' ciphertexts (as a computation server does) and asks the DS whatever it likes.

    Every request goes through `DecryptionClient` (`send_uploads`, `decrypt_measurement`), i.e. the
    real gRPC streams to a real decryption server; nothing here touches the server's internals.
    `owner_keys`: each owner's private signing key (the double plays the owners' clients, which sign
    the c1 parts of their uploads); their histograms are `histograms`, in the same order. An unsigned
    study (a server without TLS) needs no keys: any value, and nothing to forward.
    """

    ds: DecryptionClient
    contract: StudyContract
    owner_keys: Mapping[str, bytes]
    histograms: list[IntArray]
    backend: BfvBackend = field(init=False)
    uploads: dict[str, ChunkedVector] = field(init=False)
    aggregate: ChunkedVector = field(init=False)
    requests: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.backend = BfvBackend(load_context(self.ds.public_context(study_id=self.contract.study_id)))
        # as the CS of a signed study adds its noise and flood (to c0 only); an unsigned study: a fresh encryption
        self.backend.noise_in_c0 = self.backend.flood_in_c0 = self.contract.signed
        self.uploads = {o: self.backend.encrypt(owner_encoding(h)) for o, h in zip(self.owner_keys, self.histograms)}
        self.aggregate = sum_vectors(self.backend, self.uploads.values())

    @property
    def study_id(self) -> str:
        return self.contract.study_id

    @property
    def contract_hash(self) -> str:
        return self.contract.contract_hash

    def forward(self, owners: Sequence[str] | None = None) -> int:
        """Forward the owners' signed c1 parts (all owners, or `owners` only) to the DS; the chunks it keeps."""
        parts = [sign_c1_parts(self.owner_keys[o], study_id=self.study_id, owner_id=o, idempotency_key="k1",
                               contract_hash=self.contract_hash,
                               parts=[c1_bytes(c1_of_vector(self.backend.context, self.backend.serialize_chunk(c)))
                                      for c in self.uploads[o].chunks])
                 for o in (owners if owners is not None else self.owner_keys)]
        return close_and_send(self.ds, self.contract, parts, self.owner_keys)

    def chunks(self, m: Measurement, eta: IntArray, *, pad: Callable[[int], IntArray] | None = None,
               aggregate: ChunkedVector | None = None) -> list[bytes]:
        """The measurement ciphertext with the adversary's chosen draw `eta` and pads (`pad(k)`: k pad values)."""
        t = self.backend.plain_modulus
        noise = m.noise_slots(np.asarray(eta, dtype=np.int64), t)
        used = m.measured_slots()
        if used is not None:
            free = ~used
            k = int(np.count_nonzero(free))
            noise[free] = pad(k) if pad is not None else np.random.default_rng(0).integers(0, t, k)
        agg = aggregate if aggregate is not None else self.aggregate
        return [self.backend.serialize_chunk(c)
                for _, c in self.backend.noised_chunks(agg, noise, keep=m.measured_chunks(self.backend.slots))]

    def ask(self, release_id: str, release_epsilon: float, m: Measurement, chunks: list[bytes]) -> IntArray | None:
        """The DS's answer (values), or None when it refused for data reasons (after the charge)."""
        self.requests += 1
        try:
            return self.ds.decrypt_measurement(study_id=self.study_id, release_id=release_id,
                                               release_epsilon=release_epsilon, measurement=m, chunks=chunks,
                                               chunk_count=len(chunks), contract_hash=self.contract_hash).values
        except ServiceError as exc:
            if exc.details.startswith("refused after the charge") or "implausibly large" in exc.details:
                return None
            raise

    def refusal_oracle_search(self, epsilon: float, steps: int, *, prefix: str, high: int = 1 << 16) -> int:
        """Binary search for the total count with the refusal oracle (the attack that once recovered a sum).

        Each step sets its own draw to 2^44 - T on a one-partition PartitionSums, so the
        decoded value is total - T + 2^44 (+ the DS's draw): a refusal says total (+ DS
        draw) > T. Each step is a new release of `epsilon`. Returns the smallest T the
        search believes answers.
        """
        n = self.histograms[0].size
        lo, hi = 0, high
        for i in range(steps):
            if lo >= hi:
                break
            mid = (lo + hi) // 2
            m = PartitionSums(n, epsilon, 1, starts=(0,))
            answer = self.ask(f"{prefix}-{i}", epsilon, m, self.chunks(m, np.array([MAX_DECODED_MAGNITUDE - mid])))
            if answer is None:  # refused: total > mid
                lo = mid + 1
            else:
                hi = mid
        return lo
