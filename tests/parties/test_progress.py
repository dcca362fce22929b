"""Long work speaks: a live bar within 2 s on a terminal, a line per step (and a final line) in a log."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from parties.cli import main
from parties.common.progress import Progress

from .conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_a_step_in_a_log_says_when_it_starts_while_it_runs_and_when_it_ends() -> None:
    out = io.StringIO()
    progress = Progress(out, heartbeat=0.0)
    assert not progress.interactive  # a StringIO is no terminal
    with progress.step("encrypting 30 bins", total=3, unit="ciphertexts") as advance:
        for _ in range(3):
            advance(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "encrypting 30 bins ..."
    assert lines[1].startswith("encrypting 30 bins: 1/3 ciphertexts (33%), ")
    assert lines[3].startswith("encrypting 30 bins: 3/3 ciphertexts (100%), ")
    assert lines[-1].startswith("encrypting 30 bins: done in ") and "\r" not in out.getvalue()


def test_an_upload_in_a_log_says_how_long_is_left_from_the_first_second() -> None:
    out = io.StringIO()
    progress = Progress(out)  # the default heartbeat: a line every few seconds, but the first one a second in
    with progress.step("uploading 8 ciphertexts to study s1", total=8_000_000, unit="B") as advance:
        deadline = time.monotonic() + 1.3
        while time.monotonic() < deadline:
            advance(100_000)
            time.sleep(0.05)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # start, one line a second in, done
    assert lines[1].startswith("uploading 8 ciphertexts to study s1: ") and "/8.0 MB (" in lines[1]
    left = float(lines[1].split("about ")[1].split(" s left")[0])
    assert 1.5 <= left <= 30  # about 2 MB in the first second: some 3 s of the 8 MB left (a loaded machine: more)


def test_a_sealed_upload_says_it_is_sealing_and_signing_before_it_uploads(secure_cluster: Cluster) -> None:
    secure_cluster.open_study(domain_size=20_000, owners=("a",))
    out = io.StringIO()
    owner = secure_cluster.owner("a")
    owner.progress = Progress(out)
    owner.submit("s1", np.ones(20_000, dtype=np.int64))
    lines = out.getvalue().splitlines()
    # the seconds a big upload spends sealing and signing its chunks are said, not silent
    assert "sealing and signing 3 ciphertexts ..." in lines, lines
    assert lines.index("sealing and signing 3 ciphertexts ...") < lines.index("uploading 3 ciphertexts to study s1 ...")


def test_a_status_in_a_log_prints_its_text_then_a_final_line() -> None:
    out = io.StringIO()
    with Progress(out, heartbeat=0.0).status("release r1") as show:
        show("")  # nothing known yet: no line
        show("summing the submissions")
        show("1 measurement decrypted")
    lines = out.getvalue().splitlines()
    assert lines[0] == "release r1 ..."
    assert lines[1].startswith("release r1: summing the submissions, ") and lines[1].endswith(" s")
    assert lines[2].startswith("release r1: 1 measurement decrypted, ")
    assert lines[3].startswith("release r1: done in ") and len(lines) == 4


def test_a_failed_step_does_not_claim_it_is_done() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress(out).step("uploading"):
        raise RuntimeError("boom")
    assert out.getvalue() == "uploading ...\n"


def test_quiet_progress_prints_nothing() -> None:
    out = io.StringIO()
    with Progress(out, enabled=False).step("x", total=2) as advance:
        advance(2)
    assert out.getvalue() == ""


def test_on_a_terminal_a_long_step_shows_a_bar_within_two_seconds() -> None:
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w", buffering=1)
    seen: list[tuple[float, bytes]] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            seen.append((time.monotonic(), data))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    progress = Progress(stream)
    assert progress.interactive
    entered = time.monotonic()
    with progress.step("encrypting 1,000,000 bins", total=6, unit="ciphertexts") as advance:
        for _ in range(6):  # a 3 s step
            time.sleep(0.5)
            advance(1)
        ended = time.monotonic()
    stream.close()
    reader.join(timeout=5)
    os.close(master)
    assert seen, "nothing reached the terminal"
    first = seen[0][0]
    assert first - entered < 2.0 and first < ended  # shown while the step runs, not after
    text = b"".join(d for _, d in seen).decode()
    assert "encrypting 1,000,000 bins" in text and "ciphertexts" in text and "\r" in text
    assert "encrypting 1,000,000 bins: done in" in text


def test_the_demo_in_a_log_prints_a_line_per_step_and_a_final_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "parties.cli", "demo", "--insecure", "--records", "300",
                           "--domain", "age:0:100:50000"], capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.splitlines()
    assert err[0].startswith("dpagg demo: 3 data owners, domain age:0:100:50000 (50,000 bins)")  # before any work
    for step in ("starting the decryption and computation servers", "opening the study",
                 "owner-1: generating and binning 300 records", "encrypting 50,000 bins", "uploading 7 ciphertexts",
                 "aggregating, noising and decrypting", "analyst: reading the release"):
        started = [line for line in err if step in line and line.endswith(" ...")]
        finished = [line for line in err if step in line and ": done in " in line]
        assert started and finished, f"no start/end line for {step!r}:\n{proc.stderr}"
    assert "%|" not in proc.stderr and "\r" not in proc.stderr  # no tqdm fragments in a log
    assert proc.stdout.splitlines()[-1].startswith("finished in ")


def test_release_run_in_a_log_reports_the_wait(cluster: Cluster, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    assert main(["release", "run", "s1", "--epsilon", "0.5", "--computation", cluster.cs.target, "--insecure",
                 "--state-dir", str(tmp_path / "state")]) == 0
    captured = capsys.readouterr()
    release_id = captured.out.split()[1]
    assert f"release {release_id} ..." in captured.err
    assert f"release {release_id}: done in" in captured.err
    assert main(["release", "run", "s1", "--epsilon", "0.25", "--computation", cluster.cs.target, "--insecure",
                 "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    assert capsys.readouterr().err == ""  # --json: machine output only


def test_submit_on_a_terminal_draws_the_encryption_bar(tmp_path: Path) -> None:
    """The whole demo on a pseudo-terminal: the encryption and upload bars are drawn (tqdm), then cleared."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "parties.cli", "demo", "--insecure", "--records", "300",
                             "--domain", "age:0:100:200000"], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=_env(), cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "encrypting 200,000 bins:" in text and "ciphertexts/s" in text  # tqdm's rate: a live bar
    assert "\r" in text and "finished in" in text


def test_submit_in_a_log_reports_encryption_and_upload(cluster: Cluster, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from parties.data_owner.dataset import write_sample_csv

    cluster.open_study(domain_size=20, owners=("a",), epsilon=1.0, domain_spec="age:0:100:20")
    write_sample_csv(tmp_path / "a.csv", seed=1, n_records=100, owner_index=0)
    assert main(["submit", "--study", "s1", "--owner", "a", "--csv", str(tmp_path / "a.csv"), "--person-column",
                 "person_id", "--computation", cluster.cs.target, "--insecure",
                 "--state-dir", str(tmp_path / "state")]) == 0
    err = capsys.readouterr().err
    for step in ("encrypting 20 bins", "uploading 1 ciphertext to study s1"):
        assert f"{step} ...\n" in err and f"{step}: done in " in err
    assert "%|" not in err and "\r" not in err


def test_the_demo_report_does_not_repeat_the_header_and_counts_read_well() -> None:
    """On the former code the report repeated the progress header, with "(1048576 bins)" where the header said
    "(1,048,576 bins)"."""
    from parties.demo import format_demo, run_demo

    first = format_demo(run_demo(owners=2, records=200, domain="age:0:100:20000", tls=False)).splitlines()[0]
    assert not first.startswith("dpagg demo:") and "(20,000 bins)" in first


def test_a_polled_running_release_reports_its_measurements_and_chunks(cluster: Cluster,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Real servers: the release is held inside its first measurement after one chunk was sent, then before its
    second; ReleaseStatus reports exactly that (counts, no percentage), and `dpagg release status` says it."""
    from parties.cli.releases import release_progress_text

    n = 20_000  # 3 chunks of 8,192 slots
    cluster.open_study(domain_size=n, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(n) % 7)
    ds = cluster.cs.handler.decryption
    real = ds.decrypt_measurement
    held, go = [threading.Event(), threading.Event()], [threading.Event(), threading.Event()]
    calls = [0]

    def hold(**kw: object) -> object:
        i = calls[0]
        calls[0] += 1
        chunks = iter(kw.pop("chunks"))  # type: ignore[call-overload]
        first = [next(chunks)] if i == 0 else []  # the first measurement: one chunk sent, then held
        if i < 2:
            held[i].set()
            assert go[i].wait(60)
        return real(chunks=iter([*first, *chunks]), **kw)

    ds.decrypt_measurement = hold
    try:
        cs = cluster.computation()
        rel = cs.run_release("s1", epsilon=0.5, wait=False)
        assert held[0].wait(60)
        st = cs.release_status(rel.release_id)
        assert st.state == "RUNNING" and st.progress is not None
        p = st.progress
        assert (p.phase, p.measurements_done, p.measurement_kind, p.chunks_sent, p.chunks_total) == \
            ("measuring", 0, "prefix_differences", 1, 3)
        text = release_progress_text(p)
        assert text.startswith("measurement 1 (prefix_differences): 1/3 chunks sent, about ")
        assert text.endswith(" s left in it; 0 measurements decrypted before it") and "%" not in text
        assert main(["release", "status", rel.release_id, "--computation", cluster.cs.target, "--insecure"]) == 0
        assert "  measurement 1 (prefix_differences): 1/3 chunks sent" in capsys.readouterr().out
        go[0].set()
        assert held[1].wait(60)
        p2 = cs.release_status(rel.release_id).progress
        assert p2 is not None and p2.measurements_done == 1 and p2.chunks_sent == 0 and p2.measurement_kind
        assert release_progress_text(p2).startswith(f"measurement 2 ({p2.measurement_kind}): ")
        assert release_progress_text(p2).endswith("; 1 measurement decrypted before it")
        go[1].set()
        done = cs.wait_release(rel.release_id)
        assert done.state == "DONE" and done.progress is None  # no progress once it is finished
    finally:
        for e in go:
            e.set()
        ds.decrypt_measurement = real
