"""The `dpagg` command line: run each server, act as operator, data owner or analyst, or run the demo.

One module per command group, each with its own `add_parser(sub)`:

- `servers`   serve-decryption, serve-computation, serve-analyst, health
- `studies`   open-study, open-join, status (operator)
- `accuracy`  accuracy (a release's error before any budget is spent)
- `keys`      certs, keygen (the CA and party certificates; an owner's or operator's signing key)
- `owners`    submit, join-submit, sample-csv (data owner)
- `releases`  release run/status, query, direct-query (operator, analyst)
- `ledger`    budget, ledger backup/verify
- `methods`   epsilon, audit, bayes-scale, charge, pview (offline, no server)
- `demo`      demo

Shared options (TLS, server addresses, small parsers) are in `options`, the wording about a threshold
deployment's key holders in `holder_words`; `main` is the entry point
(`dpagg = "parties.cli:main"`).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from typing import Any, Sequence

# gRPC's C core logs every failed TLS handshake on stderr; the CLI reports failures itself (naming the file
# or name at fault), so it keeps the core to errors unless the user set GRPC_VERBOSITY. Set before grpc loads.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from he_partition.core.errors import DPAggError  # noqa: E402

from ..common.errors import ServiceError  # noqa: E402
from . import accuracy, demo, keys, ledger, methods, owners, releases, servers, studies  # noqa: E402

__all__ = ["main", "build_parser", "package_version"]

#: Command groups in the order `dpagg --help` lists them.
GROUPS = (servers, studies, accuracy, keys, owners, releases, ledger, demo, methods)


def build_parser() -> argparse.ArgumentParser:
    """The whole `dpagg` parser: each command group adds its own subcommands."""
    ap = argparse.ArgumentParser(
        prog="dpagg",
        description="Secure multi-party differentially private histograms: BFV-encrypted uploads, two "
                    "non-colluding servers, a privacy-budget ledger. Try `dpagg demo`.")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    ap.add_argument("--version", action="version", version=f"dpagg {package_version()}",
                    help="print the installed dpagg version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parser(sub)
    return ap


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it); "unknown" when this tree runs
    without being installed (PYTHONPATH only)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dpagg")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _verbosity_first(argv: Sequence[str]) -> list[str]:
    """Accept -v/-vv/--verbose anywhere (before or after the subcommand) by moving them to the front."""
    flags = [a for a in argv if a == "--verbose" or (len(a) > 1 and a.startswith("-") and set(a[1:]) == {"v"})]
    return [*flags, *(a for a in argv if a not in flags)]


class _ReaderMayLeave(io.TextIOBase):
    """stdout that outlives its reader: once the pipe is closed (`dpagg submit ... | head -2`) further output is
    dropped, but the command goes on with its work and its exit code still says how that work ended."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_left = False

    def _left(self) -> None:
        self.reader_left = True
        try:  # the interpreter's final flush of the real stdout must not raise again
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.reader_left:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._left()

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def fileno(self) -> int:
        return int(self._stream.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._stream, "encoding", "utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    """The `dpagg` command: parse, run the command, print one line per failure (no traceback); the exit code.

    A reader that closes our stdout early (`| head`) stops only the output: the command's work and its
    exit code are what they would have been."""
    real, real_err = sys.stdout, sys.stderr
    # stderr too: progress and the one-line summary go there, and `dpagg submit ... 2>&1 | head -2` closed
    # both; a write to the gone stderr raised, and the upload stopped before its first chunk
    sys.stdout, sys.stderr = _ReaderMayLeave(real), _ReaderMayLeave(real_err)
    try:
        try:
            return _run(sys.argv[1:] if argv is None else list(argv))
        finally:  # also after --help's SystemExit
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        sys.stdout, sys.stderr = real, real_err


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(_verbosity_first(argv))
    # Servers say what they do (start-up, commits, releases) at INFO; client commands stay quiet unless -v.
    base = logging.INFO if args.command.startswith("serve-") else logging.WARNING
    level = base - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args))
    except ServiceError as exc:
        print(f"dpagg: {exc.code.name}: {exc.details}", file=sys.stderr)
        return 1
    except DPAggError as exc:
        print(f"dpagg: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"dpagg: interrupted ({args.command}); what the servers had already accepted stands", file=sys.stderr)
        return 130
