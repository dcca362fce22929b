"""A test double of a computation server that deviates: it speaks the real wire protocol to a real
decryption server but chooses its own noise draws, pads, epsilons and replays (issue 23)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import numpy.typing as npt

from he_partition.core.backend import ChunkedVector, sum_vectors
from he_partition.core.measurements import MAX_DECODED_MAGNITUDE, Measurement, PartitionSums, owner_encoding
from he_partition.he.bfv import BfvBackend, load_context
from parties.common.errors import ServiceError
from parties.decryption.client import DecryptionClient

IntArray = npt.NDArray[np.int64]


@dataclass
class AdversarialComputationServer:
    """Holds the owners' ciphertexts (as a computation server does) and asks the DS whatever it likes.

    Every request goes through `DecryptionClient.decrypt_measurement`, i.e. the real gRPC
    stream to a real decryption server; nothing here touches the server's internals.
    """

    ds: DecryptionClient
    study_id: str
    contract_hash: str
    histograms: list[IntArray]
    backend: BfvBackend = field(init=False)
    aggregate: ChunkedVector = field(init=False)
    requests: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.backend = BfvBackend(load_context(self.ds.public_context()))
        self.aggregate = sum_vectors(self.backend, (self.backend.encrypt(owner_encoding(h)) for h in self.histograms))

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
        """The DS's answer (values), or None when it refused for data reasons (FAILED_PRECONDITION/INVALID_ARGUMENT)."""
        self.requests += 1
        try:
            return self.ds.decrypt_measurement(study_id=self.study_id, release_id=release_id,
                                               release_epsilon=release_epsilon, measurement=m, chunks=chunks,
                                               chunk_count=len(chunks), contract_hash=self.contract_hash).values
        except ServiceError as exc:
            if "implausibly large" in exc.details:
                return None
            raise

    def refusal_oracle_search(self, epsilon: float, steps: int, *, prefix: str, high: int = 1 << 16) -> int:
        """Binary search for the total count with the refusal oracle (issue 23, measured item 1).

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
