"""The strategy -> measurement-kind table the decryption server enforces matches what strategies measure."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition.core.backend import PlainBackend
from he_partition.core.measurements import Measurement
from he_partition.core.noise import SeededRandom
from he_partition.protocol import (
    STRATEGIES,
    STRATEGY_MEASUREMENT_KINDS,
    Budget,
    ComputationSide,
    DecryptionSide,
    encrypt_histogram,
    make_strategy,
    run_strategy,
)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("c", [1, 3])
def test_every_measurement_is_of_a_listed_kind_with_at_least_its_minimum_sensitivity(name: str, c: int) -> None:
    x = np.repeat([5, 40, 0, 12], 50)
    backend = PlainBackend()
    agg = encrypt_histogram(backend, x)
    cs = ComputationSide(backend, SeededRandom(1))
    ds = DecryptionSide(backend, SeededRandom(2), Budget(1.0))
    seen: list[Measurement] = []

    def measure(m: Measurement) -> np.ndarray:
        seen.append(m)
        return ds.decrypt_measurement(m, cs.measure(agg, m))

    run_strategy(make_strategy(name, x.size, 1.0, noise_parties=2, contribution_bound=c), measure)
    assert seen and {m.kind for m in seen} <= STRATEGY_MEASUREMENT_KINDS[name]
    assert all(m.sensitivity >= m.unit_sensitivity * c for m in seen)
