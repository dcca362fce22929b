/** dpagg's TypeScript SDK: a data owner encrypts, seals, signs and uploads; an analyst reads releases. */
export { DataOwner, RESUMABLE, type SubmitOptions, type SubmitResult, type Progress } from './owner.ts';
export { BfvEncryptor, c1Part, contextFingerprint, ownerEncoding } from './bfv.ts';
export { checkContract, contractHash, canonicalize, type StudyContract } from './contract.ts';
export { convertSeal, sealVersionOf, SealFormatError } from './seal-format.ts';
export { loadPrivateKey, publicKeyOf } from './signing.ts';
export { histogramFromRecords, type Bounds } from './bounding.ts';
export { type Connection, type Tls, ServiceError } from './grpc.ts';
export { DomainSpec, DomainError, pyFloat } from './domain.ts';
export { readHistogram, keyedRandom, csvRows, RecordsError, type ReadOptions } from './records.ts';
export { type BoundedHistogram } from './bounding.ts';
export { UploadCache, countsDigest, ResumeError } from './resume.ts';
export { Analyst, type ReleaseInfo, type ReleaseStatus, type ReleaseSummary, type RangeCount } from './analyst.ts';
export { rangeInterval, exactHalfwidth, exactSumHalfwidth, exactCutHalfwidth, chernoffHalfwidth, drawsPerValue, describe, type Interval } from './intervals.ts';
