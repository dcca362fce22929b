"""`dpagg serve-*` and `dpagg health`: run the three servers, probe one."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..common.config import AnalystConfig, ComputationConfig, DecryptionConfig
from he_partition.core.errors import DPAggError
from .options import (
    Subparsers,
    command_adder,
    computation_target,
    conn,
    decryption_target,
    operator_key_arg,
    operator_keys,
    refuse_seed_without_insecure,
    seed_arg,
    server_args,
    tls_args,
    tls_config,
)


def cmd_serve_decryption(args: argparse.Namespace) -> int:
    from ..decryption.server import serve_decryption

    refuse_seed_without_insecure(args)
    tls = tls_config(args)
    config = DecryptionConfig(Path(args.data_dir), host=args.host, port=args.port,
                              noise_seed=args.insecure_noise_seed, tls=tls, insecure=tls is None,
                              computation_ids=tuple(args.computation_id or ()), decrypt_workers=args.decrypt_workers,
                              operator_keys=operator_keys(args))
    if args.key_share or args.holders:
        from ..decryption.keyshare.servicer import serve_keyshare

        if not (args.key_share and args.holders):
            raise DPAggError("a key-share holder needs both --key-share NAME and --holders NAME1,NAME2,...")
        serve_keyshare(config, args.key_share, tuple(h for h in args.holders.split(",") if h),
                       port_file=args.port_file)
        return 0
    serve_decryption(config, port_file=args.port_file)
    return 0


def cmd_serve_computation(args: argparse.Namespace) -> int:
    from ..computation.server import serve_computation

    refuse_seed_without_insecure(args)
    tls = tls_config(args)
    if args.ray_tls:
        from ..common.ray_tls import apply_ray_tls

        apply_ray_tls(args.ray_tls)
    holders = tuple(args.holder or ())
    serve_computation(ComputationConfig(Path(args.data_dir), "" if holders else args.decryption, holders=holders,
                                        host=args.host, port=args.port,
                                        noise_seed=args.insecure_noise_seed, serve_analyst=not args.no_analyst,
                                        tls=tls, insecure=tls is None, chunk_workers=args.chunk_workers,
                                        upload_queue=args.upload_queue, ingest_processes=args.ingest_processes,
                                        executor="ray" if args.cluster else args.executor, cluster=args.cluster,
                                        ray_node_ip=args.ray_node_ip),
                      port_file=args.port_file)
    return 0


def cmd_serve_analyst(args: argparse.Namespace) -> int:
    from ..computation.server import serve_analyst

    tls = tls_config(args)
    serve_analyst(AnalystConfig(Path(args.data_dir), host=args.host, port=args.port, tls=tls, insecure=tls is None),
                  port_file=args.port_file)
    return 0


def cmd_setup_key(args: argparse.Namespace) -> int:
    from ..computation.client import ComputationClient

    with ComputationClient(args.computation, **conn(args)) as c:
        digest, holders, already = c.setup_key(threshold=args.threshold)
        t = c.key_threshold
    print(f"deployment {digest} ({'already fixed' if already else 'fixed'}; holders {', '.join(holders)}; "
          f"{'any ' + str(t) if t < len(holders) else 'all ' + str(len(holders))} of {len(holders)} release; "
          "each study gets its own collective key when it is opened)")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from ..common.client import BaseClient

    with BaseClient(args.target, **conn(args)) as c:
        c.wait_ready(args.service, timeout=args.timeout)
    print(f"{args.target} {args.service or '(server)'}: SERVING")
    return 0



def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    dec = decryption_target()
    p = add("serve-decryption", cmd_serve_decryption, "run the decryption server (key holder and budget ledger)")
    server_args(p, 50051)
    p.add_argument("--decrypt-workers", type=int, default=None, metavar="N",
                   help="local processes checking and decrypting a measurement's chunks on this host as they arrive "
                        "(with --key-share: computing this holder's shares of a measurement's chunks) (default: "
                        "min(cores, 8); 0 or 1: in the server process). They start with the server and read the key "
                        "file here; see docs/scaling.md")
    p.add_argument("--key-share", default="", metavar="NAME",
                   help="run as key-share holder NAME (threshold mode, docs/threshold.md): holds a share of the "
                        "collective key, its own ledger, and issues decryption shares only")
    p.add_argument("--holders", default="", metavar="NAME1,NAME2,...",
                   help="with --key-share: every holder's name in order (K = their number, K >= 2)")
    p.add_argument("--computation-id", action="append", metavar="ID",
                   help="party id of a computation server allowed to open studies and request decryptions "
                        "(repeatable; default: any certificate with role computation)")
    operator_key_arg(p)
    seed_arg(p)
    tls_args(p)

    p = add("serve-computation", cmd_serve_computation,
            "run the computation server (uploads, aggregation, releases; hosts the analyst service)")
    server_args(p, 50052)
    p.add_argument("--decryption", **dec)
    p.add_argument("--holder", action="append", metavar="NAME=HOST:PORT",
                   help="threshold mode: a key-share holder (repeat for each, K >= 2; replaces --decryption)")
    p.add_argument("--no-analyst", action="store_true", help="do not host the analyst service in this process")
    p.add_argument("--executor", choices=("processes", "inprocess", "ray"), default="processes",
                   help="where a release's chunk work runs (default: local worker processes, one per core)")
    p.add_argument("--chunk-workers", type=int, default=0, metavar="N", help="chunk workers (0: one per core)")
    p.add_argument("--upload-queue", type=int, default=64, metavar="N",
                   help="owners' uploads that may wait for a running one to finish, first come first served "
                        "(default 64; each waits on a thread of its own; past it an upload is refused 'server busy' "
                        "and the owner's client retries)")
    p.add_argument("--ingest-processes", type=int, default=0, metavar="N",
                   help="N processes share the port and receive, check and store the owners' upload chunks "
                        "themselves, forwarding every other call to this one (default 0: this process alone; "
                        "about one per 2 cores on a host that takes many owners at once; docs/scaling.md)")
    p.add_argument("--cluster", default="", metavar="HOST:PORT",
                   help="run the chunk work on this Ray cluster (HOST:PORT or ray://HOST:PORT; needs "
                        "pip install 'dpagg[ray]'); see docs/scaling.md for TLS and bind addresses")
    p.add_argument("--ray-tls", default="", metavar="DIR:NODE_ID",
                   help="run Ray under mutual TLS with the node certificate NODE_ID in DIR (made by `dpagg certs "
                        "--ray-node NODE_ID`): sets RAY_USE_TLS and RAY_TLS_* for the Ray this server starts or joins")
    p.add_argument("--ray-node-ip", default="127.0.0.1", metavar="ADDR",
                   help="the address this server's Ray processes bind to and advertise (default 127.0.0.1)")
    seed_arg(p)
    tls_args(p)

    p = add("serve-analyst", cmd_serve_analyst,
            "serve the analyst queries from a computation server's data directory (read-only)")
    server_args(p, 50053)
    tls_args(p)

    p = add("setup-key", cmd_setup_key, "threshold mode: fix the key-share holders' deployment (t and every "
                                        "holder's identity keys; idempotent) and print its digest; each study's "
                                        "collective key is set up when the study is opened")
    p.add_argument("--computation", **computation_target())
    p.add_argument("--threshold", type=int, default=0, metavar="T",
                   help="t-of-N keys: any T of the N holders release (T > N/2; e.g. 2 of 3); default: all N")
    tls_args(p)

    p = add("health", cmd_health, "check a server's gRPC health (exit 0 when SERVING); for container probes")
    p.add_argument("target", help="host:port")
    p.add_argument("--service", default="", help="service name, e.g. dpagg.v1.Computation (default: the server)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    tls_args(p)
