#!/usr/bin/env node
/**
 * dpagg-ts: the TypeScript SDK's data-owner command line.
 *
 *   node bin/dpagg-ts.ts submit --target HOST:PORT --study ID --owner ID --counts FILE.json
 *       [--signing-key OWNER.key] (--ca CA --cert CERT --key KEY [--server-name computation.dpagg] | --insecure)
 *       [--idempotency-key KEY] [--timeout SECONDS]
 *
 * FILE.json: a JSON array with one count per bin. Prints one JSON line with the result; progress
 * lines go to stderr. Errors: "dpagg-ts: message" on stderr, exit 1; a bad command line exits 2.
 */
import { readFileSync } from 'node:fs';

import { DataOwner } from '../src/owner.ts';
import { loadPrivateKey } from '../src/signing.ts';

function parse(argv: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--insecure') { out.insecure = '1'; continue; }
    if (!a.startsWith('--') || i + 1 >= argv.length) throw new Error(`unexpected argument ${a}`);
    out[a.slice(2)] = argv[++i]!;
  }
  return out;
}

async function main(): Promise<number> {
  const [command, ...rest] = process.argv.slice(2);
  let args: Record<string, string>;
  try {
    if (command !== 'submit') throw new Error('the command is submit');
    args = parse(rest);
    for (const need of ['target', 'study', 'owner', 'counts']) if (!args[need]) throw new Error(`--${need} is required`);
    if (!args.insecure && !(args.ca && args.cert && args.key)) throw new Error('mutual TLS needs --ca, --cert and --key (or --insecure)');
  } catch (err) {
    process.stderr.write(`dpagg-ts: ${(err as Error).message}\n`);
    return 2;
  }
  const counts = JSON.parse(readFileSync(args.counts!, 'utf8')) as number[];
  const owner = new DataOwner(args.owner!, {
    target: args.target!, insecure: Boolean(args.insecure), timeoutSeconds: Number(args.timeout ?? 60),
    ...(args.insecure ? {} : { tls: { ca: args.ca!, cert: args.cert!, key: args.key!, ...(args['server-name'] ? { serverName: args['server-name'] } : {}) } }),
  }, args['signing-key'] ? loadPrivateKey(args['signing-key']) : undefined);
  try {
    let last = '';
    const result = await owner.submit(args.study!, counts, {
      ...(args['idempotency-key'] ? { idempotencyKey: args['idempotency-key'] } : {}),
      progress: ({ step, done, total }) => {
        const line = `${step} ${done}/${total}`;
        if (line !== last && (done === total || step === 'encrypt')) process.stderr.write(`dpagg-ts: ${line}\n`);
        last = line;
      },
    });
    process.stdout.write(JSON.stringify(result) + '\n');
    return result.committed ? 0 : 1;
  } catch (err) {
    process.stderr.write(`dpagg-ts: ${(err as Error).message}\n`);
    return 1;
  } finally {
    owner.close();
  }
}

process.exitCode = await main();
