"""An owner that uploads other than one-hot-or-empty 0/1 indicator planes is refused, by name, before any join
cell is decrypted (he_partition.join.wellformed, parties.computation.join_checks, parties.decryption.join_checks).

On the code before the check, both malformed uploads below were released: a scaled indicator multiplied the other
owner's record at that position past the noise, and a two-hot position counted that record in two cells.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from he_partition.join.wellformed import check_rounds, residues
from parties.common.errors import ServiceError

from .conftest import Cluster, join_cells
from .test_join_services import SHAPE, _both, _open, _records


def _tamper(monkeypatch: pytest.MonkeyPatch, values: int, how: str) -> None:
    """Make the owner whose planes have `values` values upload malformed planes (the other owner is honest)."""
    import parties.data_owner.join as owner_join

    real = owner_join.encode_indicators

    def encode(placement: Any, value_of: Any, n_values: int, *args: Any) -> np.ndarray:
        planes = real(placement, value_of, n_values, *args)
        if n_values != values:
            return planes
        planes = planes.astype(np.int64)
        g, v, s = (int(i[0]) for i in np.nonzero(planes))  # one of its records
        if how == "two-hot":
            planes[g, (v + 1) % n_values, s] = 1
        else:
            planes[g, v, s] = int(how)
        return planes

    monkeypatch.setattr(owner_join, "encode_indicators", encode)


@pytest.mark.parametrize("owner,how", [("a", "1000"), ("a", "2"), ("b", "two-hot")])
def test_a_malformed_upload_is_refused_naming_its_owner(secure_cluster: Cluster, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, owner: str, how: str) -> None:
    c = secure_cluster
    _open(c)
    _tamper(monkeypatch, SHAPE[0] if owner == "a" else SHAPE[1], how)
    a, b, _ = _records()
    out = _both(c, "j1", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out  # the uploads themselves are ciphertexts
    with pytest.raises(ServiceError) as err:
        c.computation().run_release("j1", epsilon=2.5)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"owner {owner} is not well formed" in str(err.value), err.value
    honest = "b" if owner == "a" else "a"
    assert f"owner {honest}" not in str(err.value)
    st = c.computation().release_status(c.computation().study_status("j1").release_ids[-1])
    assert st.state == "FAILED" and st.error_code == "FAILED_PRECONDITION" and st.summary is None
    assert c.analyst().list_releases("j1") == []  # nothing released
    assert [ch.kind for ch in c.decryption().budget("j1").charges] == ["join_padding"]  # nothing charged
    with pytest.raises(ServiceError) as err:  # again: the key holder keeps the failure
        c.computation().run_release("j1", epsilon=2.5)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and f"owner {owner}" in str(err.value)


def test_the_key_holder_decrypts_no_join_cell_before_both_owners_passed(cluster: Cluster) -> None:
    """A computation server that skips the check, checks one owner only, or uses coefficients of its own choice
    gets no join cell decrypted and nothing charged."""
    j = join_cells(cluster, (7, 0, 3, 1))
    contract, ds, scheme, cells, m = j.contract, j.decryption, j.scheme, j.cells, j.measurement

    def decrypt() -> Any:
        return ds.decrypt_join_cells(study_id="j1", release_id="r1", release_epsilon=1.0, measurement=m,
                                     contract_hash=contract.contract_hash, cells=cells, cell_count=4)

    def check(owner: str, seed: bytes, sent_seed: bytes | None = None) -> bool:
        empty = [[scheme.serialize(scheme.encrypt([0])) for _ in range(2)]]
        return ds.check_join_upload(study_id="j1", contract_hash=contract.contract_hash, owner_id=owner,
                                    seed=seed if sent_seed is None else sent_seed,
                                    residues=residues(scheme, empty, seed, owner))

    with pytest.raises(ServiceError) as err:  # skipped
        decrypt()
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "has not passed" in str(err.value)
    with pytest.raises(ServiceError) as err:  # coefficients of the computation server's own choice
        check("a", b"\x01" * 32)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "seed" in str(err.value)
    seed, rounds = ds.join_check_seed(study_id="j1", contract_hash=contract.contract_hash)
    assert len(seed) == 32 and rounds == check_rounds(scheme.plain_modulus) == 6
    assert ds.join_check_seed(study_id="j1", contract_hash=contract.contract_hash) == (seed, rounds)
    assert check("a", seed)
    with pytest.raises(ServiceError) as err:  # one owner only
        decrypt()
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "owner b has not passed" in str(err.value)
    with pytest.raises(ServiceError) as err:
        check("c", seed)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert ds.budget("j1").charges[-1].kind == "join_padding"
    assert check("b", seed)
    assert len(decrypt().values) == 4


def test_a_second_release_reuses_the_pass_until_the_key_holder_chooses_a_new_seed(cluster: Cluster,
                                                                                  tmp_path: Path) -> None:
    """The computation server skips the check when both uploads passed under the key holder's current seed, and
    checks again once the key holder has a new one (after its restart it refuses cells until then)."""
    from .test_join_services import _both, _open, _records

    c = cluster
    _open(c, epsilon=6.0)
    a, b, _ = _records()
    assert all(getattr(r, "committed", False) for r in _both(c, "j1", a, b, tmp_path).values())
    checks: list[str] = []

    def count(client: Any) -> None:
        real = client.check_join_upload

        def recording(**kw: Any) -> bool:
            checks.append(kw["owner_id"])
            ok: bool = real(**kw)
            return ok

        client.check_join_upload = recording

    count(c.cs.handler.decryption)
    assert c.computation().run_release("j1", epsilon=1.0).state == "DONE"
    assert sorted(checks) == ["a", "b"]
    assert c.computation().run_release("j1", epsilon=1.0).state == "DONE"
    assert sorted(checks) == ["a", "b"]  # the same seed: not checked again
    c.restart_ds()  # a new seed: the key holder refuses join cells until both owners pass again
    assert c.computation().run_release("j1", epsilon=1.0).state == "DONE"
    assert sorted(checks) == ["a", "a", "b", "b"]
