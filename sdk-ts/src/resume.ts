/**
 * An owner's encrypted upload kept on its own disk, so a submit interrupted by the process dying resumes
 * without re-encrypting (the Python side: parties/data_owner/resume.py, `UploadCache`; same layout and digest).
 *
 * Encryption is randomized: re-encrypting the same counts gives other ciphertexts, which could not be combined
 * with the chunks the computation server already holds (in a signed study the signature covers every chunk).
 * `UploadCache` keeps the ciphertext chunks of one upload (public-key encryptions of this owner's own counts,
 * 0600 files in a 0700 directory) with a digest of the counts they encrypt, until the upload commits. A re-run
 * with the same counts reuses them and sends only what the server lacks; other counts are refused.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** SHA-256 of the counts (int64 little-endian) and the contribution bound ("None" without one), as Python's counts_digest. */
export function countsDigest(counts: readonly bigint[], bound: number | undefined): string {
  const h = createHash('sha256').update('dpagg-counts-v1');
  const buf = Buffer.alloc(8 * counts.length);
  counts.forEach((c, i) => buf.writeBigInt64LE(c, 8 * i));
  h.update(buf);
  h.update(bound === undefined ? 'None' : String(bound));
  return h.digest('hex');
}

export interface CachedUpload { digest: string; contractHash: string; contextFingerprint: string; domainLength: number; chunks: Uint8Array[] }

export class ResumeError extends Error { override name = 'ResumeError'; }

export class UploadCache {
  readonly dir: string;
  readonly studyId: string;
  readonly ownerId: string;
  readonly key: string;
  constructor(directory: string, studyId: string, ownerId: string, key: string) {
    this.dir = join(directory, `${studyId}.${ownerId}.${key}.chunks`);
    this.studyId = studyId; this.ownerId = ownerId; this.key = key;
  }

  /** The saved upload if it encrypts these counts for this contract and key; undefined if nothing usable is saved. */
  load(digest: string, contractHash: string, contextFingerprint: string): CachedUpload | undefined {
    const metaPath = join(this.dir, 'upload.json');
    if (!existsSync(metaPath)) return undefined;
    const meta = JSON.parse(readFileSync(metaPath, 'utf8')) as Record<string, unknown>;
    if (meta.contract_hash !== contractHash || meta.context_fingerprint !== contextFingerprint) {
      this.clear();  // encrypted for other terms or another key: useless, and the server refuses it anyway
      return undefined;
    }
    if (meta.digest !== digest) {
      throw new ResumeError(`the data differs from what the interrupted upload ${this.key} of owner ${this.ownerId} to study `
        + `${this.studyId} began with (its chunks are in ${this.dir}); submit the original file to resume, `
        + 'or delete that directory and pass a new idempotency key to start over');
    }
    const n = Number(meta.chunk_count);
    const paths = Array.from({ length: n }, (_, i) => join(this.dir, `chunk-${String(i).padStart(6, '0')}.ct`));
    if (!paths.every((p) => existsSync(p))) { this.clear(); return undefined; }
    return { digest, contractHash, contextFingerprint, domainLength: Number(meta.domain_length),
      chunks: paths.map((p) => new Uint8Array(readFileSync(p))) };
  }

  /** Write the chunks, then the metadata that makes them loadable (a crash in between leaves nothing usable). */
  save(u: CachedUpload): void {
    this.clear();
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    u.chunks.forEach((c, i) => writeFileSync(join(this.dir, `chunk-${String(i).padStart(6, '0')}.ct`), c, { mode: 0o600 }));
    writeFileSync(join(this.dir, 'upload.json'), JSON.stringify({ digest: u.digest, contract_hash: u.contractHash,
      context_fingerprint: u.contextFingerprint, domain_length: u.domainLength, chunk_count: u.chunks.length }), { mode: 0o600 });
  }

  clear(): void { rmSync(this.dir, { recursive: true, force: true }); }
}
