/**
 * TenSEAL's protobuf wrappers around SEAL objects, read and written by hand (two fields each).
 *
 * A serialized TenSEAL context (what the decryption service hands out; its SHA-256 is the study's
 * key fingerprint) is field 1: the SEAL encryption parameters, field 2: the public part (field 1:
 * the public key), field 3: the private part (field 1: the secret key; never in a public context).
 * A serialized BFV vector (one upload chunk) is field 1: its shape (packed varints: the slot
 * count), field 2: one SEAL ciphertext. The Python side writes the same vector layout itself
 * (he_partition.he.bfv, `vector_bytes`) and reads it back with `threshold.context.vector_ciphertext`.
 */

export class TensealFormatError extends Error {
  override name = 'TensealFormatError';
}

interface Field { field: number; wire: number; value: Uint8Array | bigint }

function readVarint(buf: Uint8Array, at: number): [bigint, number] {
  let v = 0n, shift = 0n, i = at;
  for (;;) {
    if (i >= buf.length) throw new TensealFormatError('truncated protobuf varint');
    const b = buf[i++]!;
    v |= BigInt(b & 0x7f) << shift;
    if (b < 0x80) return [v, i];
    shift += 7n;
    if (shift > 63n) throw new TensealFormatError('protobuf varint too long');
  }
}

function fields(buf: Uint8Array): Field[] {
  const out: Field[] = [];
  let i = 0;
  while (i < buf.length) {
    const [key, next] = readVarint(buf, i);
    i = next;
    const field = Number(key >> 3n), wire = Number(key & 7n);
    if (wire === 0) {
      const [v, n] = readVarint(buf, i); i = n; out.push({ field, wire, value: v });
    } else if (wire === 1) {
      if (i + 8 > buf.length) throw new TensealFormatError('truncated protobuf fixed64');
      out.push({ field, wire, value: buf.subarray(i, i + 8) }); i += 8;
    } else if (wire === 5) {
      if (i + 4 > buf.length) throw new TensealFormatError('truncated protobuf fixed32');
      out.push({ field, wire, value: buf.subarray(i, i + 4) }); i += 4;
    } else if (wire === 2) {
      const [len, n] = readVarint(buf, i);
      const end = n + Number(len);
      if (end > buf.length) throw new TensealFormatError('truncated protobuf bytes field');
      out.push({ field, wire, value: buf.subarray(n, end) }); i = end;
    } else {
      throw new TensealFormatError(`unsupported protobuf wire type ${wire}`);
    }
  }
  return out;
}

function bytesField(buf: Uint8Array, field: number): Uint8Array | undefined {
  const found = fields(buf).filter((f) => f.field === field && f.wire === 2);
  if (found.length > 1) throw new TensealFormatError(`protobuf field ${field} appears ${found.length} times`);
  return found[0]?.value as Uint8Array | undefined;
}

/** The SEAL objects of a serialized TenSEAL context (secretKey only in a secret context: tests). */
export interface TensealContext { parms: Uint8Array; publicKey: Uint8Array; secretKey?: Uint8Array }

export function parseContext(data: Uint8Array): TensealContext {
  const parms = bytesField(data, 1);
  const pub = bytesField(data, 2);
  const publicKey = pub && bytesField(pub, 1);
  if (!parms || !publicKey) throw new TensealFormatError('not a TenSEAL context: no encryption parameters or public key');
  const priv = bytesField(data, 3);
  const secretKey = priv && bytesField(priv, 1);
  return secretKey ? { parms, publicKey, secretKey } : { parms, publicKey };
}

function varint(n: number): number[] {
  const out: number[] = [];
  let v = n;
  for (;;) {
    const b = v % 128;
    v = Math.floor(v / 128);
    if (v) out.push(b | 0x80); else { out.push(b); return out; }
  }
}

/** A TenSEAL BFV vector of `slots` values around one SEAL ciphertext (the layout Python's `vector_bytes` writes). */
export function vectorBytes(slots: number, ciphertext: Uint8Array): Uint8Array {
  const shape = varint(slots);
  const head = [0x0a, ...varint(shape.length), ...shape, 0x12, ...varint(ciphertext.length)];
  const out = new Uint8Array(head.length + ciphertext.length);
  out.set(head, 0);
  out.set(ciphertext, head.length);
  return out;
}

/** The SEAL ciphertext inside a serialized TenSEAL BFV vector (exactly one). */
export function vectorCiphertext(data: Uint8Array): Uint8Array {
  const cts = fields(data).filter((f) => f.field === 2 && f.wire === 2);
  if (cts.length !== 1) throw new TensealFormatError(`a TenSEAL BFV vector must hold exactly one ciphertext, found ${cts.length}`);
  return cts[0]!.value as Uint8Array;
}
