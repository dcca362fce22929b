/**
 * The digests an owner signs, in the byte layouts the Python services compute (proto/dpagg/v1/common.proto,
 * parties.common.signing, parties.common.sealing, parties.decryption.keyshare.uploads, threshold.c1).
 * proto/test-vectors.json holds every one of them; test/vectors.test.ts recomputes them here.
 */
import { sha256 } from '@noble/hashes/sha2.js';

import { be, concat, frame, fromHex, utf8 } from './bytes.ts';

/** A running SHA-256 over framed chunks, closed by "end", the chunk count and total bytes. */
function framedStreamDigest(tag: string, chunks: Iterable<Uint8Array>): Uint8Array {
  const h = sha256.create().update(frame(utf8(tag)));
  let count = 0, total = 0;
  for (const c of chunks) { h.update(frame(c)); count += 1; total += c.length; }
  return h.update(concat(utf8('end'), be(count, 8), be(total, 8))).digest();
}

/** The StreamHasher digest of an upload's serialized chunks (in index order). */
export const streamDigest = (chunks: Iterable<Uint8Array>): Uint8Array =>
  framedStreamDigest('dpagg/ciphertext-stream/v1', chunks);

/** The SHA-256 over an owner's c1 parts in chunk order (threshold.c1.c1_stream_digest). */
export const c1StreamDigest = (parts: Iterable<Uint8Array>): Uint8Array =>
  framedStreamDigest('dpagg/c1-stream/v1', parts);

function namedFields(tag: string, fields: [string, Uint8Array][]): Uint8Array {
  const h = sha256.create().update(frame(utf8(tag)));
  for (const [name, value] of fields) h.update(frame(utf8(name))).update(frame(value));
  return h.digest();
}

/** The upload a signed study's owner signs (SubmitHeader.signature): the contract hash as its 32 bytes. */
export function submissionDigest(studyId: string, ownerId: string, idempotencyKey: string, contractHash: string,
  ciphertextDigest: Uint8Array): Uint8Array {
  return namedFields('dpagg/submission-digest/v1', [
    ['study_id', utf8(studyId)], ['owner_id', utf8(ownerId)], ['idempotency_key', utf8(idempotencyKey)],
    ['contract_hash', fromHex(contractHash, 'contract_hash')], ['ciphertext_digest', ciphertextDigest],
  ]);
}

/** The statement over an owner's c1 parts (SubmitHeader.c1_signature): the contract hash as its hex TEXT. */
export function c1Statement(studyId: string, ownerId: string, idempotencyKey: string, contractHash: string,
  partsDigest: Uint8Array): Uint8Array {
  return namedFields('dpagg/c1-parts-digest/v1', [
    ['study_id', utf8(studyId)], ['owner_id', utf8(ownerId)], ['idempotency_key', utf8(idempotencyKey)],
    ['contract_hash', utf8(contractHash)], ['c1_parts_digest', partsDigest],
  ]);
}

/** An upload's place: frame of study, owner, idempotency key and contract hash (hex text), UTF-8. */
export const place = (studyId: string, ownerId: string, idempotencyKey: string, contractHash: string): Uint8Array =>
  concat(...[studyId, ownerId, idempotencyKey, contractHash].map((x) => frame(utf8(x))));

/** The statement an owner signs to commit to its sealed upload (parties.common.sealing.commitment_statement). */
export function commitmentStatement(studyId: string, ownerId: string, idempotencyKey: string, contractHash: string,
  c1PartsDigest: Uint8Array, keyShares: readonly Uint8Array[]): Uint8Array {
  const h = sha256.create().update(frame(utf8('dpagg/upload-commitment/v1')));
  h.update(place(studyId, ownerId, idempotencyKey, contractHash));
  h.update(frame(c1PartsDigest));
  h.update(be(keyShares.length, 4));
  for (const s of keyShares) h.update(frame(s));
  return h.digest();
}
