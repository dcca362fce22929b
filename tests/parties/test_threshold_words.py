"""What the CLI says about key-share holders, through real services (mutual TLS, real holders): a 2-of-3 key's
noise line and direct-query charge in that deployment's own numbers, and a 3-of-3 key with a holder down refused at
once, saying that every holder must be up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from parties.cli import main
from parties.common.signing import generate_signing_key, save_private_key

from .conftest import OPERATOR_APPROVAL
from .test_threshold_services import DOMAIN, OWNERS, Threshold, _histograms
from .test_tofn_services import _wait_forwarded


def _creds(t: Threshold, party: str, role: str) -> list[str]:
    tls = t.pki.tls(party, role)
    return ["--computation", t.cs.target, "--ca-cert", str(tls.ca_cert), "--cert", str(tls.cert), "--key",
            str(tls.key)]


@pytest.fixture
def two_of_three(tmp_path: Path) -> Iterator[Threshold]:
    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key(threshold=2)
        yield t
    finally:
        t.stop()


def test_a_2_of_3_study_states_its_noise_and_its_direct_query_charge_in_its_own_numbers(
        two_of_three: Threshold, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = two_of_three
    approval = save_private_key(tmp_path / "ops.approval.key", OPERATOR_APPROVAL[0])
    publics = {o: t.signing.setdefault(o, generate_signing_key())[1].hex() for o in OWNERS}
    keys = [a for o in OWNERS for a in ("--owner-key", f"{o}={publics[o]}")]
    assert main(["open-study", "--study-id", "words", "--domain-size", str(DOMAIN), "--epsilon", "1", "--owners",
                 ",".join(OWNERS), "--strategy", "hier", *keys, "--approval-key", str(approval),
                 *_creds(t, "op", "operator")]) == 0
    out = capsys.readouterr().out
    assert ("noise tolerates 1 colluding holder: each of the 2 holders that answer a measurement (any 2 of the 3: "
            "a 2-of-3 key) draws a whole discrete Laplace draw as its share, so the computation server with 1 holder "
            "still faces one full draw") in out, out
    assert "variance is 2/1 = 2 draws, each released value's 3 draws instead of 2" in out
    assert "1 holders" not in out and "K = 2" not in out
    for o, h in zip(OWNERS, _histograms()):
        t.owner(o).submit("words", h)
    # two ranges apart: the max-overlap rule would charge 0.1; a t-of-N key charges each range in full
    assert main(["direct-query", "words", "--range", "0:10", "--range", "30:50", "--epsilon", "0.1",
                 *_creds(t, "alice", "analyst")]) == 0
    out = capsys.readouterr().out
    assert ("charged epsilon 0.2 (each range in full: with a 2-of-3 key every range is its own charge in the "
            "study's signed charge log); 0.8 left in study words") in out, out
    assert "max-overlap" not in out
    assert main(["status", "words", *_creds(t, "op", "operator")]) == 0
    assert "(any 2 of the 3: a 2-of-3 key)" in capsys.readouterr().out


def test_a_3_of_3_release_with_a_holder_down_is_refused_at_once_saying_every_holder_must_be_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()
        t.open_and_submit("down")
        _wait_forwarded(t, "down")  # the uploads closed at every holder while all were up
        t.stop_holder(2)
        began = time.monotonic()
        assert main(["release", "run", "down", "--epsilon", "0.5", "--state-dir", str(tmp_path / "state"),
                     *_creds(t, "op", "operator")]) == 1
        took = time.monotonic() - began
        err = capsys.readouterr().err
        assert "FAILED_PRECONDITION" in err and "is 3-of-3: every key-share holder must be up" in err, err
        assert "h3 is not (" in err and "nothing was charged or decrypted" in err and "Start h3 again" in err
        assert took < 8, took  # one health check of each holder (3 s at most), not every call's retries (9 s)
        assert [sum(c.epsilon for c in t.ledger(i).charges("down")) for i in range(2)] == [0, 0]
        assert not np.any([h.handler is None for h in t.holders[:2]])
    finally:
        t.stop()
