/**
 * Sealing an upload to the key holders and committing to it (the Python side: parties.common.sealing, whose
 * docstring says why). The owner encrypts each chunk with AES-256-GCM under an upload key derived from its
 * signing key and the plain chunks' digest (a resumed upload seals to the same bytes), splits the key into
 * K XOR shares and encrypts share j to key holder j's X25519 key from the contract. Every byte here is
 * deterministic and checked against proto/test-vectors.json. Adds no noise, spends no budget.
 */
import { gcm } from '@noble/ciphers/aes.js';
import { x25519 } from '@noble/curves/ed25519.js';
import { hkdf } from '@noble/hashes/hkdf.js';
import { sha256 } from '@noble/hashes/sha2.js';

import { be, concat, frame, fromHex, utf8 } from './bytes.ts';
import { place } from './digests.ts';

/** Every sealed chunk starts with these bytes. */
export const SEALED_MAGIC = utf8('dpagg-sealed/v1\n');
const KEY_BYTES = 32;

const derive = (ikm: Uint8Array, salt: Uint8Array, info: Uint8Array): Uint8Array =>
  hkdf(sha256, ikm, salt, info, KEY_BYTES);

export interface Place { studyId: string; ownerId: string; idempotencyKey: string; contractHash: string }

const placeBytes = (p: Place): Uint8Array => place(p.studyId, p.ownerId, p.idempotencyKey, p.contractHash);

/** The 32-byte upload key: HKDF(signing key, salt = the plain chunks' stream digest, info = tag + place). */
export function sealUploadKey(signingPrivate: Uint8Array, plainDigest: Uint8Array, p: Place): Uint8Array {
  return derive(signingPrivate, plainDigest, concat(utf8('dpagg/seal-upload-key/v1'), placeBytes(p)));
}

/** AES-256-GCM of chunk `index` under the upload key (nonce: the index, 12 bytes big-endian; the place authenticated). */
export function sealChunk(key: Uint8Array, index: number, data: Uint8Array, p: Place): Uint8Array {
  const aad = concat(utf8('dpagg/sealed-chunk/v1'), placeBytes(p), be(index, 8));
  return concat(SEALED_MAGIC, gcm(key, be(index, 12), aad).encrypt(data));
}

/** The inverse of `sealChunk` (tests). */
export function openChunk(key: Uint8Array, index: number, sealed: Uint8Array, p: Place): Uint8Array {
  const aad = concat(utf8('dpagg/sealed-chunk/v1'), placeBytes(p), be(index, 8));
  return gcm(key, be(index, 12), aad).decrypt(sealed.subarray(SEALED_MAGIC.length));
}

/**
 * Split `key` into one XOR share per holder seal key (hex), share j encrypted to holder j:
 * eph_public || AES-256-GCM(share) under HKDF(X25519(eph, holder), info = binding), binding as AAD, zero nonce
 * (one key per message). Shares and ephemeral keys but the last share are HKDF outputs of `key`.
 */
export function sealedKeyShares(key: Uint8Array, holderPublicKeys: readonly string[], p: Place): Uint8Array[] {
  if (!holderPublicKeys.length) throw new Error('the contract pins no key holder seal keys: nothing to seal the upload key to');
  const pl = placeBytes(p);
  const k = holderPublicKeys.length;
  const shares: Uint8Array[] = [];
  for (let j = 0; j < k - 1; j++) shares.push(derive(key, new Uint8Array(), concat(utf8('dpagg/seal-share-value/v1'), pl, be(j, 4))));
  const last = key.slice();
  for (const s of shares) for (let i = 0; i < KEY_BYTES; i++) last[i]! ^= s[i]!;
  shares.push(last);
  return shares.map((share, j) => {
    const holder = fromHex(holderPublicKeys[j]!, `holder_seal_keys[${j}]`);
    if (holder.length !== 32) throw new Error(`holder_seal_keys[${j}] must be an X25519 public key as 64 hex digits`);
    const eph = derive(key, new Uint8Array(), concat(utf8('dpagg/seal-share-ephemeral/v1'), pl, be(j, 4)));
    const ephPublic = x25519.getPublicKey(eph);
    const bound = concat(utf8('dpagg/seal-share/v1'), pl, be(j, 4), frame(holder), frame(ephPublic));
    const wrap = derive(x25519.getSharedSecret(eph, holder), new Uint8Array(), bound);
    return concat(ephPublic, gcm(wrap, new Uint8Array(12), bound).encrypt(share));
  });
}

/** Holder j's share out of its blob, with its X25519 private key (tests: what a key holder does). */
export function openKeyShare(holderPrivate: Uint8Array, blob: Uint8Array, j: number, p: Place): Uint8Array {
  const holder = x25519.getPublicKey(holderPrivate);
  const ephPublic = blob.subarray(0, 32);
  const bound = concat(utf8('dpagg/seal-share/v1'), placeBytes(p), be(j, 4), frame(holder), frame(ephPublic));
  const wrap = derive(x25519.getSharedSecret(holderPrivate, ephPublic), new Uint8Array(), bound);
  return gcm(wrap, new Uint8Array(12), bound).decrypt(blob.subarray(32));
}
