/**
 * A data owner's whole path to a study (the Python side: parties.data_owner.client.DataOwnerClient.submit).
 *
 * Fetch the contract and check its hash, that this owner is expected, the domain size, the per-owner
 * record bound and (in a signed study) that the contract lists this owner's key; fetch the study's
 * public key and check its fingerprint against the contract; encrypt the prefix sums (bfv.ts); in a
 * study that pins key holders' seal keys, seal the chunks and commit to their c1 parts (sealing.ts);
 * sign the upload; stream it, resuming with the same idempotency key until the server commits it.
 * Raw counts never leave this process. Adds no noise and spends no budget.
 */
import { randomBytes } from 'node:crypto';

import { BfvEncryptor, c1Part, contextFingerprint } from './bfv.ts';
import { checkContract, isSealed, isSigned, maxRecordsPerOwner, type StudyContract } from './contract.ts';
import { c1Statement, c1StreamDigest, commitmentStatement, streamDigest, submissionDigest } from './digests.ts';
import { type Client, type Connection, ServiceError, asServiceError, deadline, loadClient, unary } from './grpc.ts';
import { sealChunk, sealedKeyShares, sealUploadKey, type Place } from './sealing.ts';
import { publicKeyOf, sign } from './signing.ts';
import { toHex } from './bytes.ts';
import { type BoundedHistogram } from './bounding.ts';
import { UploadCache, countsDigest } from './resume.ts';

/** Failures after which an upload is resumed (same idempotency key, only the missing chunks). */
export const RESUMABLE = new Set(['UNAVAILABLE', 'DEADLINE_EXCEEDED', 'ABORTED', 'CANCELLED', 'RESOURCE_EXHAUSTED']);

export interface Progress { (event: { step: 'encrypt' | 'upload'; done: number; total: number }): void }

export interface SubmitOptions {
  idempotencyKey?: string;
  maxAttempts?: number;
  progress?: Progress;
  /** Keep the encrypted chunks here until the upload commits, so a later process with the same idempotency key and
   *  counts sends only the chunks the server lacks instead of re-encrypting (resume.ts; Python's resume_dir). */
  resumeDir?: string;
  /** The first attempt sends only these chunk indices (simulates an interrupted upload in tests, as Python's `only`). */
  only?: readonly number[];
}

export interface SubmitResult {
  studyId: string; ownerId: string; idempotencyKey: string; committed: boolean; duplicate: boolean;
  chunkCount: number; chunksSent: number; bytesSent: number; attempts: number; seconds: number;
}

const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export class DataOwner {
  readonly ownerId: string;
  readonly computation: Client;
  private readonly signingKey: Uint8Array | undefined;
  private readonly timeout: number;

  /** `signingKey`: the owner's raw Ed25519 key (`loadPrivateKey`), needed for signed studies. */
  constructor(ownerId: string, conn: Connection, signingKey?: Uint8Array) {
    if (!ID.test(ownerId)) throw new Error(`owner_id must be letters, digits, '.', '_' or '-', got ${JSON.stringify(ownerId)}`);
    this.ownerId = ownerId;
    this.computation = loadClient('Computation', conn, 'computation.dpagg');
    this.signingKey = signingKey;
    this.timeout = conn.timeoutSeconds ?? 60;
  }

  close(): void { this.computation.close(); }

  /** The study's contract from the computation server, its hash recomputed here. */
  async contract(studyId: string): Promise<StudyContract> {
    const res = await unary<object, { contract: StudyContract }>(this.computation, 'StudyStatus', { study_id: studyId }, this.timeout);
    return checkContract(res.contract);
  }

  /** The study's public key (relayed by the computation server), refused unless its SHA-256 is the contract's fingerprint. */
  async publicContext(contract: StudyContract): Promise<Uint8Array> {
    const parts: Buffer[] = [];
    await new Promise<void>((resolve, reject) => {
      const call = this.computation.GetPublicContext({ study_id: contract.study_id }, { deadline: deadline(this.timeout) });
      call.on('data', (c: { data: Buffer }) => parts.push(c.data));
      call.on('error', (e: unknown) => reject(asServiceError(e, 'GetPublicContext')));
      call.on('end', () => resolve());
    });
    const data = new Uint8Array(Buffer.concat(parts));
    const fp = contextFingerprint(data);
    if (fp !== contract.context_fingerprint) {
      throw new Error(`the public key ${fp.slice(0, 16)} is not the key of study ${contract.study_id} `
        + `(${contract.context_fingerprint.slice(0, 16)}); are you talking to the right deployment?`);
    }
    return data;
  }

  /** Refuse what the Python owner refuses before anything is encrypted (this owner, the domain, the bound, the key). */
  checkTerms(contract: StudyContract, counts: readonly bigint[]): void {
    const study = contract.study_id;
    if (!contract.expected_owners.includes(this.ownerId)) {
      throw new Error(`owner ${JSON.stringify(this.ownerId)} is not expected by study ${study} (expected: ${contract.expected_owners.join(', ')}); check the owner id`);
    }
    if (counts.length !== Number(contract.domain_size)) {
      throw new Error(`histogram has ${counts.length} bins but study ${study} has domain size ${contract.domain_size}`);
    }
    let total = 0n;
    for (const c of counts) {
      if (c < 0n) throw new Error(`histogram of owner ${this.ownerId}: counts must be non-negative integers`);
      total += c;
    }
    const limit = maxRecordsPerOwner(contract);
    if (total > limit) {
      throw new Error(`histogram of owner ${this.ownerId} holds ${total} records, more than ${limit} (study ${study}'s bound for one `
        + `of its ${contract.expected_owners.length} owner(s)); nothing was encrypted or sent`);
    }
    if (!isSigned(contract)) return;
    if (!this.signingKey) throw new Error(`study ${study} requires signed uploads: pass the owner's Ed25519 signing key`);
    const listed = contract.owner_keys[this.ownerId];
    if (listed !== toHex(publicKeyOf(this.signingKey))) {
      throw new Error(`your signing key is not the key study ${study} lists for owner ${this.ownerId}; use the key whose public half you gave the operator`);
    }
  }

  /** Encrypt, seal, sign and upload `counts` (one count per bin) to the study; resumes until committed. */
  async submit(studyId: string, histogram: readonly (number | bigint)[] | BoundedHistogram, opts: SubmitOptions = {}): Promise<SubmitResult> {
    const started = Date.now();
    const counts = Array.isArray(histogram) ? histogram as readonly (number | bigint)[] : (histogram as BoundedHistogram).counts;
    const bound = Array.isArray(histogram) ? undefined : (histogram as BoundedHistogram).contributionBound;
    const hist = counts.map((c) => {
      if (typeof c === 'number' && !Number.isSafeInteger(c)) throw new Error(`counts must be integers, got ${c}`);
      return BigInt(c);
    });
    const key = opts.idempotencyKey ?? `up-${randomBytes(10).toString('hex')}`;
    if (!ID.test(key)) throw new Error(`idempotency_key must be letters, digits, '.', '_' or '-', got ${JSON.stringify(key)}`);
    const contract = await this.contract(studyId);
    this.checkTerms(contract, hist);
    if (bound !== undefined && bound !== Number(contract.contribution_bound)) {
      throw new Error(`the histogram was bounded to ${bound} records per person but the study contract uses contribution_bound=`
        + `${contract.contribution_bound}; re-read the data with bounds whose perBin x maxBins equals ${contract.contribution_bound}`);
    }
    const status = await this.uploadStatus(studyId, key);
    const cache = opts.resumeDir === undefined ? undefined : new UploadCache(opts.resumeDir, studyId, this.ownerId, key);
    if (status.state === 'COMMITTED') {
      cache?.clear();
      return this.result(studyId, key, true, true, Number(status.chunk_count), 0, 0, 0, started);
    }
    if (status.state === 'CONFLICT') throw new ServiceError('ALREADY_EXISTS', `owner ${this.ownerId} already submitted to study ${studyId} under another idempotency key`, 'UploadStatus');
    const digest = countsDigest(hist, bound);
    const saved = cache?.load(digest, contract.contract_hash, contract.context_fingerprint);
    if (saved) return this.finish(cache, this.upload(contract, saved.chunks, key, opts, started));
    const publicContext = await this.publicContext(contract);
    const encryptor = await BfvEncryptor.create(publicContext);
    let plain: Uint8Array[];
    try {
      plain = encryptor.encryptHistogram(hist, (done, total) => opts.progress?.({ step: 'encrypt', done, total }));
    } finally {
      encryptor.dispose();
    }
    cache?.save({ digest, contractHash: contract.contract_hash, contextFingerprint: contract.context_fingerprint,
      domainLength: Number(contract.domain_size), chunks: plain });
    return this.finish(cache, this.upload(contract, plain, key, opts, started));
  }

  private async finish(cache: UploadCache | undefined, pending: Promise<SubmitResult>): Promise<SubmitResult> {
    const result = await pending;
    if (result.committed) cache?.clear();
    return result;
  }

  private async uploadStatus(studyId: string, key: string): Promise<{ state: string; received_chunks: number[]; chunk_count: number; c1_signature_wanted: boolean }> {
    return unary(this.computation, 'UploadStatus', { study_id: studyId, owner_id: this.ownerId, idempotency_key: key }, this.timeout);
  }

  private result(studyId: string, key: string, committed: boolean, duplicate: boolean, chunkCount: number, chunksSent: number,
    bytesSent: number, attempts: number, started: number): SubmitResult {
    return { studyId, ownerId: this.ownerId, idempotencyKey: key, committed, duplicate, chunkCount, chunksSent, bytesSent,
      attempts, seconds: (Date.now() - started) / 1000 };
  }

  /** Seal (when the contract pins seal keys), sign and stream `plain` chunks; retry resumable failures. */
  async upload(contract: StudyContract, plain: Uint8Array[], key: string, opts: SubmitOptions = {}, started = Date.now()): Promise<SubmitResult> {
    const studyId = contract.study_id;
    const header: Record<string, unknown> = {
      study_id: studyId, owner_id: this.ownerId, idempotency_key: key, domain_length: Number(contract.domain_size),
      context_fingerprint: contract.context_fingerprint, chunk_count: plain.length, contract_hash: contract.contract_hash,
    };
    let chunks = plain;
    let c1Signature: Uint8Array | undefined;
    const signing = this.signingKey;
    const c1Sign = (): Uint8Array => {
      const digest = c1StreamDigest(plain.map(c1Part));
      return sign(signing!, c1Statement(studyId, this.ownerId, key, contract.contract_hash, digest));
    };
    if (isSigned(contract)) {
      if (!signing) throw new Error(`study ${studyId} requires signed uploads: pass the owner's Ed25519 signing key`);
      if (isSealed(contract)) {
        const place: Place = { studyId, ownerId: this.ownerId, idempotencyKey: key, contractHash: contract.contract_hash };
        const uploadKey = sealUploadKey(signing, streamDigest(plain), place);
        chunks = plain.map((c, i) => sealChunk(uploadKey, i, c, place));
        const partsDigest = c1StreamDigest(plain.map(c1Part));
        const shares = sealedKeyShares(uploadKey, contract.holder_seal_keys, place);
        const statement = commitmentStatement(studyId, this.ownerId, key, contract.contract_hash, partsDigest, shares);
        Object.assign(header, { c1_parts_digest: Buffer.from(partsDigest), key_shares: shares.map((s) => Buffer.from(s)),
          commitment_signature: Buffer.from(sign(signing, statement)) });
      }
      const digest = submissionDigest(studyId, this.ownerId, key, contract.contract_hash, streamDigest(chunks));
      header.signature = Buffer.from(sign(signing, digest));
    }
    const total = chunks.reduce((n, c) => n + c.length, 0);
    const maxAttempts = opts.maxAttempts ?? 5;
    let sentChunks = 0, sentBytes = 0, delay = 500;
    for (let attempt = 1; attempt <= maxAttempts; attempt++) {
      const status = await this.uploadStatus(studyId, key);
      if (status.state === 'COMMITTED') return this.result(studyId, key, true, sentChunks === 0, chunks.length, sentChunks, sentBytes, attempt - 1, started);
      if (status.state === 'CONFLICT') throw new ServiceError('ALREADY_EXISTS', `owner ${this.ownerId} already submitted to study ${studyId} under another idempotency key`, 'UploadStatus');
      if (isSigned(contract) && status.c1_signature_wanted && !c1Signature) {
        c1Signature = c1Sign();
        header.c1_signature = Buffer.from(c1Signature);
      }
      const held = new Set(status.state === 'PARTIAL' ? status.received_chunks.map(Number) : []);
      const todo = chunks.map((_, i) => i).filter((i) => !held.has(i) && (attempt > 1 || !opts.only || opts.only.includes(i)));
      let done = [...held].reduce((n, i) => n + chunks[i]!.length, 0);
      try {
        const res = await new Promise<{ committed: boolean; duplicate: boolean }>((resolve, reject) => {
          const call = this.computation.SubmitHistogram({ deadline: deadline(this.timeout * 10) },
            (err: unknown, r: { committed: boolean; duplicate: boolean }) => (err ? reject(asServiceError(err, 'SubmitHistogram')) : resolve(r)));
          call.write({ header });
          for (const i of todo) {
            call.write({ chunk: { index: i, data: Buffer.from(chunks[i]!) } });
            sentChunks += 1; sentBytes += chunks[i]!.length; done += chunks[i]!.length;
            opts.progress?.({ step: 'upload', done, total });
          }
          call.end();
        });
        if (res.committed) return this.result(studyId, key, true, res.duplicate, chunks.length, sentChunks, sentBytes, attempt, started);
      } catch (err) {
        if (!(err instanceof ServiceError) || !RESUMABLE.has(err.code) || attempt === maxAttempts) throw err;
        await new Promise((r) => setTimeout(r, Math.random() * Math.min(10_000, delay)));
        delay *= 2;
      }
    }
    throw new ServiceError('UNAVAILABLE', `upload ${key} not committed after ${maxAttempts} attempts; submit again with this idempotency key to resume`, 'SubmitHistogram');
  }
}
