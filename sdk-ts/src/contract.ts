/**
 * A study contract as the owner checks it before encrypting: its hash recomputed from the fields
 * (RFC 8785 JSON, SHA-256; parties.common.contract.StudyContract.to_dict), and the terms that bind the upload.
 */
import { createHash } from 'node:crypto';

export const CONTRACT_V2 = 'dpagg.contract.v2';
/** Decoded values must stay below 2^44 (he_partition.core.measurements.MAX_DECODED_MAGNITUDE). */
export const MAX_DECODED_MAGNITUDE = 2n ** 44n;

/** The StudyContract message's fields this SDK reads (proto/dpagg/v1/common.proto), as proto-loader gives them. */
export interface StudyContract {
  version: string;
  study_id: string;
  domain_size: number;
  epsilon: number;
  strategy: string;
  contribution_bound: number;
  noise_parties: number;
  expected_owners: string[];
  context_fingerprint: string;
  strategy_params_json: string;
  contract_hash: string;
  domain_spec: string;
  owner_keys: Record<string, string>;
  correlation_leakage: number;
  correlation_source: string;
  max_organizations: number;
  max_records_per_owner?: number;
  holder_seal_keys: string[];
  noise_tolerates: number;
}

/** RFC 8785: JSON.stringify's numbers and strings, members sorted by UTF-16 code units, no whitespace. */
export function canonicalize(value: unknown): string {
  if (Array.isArray(value)) return '[' + value.map(canonicalize).join(',') + ']';
  if (value !== null && typeof value === 'object') {
    const o = value as Record<string, unknown>;
    return '{' + Object.keys(o).sort().map((k) => JSON.stringify(k) + ':' + canonicalize(o[k])).join(',') + '}';
  }
  if (typeof value === 'number' && !Number.isFinite(value)) throw new Error('RFC 8785 has no NaN or Infinity');
  return JSON.stringify(value);
}

/** The hashed fields (Python's `to_dict`: optional members only when set, so older contracts hash as before). */
export function contractDict(c: StudyContract): Record<string, unknown> {
  const d: Record<string, unknown> = {
    version: c.version, study_id: c.study_id, domain_size: Number(c.domain_size), epsilon: c.epsilon,
    strategy: c.strategy, contribution_bound: Number(c.contribution_bound), noise_parties: Number(c.noise_parties),
    expected_owners: [...c.expected_owners], context_fingerprint: c.context_fingerprint,
    strategy_params: JSON.parse(c.strategy_params_json || '{}'), domain_spec: c.domain_spec ?? '',
  };
  if (c.owner_keys && Object.keys(c.owner_keys).length) d.owner_keys = { ...c.owner_keys };
  if (c.correlation_leakage || c.correlation_source) {
    d.correlation_leakage = c.correlation_leakage;
    d.correlation_source = c.correlation_source;
  }
  const orgs = Number(c.max_organizations) || 1;
  if (orgs !== 1) d.max_organizations = orgs;
  if (c.holder_seal_keys?.length) d.holder_seal_keys = [...c.holder_seal_keys];
  if (c.noise_tolerates) d.noise_tolerates = Number(c.noise_tolerates);
  return d;
}

export function contractHash(c: StudyContract): string {
  return createHash('sha256').update(canonicalize(contractDict(c)), 'utf8').digest('hex');
}

/** Refuse a contract whose hash does not match its fields (or a v1 contract, which this SDK cannot recompute). */
export function checkContract(c: StudyContract): StudyContract {
  if (c.version !== CONTRACT_V2) {
    throw new Error(`study ${c.study_id}'s contract is ${c.version || 'unversioned'}: this SDK recomputes only `
      + `${CONTRACT_V2} contracts (RFC 8785); submit to it with the Python SDK`);
  }
  const mine = contractHash(c);
  if (c.contract_hash !== mine) {
    throw new Error(`contract hash mismatch for study ${c.study_id}: received ${c.contract_hash}, fields hash to ${mine}; `
      + 'the contract was altered in transit or built by an incompatible version');
  }
  return c;
}

/** The most records one owner may submit: 2^44 / (2 x expected owners) (StudyContract.max_records_per_owner). */
export function maxRecordsPerOwner(c: StudyContract): bigint {
  return MAX_DECODED_MAGNITUDE / BigInt(2 * Math.max(1, c.expected_owners.length));
}

export const isSigned = (c: StudyContract): boolean => Object.keys(c.owner_keys ?? {}).length > 0;
export const isSealed = (c: StudyContract): boolean => (c.holder_seal_keys ?? []).length > 0;
