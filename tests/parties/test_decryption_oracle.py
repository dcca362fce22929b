"""A decryption-failure oracle against a REAL decryption server (gRPC, port 0): a computation server that
chooses c0 and c1 and reads refusal against answer, and the refusal's text, to learn the secret key.

Whether a chunk passes the integrity check (noise budget) is a function of its phase c0 + c1 s.
With c1 = k (a constant polynomial) the phase is c0 + k s, and with c0 = k at coefficient j
only: on the former code (the check before the charge, no flood of the key holder's own) the
chunk was refused exactly when s_j = 1, free of charge and without limit. Now the check runs
after the charge, on a phase flooded by the key holder's own noise (2^108, keyed by the
ciphertext), every refusal after the charge is charged, says the same words whatever caused it,
and counts toward a cap per study (and per key). docs/threat-model.md ("What a deviating
computation server learns from the decryption server") cites these tests.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from he_partition.core.measurements import PartitionSums
from he_partition.he.bfv import BfvBackend, load_context
from parties.common.errors import ServiceError
from parties.decryption.refusals import MAX_REFUSALS_PER_STUDY

from .conftest import Cluster

#: 0.7 x 2^90: k s_i stays inside the former check's 2^90 bound, 2 k (= k s_j + k when s_j = 1) does not.
K = 7 * (1 << 90) // 10


class FailureOracle:
    """The deviating computation server: one-chunk PartitionSums requests whose c0 and c1 it chooses."""

    def __init__(self, cluster: Cluster, study_id: str) -> None:
        self.ds = cluster.decryption()
        self.study_id = study_id
        self.contract_hash = self.ds.get_study(study_id).contract_hash
        self.codec = BfvBackend(load_context(self.ds.public_context()))._codec
        self.asked = 0

    def chunk(self, c0: dict[int, int], c1: int) -> bytes:
        """The ciphertext (c0, c1): c0 zero but at the given coefficients, c1 the constant polynomial `c1`."""
        n = self.codec.degree
        polys = np.zeros((2, len(self.codec.moduli), n), dtype=np.uint64)
        for j, q in enumerate(self.codec.moduli):
            for i, v in c0.items():
                polys[0, j, i] = v % q
            polys[1, j, 0] = c1 % q
        return self.codec.vector_bytes(polys)

    def garbage(self, seed: int) -> bytes:
        """A chunk whose c0 is uniform modulo each prime (c1 = 0): its phase is noise, so its budget is 0."""
        rng = np.random.default_rng(seed)
        polys = np.zeros((2, len(self.codec.moduli), self.codec.degree), dtype=np.uint64)
        for j, q in enumerate(self.codec.moduli):
            polys[0, j] = rng.integers(0, q, self.codec.degree, dtype=np.uint64)
        return self.codec.vector_bytes(polys)

    def ask(self, data: bytes) -> str:
        """'answered', or the refusal's text."""
        self.asked += 1
        m = PartitionSums(64, 0.01, 1, starts=(0,))
        try:
            self.ds.decrypt_measurement(study_id=self.study_id, release_id=f"probe-{self.asked}", release_epsilon=0.01,
                                        measurement=m, chunks=[data], chunk_count=1, contract_hash=self.contract_hash)
        except ServiceError as exc:
            return exc.details
        return "answered"

    def probe(self, j: int, k: int = K) -> str:
        """The request whose refusal (on the former code) meant s_j = 1."""
        return self.ask(self.chunk({j: k}, k))


def _secret(cluster: Cluster) -> list[int]:
    """The DS's secret key coefficients (the test's ground truth): the phase of (0, 1) is s."""
    backend = BfvBackend(cluster.ds.handler.keys.secret_context)
    oracle = FailureOracle(cluster, "s1")
    phase, _, _ = backend.phase_and_plaintext(backend.deserialize_chunk(oracle.chunk({}, 1)))
    return phase


def test_the_failure_oracle_learns_no_key_bit_and_its_refusals_are_charged_and_capped(cluster: Cluster) -> None:
    """Twelve probes, six at coefficients with s_j = 1 and six without: on the former code the refusals were
    exactly the six with s_j = 1 (every bit learned, nothing charged). Now none of them is refused (the
    flood of 2^108 swamps the 2^90 difference, and honest ciphertexts still decode exactly), every probe is
    charged; probes sized for the new check (k = 1.4 x 2^108) are refused whatever s_j is, in one text
    that names neither the check nor the chunk, each refusal charged; after MAX_REFUSALS_PER_STUDY the
    server refuses the study outright (FAILED_PRECONDITION naming the cap), charging nothing."""
    cluster.open_study(study_id="s1", domain_size=64, owners=("a",), epsilon=10.0, signed=False)
    s = _secret(cluster)
    ones = [j for j in range(len(s)) if s[j] == 1][:6]
    others = [j for j in range(len(s)) if s[j] != 1][:6]
    oracle = FailureOracle(cluster, "s1")
    outcomes = {j: oracle.probe(j) for j in ones + others}
    learned = {j: outcomes[j] != "answered" for j in outcomes}
    truth = {j: s[j] == 1 for j in outcomes}
    assert learned != truth, "the refusals still tell which key coefficients are 1"
    assert all(o == "answered" for o in outcomes.values()), outcomes
    ds = cluster.decryption()
    assert len(ds.budget("s1").charges) == oracle.asked  # every probe paid

    # Probes sized for the check after the flood: refused, charged, in one text whatever s_j is.
    big = 14 * (1 << 108) // 10
    texts = [oracle.probe(j, big) for j in (ones[0], others[0], ones[1], others[1])]
    texts += [oracle.ask(oracle.garbage(j)) for j in range(MAX_REFUSALS_PER_STUDY - len(texts))]
    assert len(set(texts)) == 1 and texts[0].startswith("refused after the charge"), texts
    assert "chunk" not in texts[0] and "budget" not in texts[0] and "implausibly" not in texts[0]
    rows = cluster.ds.handler.arrivals.rows("s1")
    refused = [r for r in rows if r.outcome == "refused"]
    assert len(refused) == MAX_REFUSALS_PER_STUDY and all(r.epsilon_charged == pytest.approx(0.01) for r in refused)
    assert len(ds.budget("s1").charges) == oracle.asked

    # The cap: now even an honest-looking request is refused before any charge, naming the cap.
    with pytest.raises(ServiceError) as ei:
        ds.decrypt_measurement(study_id="s1", release_id="after-cap", release_epsilon=0.01,
                               measurement=PartitionSums(64, 0.01, 1, starts=(0,)), chunks=[oracle.chunk({}, 0)],
                               chunk_count=1, contract_hash=oracle.contract_hash)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "MAX_REFUSALS_PER_STUDY" in ei.value.details and f"cap of {MAX_REFUSALS_PER_STUDY}" in ei.value.details
    assert len(ds.budget("s1").charges) == oracle.asked


def test_the_refusal_cap_per_key_spans_studies(cluster: Cluster) -> None:
    """Studies under one key share its cap: a computation server cannot reset the count by opening another study
    (here the key's cap is lowered to 3 so that two studies reach it). New studies each get a key of their own, so
    the shared key is the server's legacy one: two studies opened on it before keys were made per study."""
    import dataclasses

    cluster.ds.handler.refusals.per_key = 3
    template = cluster.open_study(study_id="s0", domain_size=64, owners=("a",), epsilon=10.0, signed=False)
    for sid in ("s1", "s2"):  # written as a former server left them: under its one key
        cluster.ds.handler.ledger.create_study(dataclasses.replace(
            template, study_id=sid, context_fingerprint=cluster.ds.handler.fingerprint))
    first, second = FailureOracle(cluster, "s1"), FailureOracle(cluster, "s2")
    garbage = first.garbage(0)
    assert [first.ask(garbage)[:24], second.ask(garbage)[:24], second.ask(garbage)[:24]] == [
        "refused after the charge"] * 3
    refused = first.ask(garbage)
    assert "MAX_REFUSALS_PER_KEY" in refused and "cap of 3" in refused
    assert len(cluster.decryption().budget("s1").charges) == 1  # the refusal at the cap charged nothing
    # a study on a key of its own keeps its own count
    assert FailureOracle(cluster, "s0").ask(garbage)[:24] == "refused after the charge"


def test_join_cells_and_checks_read_the_join_key_only_after_the_charge_or_as_a_kept_failure(cluster: Cluster) -> None:
    """The join path under the same rule. A cell under another join key (its noise budget, a function of the
    key, is 0) is refused after the charge, in the one text, charged and recorded; on the former code it was
    refused before the charge ("nothing was charged"). A well-formedness check whose residues were made under
    another key answers False like a malformed upload (kept, and counted toward the caps), where the former
    code refused it with a text of its own, as often as asked."""
    from he_partition.he.join_scheme import JoinScheme
    from he_partition.join.wellformed import residues

    from .conftest import join_cells

    j = join_cells(cluster, (7, 0, 3, 1))
    contract, ds, scheme, m = j.contract, j.decryption, j.scheme, j.measurement
    other = JoinScheme.generate(scheme.params)
    seed, _ = ds.join_check_seed(study_id="j1", contract_hash=contract.contract_hash)
    empty = [[scheme.serialize(scheme.encrypt([0])) for _ in range(2)]]
    for owner in ("a", "b"):
        assert ds.check_join_upload(study_id="j1", contract_hash=contract.contract_hash, owner_id=owner, seed=seed,
                                    residues=residues(scheme, empty, seed, owner))
    foreign = [*j.cells[:3], other.serialize(other.encrypt([1]))]
    with pytest.raises(ServiceError) as ei:
        ds.decrypt_join_cells(study_id="j1", release_id="r1", release_epsilon=1.0, measurement=m,
                              contract_hash=contract.contract_hash, cells=foreign, cell_count=4)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and ei.value.details.startswith("refused after the charge")
    assert [c.kind for c in ds.budget("j1").charges] == ["join_padding", m.kind]
    rows = cluster.ds.handler.arrivals.rows("j1")
    assert [(r.outcome, r.epsilon_charged) for r in rows] == [("refused", pytest.approx(m.epsilon))]

    alien = [[other.serialize(other.encrypt([0])) for _ in range(2)]]
    assert not ds.check_join_upload(study_id="j1", contract_hash=contract.contract_hash, owner_id="a", seed=seed,
                                    residues=residues(other, alien, seed, "a"))
    assert [r.outcome for r in cluster.ds.handler.arrivals.rows("j1")] == ["refused", "refused"]
    assert cluster.ds.handler.refusals.refused("j1", contract.context_fingerprint) == (2, 2)
