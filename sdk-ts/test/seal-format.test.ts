// The SEAL header conversion (src/seal-format.ts) against node-seal itself: the layout it walks is the layout
// node-seal writes, and a converted object loads back. The Python side's layout is checked by
// tests/parties/test_ts_sdk.py (a TenSEAL ciphertext through node-seal and back, byte for byte).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { localVersion, seal } from '../src/bfv.ts';
import { ciphertextPolys, convertSeal, SealFormatError, sealVersionOf } from '../src/seal-format.ts';

const OTHER = new Uint8Array([16, 4, 3]);

async function setup() {
  const s = await seal();
  const parms = new s.EncryptionParameters(s.SchemeType.bfv);
  parms.setPolyModulusDegree(8192);
  parms.setCoeffModulus(s.CoeffModulus.Create(8192, Int32Array.from([60, 50, 50, 58])));
  parms.setPlainModulus(s.PlainModulus.Batching(8192, 49));
  const ctx = new s.SEALContext(parms, true, s.SecLevelType.tc128);
  const keys = new s.KeyGenerator(ctx);
  const pk = keys.createPublicKey();
  return { s, parms, ctx, keys, pk };
}

test('a node-seal ciphertext converts to another version and back to the same bytes, and still decrypts', async () => {
  const { s, ctx, keys, pk } = await setup();
  const enc = new s.Encryptor(ctx, pk);
  const encoder = new s.BatchEncoder(ctx);
  const plain = new s.Plaintext();
  const values = BigUint64Array.from({ length: 8192 }, (_, i) => BigInt(i) * 12345n);
  encoder.encode(values, plain);
  const ct = new s.Ciphertext();
  enc.encrypt(plain, ct);
  const mine = new Uint8Array(ct.saveToArray(s.ComprModeType.none));
  const zstd = new Uint8Array(ct.saveToArray(s.ComprModeType.zstd));
  assert.deepEqual(sealVersionOf(mine), localVersion(s));
  const other = convertSeal(zstd, 'ciphertext', OTHER);
  assert.deepEqual(sealVersionOf(other), OTHER);
  assert.deepEqual(other.subarray(89 + 2, 89 + 5), OTHER, 'the coefficient array header carries the version too');
  assert.deepEqual(convertSeal(other, 'ciphertext', localVersion(s)), mine);
  const polys = ciphertextPolys(mine);
  assert.equal(polys.size, 2); assert.equal(polys.degree, 8192); assert.equal(polys.primes, 3);
  const back = new s.Ciphertext();
  back.loadFromArray(ctx, convertSeal(other, 'ciphertext', localVersion(s)));
  const out = new s.Plaintext();
  new s.Decryptor(ctx, keys.secretKey()).decrypt(back, out);
  assert.deepEqual(encoder.decodeBigUint64(out), values);
});

test('parameters and keys convert with every nested header; node-seal refuses the other version unconverted', async () => {
  const { s, parms, ctx, pk } = await setup();
  const p = new Uint8Array(parms.saveToArray(s.ComprModeType.zstd));
  const other = convertSeal(p, 'parms', OTHER);
  const fresh = new s.EncryptionParameters(s.SchemeType.bfv);
  assert.throws(() => fresh.loadFromArray(other));
  fresh.loadFromArray(convertSeal(other, 'parms', localVersion(s)));
  assert.equal(fresh.polyModulusDegree(), 8192);
  const key = convertSeal(new Uint8Array(pk.saveToArray(s.ComprModeType.none)), 'ciphertext', OTHER);
  const loaded = new s.PublicKey();
  loaded.loadFromArray(ctx, convertSeal(key, 'ciphertext', localVersion(s)));
});

test('a layout other than the known one is refused, not loaded', () => {
  const bogus = new Uint8Array(200);
  bogus.set([0x5e, 0xa1, 16, 4, 1, 0, 0, 0]);
  new DataView(bogus.buffer).setBigUint64(8, 200n, true);
  assert.throws(() => convertSeal(bogus, 'ciphertext', OTHER), SealFormatError);
  assert.throws(() => convertSeal(new Uint8Array([1, 2, 3]), 'parms', OTHER), SealFormatError);
});
