#!/usr/bin/env node
// An analyst client for dpagg in Node.js, loaded from the repository's proto/ files only
// (@grpc/grpc-js + @grpc/proto-loader): lists a study's releases, reads the newest (or a
// given) release and asks range counts from it. Analyst queries spend no budget.
//
//   node analyst.js --target 127.0.0.1:50052 --study demo --range 0:20 --range 20:40 \
//       --ca dpagg-ca.crt --cert analyst.crt --key analyst.key
//   node analyst.js --target 127.0.0.1:50052 --study demo --insecure     # a test server run with --insecure
//
// Prints one JSON object per line: {"release": ...} then one {"range": ...} per range.
// On a gRPC error prints "dpagg-node-analyst: CODE: details" on stderr and exits 1.
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE = `usage: node analyst.js --target HOST:PORT --study ID [--release ID|latest] [--range LO:HI ...]
                        (--insecure | --ca FILE --cert FILE --key FILE [--server-name NAME])
                        [--proto-dir DIR] [--timeout SECONDS]`;

function parseArgs(argv) {
  const args = { ranges: [], release: 'latest', serverName: 'computation.dpagg', timeout: 30,
                 protoDir: path.join(__dirname, '..', '..', 'proto') };
  const need = (i) => {
    if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
    return argv[i + 1];
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    switch (a) {
      case '--target': args.target = need(i); i++; break;
      case '--study': args.study = need(i); i++; break;
      case '--release': args.release = need(i); i++; break;
      case '--range': {
        const m = /^(\d+):(\d+)$/.exec(need(i)); i++;
        if (!m) throw new Error(`a range is LO:HI (bin indices, HI exclusive), got ${argv[i]}`);
        args.ranges.push({ lo: Number(m[1]), hi: Number(m[2]) });
        break;
      }
      case '--insecure': args.insecure = true; break;
      case '--ca': args.ca = need(i); i++; break;
      case '--cert': args.cert = need(i); i++; break;
      case '--key': args.key = need(i); i++; break;
      case '--server-name': args.serverName = need(i); i++; break;
      case '--proto-dir': args.protoDir = need(i); i++; break;
      case '--timeout': args.timeout = Number(need(i)); i++; break;
      case '-h': case '--help': console.log(USAGE); process.exit(0); break;
      default: throw new Error(`unknown argument ${a}`);
    }
  }
  if (!args.target || !args.study) throw new Error('--target and --study are required');
  if (!args.insecure && !(args.ca && args.cert && args.key)) {
    throw new Error('mutual TLS needs --ca, --cert and --key (or --insecure for a test server)');
  }
  return args;
}

function loadService(protoDir) {
  const def = protoLoader.loadSync(['dpagg/v1/analyst.proto'], {
    includeDirs: [protoDir], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(def).dpagg.v1.Analyst;
}

function credentials(args) {
  if (args.insecure) return grpc.credentials.createInsecure();
  return grpc.credentials.createSsl(fs.readFileSync(args.ca), fs.readFileSync(args.key), fs.readFileSync(args.cert));
}

// dpagg servers carry the DNS name <role>.dpagg; the client checks it instead of the dialled host.
function channelOptions(args) {
  return args.insecure ? {} : { 'grpc.ssl_target_name_override': args.serverName,
                                'grpc.default_authority': args.serverName };
}

function call(client, method, request, timeoutSeconds) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + timeoutSeconds * 1000);
    client[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`dpagg-node-analyst: ${e.message}\n${USAGE}`);
    process.exit(2);
  }
  const Analyst = loadService(args.protoDir);
  const client = new Analyst(args.target, credentials(args), channelOptions(args));
  try {
    let releaseId = args.release;
    if (releaseId === 'latest') {
      const list = await call(client, 'ListReleases', { study_id: args.study }, args.timeout);
      if (list.releases.length === 0) {
        console.error(`dpagg-node-analyst: study ${args.study} has no finished release (or does not exist)`);
        process.exit(1);
      }
      releaseId = list.releases[0].release_id; // newest first
    }
    const rel = await call(client, 'GetRelease', { release_id: releaseId }, args.timeout);
    const s = rel.summary;
    console.log(JSON.stringify({ release: { release_id: s.release_id, study_id: s.study_id, epsilon: s.epsilon,
                                            domain_size: s.domain_size, partitions: s.starts.length } }));
    const ranges = args.ranges.length ? args.ranges : [{ lo: 0, hi: s.domain_size }];
    const counts = await call(client, 'RangeCounts', { release_id: releaseId, ranges }, args.timeout);
    for (const c of counts.counts) {
      console.log(JSON.stringify({ range: { lo: c.lo, hi: c.hi, value: c.value, standard_error: c.standard_error } }));
    }
  } catch (err) {
    const code = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code) || String(err.code);
    console.error(`dpagg-node-analyst: ${code}: ${err.details || err.message}`);
    process.exit(1);
  } finally {
    client.close();
  }
}

main();
