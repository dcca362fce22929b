"""HE-friendly differentially private partitioning: the pure core of dpagg."""

from .backend import ChunkedVector, PlainBackend, VectorBackend
from .errors import (
    BudgetExhaustedError,
    DPAggError,
    InvalidInputError,
    MeasurementShapeError,
    PrecisionError,
)
from .gap import GapParams, gap_partition, gap_strategy
from .measurements import Measurement, PartitionSums, PrefixDifferences, measurement_from_dict, owner_encoding
from .noise import RandomSource, SecureRandom, SeededRandom, discrete_laplace, laplace_scale
from .protocol import Budget, ComputationSide, DecryptionSide, encrypt_histogram, make_strategy, release, run_strategy
from .summary import RangeCount, Summary

__all__ = [
    "Budget", "BudgetExhaustedError", "ChunkedVector", "ComputationSide", "DPAggError", "DecryptionSide",
    "GapParams", "InvalidInputError", "Measurement", "MeasurementShapeError", "PartitionSums", "PlainBackend",
    "PrecisionError", "PrefixDifferences", "RandomSource", "RangeCount", "SecureRandom", "SeededRandom",
    "Summary", "VectorBackend", "discrete_laplace", "encrypt_histogram", "gap_partition", "gap_strategy",
    "laplace_scale", "make_strategy", "measurement_from_dict", "owner_encoding", "release", "run_strategy",
]
