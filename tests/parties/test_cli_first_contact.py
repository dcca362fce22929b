"""What a new user hits first: every help page renders, a closed pipe and a mismatched key end in one quiet line."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from parties.cli import build_parser, main
from parties.common import tls as tlsmod
from parties.common.pki import create_ca, issue_party_certificate
from parties.common.tls import TlsConfig
from parties.common.tls_diagnose import diagnose

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*path, name))
    return paths


COMMANDS = _command_paths(build_parser())


def test_the_parser_has_every_command_group() -> None:
    names = {p[0] for p in COMMANDS if p}
    assert {"serve-decryption", "open-study", "submit", "release", "query", "budget", "ledger", "demo",
            "epsilon", "certs"} <= names
    assert ("release", "run") in COMMANDS and ("ledger", "verify") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "dpagg")
def test_every_help_page_renders(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--help", "-h"):
        with pytest.raises(SystemExit) as stop:
            main([*path, flag])
        assert stop.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: dpagg") and " ".join(("dpagg", *path)) in out
        assert "seed 00" not in out  # no references to source-document numbers in help


def test_version_prints_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"dpagg {version('dpagg')}"


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `dpagg ARGS` with stdout a pipe whose reader has already gone (as `| head` after its lines)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "parties.cli", *args], stdout=write, stderr=subprocess.PIPE,
                              env=_env(), text=True, timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("epsilon", "--eps", "1"), ("--help",), ("submit", "--help")],
                         ids=["epsilon", "help", "submit-help"])
def test_a_pipe_closed_early_exits_quietly(args: tuple[str, ...]) -> None:
    proc = _run_into_closed_pipe(*args)
    assert proc.stderr == ""
    assert proc.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_parties(root: Path) -> Path:
    ca = create_ca(root)
    issue_party_certificate(ca, root, "op", "operator")
    issue_party_certificate(ca, root, "cs", "computation")
    return root


def test_a_mismatched_certificate_and_key_print_one_line(tmp_path: Path) -> None:
    d = _two_parties(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "parties.cli", "status", "s1", "--computation", f"127.0.0.1:{_free_port()}",
         "--ca-cert", str(d / "dpagg-ca.crt"), "--cert", str(d / "op.crt"), "--key", str(d / "cs.key")],
        capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dpagg: error: TLS key") and "does not belong to the certificate" in lines[0]
    assert str(d / "op.crt") in lines[0] and "Traceback" not in proc.stderr


def test_a_key_file_that_is_no_key_is_named(tmp_path: Path) -> None:
    d = _two_parties(tmp_path)
    bad = d / "bad.key"
    bad.write_text("not a key\n")
    bad.chmod(0o600)
    with pytest.raises(tlsmod.InvalidInputError, match="is not an unencrypted PEM private key"):
        TlsConfig(d / "dpagg-ca.crt", d / "op.crt", bad)


def test_the_tls_diagnosis_names_a_key_swapped_after_the_client_started(tmp_path: Path) -> None:
    """The files were checked when the client was built; the key changed on disk before the failing call."""
    d = _two_parties(tmp_path)
    config = TlsConfig.in_directory(d, "op")
    shutil.copyfile(d / "cs.key", d / "op.key")
    cause = diagnose(f"127.0.0.1:{_free_port()}", config)
    assert cause is not None and "cannot be used together" in cause and str(d / "op.key") in cause


def test_a_closed_pipe_does_not_stop_the_work_or_hide_its_outcome(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpagg CMD | head -1`: the reader leaves after the first line; the command still finishes its work (on the
    former code the first print raised, the work stopped there and the exit code was 0)."""
    proc = _run_into_closed_pipe("sample-csv", "--out", str(tmp_path), "--owners", "3", "--records", "20")
    assert proc.returncode == 0 and proc.stderr == ""
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == ["owner-1.csv", "owner-2.csv", "owner-3.csv"]

    # and a command that fails after printing still says so in its exit code
    import parties.cli as cli

    def prints_then_fails(argv: list[str]) -> int:
        print("a first line the reader never reads")
        return 1

    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError

        def flush(self) -> None:
            raise BrokenPipeError

        def fileno(self) -> int:
            return os.open(os.devnull, os.O_WRONLY)

        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(cli, "_run", prints_then_fails)
    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["status"]) == 1


@pytest.mark.parametrize("args", [("demo", "--domain", "age:0:100:17000000"),
                                  ("open-study", "--domain", "age:0:100:17000000", "--epsilon", "1", "--owners", "a"),
                                  ("open-study", "--domain-size", "16777217", "--epsilon", "1", "--owners", "a"),
                                  ("demo", "--domain", "age:0:100")],
                         ids=["demo", "open-study", "open-study-size", "unparsable"])
def test_a_domain_a_study_cannot_hold_is_refused_where_it_is_typed(args: tuple[str, ...],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """On the former code `dpagg demo --domain age:0:100:17000000` spent 13 s and 1 GB before the server refused it."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(list(args))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--domain" in err and ("bins" in err or "domain spec" in err), err


@pytest.mark.parametrize("spec", ["age:0:100:100000000", "age:edges:" + ",".join(map(str, range(20_000_000))),
                                  "c:categories:" + ",".join("x" * 20_000_000)],
                         ids=["equal-width", "edges", "categories"])
def test_a_huge_domain_is_refused_before_it_is_built(spec: str) -> None:
    """On the former code a 10^8-bin spec was built in full (27-35 s, 5.7 GB) before its size was checked."""
    import tracemalloc

    from he_partition.core.errors import InvalidInputError
    from parties.common.contract import MAX_DOMAIN_SIZE
    from parties.data_owner.domain import DomainSpec

    tracemalloc.start()
    try:
        with pytest.raises(InvalidInputError, match="a study holds 1 to 16,777,216 bins"):
            DomainSpec.parse(spec, max_bins=MAX_DOMAIN_SIZE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(spec) + (1 << 20), peak  # the text itself, not millions of edges
