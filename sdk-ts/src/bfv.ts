/**
 * The owner's BFV encryption with node-seal under a study's public key (the Python side: he_partition.he.bfv).
 *
 * An owner encrypts the inclusive prefix sums of its histogram (`ownerEncoding`), zero-padded
 * into chunks of N = slot-count values, each value reduced modulo the plain modulus t, batch
 * encoded and encrypted under the public key. Each chunk travels as a TenSEAL BFV vector whose
 * SEAL headers carry the service's SEAL version (seal-format.ts). Adds no noise, spends no budget.
 */
import { createHash } from 'node:crypto';
import initialize from 'node-seal';
import type { MainModule, SEALContext, PublicKey, Encryptor, BatchEncoder } from 'node-seal';

import { convertSeal, sealVersionOf, ciphertextPolys, type SealVersion } from './seal-format.ts';
import { parseContext, vectorBytes, vectorCiphertext } from './tenseal.ts';

let sealModule: Promise<MainModule> | undefined;

/** node-seal's WebAssembly module, loaded once per process. */
export function seal(): Promise<MainModule> {
  sealModule ??= initialize();
  return sealModule;
}

/** node-seal's own header bytes (header size, major, minor), probed by saving a plaintext. */
export function localVersion(s: MainModule): SealVersion {
  const p = new s.Plaintext();
  try {
    return sealVersionOf(new Uint8Array(p.saveToArray(s.ComprModeType.none)));
  } finally {
    p.delete();
  }
}

/** SHA-256 (hex) of a serialized public context: the key fingerprint a study contract carries. */
export function contextFingerprint(data: Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** What an owner encrypts: the inclusive prefix sums of its histogram. */
export function ownerEncoding(counts: readonly bigint[] | BigInt64Array): bigint[] {
  const out: bigint[] = [];
  let acc = 0n;
  for (const c of counts) { acc += BigInt(c); out.push(acc); }
  return out;
}

/** A public-key BFV encryptor for one study's key. */
export class BfvEncryptor {
  readonly slots: number;
  readonly plainModulus: bigint;
  readonly primes: number;
  /** The SEAL version of the service's objects: what every chunk's headers are written with. */
  readonly peerVersion: SealVersion;
  private readonly context: SEALContext;
  private readonly publicKey: PublicKey;
  private readonly encryptor: Encryptor;
  private readonly encoder: BatchEncoder;
  private readonly s: MainModule;

  private constructor(s: MainModule, contextBytes: Uint8Array) {
    this.s = s;
    const parsed = parseContext(contextBytes);
    if (parsed.secretKey) throw new Error('the key holder sent a context with a secret key; refusing to use it');
    const mine = localVersion(s);
    this.peerVersion = sealVersionOf(parsed.publicKey);
    const parms = new s.EncryptionParameters(s.SchemeType.bfv);
    parms.loadFromArray(convertSeal(parsed.parms, 'parms', mine));
    this.context = new s.SEALContext(parms, true, s.SecLevelType.tc128);
    if (!this.context.parametersSet()) throw new Error('the study key\'s BFV parameters are not valid for SEAL');
    this.publicKey = new s.PublicKey();
    this.publicKey.loadFromArray(this.context, convertSeal(parsed.publicKey, 'ciphertext', mine));
    this.encryptor = new s.Encryptor(this.context, this.publicKey);
    this.encoder = new s.BatchEncoder(this.context);
    this.slots = this.encoder.slotCount();
    const first = this.context.firstContextData().parms();
    this.plainModulus = first.plainModulus().value();
    this.primes = first.coeffModulus().size();
    parms.delete();
  }

  /** An encryptor for the public context `contextBytes` (a serialized TenSEAL public context). */
  static async create(contextBytes: Uint8Array): Promise<BfvEncryptor> {
    return new BfvEncryptor(await seal(), contextBytes);
  }

  /** One chunk: `values` (at most `slots`, zero-padded) reduced mod t, encrypted, as a TenSEAL BFV vector. */
  encryptChunk(values: readonly bigint[]): Uint8Array {
    if (values.length > this.slots) throw new Error(`a chunk holds at most ${this.slots} values`);
    const t = this.plainModulus;
    const slots = new BigUint64Array(this.slots);
    values.forEach((v, i) => { slots[i] = ((v % t) + t) % t; });
    const plain = new this.s.Plaintext();
    const ct = new this.s.Ciphertext();
    try {
      this.encoder.encode(slots, plain);
      this.encryptor.encrypt(plain, ct);
      const bytes = new Uint8Array(ct.saveToArray(this.s.ComprModeType.none));
      return vectorBytes(this.slots, convertSeal(bytes, 'ciphertext', this.peerVersion));
    } finally {
      plain.delete();
      ct.delete();
    }
  }

  /** Every chunk of a histogram's prefix encoding, `onChunk` called after each. */
  encryptHistogram(counts: readonly bigint[], onChunk?: (done: number, total: number) => void): Uint8Array[] {
    const enc = ownerEncoding(counts);
    const total = Math.max(1, Math.ceil(enc.length / this.slots));
    const out: Uint8Array[] = [];
    for (let i = 0; i < total; i++) {
      out.push(this.encryptChunk(enc.slice(i * this.slots, (i + 1) * this.slots)));
      onChunk?.(i + 1, total);
    }
    return out;
  }

  dispose(): void {
    this.encoder.delete(); this.encryptor.delete(); this.publicKey.delete(); this.context.delete();
  }
}

/**
 * The c1 part of a serialized chunk (a TenSEAL BFV vector): little-endian u64 residues, prime-major
 * (Python: `threshold.c1.c1_bytes(c1_of_vector(ctx, chunk))`).
 */
export function c1Part(vector: Uint8Array): Uint8Array {
  const ct = ciphertextPolys(vectorCiphertext(vector));
  if (ct.size !== 2) throw new Error(`expected a 2-part ciphertext, got ${ct.size} parts`);
  const part = ct.primes * ct.degree * 8;
  return ct.coefficients.slice(part, 2 * part);
}
