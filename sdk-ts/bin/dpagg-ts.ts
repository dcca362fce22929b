#!/usr/bin/env node
/**
 * dpagg-ts: the TypeScript SDK's data-owner command line.
 *
 *   node bin/dpagg-ts.ts submit --target HOST:PORT --study ID --owner ID (--counts FILE.json | --csv FILE.csv [CSV options])
 *       [--signing-key OWNER.key] (--ca CA --cert CERT --key KEY [--server-name computation.dpagg] | --insecure)
 *       [--idempotency-key KEY] [--state-dir DIR] [--timeout SECONDS]
 *   node bin/dpagg-ts.ts histogram --csv FILE.csv --domain SPEC [CSV options]     # the bounded histogram, no server
 *   node bin/dpagg-ts.ts query --target HOST:PORT (--study ID | --release ID) [--ranges LO:HI,...] [--confidence 0.95]
 *       (--ca CA --cert CERT --key KEY | --insecure)   # an analyst: releases, the release's status, range counts
 *
 * CSV options, as `dpagg submit`: --domain SPEC (default: the study's recorded domain spec), --value-column NAME,
 * --person-column NAME, --per-bin N, --max-bins N (default 1 and 1), --drop-bad-values, --accept-out-of-domain.
 * FILE.json: a JSON array with one count per bin.
 *
 * State (as `dpagg submit`, under --state-dir, env DPAGG_STATE_DIR, default ~/.dpagg; in its uploads/ folder): the
 * upload's idempotency key, the secret of its contribution bounding (so a re-run keeps the same records) and its
 * encrypted chunks until the upload commits, so running the same command again after the process died resumes.
 *
 * Prints one JSON line with the result; progress lines go to stderr. Errors: "dpagg-ts: message" on stderr,
 * exit 1; a bad command line exits 2.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

import { Analyst } from '../src/analyst.ts';
import { type Connection } from '../src/grpc.ts';
import { DataOwner, type SubmitOptions } from '../src/owner.ts';
import { type BoundedHistogram } from '../src/bounding.ts';
import { DomainSpec } from '../src/domain.ts';
import { keyedRandom, readHistogram } from '../src/records.ts';
import { loadPrivateKey } from '../src/signing.ts';

const FLAGS = new Set(['insecure', 'drop-bad-values', 'accept-out-of-domain']);
/** As `dpagg submit`: above this share of records outside the domain a submit needs --accept-out-of-domain. */
const MAX_OUT_OF_DOMAIN_SHARE = 0.2;

class UsageError extends Error {}

function parse(argv: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a.startsWith('--') && FLAGS.has(a.slice(2))) { out[a.slice(2)] = '1'; continue; }
    if (!a.startsWith('--') || i + 1 >= argv.length) throw new UsageError(`unexpected argument ${a}`);
    out[a.slice(2)] = argv[++i]!;
  }
  return out;
}

function positiveInt(args: Record<string, string>, name: string): number {
  const v = Number(args[name] ?? 1);
  if (!Number.isSafeInteger(v) || v < 1) throw new UsageError(`--${name} must be an integer >= 1, got ${args[name]}`);
  return v;
}

function uploadsDir(args: Record<string, string>): string {
  return join(args['state-dir'] ?? process.env.DPAGG_STATE_DIR ?? join(homedir(), '.dpagg'), 'uploads');
}

/** The upload's idempotency key, kept on disk (as `dpagg submit` keeps it) so a re-run resumes. */
function uploadKey(args: Record<string, string>): string {
  if (args['idempotency-key']) return args['idempotency-key'];
  const ident = createHash('sha256').update(`${args.target}|${args.study}|${args.owner}`).digest('hex').slice(0, 16);
  const path = join(uploadsDir(args), `${args.study}.${args.owner}.${ident}.key`);
  if (existsSync(path)) return readFileSync(path, 'utf8').trim();
  const key = `up-${randomBytes(10).toString('hex')}`;
  mkdirSync(uploadsDir(args), { recursive: true, mode: 0o700 });
  writeFileSync(path, key + '\n', { mode: 0o600 });
  return key;
}

/** The secret of this upload's contribution bounding (0600 next to its key): a re-run keeps the very same records. */
function boundingSecret(args: Record<string, string>, key: string): Uint8Array {
  const path = join(uploadsDir(args), `${args.study}.${args.owner}.${key}.ts-bounding`);
  if (existsSync(path)) return new Uint8Array(readFileSync(path));
  const secret = randomBytes(32);
  mkdirSync(uploadsDir(args), { recursive: true, mode: 0o700 });
  writeFileSync(path, secret, { mode: 0o600 });
  return secret;
}

function readCsv(args: Record<string, string>, domainText: string, randomBelow?: (n: number) => number): BoundedHistogram {
  let domain = DomainSpec.parse(domainText);
  if (args['value-column']) domain = domain.withColumn(args['value-column']);
  return readHistogram(args.csv!, domain, {
    ...(args['person-column'] ? { personColumn: args['person-column'] } : {}),
    bounds: { perBin: positiveInt(args, 'per-bin'), maxBins: positiveInt(args, 'max-bins') },
    onBadValue: args['drop-bad-values'] ? 'drop' : 'error', dropHint: '--drop-bad-values',
    ...(randomBelow ? { randomBelow } : {}),
  });
}

function checkCareless(args: Record<string, string>, h: BoundedHistogram): void {
  const total = h.counts.reduce((a, c) => a + c, 0n);
  if (h.recordsRead === 0 || total === 0n) {
    throw new Error(`${args.csv}: ${h.recordsRead} record(s) read, none inside the domain: refusing an empty submission `
      + '(it would commit irreversibly). Check the file and --domain');
  }
  const share = h.outOfDomain / h.recordsRead;
  if (share > MAX_OUT_OF_DOMAIN_SHARE && !args['accept-out-of-domain']) {
    throw new Error(`${args.csv}: ${h.outOfDomain} of ${h.recordsRead} records (${Math.round(share * 100)}%) fall outside the domain; `
      + 'a wrong column or unit? Nothing was sent. Pass --accept-out-of-domain to submit the rest anyway');
  }
}

function histogramJson(h: BoundedHistogram): string {
  return JSON.stringify({ counts: h.counts.map(Number), contribution_bound: h.contributionBound, records_read: h.recordsRead,
    records_dropped: h.recordsDropped, out_of_domain: h.outOfDomain });
}

async function main(): Promise<number> {
  const [command, ...rest] = process.argv.slice(2);
  let args: Record<string, string>;
  try {
    if (command !== 'submit' && command !== 'histogram' && command !== 'query') throw new UsageError('the command is submit, histogram or query');
    args = parse(rest);
    if (command === 'query') {
      if (!args.target || !(args.study || args.release)) throw new UsageError('query needs --target and --study or --release');
      if (!args.insecure && !(args.ca && args.cert && args.key)) throw new UsageError('mutual TLS needs --ca, --cert and --key (or --insecure)');
    } else if (command === 'histogram') {
      for (const need of ['csv', 'domain']) if (!args[need]) throw new UsageError(`--${need} is required`);
    } else {
      for (const need of ['target', 'study', 'owner']) if (!args[need]) throw new UsageError(`--${need} is required`);
      if (!args.counts === !args.csv) throw new UsageError('pass one of --counts FILE.json and --csv FILE.csv');
      if (!args.insecure && !(args.ca && args.cert && args.key)) throw new UsageError('mutual TLS needs --ca, --cert and --key (or --insecure)');
    }
  } catch (err) {
    process.stderr.write(`dpagg-ts: ${(err as Error).message}\n`);
    return err instanceof UsageError ? 2 : 1;
  }
  if (command === 'histogram') {
    try {
      process.stdout.write(histogramJson(readCsv(args, args.domain!)) + '\n');
      return 0;
    } catch (err) {
      process.stderr.write(`dpagg-ts: ${(err as Error).message}\n`);
      return err instanceof UsageError ? 2 : 1;
    }
  }
  const conn: Connection = {
    target: args.target!, insecure: Boolean(args.insecure), timeoutSeconds: Number(args.timeout ?? 60),
    ...(args.insecure ? {} : { tls: { ca: args.ca!, cert: args.cert!, key: args.key!, ...(args['server-name'] ? { serverName: args['server-name'] } : {}) } }),
  };
  if (command === 'query') return query(args, conn);
  let owner: DataOwner | undefined;
  try {
    owner = new DataOwner(args.owner!, conn, args['signing-key'] ? loadPrivateKey(args['signing-key']) : undefined);
    const key = uploadKey(args);
    let histogram: readonly number[] | BoundedHistogram;
    if (args.csv) {
      const contract = await owner.contract(args.study!);
      const domainText = args.domain ?? contract.domain_spec;
      if (!domainText) throw new Error(`study ${args.study} records no domain spec; pass --domain COLUMN:LO:HI:BINS`);
      histogram = readCsv(args, domainText, keyedRandom(boundingSecret(args, key), `dpagg-ts contribution bounding|${args.study}|${args.owner}|${key}`));
      checkCareless(args, histogram);
      process.stderr.write(`dpagg-ts: ${args.csv}: ${histogram.recordsRead} records read, ${histogram.outOfDomain} outside the domain or `
        + `unreadable, ${histogram.recordsDropped} dropped by the contribution bound\n`);
    } else {
      histogram = JSON.parse(readFileSync(args.counts!, 'utf8')) as number[];
    }
    // For tests only: send this many chunks, then die as a crash would (SIGKILL, nothing cleaned up).
    const crashAfter = process.env.DPAGG_TS_TEST_CRASH_AFTER_CHUNKS;
    const opts: SubmitOptions = { idempotencyKey: key, resumeDir: uploadsDir(args) };
    if (crashAfter) Object.assign(opts, { only: Array.from({ length: Number(crashAfter) }, (_, i) => i), maxAttempts: 1 });
    let last = '';
    let result;
    try {
      result = await owner.submit(args.study!, histogram, {
        ...opts,
        progress: ({ step, done, total }) => {
          const line = `${step} ${done}/${total}`;
          if (line !== last && (done === total || step === 'encrypt')) process.stderr.write(`dpagg-ts: ${line}\n`);
          last = line;
        },
      });
    } catch (err) {
      if (crashAfter) process.kill(process.pid, 'SIGKILL');
      throw err;
    }
    process.stdout.write(JSON.stringify({ ...result, ...(args.csv ? JSON.parse(histogramJson(histogram as BoundedHistogram)) : {}), counts: undefined }) + '\n');
    return result.committed ? 0 : 1;
  } catch (err) {
    process.stderr.write(`dpagg-ts: ${(err as Error).message}\n`);
    return 1;
  } finally {
    owner?.close();
  }
}

/** One JSON line: the study's releases (newest first), the chosen release's status and its range counts. */
async function query(args: Record<string, string>, conn: Connection): Promise<number> {
  const analyst = new Analyst(conn);
  try {
    const releases = args.study ? await analyst.listReleases(args.study) : [];
    const releaseId = args.release ?? releases[0]?.releaseId;
    if (!releaseId) throw new Error(`study ${args.study} has no finished release`);
    const status = await analyst.releaseStatus(releaseId);
    const ranges = (args.ranges ?? '').split(',').filter(Boolean).map((r) => {
      const m = /^(\d+):(\d+)$/.exec(r.trim());
      if (!m) throw new UsageError(`a range is LO:HI (bin indices, HI exclusive), got ${JSON.stringify(r)}`);
      return [Number(m[1]), Number(m[2])] as const;
    });
    const counts = ranges.length ? await analyst.rangeCounts(releaseId, ranges,
      args.confidence ? { confidence: Number(args.confidence) } : {}) : [];
    process.stdout.write(JSON.stringify({ releases, status, ranges: counts }) + '\n');
    return 0;
  } catch (err) {
    process.stderr.write(`dpagg-ts: ${(err as Error).message}\n`);
    return err instanceof UsageError ? 2 : 1;
  } finally {
    analyst.close();
  }
}

process.exitCode = await main();
