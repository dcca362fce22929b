/**
 * SEAL's byte format between two SEAL builds: the one place where this SDK rewrites SEAL headers.
 *
 * Why. The Python services use TenSEAL, which links SEAL 4.3; this SDK uses node-seal, which is
 * SEAL 4.1 in WebAssembly. Every SEAL object starts with a 16-byte header: magic 0x5EA1, header
 * size 16, SEAL major and minor version, compression mode (0 none, 1 zlib, 2 zstd), 2 reserved
 * bytes and the object's total size (little-endian u64). Each side's `load` refuses the other's
 * version ("incompatible version") although the members after the header are laid out alike in
 * 4.1 and 4.3. A SEAL object also nests whole objects with their own headers (a ciphertext's
 * coefficient array, each modulus of the encryption parameters), so the version is written in
 * several places.
 *
 * What. `convertSeal(bytes, kind, version)` decompresses an object (zlib or zstd) and walks its
 * members for `kind`, checking every length and nested header against the layout below, and
 * writes `version` into each header; the result is uncompressed. Anything that does not match
 * the layout is refused (`SealFormatError`), so a SEAL release that changes a member's layout
 * fails here (and in test/seal-format.test.ts and the Python cross test) instead of loading
 * wrong numbers. The layouts (SEAL 4.x `save_members`):
 *
 * - ciphertext (also a public key, which saves its ciphertext): parms_id (4 u64), NTT flag (u8),
 *   size, degree N, prime count k (3 u64), scale (f64), correction factor (u64), then a DynArray
 *   of size x k x N u64 (its header, its u64 length, the values, polynomial-major, prime-major).
 * - plaintext (also a secret key): parms_id (4 u64), coefficient count (u64), scale (f64), then a
 *   DynArray of u64.
 * - encryption parameters: scheme (u8), N (u64), k (u64), then k + 1 Modulus objects (the
 *   coefficient primes, then the plain modulus), each its header and one u64.
 */
import { zstdDecompressSync, inflateSync } from 'node:zlib';

export type SealKind = 'ciphertext' | 'plaintext' | 'parms';

/** Bytes 2..4 of a SEAL header: header size, major and minor version. */
export type SealVersion = Uint8Array;

export class SealFormatError extends Error {
  override name = 'SealFormatError';
}

const MAGIC0 = 0x5e;
const MAGIC1 = 0xa1;
const HEADER = 16;

function u64(view: DataView, at: number): number {
  const v = view.getBigUint64(at, true);
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new SealFormatError(`implausible SEAL length ${v}`);
  return Number(v);
}

/** The version bytes (header size, major, minor) of a SEAL object's header. */
export function sealVersionOf(data: Uint8Array): SealVersion {
  checkHeader(data, 0, 'object');
  return data.slice(2, 5);
}

function checkHeader(data: Uint8Array, at: number, what: string): void {
  if (data.length < at + HEADER || data[at] !== MAGIC0 || data[at + 1] !== MAGIC1 || data[at + 2] !== HEADER) {
    throw new SealFormatError(`no SEAL header where the ${what} should start (byte ${at}): the SEAL byte format `
      + 'differs from the layout this SDK knows (seal-format.ts)');
  }
}

/** The object's members after its header, uncompressed. */
function members(data: Uint8Array, what: string): Uint8Array {
  checkHeader(data, 0, what);
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const total = u64(view, 8);
  if (total !== data.length) throw new SealFormatError(`SEAL ${what} of ${data.length} bytes says it has ${total}`);
  const body = data.subarray(HEADER);
  switch (data[5]) {
    case 0: return body;
    case 1: return new Uint8Array(inflateSync(body));
    case 2: return new Uint8Array(zstdDecompressSync(body));
    default: throw new SealFormatError(`SEAL ${what}: unknown compression mode ${data[5]}`);
  }
}

function header(version: SealVersion, total: number): Uint8Array {
  const h = new Uint8Array(HEADER);
  h[0] = MAGIC0; h[1] = MAGIC1; h.set(version.subarray(0, 3), 2);
  new DataView(h.buffer).setBigUint64(8, BigInt(total), true);
  return h;
}

/** Offsets (in the members) of every nested header of `kind`, checked against the members' length. */
function nestedHeaders(body: Uint8Array, kind: SealKind): number[] {
  const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const need = (n: number): void => {
    if (body.length < n) throw new SealFormatError(`SEAL ${kind}: truncated members (${body.length} bytes)`);
  };
  const dynArray = (at: number, count: number): number[] => {
    need(at + HEADER + 8);
    checkHeader(body, at, `${kind}'s coefficient array`);
    if (body[at + 5] !== 0) throw new SealFormatError(`SEAL ${kind}: a compressed coefficient array inside`);
    const stored = u64(view, at + HEADER);
    if (stored !== count || body.length !== at + HEADER + 8 + 8 * count || u64(view, at + 8) !== HEADER + 8 + 8 * count) {
      throw new SealFormatError(`SEAL ${kind}: its coefficient array holds ${stored} values in ${body.length - at} `
        + `bytes, expected ${count}`);
    }
    return [at];
  };
  if (kind === 'ciphertext') {
    need(73);
    const size = u64(view, 33), n = u64(view, 41), k = u64(view, 49);
    if (body[32]! > 1 || size < 1 || size > 16 || n < 1 || n > 1 << 17 || k < 1 || k > 64) {
      throw new SealFormatError(`SEAL ciphertext: implausible shape (${size} parts, degree ${n}, ${k} primes)`);
    }
    return dynArray(73, size * n * k);
  }
  if (kind === 'plaintext') {
    need(48);
    return dynArray(48, u64(view, 32));
  }
  need(17);
  const k = u64(view, 9);
  if (body[0] !== 1 || k < 1 || k > 64) throw new SealFormatError(`SEAL parameters: not BFV or ${k} primes`);
  if (body.length !== 17 + 24 * (k + 1)) {
    throw new SealFormatError(`SEAL parameters: ${body.length} bytes of members for ${k} primes, expected ${17 + 24 * (k + 1)}`);
  }
  const out: number[] = [];
  for (let i = 0; i <= k; i++) {
    const at = 17 + 24 * i;
    checkHeader(body, at, 'modulus');
    if (u64(view, at + 8) !== 24) throw new SealFormatError('SEAL parameters: a modulus is not 24 bytes');
    out.push(at);
  }
  return out;
}

/**
 * `data` (a SEAL object of `kind`, any compression) with `version` in every header, uncompressed.
 * The one place the SEAL 4.1 (node-seal) / 4.3 (TenSEAL) difference is handled (see the module doc).
 */
export function convertSeal(data: Uint8Array, kind: SealKind, version: SealVersion): Uint8Array {
  const body = members(data, kind).slice();
  for (const at of nestedHeaders(body, kind)) body.set(version.subarray(0, 3), at + 2);
  const out = new Uint8Array(HEADER + body.length);
  out.set(header(version, out.length), 0);
  out.set(body, HEADER);
  return out;
}

/** The uncompressed members of a ciphertext: (parms_id words, N, k, residues of every part). */
export interface CiphertextPolys {
  parmsId: bigint[];
  size: number;
  degree: number;
  primes: number;
  /** Little-endian u64 residues, part-major, then prime-major: size x k x N values. */
  coefficients: Uint8Array;
}

/** Parse an (any compression) SEAL ciphertext's members, checking the layout as `convertSeal` does. */
export function ciphertextPolys(data: Uint8Array): CiphertextPolys {
  const body = members(data, 'ciphertext');
  nestedHeaders(body, 'ciphertext');
  const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
  if (body[32] !== 0) throw new SealFormatError('expected a coefficient-form ciphertext, got NTT form');
  return {
    parmsId: [0, 8, 16, 24].map((o) => view.getBigUint64(o, true)),
    size: u64(view, 33), degree: u64(view, 41), primes: u64(view, 49),
    coefficients: body.subarray(73 + HEADER + 8),
  };
}
