"""read_histogram from a pandas DataFrame as from a CSV; a summary's labelled frame and its plot (Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpagg import ContributionBounds, DomainSpec, read_histogram, write_sample_csv
from he_partition.core.errors import InvalidInputError
from he_partition.protocol import release

pd = pytest.importorskip("pandas")


def test_read_histogram_takes_a_dataframe_as_it_takes_the_csv(tmp_path: Path) -> None:
    path = tmp_path / "owner.csv"
    write_sample_csv(path, seed=1, n_records=500, owner_index=0)
    domain = DomainSpec.parse("age:0:100:50")
    bounds = ContributionBounds(2, 1)
    from_csv = read_histogram(path, domain, person_column="person_id", bounds=bounds, rng=7)
    from_frame = read_histogram(pd.read_csv(path, dtype=str), domain, person_column="person_id", bounds=bounds,
                                rng=7)
    assert np.array_equal(from_csv.counts, from_frame.counts)
    assert (from_frame.records_read, from_frame.records_dropped) == (from_csv.records_read, from_csv.records_dropped)
    typed = pd.read_csv(path)  # numbers as numbers: the same totals
    assert read_histogram(typed, domain, person_column="person_id", bounds=bounds, rng=7).total == from_csv.total
    typed.loc[3, "age"] = np.nan
    with pytest.raises(InvalidInputError, match="row 3 has a missing or bad value"):
        read_histogram(typed, domain)
    assert read_histogram(typed, domain, on_bad_value="drop").out_of_domain >= 1
    with pytest.raises(InvalidInputError, match="no value column 'years'"):
        read_histogram(typed, DomainSpec.parse("years:0:100:50"))


def _summary(strategy: str = "gap"):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    return release([rng.integers(0, 30, 50)], 1.0, strategy=strategy, rng=5)


def test_a_summary_frame_carries_value_labels_and_intervals() -> None:
    summary = _summary()
    domain = DomainSpec.parse("age:0:100:50")
    assert list(summary.to_pandas().columns) == ["start", "stop", "sum", "standard_error"]
    frame = summary.to_pandas(domain, confidence=0.95)
    assert list(frame.columns) == ["start", "stop", "value_lo", "value_hi", "label", "sum", "standard_error",
                                   "estimate", "ci_lo", "ci_hi", "confidence", "interval_method"]
    assert len(frame) == summary.n_partitions
    assert frame["value_lo"][0] == 0.0 and frame["value_hi"].iloc[-1] == 100.0
    assert (frame["ci_lo"] <= frame["estimate"]).all() and set(frame["interval_method"]) == {"exact"}
    with pytest.raises(InvalidInputError, match="the domain has 10 bins but the release has 50"):
        summary.to_pandas(DomainSpec.parse("age:0:100:10"))


@pytest.mark.parametrize("strategy", ["gap", "auto", "privelet"])
def test_summary_plot_draws_one_bar_per_partition(strategy: str) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = _summary(strategy)
    domain = DomainSpec.parse("age:0:100:50")
    ax = summary.plot(domain=domain, confidence=0.95)
    bars = summary.domain_size if summary.estimator.startswith("haar") else summary.n_partitions
    assert len(ax.patches) == bars
    assert ax.get_xlabel() == "age"
    lefts = sorted(p.get_x() for p in ax.patches)
    assert lefts[0] == 0.0 and max(p.get_x() + p.get_width() for p in ax.patches) == pytest.approx(100.0)
    heights = np.array([p.get_height() for p in sorted(ax.patches, key=lambda p: p.get_x())])
    widths = np.array([p.get_width() for p in sorted(ax.patches, key=lambda p: p.get_x())]) / 2.0  # bins per bar
    assert float(np.sum(heights * widths)) == pytest.approx(float(summary.estimate().sum()))
    plt.close(ax.figure)
