/**
 * Contribution bounding before encryption, as the Python owner does it (parties.data_owner.dataset.histogram_from_records).
 *
 * Differential privacy protects one record; when a person owns several, the owner bounds each person's
 * contribution: at most `perBin` of a person's records count in any one bin, and a person counts in at most
 * `maxBins` distinct bins, chosen uniformly at random among that person's bins (never by a data-dependent rule).
 * Adding or removing one person then changes the histogram by at most perBin x maxBins in L1, which must equal
 * the contract's contribution_bound (checked by `DataOwner.checkTerms` callers via `bound`). No noise is added
 * here; the randomness is node's CSPRNG (`crypto.randomInt`, exactly uniform), so nobody can predict the choice.
 * Records arrive as bin indices (-1: outside the domain); the domain grammar (domain_spec) is not ported.
 */
import { randomInt } from 'node:crypto';

export interface Bounds { perBin: number; maxBins: number }

export interface BoundedHistogram {
  counts: bigint[];
  contributionBound: number;
  recordsRead: number;
  recordsDropped: number;
  outOfDomain: number;
}

export function histogramFromRecords(bins: readonly number[], domainSize: number, persons?: readonly string[],
  bounds: Bounds = { perBin: 1, maxBins: 1 }, randomBelow: (n: number) => number = (n) => randomInt(n)): BoundedHistogram {
  for (const [name, v] of Object.entries(bounds)) {
    if (!Number.isSafeInteger(v) || v < 1) throw new Error(`${name} must be an integer >= 1, got ${v}`);
  }
  if (persons && persons.length !== bins.length) throw new Error(`persons must hold one id per record: ${bins.length} values, ${persons.length} ids`);
  const counts = new Array<bigint>(domainSize).fill(0n);
  let outOfDomain = 0;
  const perPerson = new Map<string, Map<number, number>>();
  bins.forEach((b, r) => {
    if (!Number.isInteger(b) || b < 0 || b >= domainSize) { outOfDomain += 1; return; }
    if (!persons) { counts[b]! += 1n; return; }
    const mine = perPerson.get(persons[r]!) ?? new Map<number, number>();
    mine.set(b, (mine.get(b) ?? 0) + 1);
    perPerson.set(persons[r]!, mine);
  });
  for (const mine of perPerson.values()) {
    const owned = [...mine.keys()].sort((a, b) => a - b);
    // Partial Fisher-Yates: the first maxBins entries are a uniformly random subset of the person's bins.
    const keep = Math.min(bounds.maxBins, owned.length);
    for (let j = 0; j < keep && owned.length > bounds.maxBins; j++) {
      const k = j + randomBelow(owned.length - j);
      [owned[j], owned[k]] = [owned[k]!, owned[j]!];
    }
    for (const b of owned.slice(0, keep)) counts[b]! += BigInt(Math.min(mine.get(b)!, bounds.perBin));
  }
  const kept = counts.reduce((a, c) => a + c, 0n);
  return { counts, contributionBound: bounds.perBin * bounds.maxBins, recordsRead: bins.length,
    recordsDropped: bins.length - outOfDomain - Number(kept), outOfDomain };
}
