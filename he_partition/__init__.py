"""HE-friendly differentially private partitioning: the pure core of dpagg."""

from .backend import ChunkedVector, PlainBackend, VectorBackend
from .errors import (
    BudgetExhaustedError,
    DPAggError,
    InvalidInputError,
    MeasurementShapeError,
    PrecisionError,
)
from .auto import AutoParams, auto_strategy
from .dawa import DawaParams, dawa_strategy
from .estimation import IntervalTree
from .gap import GapParams, gap_partition, gap_strategy
from .hier import HierParams, hier_strategy
from .hilbert import RectangleCount, flatten, rectangle_count, rectangle_ranges, unflatten
from .measurements import (
    HaarCoefficients,
    Measurement,
    PartitionSums,
    PrefixDifferences,
    measurement_from_dict,
    owner_encoding,
)
from .noise import RandomSource, SecureRandom, SeededRandom, discrete_laplace, laplace_scale
from .privelet import PriveletParams, privelet_strategy
from .protocol import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Budget,
    ComputationSide,
    DecryptionSide,
    encrypt_histogram,
    make_strategy,
    release,
    run_strategy,
)
from .summary import RangeCount, ReleasedValues, Summary

__all__ = [
    "Budget", "BudgetExhaustedError", "ChunkedVector", "ComputationSide", "DPAggError", "DecryptionSide",
    "GapParams", "InvalidInputError", "Measurement", "MeasurementShapeError", "PartitionSums", "PlainBackend",
    "PrecisionError", "PrefixDifferences", "RandomSource", "RangeCount", "SecureRandom", "SeededRandom",
    "Summary", "VectorBackend", "discrete_laplace", "encrypt_histogram", "gap_partition", "gap_strategy",
    "laplace_scale", "make_strategy", "measurement_from_dict", "owner_encoding", "release", "run_strategy",
    "AutoParams", "DawaParams", "HierParams", "PriveletParams", "auto_strategy", "dawa_strategy", "hier_strategy",
    "privelet_strategy", "HaarCoefficients", "IntervalTree", "ReleasedValues", "RectangleCount", "flatten",
    "unflatten", "rectangle_count", "rectangle_ranges", "DEFAULT_STRATEGY", "STRATEGIES",
]
