#!/usr/bin/env node
// An analyst client for dpagg in Node.js, loaded from the repository's proto/ files only
// (@grpc/grpc-js + @grpc/proto-loader): checks the analyst service's health, lists a study's
// releases, reads the newest (or a given) release and asks range counts from it. Analyst
// queries spend no budget.
//
//   node analyst/analyst.cjs --target 127.0.0.1:50052 --study demo --ranges 0:20,20:40 \
//       --ca dpagg-ca.crt --cert analyst.crt --key analyst.key
//   node analyst/analyst.cjs --target 127.0.0.1:50052 --study demo --insecure     # a test server run with --insecure
//   node analyst/analyst.cjs ... --ranges 0:20 --confidence 0.95                   # with 95% confidence intervals
//
// Prints one JSON object per line: {"health": ...}, {"release": ...}, then one {"range": ...}
// per range. On a gRPC error prints "dpagg-node-analyst: CODE: details" on stderr and exits 1.
// With --confidence LEVEL a {"confidence": {"level", "meaning"}} line comes before the ranges and each
// range also carries ci_lo, ci_hi, confidence and interval_method, computed here from the summary as
// the Python SDK does (intervals.cjs says where this client's interval is wider than Python's).
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { rangeInterval } = require('./intervals.cjs');

const USAGE = `usage: node analyst/analyst.cjs --target HOST:PORT --study ID [--release ID|latest]
                        [--ranges LO:HI,LO:HI,...] [--range LO:HI ...]
                        (--insecure | --ca FILE --cert FILE --key FILE [--server-name NAME])
                        [--confidence LEVEL] [--proto-dir DIR] [--timeout SECONDS]`;

// "LO:HI" -> {lo, hi}: bin indices, HI exclusive (the server checks them against the domain).
function parseRange(text) {
  const m = /^(\d+):(\d+)$/.exec(text.trim());
  if (!m) throw new Error(`a range is LO:HI (bin indices, HI exclusive), got ${JSON.stringify(text)}`);
  return { lo: Number(m[1]), hi: Number(m[2]) };
}

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
      case '--range': case '--ranges':
        for (const r of need(i).split(',')) args.ranges.push(parseRange(r));
        i++;
        break;
      case '--insecure': args.insecure = true; break;
      case '--ca': args.ca = need(i); i++; break;
      case '--cert': args.cert = need(i); i++; break;
      case '--key': args.key = need(i); i++; break;
      case '--server-name': args.serverName = need(i); i++; break;
      case '--proto-dir': args.protoDir = need(i); i++; break;
      case '--timeout': args.timeout = Number(need(i)); i++; break;
      case '--confidence': {
        const level = Number(need(i)); i++;
        if (!(level > 0 && level < 1)) {
          throw new Error(`a confidence level is strictly between 0 and 1 (e.g. 0.95), got ${argv[i]}`);
        }
        args.confidence = level;
        break;
      }
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

// "dpagg.v1.Analyst" from the loaded service's method paths ("/dpagg.v1.Analyst/ListReleases").
function serviceName(ctor) {
  return ctor.service.ListReleases.path.split('/')[1];
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

// grpc.health.v1.Health/Check. proto/ holds only dpagg's own protos, so the two one-field
// messages of the standard health protocol are encoded here by hand:
//   HealthCheckRequest  { string service = 1; }
//   HealthCheckResponse { ServingStatus status = 1; }  UNKNOWN=0 SERVING=1 NOT_SERVING=2 SERVICE_UNKNOWN=3
const HEALTH_CHECK = '/grpc.health.v1.Health/Check';
const SERVING_STATUS = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];

function encodeVarint(n) {
  const out = [];
  while (n > 0x7f) { out.push((n & 0x7f) | 0x80); n >>>= 7; }
  out.push(n);
  return Buffer.from(out);
}

function encodeHealthRequest(req) {
  const name = Buffer.from(req.service || '', 'utf8');
  return name.length ? Buffer.concat([Buffer.from([0x0a]), encodeVarint(name.length), name]) : Buffer.alloc(0);
}

function decodeHealthResponse(buf) {
  let pos = 0;
  const varint = () => {
    let result = 0; let shift = 0; let b;
    do {
      if (pos >= buf.length) throw new Error('truncated HealthCheckResponse');
      b = buf[pos++];
      result += (b & 0x7f) * 2 ** shift;
      shift += 7;
    } while (b & 0x80);
    return result;
  };
  let status = 0;
  while (pos < buf.length) {
    const key = varint();
    const field = Math.floor(key / 8); const wire = key & 7;
    if (wire === 0) { const v = varint(); if (field === 1) status = v; }
    else if (wire === 1) pos += 8;
    else if (wire === 2) pos += varint();
    else if (wire === 5) pos += 4;
    else throw new Error(`HealthCheckResponse: unsupported wire type ${wire}`);
  }
  return { status: SERVING_STATUS[status] || String(status) };
}

function healthCheck(client, service, timeoutSeconds) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + timeoutSeconds * 1000);
    client.makeUnaryRequest(HEALTH_CHECK, encodeHealthRequest, decodeHealthResponse, { service },
                            new grpc.Metadata(), { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

// An error this client decides on (not the server), printed like a gRPC status.
function clientError(code, details) {
  return Object.assign(new Error(details), { code: grpc.status[code], details });
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
    // Health is registered per service under its full name ("dpagg.v1.Analyst"), taken from proto/.
    const service = serviceName(Analyst);
    const health = await healthCheck(client, service, args.timeout);
    console.log(JSON.stringify({ health: { service, status: health.status } }));
    if (health.status !== 'SERVING') {
      throw clientError('UNAVAILABLE', `health check of ${service} at ${args.target} says ${health.status}`);
    }
    const list = await call(client, 'ListReleases', { study_id: args.study }, args.timeout);
    console.log(JSON.stringify({ releases: list.releases.map((r) => ({
      release_id: r.release_id, epsilon: r.epsilon, domain_size: r.domain_size, partitions: r.partitions,
      created_at: r.created_at })) }));
    let releaseId = args.release;
    if (releaseId === 'latest') {
      // ListReleases answers an empty list (not an error) for a study with no finished release,
      // including one that does not exist; the client reports that as NOT_FOUND.
      if (list.releases.length === 0) {
        throw clientError('NOT_FOUND', `study ${args.study} has no finished release (ListReleases returned none; `
                                       + 'does the study exist and has a release run?)');
      }
      releaseId = list.releases[0].release_id; // newest first
    }
    const rel = await call(client, 'GetRelease', { release_id: releaseId }, args.timeout);
    const s = rel.summary;
    console.log(JSON.stringify({ release: { release_id: s.release_id, study_id: s.study_id, epsilon: s.epsilon,
                                            domain_size: s.domain_size, partitions: s.starts.length } }));
    const ranges = args.ranges.length ? args.ranges : [{ lo: 0, hi: s.domain_size }];
    const counts = await call(client, 'RangeCounts', { release_id: releaseId, ranges }, args.timeout);
    if (args.confidence !== undefined) {
      const pct = `${Math.round(args.confidence * 1e6) / 1e4}%`;
      console.log(JSON.stringify({ confidence: { level: args.confidence, meaning:
        `in at least ${pct} of releases the interval contains the true count, over the noise; `
        + 'the bias of spreading a count evenly inside a partition is not covered' } }));
    }
    for (const c of counts.counts) {
      const range = { lo: c.lo, hi: c.hi, value: c.value, standard_error: c.standard_error };
      if (args.confidence !== undefined) {
        const ci = rangeInterval(s, c.lo, c.hi, c.value, c.standard_error, args.confidence);
        Object.assign(range, { ci_lo: ci.lo, ci_hi: ci.hi, confidence: ci.confidence, interval_method: ci.method });
        if (ci.reason) range.interval_note = ci.reason;
      }
      console.log(JSON.stringify({ range }));
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
