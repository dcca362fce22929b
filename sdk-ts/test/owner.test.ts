// What the owner refuses before encrypting (a curious or deviating server's contract), and contribution bounding.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { histogramFromRecords } from '../src/bounding.ts';
import { checkContract, type StudyContract } from '../src/contract.ts';

const vectors = JSON.parse(readFileSync(fileURLToPath(new URL('../../proto/test-vectors.json', import.meta.url)), 'utf8'));

function sealedContract(): StudyContract {
  const v = vectors.contracts.find((c: { name: string }) => c.name.startsWith('sealed study'));
  const c = v.contract;
  return { ...c, strategy_params_json: JSON.stringify(c.strategy_params), correlation_leakage: 0, correlation_source: '',
    max_organizations: 0, contract_hash: v.contract_hash } as StudyContract;
}

test('a contract whose fields differ from its hash is refused, naming the mismatch', () => {
  assert.equal(checkContract(sealedContract()).study_id, 's1');
  for (const change of [{ epsilon: 2 }, { holder_seal_keys: ['00'.repeat(32)] }, { owner_keys: { a: '22'.repeat(32) } },
    { expected_owners: ['a'] }, { noise_tolerates: 0 }]) {
    assert.throws(() => checkContract({ ...sealedContract(), ...change } as StudyContract), /contract hash mismatch/);
  }
  assert.throws(() => checkContract({ ...sealedContract(), version: 'dpagg.contract.v1' }), /Python SDK/);
});

test('bounding keeps at most perBin records of a person per bin and maxBins of its bins, chosen at random', () => {
  const bins = [0, 0, 0, 1, 2, 3, 4, 4, 9, -1, 12];
  const persons = ['p', 'p', 'p', 'p', 'p', 'p', 'q', 'q', 'r', 'r', 's'];
  for (let trial = 0; trial < 20; trial++) {
    const h = histogramFromRecords(bins, 10, persons, { perBin: 2, maxBins: 2 });
    assert.equal(h.contributionBound, 4);
    assert.equal(h.outOfDomain, 2);
    const p = [0, 1, 2, 3].filter((b) => h.counts[b]! > 0n);
    assert.equal(p.length, 2);                       // p owns bins 0..3: two of them kept
    assert.ok(h.counts[0]! <= 2n);                    // three records of p in bin 0: at most two count
    assert.equal(h.counts[4], 2n); assert.equal(h.counts[9], 1n);
    assert.equal(Number(h.counts.reduce((a, c) => a + c, 0n)) + h.recordsDropped + h.outOfDomain, h.recordsRead);
  }
  const seen = new Set<string>();
  for (let i = 0; i < 200; i++) {
    const h = histogramFromRecords([0, 1, 2], 3, ['p', 'p', 'p'], { perBin: 1, maxBins: 1 });
    seen.add(h.counts.join(','));
  }
  assert.equal(seen.size, 3, 'each of the person\'s bins is sometimes the one kept');
  assert.deepEqual(histogramFromRecords([0, 0, 1], 2).counts, [2n, 1n]);  // no person column: every record counts
});
