"""What the CLI says about a threshold deployment's key holders: how many answer each measurement, and what the
study's `noise_tolerates` buys and costs in those numbers (open-study, status)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..common.contract import StudyContract

__all__ = ["holder_counts", "noise_tolerates_line"]


def holder_counts(cs: Any, contract: "StudyContract") -> tuple[int, int]:
    """(K, holders answering each measurement) from the study's status; (0, 0) where the server does not say."""
    from ..common.errors import ServiceError

    try:
        st = cs.study_status(contract.study_id)
    except ServiceError:
        return 0, 0
    return st.key_holders, st.holders_per_measurement


def noise_tolerates_line(contract: "StudyContract", key_holders: int = 0, per_measurement: int = 0) -> str:
    """What noise_tolerates T buys and costs, in this deployment's numbers: m holders answer each measurement (t of
    a t-of-N key, else all K), each drawing its share so that any m - T of them sum to one full draw, m/(m - T)
    draws' variance in all. Without the numbers (a server that does not say them) the rule in letters."""
    t = contract.noise_tolerates
    coalition = f"{t} holder{'' if t == 1 else 's'}"
    m = per_measurement
    if m <= t:
        return (f"key holders' noise tolerates {t} colluding holder{'' if t == 1 else 's'}: each of the m holders "
                f"answering a measurement (t of a t-of-N key, else all K) draws a share such that any m - {t} of the "
                f"shares add up to one full discrete Laplace draw, so the computation server with {coalition} still "
                f"faces one full draw; cost: the holders' noise variance is m/(m - {t}) draws, each released "
                f"value's 1 + m/(m - {t}) draws instead of 2")
    who = (f"each of the {m} holders that answer a measurement (any {m} of the {key_holders}: a "
           f"{m}-of-{key_holders} key)" if 0 < m < key_holders else f"each of the {m} holders")
    factor = m / (m - t)
    share = ("a whole discrete Laplace draw as its share" if m - t == 1 else
             f"a share such that any {m - t} of the shares add up to one full discrete Laplace draw")
    return (f"key holders' noise tolerates {t} colluding holder{'' if t == 1 else 's'}: {who} draws {share}, so "
            f"the computation server with {coalition} still faces one full draw; cost: the holders' noise variance "
            f"is {m}/{m - t} = {factor:g} draws, each released value's {1 + factor:g} draws instead of 2")
