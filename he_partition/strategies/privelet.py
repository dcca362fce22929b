"""Privelet strategy: noisy Haar wavelet coefficients (Xiao, Wang, Gehrke), optional non-negative refinement."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Generator

import numpy as np
import numpy.typing as npt

from ..core.estimation import haar_depth
from ..core.measurements import HaarCoefficients, Measurement
from ..core.summary import ReleasedValues, Summary

__all__ = ["PriveletParams", "privelet_strategy"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PriveletParams:
    """`nonnegative`: reconstruct with the non-negative refinement of Terada et al. (2015) /
    Hongo et al. (seed 001): while inverting the transform top-down, a detail that would make
    a child negative is shrunk so that child is exactly 0. Non-linear post-processing: it
    removes negative counts and helps on sparse data, but it is biased and the reported
    standard errors are those of the linear reconstruction.
    """

    nonnegative: bool = False


def privelet_strategy(
    domain_size: int,
    epsilon: float,
    *,
    noise_parties: int,
    contribution_bound: int = 1,
    params: PriveletParams = PriveletParams(),
) -> Generator[Measurement, IntArray, Summary]:
    """Privelet as a coroutine: one HaarCoefficients measurement, inverted by the analyst.

    Privacy: one measurement at `epsilon` with L1 sensitivity (1 + ceil(log2 n)) * c (a record
    changes the total and one detail per tree level by 1), under add/remove of one record (one
    person with at most c records); each noise party's draw alone gives this. This is
    Privelet's Lap((1 + log2 n) / eps) on the weighted Haar coefficients.
    """
    c = contribution_bound
    m = HaarCoefficients(domain_size, epsilon, (1 + haar_depth(domain_size)) * c)
    values = yield m
    var = noise_parties * m.noise_variance
    released = ReleasedValues(kind=m.kind, values=tuple(int(v) for v in values), variance=var, epsilon=epsilon)
    return Summary(
        domain_size=domain_size,
        epsilon=epsilon,
        strategy="privelet",
        noise_parties=noise_parties,
        contribution_bound=c,
        starts=(0,),
        sums=(int(values[-1]),),  # the released noisy total: a valid one-partition view
        sum_variance=(var,),
        epsilon_spent=((m.kind, epsilon),),
        params=asdict(params),
        estimator="haar_nonnegative" if params.nonnegative else "haar",
        released=(released,),
    )
