// proto/test-vectors.json recomputed by this SDK: every byte an owner signs, seals and commits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { fromHex, toHex } from '../src/bytes.ts';
import { c1Part } from '../src/bfv.ts';
import { canonicalize, contractHash, type StudyContract } from '../src/contract.ts';
import { c1Statement, c1StreamDigest, commitmentStatement, streamDigest, submissionDigest } from '../src/digests.ts';
import { openChunk, openKeyShare, sealChunk, sealedKeyShares, sealUploadKey } from '../src/sealing.ts';
import { publicKeyOf, sign, verify } from '../src/signing.ts';

const file = process.env.DPAGG_TEST_VECTORS ?? fileURLToPath(new URL('../../proto/test-vectors.json', import.meta.url));
const vectors = JSON.parse(readFileSync(file, 'utf8'));
const hex = (b: Uint8Array): string => toHex(b);

test('contracts: RFC 8785 text and hash of every v2 contract', () => {
  for (const v of vectors.contracts) {
    if (v.contract.version !== 'dpagg.contract.v2') continue;
    assert.equal(canonicalize(v.contract), v.canonical_json, v.name);
    const c = v.contract;
    const asProto = { ...c, strategy_params_json: JSON.stringify(c.strategy_params), owner_keys: c.owner_keys ?? {},
      holder_seal_keys: c.holder_seal_keys ?? [], correlation_leakage: c.correlation_leakage ?? 0,
      correlation_source: c.correlation_source ?? '', max_organizations: c.max_organizations ?? 0,
      noise_tolerates: c.noise_tolerates ?? 0, contract_hash: v.contract_hash } as StudyContract;
    assert.equal(contractHash(asProto), v.contract_hash, v.name);
  }
});

test('RFC 8785 numbers', () => {
  for (const n of vectors.rfc8785_numbers) assert.equal(canonicalize(Number(n.double)), n.canonical, n.double);
});

test('submissions: stream digest, submission digest, signature', () => {
  for (const v of vectors.submissions) {
    const stream = streamDigest(v.chunks_hex.map((h: string) => fromHex(h)));
    assert.equal(hex(stream), v.ciphertext_digest, v.name);
    const digest = submissionDigest(v.study_id, v.owner_id, v.idempotency_key, v.contract_hash, stream);
    assert.equal(hex(digest), v.submission_digest, v.name);
    assert.equal(hex(sign(fromHex(v.private_key_seed), digest)), v.signature, v.name);
  }
});

test('owner uploads: c1 parts, sealing, key shares, commitment and signatures', () => {
  assert.ok(vectors.owner_uploads.length >= 2);
  for (const v of vectors.owner_uploads) {
    const key = fromHex(v.private_key_seed);
    assert.equal(hex(publicKeyOf(key)), v.public_key);
    const place = { studyId: v.study_id, ownerId: v.owner_id, idempotencyKey: v.idempotency_key, contractHash: v.contract_hash };
    const chunks: Uint8Array[] = v.chunks_hex.map((h: string) => fromHex(h));
    const parts = chunks.map(c1Part);
    assert.deepEqual(parts.map(hex), v.c1_parts_hex, v.name);
    const partsDigest = c1StreamDigest(parts);
    assert.equal(hex(partsDigest), v.c1_parts_digest);
    const c1s = c1Statement(v.study_id, v.owner_id, v.idempotency_key, v.contract_hash, partsDigest);
    assert.equal(hex(c1s), v.c1_statement);
    assert.equal(hex(sign(key, c1s)), v.c1_signature);
    const plain = streamDigest(chunks);
    assert.equal(hex(plain), v.plain_stream_digest);
    const uploadKey = sealUploadKey(key, plain, place);
    assert.equal(hex(uploadKey), v.upload_key);
    const sealed = chunks.map((c, i) => sealChunk(uploadKey, i, c, place));
    assert.deepEqual(sealed.map(hex), v.sealed_chunks_hex);
    sealed.forEach((s, i) => assert.deepEqual(openChunk(uploadKey, i, s, place), chunks[i]));
    const shares = sealedKeyShares(uploadKey, v.holder_seal_keys, place);
    assert.deepEqual(shares.map(hex), v.key_shares_hex);
    const opened = shares.map((s, j) => openKeyShare(fromHex(v.holder_private_keys[j]), s, j, place));
    const xor = opened.reduce((a, b) => a.map((x, i) => x ^ b[i]!));
    assert.equal(hex(xor), v.upload_key);
    const statement = commitmentStatement(v.study_id, v.owner_id, v.idempotency_key, v.contract_hash, partsDigest, shares);
    assert.equal(hex(statement), v.commitment_statement);
    assert.equal(hex(sign(key, statement)), v.commitment_signature);
    const sealedStream = streamDigest(sealed);
    assert.equal(hex(sealedStream), v.ciphertext_digest);
    const digest = submissionDigest(v.study_id, v.owner_id, v.idempotency_key, v.contract_hash, sealedStream);
    assert.equal(hex(digest), v.submission_digest);
    assert.equal(hex(sign(key, digest)), v.signature);
    assert.ok(verify(publicKeyOf(key), digest, fromHex(v.signature)));
  }
});
