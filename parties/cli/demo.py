"""`dpagg demo`: every party on loopback, generated owners, a release and a query."""

from __future__ import annotations

import argparse
from pathlib import Path

from he_partition.core.errors import DPAggError

from ..common.progress import Progress
from .options import domain_spec, Subparsers, command_adder, print_json, seed_arg


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import format_demo, plot_demo, run_demo

    if args.plot:
        try:
            import matplotlib  # noqa: F401  (checked before the demo runs, not after)
        except ImportError:
            raise DPAggError("--plot needs matplotlib: pip install 'dpagg[plot]' (or run the demo without --plot)") \
                from None

    result = run_demo(owners=args.owners, records=args.records, domain=args.domain, epsilon=args.epsilon,
                      seed=args.seed, data_dir=Path(args.data_dir) if args.data_dir else None,
                      noise_seed=args.insecure_noise_seed, tls=not args.insecure,
                      progress=Progress(enabled=not args.json))
    if args.plot:
        plot_demo(result, Path(args.plot))
        result["plot"] = str(args.plot)
    if args.json:
        print_json(result)
    else:
        print(format_demo(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0



def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    p = add("demo", cmd_demo, "run every party on loopback with three generated data owners, release, query")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--plot", metavar="PATH",
                   help="write a PNG of true vs released histogram, partition boundaries marked (needs matplotlib)")
    p.add_argument("--owners", type=int, default=3, help="number of data owners (default 3)")
    p.add_argument("--records", type=int, default=3000, help="records per owner (default 3000)")
    p.add_argument("--domain", type=domain_spec, default="age:0:100:100", help="binning (default age:0:100:100)")
    p.add_argument("--epsilon", type=float, default=1.0, help="study budget (default 1.0)")
    p.add_argument("--seed", type=int, default=7, help="seed of the generated data (default 7)")
    p.add_argument("--data-dir", help="keep the servers' state here (default: a temporary directory)")
    p.add_argument("--insecure", action="store_true",
                   help="run the parties without mutual TLS (default: TLS with a throwaway CA in the data dir)")
    seed_arg(p)
