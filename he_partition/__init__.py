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
    from .core.measurements import HaarCoefficients, Measurement, PartitionSums, PrefixDifferences, measurement_from_dict, owner_encoding
    from .core.noise import CipherRandom, RandomSource, SecureRandom, SeededRandom, discrete_laplace, laplace_scale
    from .strategies.privelet import PriveletParams, privelet_strategy
    from .protocol import DEFAULT_STRATEGY, STRATEGIES, Budget, ComputationSide, DecryptionSide, encrypt_histogram, make_strategy, release, run_strategy
    from .core.summary import RangeCount, ReleasedValues, Summary

#: Each public name and the submodule that defines it.
_SOURCES = {
    "ChunkedVector": ".core.backend",
    "PlainBackend": ".core.backend",
    "VectorBackend": ".core.backend",
    "BudgetExhaustedError": ".core.errors",
    "DPAggError": ".core.errors",
    "InvalidInputError": ".core.errors",
    "MeasurementShapeError": ".core.errors",
    "PrecisionError": ".core.errors",
    "AutoParams": ".strategies.auto",
    "auto_strategy": ".strategies.auto",
    "DawaParams": ".strategies.dawa",
    "dawa_strategy": ".strategies.dawa",
    "IntervalTree": ".core.estimation",
    "GapParams": ".strategies.gap",
    "gap_partition": ".strategies.gap",
    "gap_strategy": ".strategies.gap",
    "HierParams": ".strategies.hier",
    "hier_strategy": ".strategies.hier",
    "RectangleCount": ".strategies.hilbert",
    "flatten": ".strategies.hilbert",
    "rectangle_count": ".strategies.hilbert",
    "rectangle_ranges": ".strategies.hilbert",
    "unflatten": ".strategies.hilbert",
    "HaarCoefficients": ".core.measurements",
    "Measurement": ".core.measurements",
    "PartitionSums": ".core.measurements",
    "PrefixDifferences": ".core.measurements",
    "measurement_from_dict": ".core.measurements",
    "owner_encoding": ".core.measurements",
    "CipherRandom": ".core.noise",
    "RandomSource": ".core.noise",
    "SecureRandom": ".core.noise",
    "SeededRandom": ".core.noise",
    "discrete_laplace": ".core.noise",
    "laplace_scale": ".core.noise",
    "PriveletParams": ".strategies.privelet",
    "privelet_strategy": ".strategies.privelet",
    "DEFAULT_STRATEGY": ".protocol",
    "STRATEGIES": ".protocol",
    "Budget": ".protocol",
    "ComputationSide": ".protocol",
    "DecryptionSide": ".protocol",
    "encrypt_histogram": ".protocol",
    "make_strategy": ".protocol",
    "release": ".protocol",
    "run_strategy": ".protocol",
    "RangeCount": ".core.summary",
    "ReleasedValues": ".core.summary",
    "Summary": ".core.summary",
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


__getattr__, __dir__ = exports(__name__, _SOURCES)
