"""A join study through the real services with mutual TLS: two owners, placement, signed uploads, release, queries."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.join.protocol import JoinKeyPair
from parties.common.errors import ServiceError
from parties.common.join_keys import sign_join_key
from parties.data_owner.join import submit_join

from .conftest import Cluster

SHAPE = (4, 3)
TERMS = {"shape": list(SHAPE), "capacity": 8192, "padding_epsilon": 0.5, "padding_offset": 86}  # delta <= 1e-6


def _open(c: Cluster, study_id: str = "j1", epsilon: float = 3.0) -> Any:
    return c.open_study(study_id=study_id, domain_size=SHAPE[0] * SHAPE[1], epsilon=epsilon, owners=("a", "b"),
                        strategy="join", strategy_params_json=json.dumps(TERMS))


def _records(seed: int = 1) -> tuple[dict[str, int], dict[str, int], np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = [f"cust-{i}@example.org" for i in range(1500)]
    a = {i: int(rng.integers(SHAPE[0])) for i in ids[:1000]}
    b = {i: int(rng.integers(SHAPE[1])) for i in ids[500:]}
    truth = np.zeros(SHAPE, dtype=np.int64)
    for i in set(a) & set(b):
        truth[a[i], b[i]] += 1
    return a, b, truth


def _both(c: Any, study_id: str, a: dict[str, int], b: dict[str, int], tmp: Path,
          max_partner_records: int = 8192, key_holders: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Both owners' submit_join in threads. Each accepts a partner quota up to `max_partner_records` (plus the
    dummies' allowance): TERMS declares no counts, so each quota is the capacity, 8,192, above the default 4 x
    1,000 records. `key_holders(owner)`: that owner's clients of the key-share holders (a study at holders)."""
    out: dict[str, Any] = {}

    def run(owner: str, records: dict[str, int]) -> None:
        try:
            out[owner] = submit_join(c.owner(owner), study_id, records, idempotency_key=f"k-{owner}",
                                     state_dir=tmp / owner, wait_timeout=120, poll_interval=0.05,
                                     max_partner_records=max_partner_records,
                                     key_holders=key_holders(owner) if key_holders else None)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            out[owner] = exc

    threads = [threading.Thread(target=run, args=("a", a)), threading.Thread(target=run, args=("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def test_a_join_study_end_to_end(secure_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """...with owner b's list posted in parts of 300 pseudonyms (a long list never travels in one message)."""
    import parties.data_owner.join as owner_join

    c = secure_cluster
    contract = _open(c)
    assert contract.is_join and contract.join_terms().shape == SHAPE
    budget = c.decryption().budget("j1")
    assert budget.spent == pytest.approx(0.5)  # the padding epsilon is booked when the study opens
    a, b, truth = _records()
    monkeypatch.setattr(owner_join, "PART_PSEUDONYMS", 300)
    out = _both(c, "j1", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out
    stored = {p.name for p in (c.root / "cs" / "join" / "j1").iterdir()}
    assert {"a.parts", "a.part0", "a.part3", "b.parts"} <= stored  # ~1,260 pseudonyms each: 5 parts
    # What the CS stores: sorted lists (nothing of the file order), and more than the shared dummies besides
    # the records: |A list| - |A| is not matched - |A n B|, so a public |A| does not give the shared dummy count.
    held = {o: (c.root / "cs" / "join" / "j1" / f"{o}.pseudonyms").read_bytes() for o in "ab"}
    lists = {o: [v[i:i + 32] for i in range(0, len(v), 32)] for o, v in held.items()}
    assert all(v == sorted(v) for v in lists.values())
    matched = len(set(lists["a"]) & set(lists["b"]))
    assert len(lists["a"]) - len(a) > matched - int(truth.sum()) > 0
    assert not any(list((tmp_path / o).glob("*.join-x25519.key")) for o in "ab")  # owners deleted the X25519 key
    release = c.computation().run_release("j1", epsilon=2.5)
    assert release.state == "DONE"
    kept = sorted(p.name for p in (c.root / "cs" / "join" / "j1").iterdir())
    assert kept == ["released"], kept  # keys, signatures, lists and placements deleted when the release started
    with pytest.raises(ServiceError) as err:
        c.owner("a").computation.join_placement("j1", "a", bytes(range(32)))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "has been released" in str(err.value)
    summary = c.analyst().get_release(release.release_id).summary
    table = np.array(summary.sums).reshape(SHAPE)
    sd = np.sqrt(summary.sum_variance[0])
    assert np.all(np.abs(table - truth) <= 8 * sd), (table, truth)
    assert summary.params["join"]["shape"] == list(SHAPE)
    row0 = c.analyst().range_counts(release.release_id, [(0, SHAPE[1])])[0]  # row 0 of the table, row-major
    assert row0.value == pytest.approx(table[0].sum())
    charges = c.decryption().budget("j1").charges
    assert [(ch.kind, ch.epsilon) for ch in charges] == [("join_padding", 0.5), ("partition_sums", 2.5)]
    again = _both(c, "j1", a, b, tmp_path)  # a re-run finds the committed uploads: nothing is sent twice
    assert all(r.duplicate for r in again.values()), again


def test_a_join_table_released_with_a_partition_strategy_along_the_hilbert_curve(secure_cluster: Cluster,
                                                                                 tmp_path: Path) -> None:
    """release "gap", order "hilbert": noisy gaps choose the partitions, their sums are the plaintext join's sums
    over the same bins (within error bars), the ledger books the strategy's two measurements, and the key holder
    refuses measurements the study's release does not make."""
    from he_partition.join.release import bin_cells, cell_table
    from he_partition.core.measurements import HaarCoefficients, PartitionSums, PrefixDifferences

    from .conftest import CS_ID

    c = secure_cluster
    terms = {**TERMS, "shape": [4, 4], "release": "gap", "order": "hilbert"}
    c.open_study(study_id="jg", domain_size=16, epsilon=3.0, owners=("a", "b"), strategy="join",
                 strategy_params_json=json.dumps(terms))
    rng = np.random.default_rng(4)
    ids = [f"cust-{i}" for i in range(1500)]
    a = {i: int(rng.integers(2)) for i in ids[:1000]}  # only rows 0-1 and columns 0-1: a block of the curve
    b = {i: int(rng.integers(2)) for i in ids[500:]}
    truth = np.zeros((4, 4), dtype=np.int64)
    for i in set(a) & set(b):
        truth[a[i], b[i]] += 1
    out = _both(c, "jg", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out
    release = c.computation().run_release("jg", epsilon=2.5)
    assert release.state == "DONE", release
    s = c.analyst().get_release(release.release_id).summary
    assert s.strategy == "gap" and s.params["join"]["order"] == "hilbert"
    flat = truth.ravel()[bin_cells(c.computation().study_status("jg").contract.join_terms())]
    ends = [*s.starts[1:], 16]
    for lo, hi, v, var in zip(s.starts, ends, s.sums, s.sum_variance):
        assert abs(v - int(flat[lo:hi].sum())) <= 8 * np.sqrt(var), (lo, hi, v)
    est, _ = cell_table(s)
    assert est.shape == (4, 4) and abs(est[2:, :].sum() + est[:, 2:].sum()) < 80  # the empty part stays small
    charges = c.decryption().budget("jg").charges
    assert [ch.kind for ch in charges] == ["join_padding", "prefix_differences", "partition_sums"]
    assert sum(ch.epsilon for ch in charges[1:]) == pytest.approx(2.5)
    contract = c.computation().study_status("jg").contract
    cs = c.decryption(CS_ID, "computation")
    bad = [(HaarCoefficients(16, 0.1, 5), grpc.StatusCode.FAILED_PRECONDITION, "not used by join study"),
           (PartitionSums(16, 0.1, 1, starts=(0, 8)), grpc.StatusCode.RESOURCE_EXHAUSTED, "has 0 left"),
           (PrefixDifferences(16, 0.01, 1), grpc.StatusCode.INVALID_ARGUMENT, "sensitivity"),
           (PartitionSums(12, 0.01, 1, starts=(0,)), grpc.StatusCode.INVALID_ARGUMENT, "domain_size")]
    for m, code, text in bad:
        with pytest.raises(ServiceError) as err:
            cs.decrypt_join_cells(study_id="jg", release_id="r-bad", release_epsilon=m.epsilon,
                                  contract_hash=contract.contract_hash, cells=[b"x"] * m.count, cell_count=m.count,
                                  measurement=m)
        assert err.value.code == code and text in str(err.value), (m.kind, err.value)
    assert len(c.decryption().budget("jg").charges) == 3  # nothing was charged


def test_join_requests_that_break_the_rules_are_refused(secure_cluster: Cluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    c = secure_cluster
    contract = _open(c)
    cs_a = c.owner("a").computation
    key = JoinKeyPair().public_bytes
    sign = c.signing_key("a")[0]
    assert cs_a.join_exchange("j1", "a", key, sign_join_key(sign, contract, "a", key)) == (b"", b"")  # b not yet
    other = JoinKeyPair().public_bytes
    with pytest.raises(ServiceError) as err:
        cs_a.join_exchange("j1", "a", other, sign_join_key(sign, contract, "a", other))
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS and "if it is lost, ask the operator" in str(err.value)
    with pytest.raises(ServiceError) as err:
        cs_a.join_exchange("j1", "b", key)  # in another owner's name
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(ServiceError) as err:  # more than the capacity: refused at once, not after b posts
        cs_a.join_placement("j1", "a", b"".join(i.to_bytes(32, "big") for i in range(8193)))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "alone do not fit" in str(err.value)
    with pytest.raises(ServiceError) as err:  # in file order, not sorted: refused, it could show the file's order
        cs_a.join_placement("j1", "a", bytes(range(1, 33)) + bytes(range(32)))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "sorted" in str(err.value)
    for part, parts in ((2, 2), (-1, 3), (0, 65), (1, 0)):
        with pytest.raises(ServiceError) as err:
            cs_a.join_placement("j1", "a", bytes(range(32)), part=part, parts=parts)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "part" in str(err.value), (part, parts)
    cs_a.join_placement("j1", "a", bytes(range(1, 33)), part=0, parts=2)  # two parts out of order together
    with pytest.raises(ServiceError) as err:
        cs_a.join_placement("j1", "a", bytes(range(32)), part=1, parts=2)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "sorted" in str(err.value)
    with pytest.raises(ServiceError) as err:
        cs_a.join_placement("j1", "a", b"x" * 64)  # the same pseudonym twice
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert cs_a.join_placement("j1", "a", bytes(range(32)) + bytes(range(1, 33))) == (False, [], 8192)
    with pytest.raises(ServiceError) as err:
        cs_a.join_placement("j1", "a", bytes(range(2, 34)))
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(ServiceError) as err:  # an upload before the placement exists
        c.owner("b").upload(_fake_upload(contract), idempotency_key="early")
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ServiceError) as err:
        c.computation().direct_range_counts("j1", [(0, 2)], 0.1)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ServiceError) as err:
        c.computation().run_release("j1", epsilon=1.0, force=True)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT

    # A placement that puts two records at one position is refused by the owner before anything is encrypted.
    _open(c, "j2")
    from parties.computation.join import JoinCoordinator

    real = JoinCoordinator.placement

    def doubled(self: JoinCoordinator, *args: Any, **kw: Any) -> tuple[bool, list[int], int]:
        ready, positions, capacity = real(self, *args, **kw)
        return ready, ([positions[0]] * len(positions) if ready else positions), capacity

    monkeypatch.setattr(JoinCoordinator, "placement", doubled)
    a, b, _ = _records(2)
    out = _both(c, "j2", a, b, tmp_path)
    assert all(isinstance(e, InvalidInputError) and "two records at one position" in str(e) for e in out.values())
    assert c.computation().study_status("j2").submitted_owners == ()


def test_a_cs_that_substitutes_a_join_key_is_refused(secure_cluster: Cluster, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay hands each owner its own X25519 key instead of the other owner's: both owners refuse it (the
    signature does not check against the contract's key for the other owner) before posting any pseudonym. And
    the CS itself refuses a join key without the owner's signature."""
    from parties.common.signing import SignatureError
    from parties.computation.join import JoinCoordinator

    c = secure_cluster
    contract = _open(c, "jk")
    cs_a = c.owner("a").computation
    key = JoinKeyPair().public_bytes
    for signature in (b"", sign_join_key(c.signing_key("b")[0], contract, "a", key)):  # none; b's key signing
        with pytest.raises(ServiceError) as err:
            cs_a.join_exchange("jk", "a", key, signature)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED and "not signed by the key" in str(err.value) \
            or "no valid signature" in str(err.value), err.value
    attacker = JoinKeyPair().public_bytes
    real = JoinCoordinator.exchange

    def substituted(self: JoinCoordinator, *args: Any) -> tuple[bytes, bytes]:
        peer, signature = real(self, *args)
        return (attacker, signature) if peer else (peer, signature)

    monkeypatch.setattr(JoinCoordinator, "exchange", substituted)
    a, b, _ = _records(3)
    out = _both(c, "jk", a, b, tmp_path)
    assert all(isinstance(e, SignatureError) and "substituted" in str(e) for e in out.values()), out
    assert not list((c.root / "cs" / "join" / "jk").glob("*.pseudonyms"))  # nothing was posted


def _fake_upload(contract: Any) -> Any:
    from parties.data_owner.client import EncryptedHistogram

    return EncryptedHistogram(contract.study_id, contract.domain_size, contract.context_fingerprint,
                              (b"\0" * 16,) * 3, contract.contract_hash, True)


def test_a_join_study_through_the_cli(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from parties.cli import main
    from parties.common.signing import save_private_key

    conn = ["--computation", cluster.cs.target, "--insecure"]
    keys = {o: cluster.signing_key(o) for o in ("bank", "shop")}
    for o, (private, _) in keys.items():
        save_private_key(tmp_path / f"{o}.signing.key", private)
    signed = [arg for o, (_, public) in keys.items() for arg in ("--owner-key", f"{o}={public.hex()}")]
    too_many = ["open-join", "--study-id", "jc", "--owners", "bank,shop", "--rows", "age:0:100:4", "--cols",
                "spend:categories:low,mid,high", "--max-records", "2100000,2100000", "--epsilon", "2", *signed, *conn]
    assert main(too_many) != 0  # sized and refused before the study opens: nothing is booked
    assert "above the 4128768 whose counts still decode (join scheme version 2" in capsys.readouterr().err
    with pytest.raises(ServiceError):
        cluster.computation().study_status("jc")
    assert main(["open-join", "--study-id", "jc", "--owners", "bank,shop", "--rows", "age:0:100:4",
                 "--cols", "spend:categories:low,mid,high", "--id-column", "email", "--max-records", "400,400",
                 "--epsilon", "2", "--padding-epsilon", "0.2", "--release", "dawa", *signed, *conn]) == 0
    assert "4 x 3 table" in capsys.readouterr().out
    assert cluster.computation().study_status("jc").contract.join_terms().order == "row"  # 4 x 3: no Hilbert curve
    stated = cluster.computation().study_status("jc").contract.strategy_params  # delta is in the signed contract
    assert stated["padding_offset"] == 214 and 0 < stated["padding_delta"] <= 1e-6
    assert stated["join_version"] == 2  # new studies get the current join scheme (23-bit plain modulus)
    rng = np.random.default_rng(6)
    emails = [f"Person{i}@Example.org" for i in range(600)]
    bank = tmp_path / "bank.csv"
    bank.write_text("email,age\n" + "".join(f"{e},{rng.integers(0, 100)}\n" for e in emails[:400]))
    shop = tmp_path / "shop.csv"  # the same people, written differently: the join normalizes identifiers
    shop.write_text("email,spend\n" + "".join(f" {e.lower()} ,{rng.choice(['low', 'mid', 'high'])}\n"
                                              for e in emails[200:]))
    codes: dict[str, int] = {}

    def submit(owner: str, csv: Path, *bound: str) -> None:
        codes[owner] = main(["join-submit", "--study", "jc", "--owner", owner, "--csv", str(csv), "--state-dir",
                             str(tmp_path / owner), "--wait", "120", "--signing-key",
                             str(tmp_path / f"{owner}.signing.key"), "--decryption", cluster.ds.target, *bound, *conn])

    quota = 400 + 2 * stated["padding_offset"]  # shop's declared 400 records and its dummies' allowance
    submit("bank", bank, "--max-partner-records", "399")  # bank accepts less than shop declared: nothing is sent
    err = capsys.readouterr().err
    assert codes["bank"] == 1 and "the other owner shop: declared 400 records, quota " + f"{quota:,}" in err, err
    assert "refusing to take part in join study jc" in err and "--max-partner-records 400" in err, err
    assert not (cluster.root / "cs" / "join" / "jc").exists()  # nothing posted to the computation server

    threads = [threading.Thread(target=submit, args=("bank", bank)), threading.Thread(target=submit,
                                                                                        args=("shop", shop))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert codes == {"bank": 0, "shop": 0}, capsys.readouterr().err
    assert main(["release", "run", "jc", "--epsilon", "rest", "--state-dir", str(tmp_path / "op"), *conn]) == 0
    capsys.readouterr()
    assert main(["query", "latest", "--study", "jc", "--analyst", cluster.cs.target, "--insecure"]) == 0
    out = capsys.readouterr().out
    assert "joint table, 4 rows (age:0:100:4) x 3 columns (spend:categories:low,mid,high): dawa partitions" in out
    lines = out.strip().splitlines()
    assert lines[-5].split() == ["spend", "in", "{low}", "spend", "in", "{mid}", "spend", "in", "{high}"]
    labels = ["age in [0, 25)", "age in [25, 50)", "age in [50, 75)", "age in [75, 100)"]
    assert all(line.startswith(label + " ") for line, label in zip(lines[-4:], labels)), lines[-4:]
    table = np.array([[int(v) for v in line.split()[-3:]] for line in lines[-4:]])
    assert table.shape == (4, 3) and abs(int(table.sum()) - 200) < 60  # 200 shared people, noisy cells
    assert main(["query", "latest", "--study", "jc", "--json", "--analyst", cluster.cs.target, "--insecure"]) == 0
    whole = json.loads(capsys.readouterr().out)["join_table"]
    assert np.round(whole["estimate"]).astype(int).tolist() == table.tolist()
    assert whole["row_labels"][3] == "age in [75, 100)" and whole["col_labels"] == ["spend in {low}",
                                                                                    "spend in {mid}", "spend in {high}"]
    assert np.asarray(whole["standard_error"]).shape == (4, 3) and 0 < whole["padding_delta"] <= 1e-6
    assert main(["status", "jc", "--computation", cluster.cs.target, "--insecure"]) == 0
    assert "join table 4 x 3: rows age:0:100:4, columns spend:categories:low,mid,high; capacity 8192" in \
        capsys.readouterr().out


def test_a_version_1_study_keeps_its_key_and_releases_next_to_a_version_2_study(cluster: Cluster,
                                                                                tmp_path: Path) -> None:
    """A contract that names no join_version (one opened before versions existed) stays on version 1: the
    join_secret.bin / join_public.bin, loaded again after a restart; a version 2 study gets join_v2_*.bin. Each
    join study has its own key pair (keys/studies/STUDY/). Both release their tables, and neither key serves the
    other's study."""
    from he_partition.he.bfv import context_fingerprint
    from parties.data_owner.join import _scheme

    c = cluster
    old = _open(c, "jv1")
    new = c.open_study(study_id="jv2", domain_size=SHAPE[0] * SHAPE[1], epsilon=3.0, owners=("a", "b"),
                       strategy="join", strategy_params_json=json.dumps({**TERMS, "join_version": 2}))
    assert (old.join_terms().version, new.join_terms().version) == (1, 2)
    keys = c.root / "ds" / "keys"
    assert old.context_fingerprint == context_fingerprint((keys / "studies" / "jv1" / "join_public.bin").read_bytes())
    assert new.context_fingerprint == context_fingerprint((keys / "studies" / "jv2" / "join_v2_public.bin")
                                                          .read_bytes())
    assert (keys / "studies" / "jv2" / "join_v2_secret.bin").stat().st_mode & 0o077 == 0
    c.restart_ds()  # the keys come back from the files
    a, b, truth = _records(5)
    for study in ("jv1", "jv2"):
        out = _both(c, study, a, b, tmp_path / study)
        assert all(getattr(r, "committed", False) for r in out.values()), out
        assert _scheme(c.owner("a"), c.computation().study_status(study).contract).params.version == int(study[-1])
        release = c.computation().run_release(study, epsilon=2.5)
        summary = c.analyst().get_release(release.release_id).summary
        table = np.array(summary.sums).reshape(SHAPE)
        assert np.all(np.abs(table - truth) <= 8 * np.sqrt(summary.sum_variance[0])), (study, table, truth)


def test_an_unsigned_join_study_is_refused_even_on_an_insecure_server(cluster: Cluster,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Without the owners' signing keys the X25519 join keys would be exchanged unauthenticated (the computation
    server could substitute its own): the key holder refuses to open such a study, and nothing is booked."""
    from parties.cli import main

    before = cluster.snapshot()
    with pytest.raises(ServiceError) as err:
        cluster.open_study(study_id="ju", domain_size=12, epsilon=3.0, owners=("a", "b"), strategy="join",
                           strategy_params_json=json.dumps(TERMS), signed=False)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "a join study must be signed" in str(err.value)
    assert main(["open-join", "--study-id", "ju", "--owners", "a,b", "--rows", "x:0:4:4", "--cols", "y:0:3:3",
                 "--capacity", "8192", "--epsilon", "2", "--computation", cluster.cs.target, "--insecure"]) != 0
    assert "a join study must be signed" in capsys.readouterr().err
    assert cluster.snapshot() == before


def test_the_computation_server_fetches_the_join_key_at_the_key_exchange(secure_cluster: Cluster) -> None:
    """The first key exchange starts the CS's fetch of the study's join key (checked against the contract), so the
    owners' uploads do not wait for it; later needs take the fetched key (one fetch, not one per upload)."""
    c = secure_cluster
    contract = _open(c)
    joins = c.cs.handler.joins
    fp = contract.context_fingerprint
    assert fp not in joins._schemes
    key = JoinKeyPair().public_bytes
    c.owner("a").computation.join_exchange("j1", "a", key, sign_join_key(c.signing_key("a")[0], contract, "a", key))
    deadline = time.monotonic() + 60
    while fp not in joins._schemes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fp in joins._schemes  # fetched before any upload asked for it

    def refetch(study_id: str) -> bytes:
        raise AssertionError(f"the join key of {study_id} was fetched again")

    assert joins.scheme(contract, refetch) is joins._schemes[fp][1]
