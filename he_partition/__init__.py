"""HE-friendly differentially private partitioning: the pure core of dpagg.

The packages, lowest layer first (each may import only the layers before it):

- `core/`: errors, validation, exact discrete Laplace noise, the vector interface and its numpy
  oracle (`backend`), linear measurements, estimation, `Summary`, budget arithmetic (`accounting`).
- `he/`: the BFV scheme on TenSEAL (`bfv`), the key holder's raw view (`keyholder`), the
  join's ciphertext products (`join_scheme`) and n-of-n threshold BFV (`threshold/`): the only
  modules that import TenSEAL.
- `strategies/`: the release strategies (gap, hier, dawa, privelet, auto) and the Hilbert order.
- `execution/`: where the computation server's chunk work runs (in-process, worker processes, Ray).
- `protocol.py`: the two servers' sides of a release (`ComputationSide`, `DecryptionSide`),
  the strategy registry and `release()`.
- `join/`: the cross-organization join (pseudonyms and placement, its release, the evaluator).
- `methods/`: the source documents' further methods (p-views, Bayesian DP, guidance, audit).

Nothing here imports a party, the network or storage (tests/test_layout.py checks the arrows).
Each module is imported from its package (`he_partition.core.measurements`, `he_partition.he.bfv`, ...).

The names below are loaded on first use (PEP 562): importing a submodule (a worker process
that needs only `he_partition.join.oprf`, say) does not load the strategies, numpy or the
protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.lazy import exports

if TYPE_CHECKING:
    from .core.backend import ChunkedVector, PlainBackend, VectorBackend
    from .core.errors import BudgetExhaustedError, DPAggError, InvalidInputError, MeasurementShapeError, PrecisionError
    from .strategies.auto import AutoParams, auto_strategy
    from .strategies.dawa import DawaParams, dawa_strategy
    from .core.estimation import IntervalTree
    from .strategies.gap import GapParams, gap_partition, gap_strategy
    from .strategies.hier import HierParams, hier_strategy
    from .strategies.hilbert import RectangleCount, flatten, rectangle_count, rectangle_ranges, unflatten
    from .core.measurements import (
        HaarCoefficients, Measurement, PartitionSums, PrefixDifferences, measurement_from_dict, owner_encoding,
    )
    from .core.noise import CipherRandom, RandomSource, SecureRandom, SeededRandom, discrete_laplace, laplace_scale
    from .strategies.privelet import PriveletParams, privelet_strategy
    from .protocol import (
        DEFAULT_STRATEGY, STRATEGIES, Budget, ComputationSide, DecryptionSide, encrypt_histogram, make_strategy,
        release, run_strategy,
    )
    from .core.summary import RangeCount, ReleasedValues, Summary

#: The public names each submodule defines.
_MODULES = {
    ".core.backend": ["ChunkedVector", "PlainBackend", "VectorBackend"],
    ".core.errors": ["BudgetExhaustedError", "DPAggError", "InvalidInputError", "MeasurementShapeError",
                     "PrecisionError"],
    ".strategies.auto": ["AutoParams", "auto_strategy"],
    ".strategies.dawa": ["DawaParams", "dawa_strategy"],
    ".core.estimation": ["IntervalTree"],
    ".strategies.gap": ["GapParams", "gap_partition", "gap_strategy"],
    ".strategies.hier": ["HierParams", "hier_strategy"],
    ".strategies.hilbert": ["RectangleCount", "flatten", "rectangle_count", "rectangle_ranges", "unflatten"],
    ".core.measurements": ["HaarCoefficients", "Measurement", "PartitionSums", "PrefixDifferences",
                           "measurement_from_dict", "owner_encoding"],
    ".core.noise": ["CipherRandom", "RandomSource", "SecureRandom", "SeededRandom", "discrete_laplace",
                    "laplace_scale"],
    ".strategies.privelet": ["PriveletParams", "privelet_strategy"],
    ".protocol": ["DEFAULT_STRATEGY", "STRATEGIES", "Budget", "ComputationSide", "DecryptionSide",
                  "encrypt_histogram", "make_strategy", "release", "run_strategy"],
    ".core.summary": ["RangeCount", "ReleasedValues", "Summary"],
}

__all__ = [
    "Budget", "BudgetExhaustedError", "ChunkedVector", "ComputationSide", "DPAggError", "DecryptionSide",
    "GapParams", "InvalidInputError", "Measurement", "MeasurementShapeError", "PartitionSums", "PlainBackend",
    "CipherRandom", "PrecisionError", "PrefixDifferences", "RandomSource", "RangeCount", "SecureRandom", "SeededRandom",
    "Summary", "VectorBackend", "discrete_laplace", "encrypt_histogram", "gap_partition", "gap_strategy",
    "laplace_scale", "make_strategy", "measurement_from_dict", "owner_encoding", "release", "run_strategy",
    "AutoParams", "DawaParams", "HierParams", "PriveletParams", "auto_strategy", "dawa_strategy", "hier_strategy",
    "privelet_strategy", "HaarCoefficients", "IntervalTree", "ReleasedValues", "RectangleCount", "flatten",
    "unflatten", "rectangle_count", "rectangle_ranges", "DEFAULT_STRATEGY", "STRATEGIES",
]


__getattr__, __dir__ = exports(__name__, _MODULES)
