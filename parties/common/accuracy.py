"""A study's accuracy preview: the error a release of its terms will carry, before any budget is spent.

The contract fixes everything the error depends on (domain size, strategy and its params, epsilon, the
person bound, the noise draws per value); `he_partition.methods.accuracy` runs the strategy's design
on no data. Nothing is measured, no noise is drawn, no budget is spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from he_partition.methods.accuracy import AccuracyPreview, accuracy_preview

if TYPE_CHECKING:
    from .contract import StudyContract

__all__ = ["study_accuracy"]


def _noise_draws(contract: "StudyContract") -> float:
    """Noise variance per released value in draws of its scale: the CS's draw plus the key holders' K/(K - T)
    (K from the contract's holders; where it lists none, the fewest holders T allows, K = T + 1: the most
    noise, so the preview does not promise less error than the release has)."""
    if not contract.noise_tolerates:
        return float(contract.noise_parties)
    k = len(contract.holder_seal_keys) or contract.noise_tolerates + 1
    return contract.noise_parties - 1 + contract.holder_noise_variance(k)


def study_accuracy(contract: "StudyContract", *, epsilon: float | None = None, lengths: Sequence[int] | None = None,
                   confidence: float = 0.95) -> AccuracyPreview:
    """The preview of a release of `epsilon` (default: the study's whole budget) under `contract`'s terms:
    its strategy and params, its DP epsilon (a study with correlated records is noised at eps / (1 + L)),
    its person bound and its noise draws. `lengths`: range lengths in bins (default: 1 bin, a tenth and half of
    the domain). Raises InvalidInputError for a strategy that chooses its partition from the data (gap, dawa)."""
    eps = contract.epsilon if epsilon is None else epsilon
    return accuracy_preview(contract.domain_size, contract.dp_epsilon(eps), lengths, strategy=contract.strategy,
                            confidence=confidence, noise_parties=contract.noise_parties,
                            contribution_bound=contract.person_bound, params=contract.strategy_params or None,
                            noise_draws=_noise_draws(contract))
