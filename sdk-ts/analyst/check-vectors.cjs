#!/usr/bin/env node
// Recompute dpagg's contract hashes and submission signatures from proto/test-vectors.json with
// Node's standard library only, following the definitions in proto/dpagg/v1/common.proto
// (StudyContract, OwnerSignature). Prints one line per vector; exits 1 on any mismatch.
//
//   node sdk-ts/analyst/check-vectors.cjs [path/to/test-vectors.json]
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const file = process.argv[2] || path.join(__dirname, '..', '..', 'proto', 'test-vectors.json');
const vectors = JSON.parse(fs.readFileSync(file, 'utf8'));

// RFC 8785: JSON.stringify's numbers and strings, object members sorted by UTF-16 code units
// (JavaScript's default string order), no whitespace.
function canonicalize(value) {
  if (Array.isArray(value)) return '[' + value.map(canonicalize).join(',') + ']';
  if (value !== null && typeof value === 'object') {
    return '{' + Object.keys(value).sort().map((k) => JSON.stringify(k) + ':' + canonicalize(value[k])).join(',') + '}';
  }
  return JSON.stringify(value);
}

const sha256 = (data) => crypto.createHash('sha256').update(data).digest();
function frame(bytes) {
  const len = Buffer.alloc(8);
  len.writeBigUInt64BE(BigInt(bytes.length));
  return Buffer.concat([len, bytes]);
}
function u64(n) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

function ciphertextDigest(chunks) {
  const parts = [frame(Buffer.from('dpagg/ciphertext-stream/v1'))];
  let total = 0;
  for (const c of chunks) {
    parts.push(frame(c));
    total += c.length;
  }
  parts.push(Buffer.from('end'), u64(chunks.length), u64(total));
  return sha256(Buffer.concat(parts));
}

function submissionDigest(v, streamDigest) {
  const fields = [
    ['study_id', Buffer.from(v.study_id, 'utf8')],
    ['owner_id', Buffer.from(v.owner_id, 'utf8')],
    ['idempotency_key', Buffer.from(v.idempotency_key, 'utf8')],
    ['contract_hash', Buffer.from(v.contract_hash, 'hex')],
    ['ciphertext_digest', streamDigest],
  ];
  const parts = [frame(Buffer.from('dpagg/submission-digest/v1'))];
  for (const [name, value] of fields) parts.push(frame(Buffer.from(name)), frame(value));
  return sha256(Buffer.concat(parts));
}

const b64url = (hex) => Buffer.from(hex, 'hex').toString('base64url');
let failures = 0;
let checked = 0;
function check(what, ok, detail) {
  checked += 1;
  if (!ok) failures += 1;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${ok ? '' : ': ' + detail}`);
}

for (const v of vectors.contracts) {
  const hash = sha256(Buffer.from(v.canonical_json, 'utf8')).toString('hex');
  if (v.contract.version === 'dpagg.contract.v2') {
    const text = canonicalize(v.contract);
    check(`contract "${v.name}": RFC 8785 text`, text === v.canonical_json, text);
  }
  check(`contract "${v.name}": hash`, hash === v.contract_hash, hash);
}

for (const n of vectors.rfc8785_numbers) {
  const text = String(Number(n.double));
  check(`number ${n.double}`, text === n.canonical, text);
}

for (const v of vectors.submissions) {
  const stream = ciphertextDigest(v.chunks_hex.map((h) => Buffer.from(h, 'hex')));
  check(`submission "${v.name}": ciphertext digest`, stream.toString('hex') === v.ciphertext_digest, stream.toString('hex'));
  const digest = submissionDigest(v, stream);
  check(`submission "${v.name}": submission digest`, digest.toString('hex') === v.submission_digest, digest.toString('hex'));
  const pub = crypto.createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: b64url(v.public_key) }, format: 'jwk' });
  const sig = Buffer.from(v.signature, 'hex');
  check(`submission "${v.name}": signature verifies`, crypto.verify(null, digest, pub, sig), 'Ed25519 verify failed');
  const priv = crypto.createPrivateKey({
    key: { kty: 'OKP', crv: 'Ed25519', x: b64url(v.public_key), d: b64url(v.private_key_seed) }, format: 'jwk',
  });
  const mine = crypto.sign(null, digest, priv).toString('hex');
  check(`submission "${v.name}": same signature from the seed`, mine === v.signature, mine);
}

console.log(`${checked - failures} of ${checked} checks passed`);
process.exit(failures ? 1 : 0);
