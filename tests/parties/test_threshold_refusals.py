"""K = 3 key-share holders through real services: what a deviating computation server, a rogue key or
malformed input gets (nothing), the refusals of the full-key RPCs and of joins, and the CLI processes."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from he_partition.core.measurements import Measurement
from parties.common.errors import ServiceError
from tests.parties.conftest import CS_ID, FAST_RETRY, approved
from tests.parties.test_threshold_services import (DOMAIN, HOLDERS, OWNERS, Threshold, _histograms, _spent, _Spy,
                                                   threshold)

__all__ = ["threshold"]  # the fixture, imported for the tests here


def _as_computation_server(t: Threshold, i: int) -> Any:
    """A client of holder i with the computation server's certificate (a deviating CS, played by the test)."""
    from parties.decryption.keyshare.client import KeyShareClient
    c = KeyShareClient(HOLDERS[i], t.holders[i].target, retry=FAST_RETRY, tls=t.pki.tls(CS_ID, "computation"))
    t.clients.append(c)
    return c


def test_an_identical_request_gets_identical_shares_charged_once_and_wrong_shares_are_refused(
        threshold: Threshold) -> None:
    threshold.open_and_submit("s-share")
    spy = _Spy(threshold.combiner)
    assert threshold.computation().run_release("s-share", epsilon=0.5).state == "DONE"
    kw, values = spy.calls[0]
    h1 = _as_computation_server(threshold, 0)
    ask = {k: kw[k] for k in ("study_id", "release_id", "release_epsilon", "measurement", "chunk_count")}
    ask["contract_hash"] = kw["contract_hash"]
    first = h1.issue_shares(**ask)  # the very same request (a retry after a lost reply): the same shares, no charge
    again = h1.issue_shares(**ask)
    assert first.repeated and again.repeated and first.shares == again.shares
    assert _spent(threshold, 0, "s-share") == pytest.approx(0.5)
    with pytest.raises(ServiceError) as err:  # a request that carries ciphertexts: the holder takes none
        h1.issue_shares(**ask, chunks=kw["chunks"])
    assert err.value.code.name == "INVALID_ARGUMENT" and "header only" in err.value.details
    assert _spent(threshold, 0, "s-share") == pytest.approx(0.5)
    # a combiner handed holder h1's share in holder h2's place refuses to combine
    from he_partition.core.errors import InvalidInputError
    from he_partition.he.threshold.context import vector_ciphertext
    from he_partition.he.threshold.decrypt import combine
    shares = [_as_computation_server(threshold, i).issue_shares(**ask).shares[0] for i in range(3)]
    ct = vector_ciphertext(kw["chunks"][0])
    fp = bytes.fromhex(threshold.holders[0].handler.study_key("s-share").fingerprint)
    with pytest.raises(InvalidInputError, match="duplicate"):
        combine(threshold.combiner._template, ct, [shares[0], shares[0], shares[2]], [0, 1, 2], fp, bound_to_c1=True)
    # the shares are bound to the chunk's signed c1: a ciphertext with any other c1 does not combine with them
    from he_partition.he.bfv import BfvBackend, load_context
    be = BfvBackend(load_context(threshold.combiner.public_context(study_id="s-share")))
    other = be.serialize_chunk(be.deserialize_chunk(kw["chunks"][0]) + be.encrypt(np.zeros(8192, np.int64)).chunks[0])
    with pytest.raises(InvalidInputError, match="for another ciphertext"):
        combine(threshold.combiner._template, vector_ciphertext(other), shares, [0, 1, 2], fp, bound_to_c1=True)
    assert np.asarray(combine(threshold.combiner._template, ct, shares, [0, 1, 2], fp, bound_to_c1=True)).size == 8192


def test_a_rogue_key_gets_nothing_from_the_holders_or_the_owners(threshold: Threshold) -> None:
    from he_partition.core.errors import InvalidInputError
    from he_partition.he.bfv import context_fingerprint, generate_secret_context, public_context_bytes
    from parties.common.contract import StudyContract
    from parties.common.signing import generate_signing_key

    rogue = public_context_bytes(generate_secret_context())  # the CS's own key pair: it could decrypt alone
    contract = threshold.open_and_submit("s-rogue-ok")
    # owners check the context against the contract's fingerprint: a CS serving its own key gets no upload
    keys = {o: generate_signing_key() for o in OWNERS}
    threshold.signing.update(keys)
    contract2, _ = threshold.computation().open_study(
        study_id="s-rogue", domain_size=DOMAIN, epsilon=1.0, expected_owners=list(OWNERS), strategy="hier",
        owner_keys={o: keys[o][1] for o in OWNERS})
    threshold.combiner._contexts["s-rogue"] = rogue
    assert context_fingerprint(rogue) != contract2.context_fingerprint != contract.context_fingerprint
    with pytest.raises(InvalidInputError, match="is not the key of study"):
        threshold.owner("a").submit("s-rogue", _histograms()[0])
    # a contract naming another key (written into a holder's ledger) gets no share from that holder
    foreign = StudyContract.create(study_id="s-foreign", domain_size=DOMAIN, epsilon=1.0,
                                   expected_owners=list(OWNERS), context_fingerprint=context_fingerprint(rogue),
                                   strategy="hier")
    threshold.ledger(0).create_study(foreign)
    # approved by the operator (as if its terms were signed): what is refused below is the key it names
    threshold.holders[0].handler.approvals.keep("s-foreign", approved(study_id="s-foreign", domain_size=DOMAIN,
                                                                      epsilon=1.0, expected_owners=list(OWNERS)))
    threshold.open_and_submit("s-real")
    spy = _Spy(threshold.combiner)
    assert threshold.computation().run_release("s-real", epsilon=0.5).state == "DONE"
    spy_kw = spy.calls[0][0]
    with pytest.raises(ServiceError) as err:
        _as_computation_server(threshold, 0).issue_shares(
            study_id="s-foreign", release_id="rel-x", release_epsilon=0.5, measurement=spy_kw["measurement"],
            chunk_count=spy_kw["chunk_count"], contract_hash=foreign.contract_hash)
    assert err.value.code.name == "FAILED_PRECONDITION" and "h1 holds no key for study s-foreign" in err.value.details
    assert _spent(threshold, 0, "s-foreign") == 0


def test_a_holder_answers_the_full_key_rpcs_with_failed_precondition(threshold: Threshold) -> None:
    from parties.common.signing import generate_signing_key

    contract = threshold.open_and_submit("s-full")
    h1 = _as_computation_server(threshold, 0)
    with pytest.raises(ServiceError) as err:
        h1.decrypt_measurement(study_id="s-full", release_id="r", release_epsilon=0.5,
                               measurement=_partition_sums(), chunks=[b"x"], chunk_count=1,
                               contract_hash=contract.contract_hash)
    assert err.value.code.name == "FAILED_PRECONDITION" and "key-share holder 'h1'" in err.value.details
    with pytest.raises(ServiceError) as err:  # nor the join's well-formedness check
        h1.join_check_seed(study_id="s-full", contract_hash=contract.contract_hash)
    assert err.value.code.name == "FAILED_PRECONDITION" and "check a join among themselves" in err.value.details
    keys = {o: generate_signing_key() for o in ("a", "b")}
    from parties.decryption.client import DecryptionClient
    owner_at_h1 = DecryptionClient(threshold.holders[0].target, retry=FAST_RETRY, tls=threshold.pki.tls("a", "data_owner"))
    threshold.clients.append(owner_at_h1)
    with pytest.raises(ServiceError) as err:  # the single holder's request (no route): refused by name
        owner_at_h1.evaluate_pseudonyms(study_id="s-join", owner_id="a", contract_hash="f" * 64, elements=[b"\0" * 32])
    assert err.value.code.name == "INVALID_ARGUMENT" and "names its route" in err.value.details
    with pytest.raises(ServiceError) as err:  # a join study the holder does not hold: nothing evaluated
        owner_at_h1.evaluate_shared(study_id="s-join", owner_id="a", contract_hash="f" * 64, page=0, route=[0, 1, 2],
                                    elements=[b"\0" * 32])
    assert err.value.code.name == "FAILED_PRECONDITION" and "nothing was evaluated" in err.value.details
    _shared_pseudonyms_through_the_holders(threshold, keys)


def _shared_pseudonyms_through_the_holders(threshold: Threshold, keys: dict[str, tuple[bytes, bytes]]) -> None:
    """3-of-3 through real holders: a join study written into each holder's ledger (its contract pins the holders'
    seal keys in order), owner a's pseudonyms from the three holders' answers equal the single key's under the
    combined key, each holder books the page; and the single key holder's join RPCs stay refused at a holder."""
    import json

    from he_partition.join import oprf, toprf
    from he_partition.join.protocol import oprf_input
    from parties.data_owner.join_holders import shared_outputs
    from parties.decryption.client import DecryptionClient

    from parties.common.contract import StudyContract

    contract = StudyContract.create(
        study_id="s-join", domain_size=4, epsilon=3.0, expected_owners=["a", "b"], context_fingerprint="ab" * 32,
        strategy="join", owner_keys={o: k[1].hex() for o, k in keys.items()},
        strategy_params=json.dumps({"shape": [2, 2], "capacity": 8192, "padding_epsilon": 0.5, "padding_offset": 86,
                                    "max_records": [20, 20], "pseudonyms": "oprf"}),
        holder_seal_keys=[h.handler.seal.public_hex for h in threshold.holders])
    approval = approved(study_id="s-join", domain_size=4, epsilon=3.0, expected_owners=["a", "b"], strategy="join",
                        strategy_params_json=contract.strategy_params_json, owner_keys=dict(contract.owner_keys))
    for h in threshold.holders:
        h.handler.require_active().ledger.create_study(contract)
        h.handler.approvals.keep("s-join", approval)
    owners = [DecryptionClient(h.target, retry=FAST_RETRY, tls=threshold.pki.tls("a", "data_owner"))
              for h in threshold.holders]
    threshold.clients.extend(owners)
    inputs = [oprf_input(f"cust-{i}@example.org") for i in range(20)]
    out = shared_outputs(owners, contract, "a", b"s" * 32, inputs, 3, page_elements=32_768)
    k = toprf.combined_key([h.handler.shared_pseudonyms().key(contract) for h in threshold.holders])
    assert out == [oprf.evaluate(k, x) for x in inputs]
    assert [[(r.owner_id, r.page, r.elements) for r in h.handler.evaluations.rows("s-join")]
            for h in threshold.holders] == [[("a", 0, 23)]] * 3
    with pytest.raises(ServiceError) as err:  # owner b's page in a's name: refused before anything
        DecryptionClient(threshold.holders[0].target, retry=FAST_RETRY, tls=threshold.pki.tls("b", "data_owner")
                         ).evaluate_shared(study_id="s-join", owner_id="a", contract_hash=contract.contract_hash,
                                           page=1, route=[0, 1, 2], elements=[b"\0" * 32])
    assert err.value.code.name == "PERMISSION_DENIED"
    with pytest.raises(ServiceError) as err:  # the single key holder's check RPC: a holder checks with the others
        _as_computation_server(threshold, 0).join_check_seed(study_id="s-join", contract_hash=contract.contract_hash)
    assert err.value.code.name == "FAILED_PRECONDITION"


def _partition_sums() -> Measurement:
    from he_partition.core.measurements import PartitionSums
    return PartitionSums(domain_size=DOMAIN, epsilon=0.5, sensitivity=1, starts=(0, 32))


@pytest.mark.slow
def test_a_threshold_deployment_through_the_cli_processes(tmp_path: Path) -> None:
    """Three `dpagg serve-decryption --key-share` processes, `serve-computation --holder ...`, `dpagg setup-key`, a
    signed study, two uploads and a release, all as real processes with mutual TLS."""
    import json
    import subprocess
    import sys

    from tests.parties.test_cli import _creds, _env, _wait_port, dpagg

    dpagg(tmp_path, "certs", "--out", "pki", "--party", "h1:decryption", "--party", "h2:decryption", "--party",
          "h3:decryption", "--party", "cs:computation", "--party", "op:operator", "--party", "o1:data_owner",
          "--party", "o2:data_owner", "--signing-keys")
    env = _env(tmp_path)
    procs: list[subprocess.Popen[str]] = []

    def serve(*args: str) -> str:
        name = args[args.index("--port-file") + 1]
        procs.append(subprocess.Popen([sys.executable, "-m", "parties.cli", *args], cwd=tmp_path, env=env,
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        return f"127.0.0.1:{_wait_port(tmp_path / name, procs[-1])}"

    try:
        targets = [serve("serve-decryption", "--key-share", h, "--holders", ",".join(HOLDERS), "--data-dir", h,
                         "--port", "0", "--port-file", f"{h}.port", "--computation-id", "cs", *_creds(h))
                   for h in HOLDERS]
        cs = serve("serve-computation", "--data-dir", "cs", "--port", "0", "--port-file", "cs.port",
                   "--executor", "inprocess", *[a for h, t in zip(HOLDERS, targets) for a in ("--holder", f"{h}={t}")],
                   *_creds("cs"))
        first = dpagg(tmp_path, "setup-key", "--computation", cs, *_creds("op")).stdout
        digest = first.split()[1]
        assert len(digest) == 64 and "(fixed;" in first and "h1, h2, h3" in first and "own collective key" in first
        again = dpagg(tmp_path, "setup-key", "--computation", cs, *_creds("op")).stdout
        assert f"deployment {digest} (already fixed;" in again
        opened = json.loads(dpagg(tmp_path, "open-study", "--computation", cs, "--study-id", "thr", "--domain",
                                  "age:0:100:20", "--epsilon", "1", "--owners", "o1,o2", "--strategy", "hier",
                                  "--owner-keys-dir", "pki", "--json", *_creds("op")).stdout)
        keys = [json.loads((tmp_path / h / "keys" / "studies" / "thr" / "key.json").read_text()) for h in HOLDERS]
        assert [k["fingerprint"] for k in keys] == [opened["context_fingerprint"]] * 3  # the study's own key
        assert opened["noise_tolerates"] == 2  # K - 1 by default: each holder's share is a full draw
        refused = dpagg(tmp_path, "open-study", "--computation", cs, "--study-id", "thr-t3", "--domain-size", "20",
                        "--epsilon", "1", "--owners", "o1,o2", "--owner-keys-dir", "pki", "--noise-tolerates", "3",
                        *_creds("op"), check=False)
        assert refused.returncode != 0 and "noise_tolerates is 3" in refused.stderr and "K = 3" in refused.stderr
        from parties.data_owner.dataset import write_sample_csv
        for i, owner in enumerate(("o1", "o2")):
            write_sample_csv(tmp_path / f"{owner}.csv", seed=3, n_records=300, owner_index=i)
            dpagg(tmp_path, "submit", "--computation", cs, "--study", "thr", "--owner", owner, "--csv",
                  f"{owner}.csv", "--person-column", "person_id", "--signing-key", f"pki/{owner}.signing.key",
                  *_creds(owner))
        rel = json.loads(dpagg(tmp_path, "release", "run", "thr", "--epsilon", "rest", "--computation", cs, "--json",
                               *_creds("op")).stdout)
        assert rel["state"] == "DONE" and rel["summary"]["domain_size"] == 20
        assert rel["summary"]["params"]["holder_noise"] == {"key_holders": 3, "noise_tolerates": 2,
                                                            "holder_variance_factor": 3.0}
        status = dpagg(tmp_path, "status", "thr", "--computation", cs, *_creds("op")).stdout
        assert "noise tolerates 2 colluding holders: each of the 3 holders draws a whole discrete Laplace" in status
        assert "variance is 3/1 = 3 draws, each released value's 4 draws instead of 2" in status
        assert not any((tmp_path / h / "keys" / "studies" / "thr").exists() for h in HOLDERS)  # spent: erased
        for h, t in zip(HOLDERS, targets):  # every holder charged its own ledger for the whole release
            budget = json.loads(dpagg(tmp_path, "budget", "thr", "--decryption", t, "--json", *_creds("op")).stdout)
            assert budget["spent"] == pytest.approx(1.0), h
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_a_rogue_key_share_in_the_setup_is_refused_by_every_holder_and_activates_nothing(tmp_path: Path) -> None:
    """A relay (the test, with the computation server's certificate) swaps holder h3's revealed key share for one
    it made itself on the same common seed: every holder checks it against h3's commitment and stops the setup."""
    import secrets as pysecrets

    from he_partition.he.bfv import generate_secret_context
    from he_partition.he.threshold.keys import holder_keygen
    from he_partition.he.threshold.setup import common_seed, study_session

    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()  # the deployment; the study's key is set up below
        hs = [_as_computation_server(t, i) for i in range(3)]
        session = study_session("s-rs", pysecrets.token_bytes(16))

        def step(name: str, messages: dict[int, bytes] | None = None) -> dict[int, bytes]:
            return {i: h.key_setup(name, session, HOLDERS, messages).message for i, h in enumerate(hs)}

        seeds = step("reveal_seed", step("commit_seed"))
        reveals = step("reveal_key", step("commit_key", seeds))
        _, rogue = holder_keygen(generate_secret_context(), common_seed(session, seeds), 2)
        for h in hs:
            with pytest.raises(ServiceError) as err:
                h.key_setup("build_key", session, HOLDERS, {**reveals, 2: rogue})
            assert err.value.code.name == "INVALID_ARGUMENT" and "holder 2" in err.value.details
        with pytest.raises(ServiceError) as err:  # a holder list other than the holder's own configuration
            hs[0].key_setup("commit_seed", session, ("h1", "h2", "evil"))
        assert err.value.code.name == "INVALID_ARGUMENT" and "configured" in err.value.details
        assert all(h.handler.study_key("s-rs") is None for h in t.holders)
        contract = t.open_and_submit("s-rs")  # an honest setup afterwards: a new session
        assert [h.handler.study_key("s-rs").fingerprint for h in t.holders] == [contract.context_fingerprint] * 3
    finally:
        t.stop()


def test_malformed_setup_steps_and_chunks_are_refused_with_the_problem_named_and_nothing_charged(
        threshold: Threshold) -> None:
    from he_partition.he.bfv import _varint
    from he_partition.he.threshold.setup import study_session

    threshold.open_and_submit("s-bad")
    spy = _Spy(threshold.combiner)
    assert threshold.computation().run_release("s-bad", epsilon=0.5).state == "DONE"
    kw = spy.calls[0][0]
    h1 = _as_computation_server(threshold, 0)
    before = _spent(threshold, 0, "s-bad")
    framed_junk = bytes([2 << 3 | 2]) + _varint(5) + b"junk!"  # a TenSEAL vector frame around non-SEAL bytes
    for junk in (b"x", framed_junk):  # chunks are refused whatever they hold: a holder takes no ciphertext
        with pytest.raises(ServiceError) as err:
            h1.issue_shares(study_id="s-bad", release_id="rel-junk", release_epsilon=0.5,
                            measurement=kw["measurement"], chunk_count=kw["chunk_count"],
                            chunks=[junk] * kw["chunk_count"], contract_hash=kw["contract_hash"])
        assert err.value.code.name == "INVALID_ARGUMENT" and "nothing was charged" in err.value.details
    with pytest.raises(ServiceError) as err:  # a chunk count that is not the measurement's
        h1.issue_shares(study_id="s-bad", release_id="rel-junk", release_epsilon=0.5, measurement=kw["measurement"],
                        chunk_count=kw["chunk_count"] + 1, contract_hash=kw["contract_hash"])
    assert err.value.code.name == "INVALID_ARGUMENT" and "chunk_count" in err.value.details
    assert _spent(threshold, 0, "s-bad") == before
    for step, session, messages in (("commit_seed", b"short", None), ("reveal_seed", b"s" * 16, {7: b"x"}),
                                    ("nonsense", b"s" * 16, None)):
        with pytest.raises(ServiceError) as err:
            h1.key_setup(step, session, HOLDERS, messages)
        assert err.value.code.name in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), err.value
    assert threshold.holders[0].handler.study_key("s-bad") is not None  # a study's key is never replaced
    with pytest.raises(ServiceError) as err:  # nor set up again once the study is open
        h1.key_setup("commit_seed", study_session("s-bad", b"n" * 16), HOLDERS)
    assert err.value.code.name == "FAILED_PRECONDITION" and "not replaced" in err.value.details


def test_the_combiner_reads_nothing_in_the_unmeasured_slots(threshold: Threshold) -> None:
    """The CS knows its own pads, so the holders pad every slot a measurement does not use: a combiner (the test,
    with the CS's certificate) that sends an unpadded ciphertext of known values reads the measured slots (plus the
    holders' DP noise) and nothing else."""
    from he_partition.core.measurements import PartitionSums
    from he_partition.he.bfv import load_context
    from he_partition.he.threshold.context import vector_ciphertext
    from he_partition.he.threshold.decrypt import combine

    from he_partition.core.measurements import owner_encoding
    from he_partition.he.bfv import BfvBackend
    from parties.computation.threshold.c1_forward import owner_c1_parts

    contract = threshold.open_and_submit("s-pads")
    ctx = load_context(threshold.combiner.public_context(study_id="s-pads"))
    slots = 8192
    values = (np.arange(slots) * 7 + 1000).tolist()
    # the holders compute on the owners' signed c1 (docs/threshold.md, section 3a): the combiner forwards them and
    # combines the shares with its own c0, the owners' aggregate with known values added
    h = threshold.cs.handler
    subs = h.submissions_to_include(contract, force=False, action="release")  # the sealed uploads close and open
    threshold.combiner.forward_uploads(contract, lambda: [owner_c1_parts(ctx, s, h.store.read_chunk, h.c1_signatures.get(
        "s-pads", s.meta.owner_id, s.meta.idempotency_key)) for s in subs],
        [(s.meta.owner_id, s.meta.idempotency_key) for s in subs])
    be = BfvBackend(ctx)
    parts = [be.deserialize_chunk(h.store.read_chunk(s, 0)) for s in subs]
    chunk = be.serialize_chunk(parts[0] + parts[1] + parts[2] + values)  # plaintext addition: c1 unchanged
    known = np.array(values, dtype=np.int64)
    known[:DOMAIN] += sum(owner_encoding(x) for x in _histograms())
    m = PartitionSums(domain_size=DOMAIN, epsilon=0.5, sensitivity=1, starts=(0, 16, 32, 48))
    shares = [_as_computation_server(threshold, i).issue_shares(
        study_id="s-pads", release_id="rel-pads", release_epsilon=0.5, measurement=m, chunk_count=1,
        contract_hash=contract.contract_hash).shares[0] for i in range(3)]
    fp = bytes.fromhex(contract.context_fingerprint)
    got = combine(threshold.combiner._template, vector_ciphertext(chunk), shares, [0, 1, 2], fp, bound_to_c1=True)
    t = 562949952847873
    offset = (got - known) % t
    offset = np.where(offset > t // 2, offset - t, offset)
    ends = [15, 31, 47, 63]
    assert np.all(np.abs(offset[ends]) < 10_000)  # the values there, plus the holders' (cumulative) DP noise
    others = np.setdiff1d(np.arange(slots), ends)
    assert np.all(np.abs(offset[others]) > 10_000)  # everywhere else: uniform pads mod t (P[|x| < 10^4] ~ 2^-35)
