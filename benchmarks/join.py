"""Cross-organization join benchmark: two owners' DP cross-tabulation, through the services or the library.

`python -m benchmarks.join` runs two owners with 50,000 records each, 30,000 shared, joint
domain 16 x 16, through the real services (decryption and computation servers as separate
processes on loopback, the two owners as two processes running `submit_join`, an operator
release, an analyst read) and prints its figures on the last line; `--bins 64` runs 64 x 64
(16x the ciphertext products); `--records`, `--shared`, `--padding-offset` change the data.
`--release` picks how the table is released (default cells: every cell noised; gap, hier,
dawa, privelet, auto: that strategy over the table flattened along the Hilbert curve).
`--holders 3` runs the same join at three key-share holders (each its own process; `--threshold 2`
for 2-of-3, `--stop-holder I` stops holder I once the study is open, through the uploads and the
release) right after the single key holder's run with the same data, and reports both and their ratio.
`--library` runs the protocol's library path in one process instead, timing each step:
key generation (decryption server), oblivious pseudonyms (owners blind, the key holder evaluates,
owners unblind: `oprf_blind`, `oprf_evaluate`, `oprf_finalize`, both owners together), X25519 key
agreement and the HMAC of each PRF value (owners),
placement (computation server), indicator encoding, encryption and serialization (owners:
the bytes they would upload), products and rotations (computation server), then the release
(noise, pads and flooding per measured value; decryption and the key holder's noise).
Reported: wall time per step and total, bytes uploaded per owner, bytes sent to the key
holder, peak RSS, and the per-cell error against the plaintext join.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

import numpy as np

from he_partition.join import oprf
from he_partition.join.protocol import (JOIN_RELEASES, JoinKeyPair, JoinTerms, check_placement, encode_indicators,
                                        groups_for, min_padding_offset, oprf_input, place, posted_pseudonyms)
from parties.data_owner.join import evaluation_batch
from he_partition.join.protocol import CURRENT_JOIN_VERSION, MAX_JOIN_CAPACITY
from he_partition.he.join_scheme import JoinParams, JoinScheme, join_plain_modulus
from he_partition.join.parallel import JoinEvaluator
from he_partition.join.release import bin_cells, cell_table, release_table
from he_partition.join.wellformed import SEED_BYTES, check_rounds, residues, well_formed
from he_partition.core.noise import SecureRandom

from .common import write_result


def _data(records: int, shared: int, bins: int, seed: int, skew: float = 0.0) -> tuple[dict[str, int], dict[str, int]]:
    """Both owners' records: attribute bins uniform, or (skew p > 0) geometric(p) - 1 capped at the last bin,
    which leaves most of the table nearly empty (the case partition strategies are for)."""
    rng = np.random.default_rng(seed)
    ids = [f"customer-{i:07d}@example.org" for i in range(2 * records - shared)]

    def values() -> list[int]:
        if skew > 0:
            return np.minimum(rng.geometric(skew, records) - 1, bins - 1).tolist()
        return rng.integers(0, bins, records).tolist()

    a = dict(zip(ids[:records], values()))
    b = dict(zip(ids[records - shared:], values()))
    return a, b


def _order(bins: int) -> str:
    return "hilbert" if not bins & (bins - 1) else "row"


def _errors(summary: Any, truth: np.ndarray) -> dict[str, Any]:
    est, se = cell_table(summary)
    err = est - truth
    return {"release": summary.params["join"]["release"], "order": summary.params["join"]["order"],
            "partitions": summary.n_partitions, "cell_noise_sd": [round(float(se.min()), 3), round(float(se.max()), 3)],
            "max_abs_error": round(float(np.abs(err).max()), 2), "rmse": round(float(np.sqrt(np.mean(err ** 2))), 3)}


def run(records: int, shared: int, bins: int, epsilon: float, pad_epsilon: float, pad_offset: int,
        seed: int, release: str = "cells", skew: float = 0.0, compare: int = 0) -> dict[str, Any]:
    """The library path; `compare` > 0: afterwards release the same cell totals with every join release
    `compare` times each and report the mean errors (result["compare"])."""
    a, b = _data(records, shared, bins, seed, skew)
    times: dict[str, float] = {}

    def step(name: str, t0: float) -> float:
        now = time.perf_counter()
        times[name] = round(now - t0, 3)
        return now

    start = t = time.perf_counter()
    ds = JoinScheme.generate(JoinParams.for_version(CURRENT_JOIN_VERSION))
    public_bytes = ds.public_bytes()
    t = step("keygen", t)
    owner_scheme = JoinScheme.from_public(public_bytes)
    ka, kb = JoinKeyPair(), JoinKeyPair()
    key_a = ka.join_key(kb.public_bytes, study_id="bench", contract_hash="h")
    key_b = kb.join_key(ka.public_bytes, study_id="bench", contract_hash="h")
    ids_a, ids_b = list(a), list(b)
    slots = owner_scheme.slots
    capacity = _capacity(records, shared, pad_offset)  # public in a real study (the contract's join capacity)
    pad_terms = JoinTerms(bins, bins, capacity, pad_epsilon, pad_offset, version=CURRENT_JOIN_VERSION,
                          pseudonyms="oprf")
    # Oblivious pseudonyms: each owner blinds its identifiers (and pads), the key holder evaluates, the owner
    # unblinds and hashes (he_partition.join.oprf); timed per side.
    oprf_key = oprf.study_key(b"k" * 32, "bench", "h")
    outputs = []
    for pair, ids in ((ka, ids_a), (kb, ids_b)):
        inputs = [oprf_input(i) for i in ids]
        t0 = time.perf_counter()
        batch, blinds, where = evaluation_batch(pair.private_secret("bench"), inputs, pad_terms.dummy_allowance() // 2)
        t1 = time.perf_counter()
        evaluated = oprf.blind_evaluate(oprf_key, batch)
        t2 = time.perf_counter()
        outputs.append(oprf.finalize(inputs, blinds, [evaluated[k] for k in where]))
        t3 = time.perf_counter()
        for name, dt in (("oprf_blind", t1 - t0), ("oprf_evaluate", t2 - t1), ("oprf_finalize", t3 - t2)):
            times[name] = round(times.get(name, 0.0) + dt, 3)
    t = time.perf_counter()
    ps_a, real_a = posted_pseudonyms(ka, key_a, ids_a, pad_terms, study_id="bench", prf_outputs=outputs[0])
    ps_b, real_b = posted_pseudonyms(kb, key_b, ids_b, pad_terms, study_id="bench", prf_outputs=outputs[1])
    t = step("pseudonyms", t)
    place_a, place_b = place(ps_a, ps_b, capacity, SecureRandom())
    t = step("placement", t)
    check_placement(ps_a, place_a, capacity)
    check_placement(ps_b, place_b, capacity)
    uploads = []
    for real, ids, values, placement in ((real_a, ids_a, a, place_a), (real_b, ids_b, b, place_b)):
        value_of = {p: values[i] for p, i in zip(real, ids)}
        planes = encode_indicators(placement, value_of, bins, capacity, slots)
        uploads.append([[owner_scheme.serialize(owner_scheme.encrypt(p)) for p in g] for g in planes])
    t = step("owners_encrypt", t)
    seed = os.urandom(SEED_BYTES)  # the key holder's (parties.decryption.join_checks)
    for owner, up in zip("ab", uploads):  # the well-formedness check: the CS's residues, the key holder's decryption
        if not well_formed(ds, [ds.deserialize_released(c) for c in residues(owner_scheme, up, seed, owner)]):
            raise SystemExit(f"owner {owner}'s upload failed the well-formedness check")
    t = step("wellformed_check", t)
    terms = JoinTerms(bins, bins, capacity, pad_epsilon, pad_offset, release=release, order=_order(bins),
                      version=CURRENT_JOIN_VERSION)
    with JoinEvaluator(public_bytes, uploads[0], uploads[1], bin_cells(terms), SecureRandom()) as ev:
        t = step("cs_products_and_sums", t)
        summary, sent = release_table(ev.measure, ds, terms, epsilon, SecureRandom())
        t = step("release_noise_flood_decrypt", t)
        total = time.perf_counter() - start
        truth = np.zeros((bins, bins), dtype=np.int64)
        for ident in set(a) & set(b):
            truth[a[ident], b[ident]] += 1
        compared = {}
        for name in JOIN_RELEASES if compare else ():
            other = JoinTerms(bins, bins, capacity, pad_epsilon, pad_offset, release=name, order=_order(bins),
                              version=CURRENT_JOIN_VERSION)
            runs = [_errors(release_table(ev.measure, ds, other, epsilon, SecureRandom())[0], truth)
                    for _ in range(compare)]
            compared[name] = {"rmse": round(float(np.mean([r["rmse"] for r in runs])), 3),
                              "partitions": round(float(np.mean([r["partitions"] for r in runs])), 1)}
            print(f"  {name:8s} cell RMSE {compared[name]['rmse']:7.3f} ({compared[name]['partitions']:.0f} partitions, "
                  f"mean of {compare})", flush=True)
    return {
        "mode": "library", "records_per_owner": records, "shared": shared, "bins": f"{bins}x{bins}", "skew": skew,
        "epsilon": epsilon,
        "padding": {"epsilon": pad_epsilon, "offset": pad_offset, "delta": pad_terms.delta, "posted": [len(ps_a), len(ps_b)]},
        "capacity": capacity, "groups": capacity // slots,
        "ciphertext_products": capacity // slots * bins * bins,
        # both owners: per group and round one squaring and 2 x bins plaintext products (NTT form); per round one
        # relinearization
        "wellformed_check": {"rounds": check_rounds(owner_scheme.plain_modulus),
                             "squarings": 2 * capacity // slots * check_rounds(owner_scheme.plain_modulus),
                             "plain_products": 2 * capacity // slots * 2 * bins * check_rounds(owner_scheme.plain_modulus),
                             "relinearizations": 2 * check_rounds(owner_scheme.plain_modulus), "rotations": 0},
        "seconds": times, "total_seconds": round(total, 2),
        "bytes_uploaded_per_owner": [sum(len(x) for g in up for x in g) for up in uploads],
        "bytes_to_key_holder": sent, "public_key_bytes": len(public_bytes),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **_errors(summary, truth),
        **({"compare": compared, "nonzero_cells": int(np.count_nonzero(truth))} if compare else {}),
    }


def _owner_process(owner: str, study: str, cs: str, records: dict[str, int], state: str, out: Any,
                   signing_key: bytes, ds: str, capacity: int, holders: list[str] | None = None) -> None:
    from parties.data_owner.client import DataOwnerClient
    from parties.data_owner.join import submit_join
    from parties.decryption.client import DecryptionClient

    t0 = time.perf_counter()
    key_holders = [DecryptionClient(h, insecure=True) for h in holders] if holders else None
    with DataOwnerClient(owner, computation=cs, decryption=ds or None, insecure=True, progress=False,
                         signing_key=signing_key) as client:
        # The study declares no counts, so each owner's quota is the capacity: both owners here accept it.
        res = submit_join(client, study, records, idempotency_key=f"bench-{owner}", state_dir=state,
                          max_partner_records=capacity, key_holders=key_holders)
    out.put((owner, res.bytes_sent, time.perf_counter() - t0,
             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def _owner_results(out: Any, procs: list[Any], limit: float = 3600.0) -> list[Any]:
    """Each owner process's result; SystemExit as soon as one exits without one (its traceback is above)."""
    import queue

    results: list[Any] = []
    deadline = time.monotonic() + limit
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [p.name for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise SystemExit(f"owner process(es) {', '.join(failed) or 'timed out'} ended without a result; "
                                 "stopping the servers") from None
    return results


def run_services(records: int, shared: int, bins: int, epsilon: float, pad_epsilon: float, pad_offset: int,
                 seed: int, release: str = "cells", skew: float = 0.0, holders: int = 0, threshold: int = 0,
                 stop_holder: int | None = None) -> dict[str, Any]:
    """End to end through the services: servers and owners in their own processes, plaintext loopback; with
    `holders` K > 1, K key-share holders in place of the decryption server (t-of-N: `threshold`; holder
    `stop_holder` stopped once the study is open)."""
    import multiprocessing as mp
    import tempfile
    from pathlib import Path

    from parties.analyst.client import AnalystClient
    from parties.common.signing import generate_signing_key
    from parties.computation.client import ComputationClient

    from .services import _start_server, _vm_hwm_mb

    a, b = _data(records, shared, bins, seed, skew)
    work = Path(tempfile.mkdtemp(prefix="dpagg-join-bench-"))
    names = [f"h{i + 1}" for i in range(holders)]
    servers: dict[str, Any] = {}
    if holders:
        for name in names:
            servers[name] = _start_server(["serve-decryption", "--insecure", "--data-dir", str(work / name),
                                           "--key-share", name, "--holders", ",".join(names)], work, name)
        link = [a for name in names for a in ("--holder", f"{name}={servers[name][1]}")]
        ds_target = ""
    else:
        servers["ds"] = _start_server(["serve-decryption", "--data-dir", str(work / "ds"), "--insecure"], work, "ds")
        ds_target = servers["ds"][1]
        link = ["--decryption", ds_target]
    cs, cs_target = _start_server(["serve-computation", "--data-dir", str(work / "cs"), *link, "--insecure"], work,
                                  "cs")
    holder_targets = [servers[n][1] for n in names] if holders else None
    procs: list[Any] = []
    try:
        capacity = _capacity(records, shared, pad_offset)
        terms = {"shape": [bins, bins], "capacity": capacity, "padding_epsilon": pad_epsilon,
                 "padding_offset": pad_offset, "release": release, "order": _order(bins),
                 "join_version": CURRENT_JOIN_VERSION}
        keys = {o: generate_signing_key() for o in ("a", "b")}  # a join study is signed (docs/join.md)
        with ComputationClient(cs_target, insecure=True) as op:
            if holders:
                op.setup_key(threshold=threshold)
        start = time.perf_counter()
        with ComputationClient(cs_target, insecure=True) as op:
            op.open_study(study_id="bench", domain_size=bins * bins, epsilon=epsilon + pad_epsilon,
                          expected_owners=["a", "b"], strategy="join", strategy_params_json=json.dumps(terms),
                          owner_keys={o: public for o, (_, public) in keys.items()})
            opened = time.perf_counter()
            if stop_holder is not None:
                servers[names[stop_holder]][0].terminate()
                servers[names[stop_holder]][0].wait(30)
            out: Any = mp.get_context("spawn").Queue()
            procs = [mp.get_context("spawn").Process(target=_owner_process, args=(o, "bench", cs_target, r,
                                                                                 str(work / o), out, keys[o][0], ds_target,
                                                                                 capacity, holder_targets))
                     for o, r in (("a", a), ("b", b))]
            for p in procs:
                p.start()
            owners = sorted(_owner_results(out, procs))
            for p in procs:
                p.join()
            submitted = time.perf_counter()
            rel = op.run_release("bench", epsilon=epsilon)
            released = time.perf_counter()
        with AnalystClient(cs_target, insecure=True) as an:
            summary = an.get_release(rel.release_id).summary
        total = time.perf_counter() - start
        live = {n: proc for n, (proc, _) in servers.items() if proc.poll() is None}
        rss: dict[str, Any] = {**{n: _vm_hwm_mb(proc.pid) for n, proc in live.items()},
                               "computation": _vm_hwm_mb(cs.pid), **{f"owner_{o}": round(m, 1) for o, _, _, m in owners}}
        cpu: dict[str, Any] = {"computation_server": _cpu_seconds(cs.pid),
                               **{n: _cpu_seconds(proc.pid) for n, proc in live.items()}}
        log_lines = (work / "cs.log").read_text().splitlines()
        workers = [line.rsplit("peak RSS per worker ", 1)[-1] for line in log_lines if "peak RSS per worker" in line]
        if workers:  # the last: after the release (the workers' peak over the products and the measurements)
            rss["computation_workers"] = workers[-1].removesuffix(" MB")
        worker_cpu = [line.split("CPU per worker ", 1)[1].split(" s,", 1)[0] for line in log_lines
                      if "CPU per worker" in line]
        if worker_cpu:
            cpu["computation_workers"] = worker_cpu[-1]
        checked = [line.split("both join uploads checked in ", 1)[1].split(" s", 1)[0] for line in log_lines
                   if "both join uploads checked in " in line]
    finally:
        for owner in procs:  # an owner that failed or still waits is stopped with the servers
            if owner.is_alive():
                owner.terminate()
            owner.join(30)
        for proc in (cs, *(p for p, _ in servers.values())):
            if proc.poll() is None:
                proc.terminate()
            proc.wait(30)
    truth = np.zeros((bins, bins), dtype=np.int64)
    for ident in set(a) & set(b):
        truth[a[ident], b[ident]] += 1
    return {
        "mode": "services", "key_holders": holders or 1, "threshold": threshold or holders or 1,
        "stopped_holder": names[stop_holder] if stop_holder is not None else None, "records_per_owner": records, "shared": shared, "bins": f"{bins}x{bins}", "skew": skew,
        "epsilon": epsilon, "padding": {"epsilon": pad_epsilon, "offset": pad_offset}, "capacity": capacity,
        "ciphertext_products": capacity // 8192 * bins * bins,
        "seconds": {"open_study": round(opened - start, 2), "owners_until_both_committed": round(submitted - opened, 2),
                    **{f"owner_{o}": round(t, 2) for o, _, t, _ in owners},
                    "release": round(released - submitted, 2), "release_server_side": round(rel.seconds or 0, 2),
                    # the well-formedness check inside the release (the computation server's log)
                    **({"release_check": float(checked[-1])} if checked else {})},
        "total_seconds": round(total, 2),
        "bytes_uploaded_per_owner": [n for _, n, _, _ in owners],
        "bytes_to_key_holder": rel.bytes_to_decryption,
        "peak_rss_mb": {k: round(v, 1) if isinstance(v, float) else v for k, v in rss.items()},
        "cpu_seconds": cpu,
        **_errors(summary, truth),
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (its own, not its children's: the workers report theirs)."""
    import os
    from pathlib import Path

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def _capacity(records: int, shared: int, pad_offset: int) -> int:
    """Room for both owners' records and the three paddings (each offset + a discrete Laplace draw)."""
    capacity = groups_for(2 * records - shared + pad_offset * 4, 8192) * 8192
    if capacity > MAX_JOIN_CAPACITY:
        raise SystemExit(f"{2 * records - shared} customers need capacity {capacity}, above {MAX_JOIN_CAPACITY}: "
                         f"counts mod t = {join_plain_modulus(CURRENT_JOIN_VERSION)} could wrap (docs/join.md, Scale)")
    return capacity


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=50_000, help="records per owner (default 50000)")
    p.add_argument("--shared", type=int, default=30_000, help="customers both owners hold (default 30000)")
    p.add_argument("--bins", type=int, default=16, help="bins per attribute: the table is BINS x BINS (default 16)")
    p.add_argument("--epsilon", type=float, default=1.0, help="release epsilon (default 1)")
    p.add_argument("--padding-epsilon", type=float, default=0.5,
                   help="epsilon of the dummy padding that hides the intersection size (default 0.5)")
    p.add_argument("--padding-offset", type=int, default=None,
                   help="mean number of dummies of each kind (default: the smallest with delta <= 1e-6)")
    p.add_argument("--seed", type=int, default=7, help="data seed (default 7)")
    p.add_argument("--release", choices=JOIN_RELEASES, default="cells",
                   help="how the table is released (default cells; the others run that strategy over the table "
                        "flattened along the Hilbert curve)")
    p.add_argument("--skew", type=float, default=0.0,
                   help="attribute bins geometric(SKEW) instead of uniform: 0.3 leaves most cells nearly empty "
                        "(default 0: uniform)")
    p.add_argument("--library", action="store_true", help="run the library path in one process (no services)")
    p.add_argument("--holders", type=int, default=0, metavar="K",
                   help="also run the join at K key-share holders (after the single key holder's run, same data)")
    p.add_argument("--threshold", type=int, default=0, metavar="T", help="with --holders: a T-of-K key (default K)")
    p.add_argument("--stop-holder", type=int, default=None, metavar="I",
                   help="with --holders: stop holder I (0-based) once the study is open")
    p.add_argument("--compare", type=int, default=0, metavar="N",
                   help="with --library: then release the same table with every join release N times each and "
                        "print the mean cell RMSE of each")
    args = p.parse_args(argv)
    if args.padding_offset is None:
        args.padding_offset = min_padding_offset(args.padding_epsilon)
    if args.compare and not args.library:
        p.error("--compare needs --library")
    if args.library:
        result = run(args.records, args.shared, args.bins, args.epsilon, args.padding_epsilon, args.padding_offset,
                     args.seed, args.release, args.skew, args.compare)
    elif args.holders:
        return _main_holders(args)
    else:
        result = run_services(args.records, args.shared, args.bins, args.epsilon, args.padding_epsilon,
                              args.padding_offset, args.seed, args.release, args.skew)
    sized = (args.records, args.shared) != (p.get_default("records"), p.get_default("shared"))
    suffix = (("_library" if args.library else "") + ("" if args.release == "cells" else f"_{args.release}")
              + (f"_records{args.records}_shared{args.shared}" if sized else "")
              + (f"_skew{args.skew:g}" if args.skew else "")
              + (f"_compare_eps{args.epsilon:g}" if args.compare else ""))
    write_result(f"join_{args.bins}x{args.bins}{suffix}", result)
    s = result["seconds"]
    print(f"join {result['bins']} ({'library' if args.library else 'services'}), {args.records} records per owner, "
          f"{args.shared} shared: {result['ciphertext_products']} ciphertext products; "
          + ", ".join(f"{k} {v} s" for k, v in s.items()))
    print(f"uploaded {result['bytes_uploaded_per_owner'][0] / 1e6:.1f} MB per owner, "
          f"{result['bytes_to_key_holder'] / 1e6:.1f} MB to the key holder, peak RSS {result['peak_rss_mb']} MB, "
          f"release {result['release']} ({result['partitions']} partitions): cell RMSE {result['rmse']}, max |error| "
          f"{result['max_abs_error']} (cell noise sd {result['cell_noise_sd']})")
    print(json.dumps({"total_seconds": result["total_seconds"], "bins": result["bins"],
                      "bytes_uploaded_per_owner": result["bytes_uploaded_per_owner"][0],
                      "peak_rss_mb": result["peak_rss_mb"],
                      **({"cpu_seconds": result["cpu_seconds"]} if "cpu_seconds" in result else {})}))
    return 0


def _main_holders(args: argparse.Namespace) -> int:
    """The single key holder's run, then the same join at --holders key-share holders; both and their ratios."""
    common = (args.records, args.shared, args.bins, args.epsilon, args.padding_epsilon, args.padding_offset,
              args.seed, args.release, args.skew)
    single = run_services(*common)
    held = run_services(*common, holders=args.holders, threshold=args.threshold, stop_holder=args.stop_holder)
    ratios = {k: round(held["seconds"][k] / single["seconds"][k], 2)
              for k in ("release", "owners_until_both_committed") if single["seconds"].get(k)}
    ratios["total"] = round(held["total_seconds"] / single["total_seconds"], 2)
    form = f"{args.threshold or args.holders}of{args.holders}" + (f"_stop{args.stop_holder}"
                                                                  if args.stop_holder is not None else "")
    path = write_result(f"join_holders_services_{args.bins}x{args.bins}_{form}", {
        "single_key_holder": single, "key_share_holders": held, "ratio_holders_over_single": ratios,
        "note": "every server and owner a separate process on one machine, plaintext loopback; the two runs one "
                "after the other with the same data"})
    for r in (single, held):
        print(f"{r['key_holders']} key holder(s) ({r['threshold']} per release, stopped: {r['stopped_holder']}): "
              + ", ".join(f"{k} {v} s" for k, v in r["seconds"].items()) + f"; total {r['total_seconds']} s; "
              f"cell RMSE {r['rmse']}; CPU s {r['cpu_seconds']}; peak RSS MB {r['peak_rss_mb']}")
    print(f"holders / single: {ratios}; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
