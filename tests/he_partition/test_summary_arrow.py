"""The summary's Arrow IPC form: an exact round trip, files pandas reads, no-copy DataFrames, bad files refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from he_partition import release
from he_partition.core import summary_arrow
from he_partition.core.errors import InvalidInputError
from he_partition.core.summary import Summary
from he_partition.core.summary_arrow import (PARTITIONS_FILE, RELEASED_FILE, read_summary, read_summary_files,
                                             summary_buffers, write_summary_files)


@pytest.mark.parametrize("strategy", ["gap", "hier", "privelet", "auto"])
def test_the_arrow_round_trip_is_the_json_round_trip(strategy, tmp_path):
    x = np.random.default_rng(1).integers(0, 9, 300)
    s = release([x], 0.7, strategy=strategy, rng=3)
    from_json = Summary.from_json(s.to_json())
    for back in (summary_arrow.summary_tables(s).to_summary(), read_summary(*summary_buffers(s))):
        assert back == s == from_json
        assert back.to_json() == s.to_json()  # the same document, byte for byte
        assert np.array_equal(back.estimate(), s.estimate())
    size = write_summary_files(s, tmp_path / "rel")
    assert size == sum((tmp_path / "rel" / f).stat().st_size for f in (PARTITIONS_FILE, RELEASED_FILE))
    assert read_summary_files(tmp_path / "rel") == s
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel"]  # no temporary directory left behind


def test_big_integers_floats_and_params_survive(tmp_path):
    s = Summary(domain_size=5, epsilon=0.1 + 0.2, strategy="gap", noise_parties=3, starts=(0, 2, 3),
                sums=(-(1 << 62), 0, (1 << 63) - 1), sum_variance=(1e-300, 2.0 / 3.0, 5e300),
                epsilon_spent=(("partition_sums", 0.1 + 0.2),), params={"a": [1, {"b": None}], "é": "ü"})
    back = read_summary(*summary_buffers(s))
    assert back == s and back.to_json() == s.to_json()
    with pytest.raises(InvalidInputError, match="int64"):
        summary_buffers(Summary(domain_size=2, epsilon=1.0, strategy="gap", noise_parties=1, starts=(0,),
                                sums=(1 << 63,), sum_variance=(1.0,)))


def test_pandas_reads_the_file_and_the_sdk_frame_shares_the_arrow_buffers(tmp_path):
    pd = pytest.importorskip("pandas")
    s = release([np.arange(64)], 1.0, strategy="gap", rng=5)
    write_summary_files(s, tmp_path / "rel")
    frame = pd.read_feather(tmp_path / "rel" / PARTITIONS_FILE)
    assert frame["start"].tolist() == list(s.starts) and frame["sum"].tolist() == list(s.sums)
    back = read_summary_files(tmp_path / "rel")
    df = back.to_pandas()
    assert df.equals(s.to_pandas())
    mapped = back._arrow.partitions.column("sum").chunk(0).to_numpy(zero_copy_only=True)
    assert np.shares_memory(df["sum"].to_numpy(), mapped)  # the DataFrame's column is the mapped file's buffer


def test_files_that_disagree_with_their_head_are_refused():
    x = np.random.default_rng(4).integers(0, 9, 128)
    s = release([x], 0.7, strategy="hier", rng=3)
    parts, rel = summary_buffers(s)
    with pytest.raises(InvalidInputError, match="not an Arrow IPC file"):
        read_summary(b"not arrow", rel)
    with pytest.raises(InvalidInputError, match="released.arrow is needed"):
        read_summary(parts)
    table = summary_arrow.summary_tables(s)
    with pytest.raises(InvalidInputError, match="rows"):
        read_summary(table.partitions.slice(1), table.released)
    with pytest.raises(InvalidInputError, match="do not match"):
        read_summary(table.partitions, table.released.slice(1))
    with pytest.raises(InvalidInputError, match="head"):
        read_summary(table.partitions.replace_schema_metadata({}), table.released)
    with pytest.raises(InvalidInputError, match="int64 column 'sum'"):
        bad = table.partitions.set_column(1, "sum", pa.array(np.zeros(s.n_partitions), type=pa.float64()))
        read_summary(bad, table.released)
