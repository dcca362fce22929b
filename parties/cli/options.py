"""What every command group shares: environment names, TLS and connection options, small parsers, output."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeAlias


from he_partition.core.errors import DPAggError

from ..common.config import ENV_COMPUTATION, ENV_DECRYPTION, default_target

if TYPE_CHECKING:
    from ..common.tls import TlsConfig

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

ENV_STATE_DIR = "DPAGG_STATE_DIR"
ENV_CA_CERT = "DPAGG_CA_CERT"
ENV_CERT = "DPAGG_CERT"
ENV_KEY = "DPAGG_KEY"
#: The operator's study approval key (private, from `dpagg keygen`), which open-study signs with.
ENV_APPROVAL_KEY = "DPAGG_APPROVAL_KEY"
#: The operator approval public keys a key holder pins (comma-separated files or hex keys).
ENV_OPERATOR_KEY = "DPAGG_OPERATOR_KEY"


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, separators=(",", ":")))


def owner_list(text: str) -> list[str]:
    owners = [o.strip() for o in text.split(",") if o.strip()]
    if not owners:
        raise argparse.ArgumentTypeError("give at least one owner id, comma-separated")
    return owners




def domain_spec(text: str) -> str:
    """argparse type of --domain: the spec parses and has a bin count a study accepts (checked where it is typed,
    before any data is read or any server asked)."""
    from ..common.contract import MAX_DOMAIN_SIZE
    from ..data_owner.domain import DomainSpec

    try:
        bins = DomainSpec.parse(text, max_bins=MAX_DOMAIN_SIZE).n_bins
    except DPAggError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 1 <= bins <= MAX_DOMAIN_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r} has {bins:,} bins; a study holds 1 to {MAX_DOMAIN_SIZE:,} "
                                         "(2^24) bins")
    return text


def domain_size(text: str) -> int:
    """argparse type of --domain-size: an integer bin count a study accepts (0: not given)."""
    from ..common.contract import MAX_DOMAIN_SIZE

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bins") from None
    if not 0 <= n <= MAX_DOMAIN_SIZE:
        raise argparse.ArgumentTypeError(f"{n:,} bins; a study holds 1 to {MAX_DOMAIN_SIZE:,} (2^24) bins")
    return n


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return v


def nonempty_id(text: str) -> str:
    """An id given on the command line: an empty one is an error (usually an unset shell variable)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset shell variable?); give an id, or leave the flag out to "
                                         "have one generated")
    return text


def state_dir(args: argparse.Namespace) -> Path:
    base = args.state_dir or os.environ.get(ENV_STATE_DIR) or str(Path.home() / ".dpagg")
    return Path(base) / "uploads"


def upload_key_path(args: argparse.Namespace) -> Path:
    """Where this owner's upload key to this study (on this computation server) is kept."""
    ident = hashlib.sha256(f"{args.computation}|{args.study}|{args.owner}".encode()).hexdigest()[:16]
    return state_dir(args) / f"{args.study}.{args.owner}.{ident}.key"


def upload_key(args: argparse.Namespace) -> str:
    """The idempotency key of this owner's upload to this study, kept on disk so a re-run resumes."""
    if args.idempotency_key:
        return str(args.idempotency_key)
    path = upload_key_path(args)
    if path.exists():
        return path.read_text().strip()
    key = f"up-{uuid.uuid4().hex[:20]}"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(key + "\n")
    return key


def bounding_random(args: argparse.Namespace, key: str) -> Any:
    """The random source of this upload's contribution bounding: a KeyedRandom under a 32-byte secret made
    with the upload (0600 next to its key in the state directory), so a re-run of an interrupted submit keeps
    the very records the first run kept and resumes, where fresh randomness would pick another subset.

    The choice stays independent of the data (the bins kept per person are uniformly random under a key only
    this owner holds); it adds no noise and spends no budget."""
    from he_partition.core.noise import KeyedRandom

    path = state_dir(args) / f"{args.study}.{args.owner}.{key}.bounding"
    if path.is_file():
        secret = path.read_bytes()
    else:
        from ..common.tls import write_private_file

        secret = os.urandom(32)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private_file(path, secret)
    return KeyedRandom(secret, f"dpagg contribution bounding|{args.study}|{args.owner}|{key}".encode())


def tls_config(args: argparse.Namespace) -> "TlsConfig | None":
    """This party's mutual-TLS files from --ca-cert/--cert/--key (or DPAGG_CA_CERT/DPAGG_CERT/DPAGG_KEY).

    Without them the command refuses to run unless --insecure was given explicitly.
    """
    from ..common.tls import TlsConfig

    given = [args.ca_cert, args.cert, args.key]
    if args.insecure:
        return None
    if not all(given):
        missing = [flag for flag, v in zip(("--ca-cert", "--cert", "--key"), given) if not v]
        raise DPAggError(
            f"`dpagg {args.command}` uses mutual TLS and needs this party's certificate: {', '.join(missing)} "
            f"missing (or set {ENV_CA_CERT}, {ENV_CERT}, {ENV_KEY}). Create them with `dpagg certs --out DIR "
            "--party ID:ROLE ...`, or pass --insecure for a local test setup without TLS"
        )
    return TlsConfig(Path(args.ca_cert), Path(args.cert), Path(args.key), server_name=args.tls_server_name or "")


def conn(args: argparse.Namespace) -> dict[str, Any]:
    """Client connection arguments: this party's TLS, or an explicit plaintext test setup."""
    return {"tls": tls_config(args), "insecure": bool(args.insecure)}


# --------------------------------------------------------------------------------------- commands
def refuse_seed_without_insecure(args: argparse.Namespace) -> None:
    if getattr(args, "insecure_noise_seed", None) is not None and not args.insecure:
        raise DPAggError("--insecure-noise-seed makes this server's DP noise predictable (no privacy); it is only "
                         "accepted together with --insecure, on a test setup")


def server_args(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--data-dir", required=True, help="directory for this server's state (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    p.add_argument("--port", type=int, default=default_port, help=f"port (0 = any free port; default {default_port})")
    p.add_argument("--port-file", help="write the bound port to this file once listening")


def tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mutual TLS (required unless --insecure)")
    g.add_argument("--ca-cert", default=os.environ.get(ENV_CA_CERT), metavar="PATH",
                   help=f"the deployment CA's certificate (env {ENV_CA_CERT})")
    g.add_argument("--cert", default=os.environ.get(ENV_CERT), metavar="PATH",
                   help=f"this party's certificate; its id and role are what servers check (env {ENV_CERT})")
    g.add_argument("--key", default=os.environ.get(ENV_KEY), metavar="PATH",
                   help=f"this party's private key, mode 0600 (env {ENV_KEY})")
    g.add_argument("--tls-server-name", metavar="NAME",
                   help="name to verify in the server certificate instead of the dialled host")
    g.add_argument("--insecure", action="store_true",
                   help="TESTS ONLY: plaintext gRPC without identities; servers then skip every role check")


def approval_key_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--approval-key", default=os.environ.get(ENV_APPROVAL_KEY), metavar="FILE",
                   help="the operator's study approval key (an Ed25519 key from `dpagg keygen`; env "
                        f"{ENV_APPROVAL_KEY}): the study's terms are signed with it, and key holders with TLS open "
                        "only studies signed by a key they pin (--operator-key)")


def approval_key(args: argparse.Namespace) -> bytes | None:
    """The raw approval key named by --approval-key (None when none is given)."""
    if not getattr(args, "approval_key", None):
        return None
    if not Path(args.approval_key).exists():
        if getattr(args, "insecure", False):
            return None  # a plaintext test setup: its key holders pin nothing
        raise DPAggError(f"--approval-key {args.approval_key}: no such file (make the operator's approval key with "
                         "`dpagg keygen --out FILE`; key holders pin FILE's .pub)")
    from ..common.signing import load_private_key

    return load_private_key(args.approval_key)


def operator_key_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--operator-key", action="append", metavar="FILE.pub|HEX",
                   help="pin an operator approval public key (the .pub `dpagg keygen` wrote, or 64 hex digits); "
                        "repeatable, comma-separated in env " + ENV_OPERATOR_KEY + ". This key holder opens only "
                        "studies one of them signed; required with TLS")


def operator_keys(args: argparse.Namespace) -> tuple[bytes, ...]:
    """The pinned approval keys from --operator-key, else from the environment."""
    from ..common.approval import load_operator_keys

    given = list(args.operator_key or ())
    if not given and not getattr(args, "insecure", False):  # a plaintext test server ignores the environment's
        given = [v for v in os.environ.get(ENV_OPERATOR_KEY, "").split(",") if v]
    return load_operator_keys(given)


def seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--insecure-noise-seed", type=int, default=None, metavar="N",
                   help="TESTS ONLY: draw this server's DP noise from a seeded stream (predictable noise gives "
                        "no privacy)")


Handler: TypeAlias = Callable[[argparse.Namespace], int]


def command_adder(sub: Subparsers) -> Callable[[str, Handler, str], argparse.ArgumentParser]:
    """`add(name, fn, help)`: a subcommand whose description is its help line and whose handler is `fn`."""
    def add(name: str, fn: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=fn)
        return p

    return add


def server_address(text: str) -> str:
    """A server address: host:port (or a gRPC target such as unix:PATH), not a URL."""
    if text.startswith(("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:")):
        return text
    scheme, sep, rest = text.partition("://")
    if sep:
        raise argparse.ArgumentTypeError(f"give the server as host:port, not a URL: {text!r} -> {rest.rstrip('/')!r}"
                                         if ":" in rest else f"give the server as host:port, not a URL ({text!r})")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"give the server as host:port (e.g. localhost:50052), got {text!r}")
    return text


def computation_target() -> dict[str, Any]:
    """`--computation` keyword arguments: the computation server's address (env DPAGG_COMPUTATION)."""
    return {"default": default_target(ENV_COMPUTATION), "type": server_address,
            "help": f"computation server host:port (env {ENV_COMPUTATION}; default %(default)s)"}


def decryption_target() -> dict[str, Any]:
    """`--decryption` keyword arguments: the decryption server's address (env DPAGG_DECRYPTION)."""
    return {"default": default_target(ENV_DECRYPTION), "type": server_address,
            "help": f"decryption server host:port (env {ENV_DECRYPTION}; default %(default)s)"}
