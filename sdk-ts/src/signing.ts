/** Ed25519 (RFC 8032) signatures of an owner's digests with its raw 32-byte key (the Python side: parties.common.signing). */
import { ed25519 } from '@noble/curves/ed25519.js';
import { readFileSync } from 'node:fs';
import { createPrivateKey } from 'node:crypto';

export const sign = (privateKey: Uint8Array, digest: Uint8Array): Uint8Array => ed25519.sign(digest, privateKey);
export const publicKeyOf = (privateKey: Uint8Array): Uint8Array => ed25519.getPublicKey(privateKey);
export const verify = (publicKey: Uint8Array, digest: Uint8Array, signature: Uint8Array): boolean =>
  ed25519.verify(signature, digest, publicKey);

/** The raw private key of a PKCS#8 PEM file as `dpagg keygen` writes it (unencrypted). */
export function loadPrivateKey(path: string): Uint8Array {
  const key = createPrivateKey(readFileSync(path));
  if (key.asymmetricKeyType !== 'ed25519') throw new Error(`${path} holds a ${key.asymmetricKeyType} key, not an Ed25519 signing key`);
  const jwk = key.export({ format: 'jwk' });
  return new Uint8Array(Buffer.from(jwk.d!, 'base64url'));
}
