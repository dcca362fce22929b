"""Counts past what a study can decode are refused by the data owner before anything is encrypted or sent:
the bound is stated in the contract (`max_records_per_owner`, also on the wire)."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.convert import contract_to_proto
from parties.data_owner.client import DataOwnerClient

from .conftest import Cluster


def test_counts_of_2_to_the_60_are_refused_before_any_network_traffic() -> None:
    # Nothing listens on port 1: any RPC would fail with UNAVAILABLE, so the refusal comes first.
    owner = DataOwnerClient("a", computation="127.0.0.1:1", decryption="127.0.0.1:1", insecure=True, progress=False)
    try:
        with pytest.raises(InvalidInputError, match="nothing was encrypted or sent") as ei:
            owner.submit("s1", np.array([2**60] + [0] * 63, dtype=np.int64))
        assert f"holds {2**60} records" in str(ei.value)
    finally:
        owner.close()


def test_counts_past_the_study_bound_are_refused_before_encryption(cluster: Cluster) -> None:
    contract = cluster.open_study(domain_size=64, owners=("a", "b", "c"))
    limit = 2**44 // 6
    assert contract.max_records_per_owner == limit
    assert contract_to_proto(contract).max_records_per_owner == limit  # stated on the wire too
    before = cluster.snapshot()
    counts = np.zeros(64, dtype=np.int64)
    counts[5] = limit + 1  # decodes alone, but three such owners would pass the 2^44 bound
    with pytest.raises(InvalidInputError, match=f"more than {limit} .study s1's bound"):
        cluster.owner("a").submit("s1", counts)
    assert cluster.snapshot() == before  # no upload, no submission
    counts[5] = limit
    assert cluster.owner("a").submit("s1", counts).committed  # exactly the bound is accepted
