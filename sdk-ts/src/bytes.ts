/** Byte helpers shared by the digests: length framing, hex, UTF-8, big-endian integers. */

export const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

export function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

/** `n` as `width` big-endian bytes. */
export function be(n: number | bigint, width: number): Uint8Array {
  const out = new Uint8Array(width);
  let v = BigInt(n);
  for (let i = width - 1; i >= 0; i--) { out[i] = Number(v & 0xffn); v >>= 8n; }
  return out;
}

/** frame(x): the 8-byte big-endian length of x, then x. */
export const frame = (data: Uint8Array): Uint8Array => concat(be(data.length, 8), data);

export const toHex = (b: Uint8Array): string => Buffer.from(b).toString('hex');

export function fromHex(s: string, what = 'hex text'): Uint8Array {
  if (s.length % 2 || /[^0-9a-fA-F]/.test(s)) throw new Error(`${what} is not hex: ${s.slice(0, 80)}`);
  return new Uint8Array(Buffer.from(s, 'hex'));
}
