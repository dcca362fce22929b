// The domain grammar and CSV reading of the Python owner (domain.py, dataset.py), the keyed bounding choice,
// and the resume cache's digest (resume.py). tests/parties/test_ts_sdk.py compares whole files with Python.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { DomainSpec, pyFloat } from '../src/domain.ts';
import { csvRows, keyedRandom, readHistogram } from '../src/records.ts';
import { UploadCache, countsDigest } from '../src/resume.ts';

test('the domain grammar: equal widths, edges, categories; bins half-open, the upper edge outside', () => {
  const d = DomainSpec.parse('age:0:100:50');
  assert.equal(d.nBins, 50);
  assert.equal(d.binOf(0), 0); assert.equal(d.binOf(1.999), 0); assert.equal(d.binOf(2), 1);
  assert.equal(d.binOf(99.9), 49); assert.equal(d.binOf(100), -1); assert.equal(d.binOf(-0.1), -1); assert.equal(d.binOf(NaN), -1);
  const e = DomainSpec.parse('a:b:edges:0, 18,65,120');
  assert.equal(e.column, 'a:b'); assert.deepEqual(e.edges, [0, 18, 65, 120]);
  assert.equal(e.binOf('18'), 1); assert.equal(e.binOf(Infinity), -1);
  const c = DomainSpec.parse('sector:categories:retail,health,other');
  assert.equal(c.binOf('health'), 1); assert.equal(c.binOf('Health'), -1); assert.equal(c.nBins, 3);
  assert.throws(() => DomainSpec.parse('age:0:100'), /cannot parse domain spec/);
  assert.throws(() => DomainSpec.parse('age:edges:0,5,5'), /strictly increasing/);
  assert.throws(() => DomainSpec.parse('age:0:100:x'), /n_bins must be an integer/);
  assert.throws(() => DomainSpec.parse('age:categories:a,a'), /listed twice/);
  assert.throws(() => DomainSpec.parse('age:0:1:100000000', 1 << 24), /the domain has 100,000,000 bins/);
});

test('numbers are read as Python float() reads them', () => {
  for (const [text, v] of [['1', 1], [' 2.5 ', 2.5], ['1_000', 1000], ['.5', 0.5], ['5.', 5], ['1e3', 1000], ['-inf', -Infinity], ['Infinity', Infinity]] as const) {
    assert.equal(pyFloat(text), v, text);
  }
  assert.ok(Number.isNaN(pyFloat('nan')));
  for (const bad of ['', '0x10', '1__0', '_1', '1,5', 'abc', '1e']) assert.equal(pyFloat(bad), undefined, bad);
});

test('CSV rows as Python csv.reader gives them: quotes, doubled quotes, newlines inside quotes, CRLF', () => {
  const rows = [...csvRows('a,b\r\n"x, y","say ""hi"""\n\n"multi\nline",2\nlast,')].map((r) => r.row);
  assert.deepEqual(rows, [['a', 'b'], ['x, y', 'say "hi"'], [], ['multi\nline', '2'], ['last', '']]);
});

function file(text: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'dpagg-ts-'));
  const p = join(dir, 'r.csv');
  writeFileSync(p, text);
  return p;
}

test('a CSV file to a histogram: person bounding, bad values named by line or dropped', () => {
  const p = file('\uFEFFperson_id, age\np1,20\np1,21\np1,40\np2,20\n\np3,200\n');
  const d = DomainSpec.parse('age:0:100:10');
  const h = readHistogram(p, d, { personColumn: 'person_id', bounds: { perBin: 5, maxBins: 5 } });
  assert.equal(h.counts[2], 3n); assert.equal(h.counts[4], 1n);
  assert.equal(h.recordsRead, 5); assert.equal(h.outOfDomain, 1); assert.equal(h.recordsDropped, 0);
  const bad = file('person_id,age\np1,20\np2,old\np3,\n');
  assert.throws(() => readHistogram(bad, d), /line 3 has value 'old' in column 'age', which is not a number/);
  const dropped = readHistogram(bad, d, { onBadValue: 'drop' });
  assert.equal(dropped.recordsRead, 3); assert.equal(dropped.outOfDomain, 2);
  assert.throws(() => readHistogram(p, d, { personColumn: 'who' }), /no person id column 'who'; the columns present are 'person_id', 'age'/);
});

test('a keyed choice is repeatable under its secret and uniform across secrets', () => {
  const secret = new Uint8Array(32).fill(7);
  const a = Array.from({ length: 50 }, keyedRandom(secret, 'x').bind(null, 10) as () => number);
  const draw = keyedRandom(secret, 'x');
  assert.deepEqual(Array.from({ length: 50 }, () => draw(10)), a);
  assert.notDeepEqual(Array.from({ length: 50 }, ((r) => () => r(10))(keyedRandom(secret, 'y'))), a);
  const seen = new Array(3).fill(0);
  const r = keyedRandom(new Uint8Array(16).fill(1), 'z');
  for (let i = 0; i < 3000; i++) seen[r(3)] += 1;
  assert.ok(seen.every((n) => n > 900), String(seen));
});

test('the resume cache: Python\'s digest, 0600 chunks, other counts refused, other terms forgotten', () => {
  // counts_digest(np.array([1, 2, 3]), 2) and counts_digest(np.array([1, 2, 3]), None) in Python:
  assert.equal(countsDigest([1n, 2n, 3n], 2), '747cedf3272d9bcd46967419ec7c602b6081e1f82efa3c093a67c9beda73a9e6');
  assert.equal(countsDigest([1n, 2n, 3n], undefined), '048022edb6b09d6c4baa954badbbb3f253f6a66ad0e5b81a89c0203a156f27fe');
  const dir = mkdtempSync(join(tmpdir(), 'dpagg-ts-'));
  const cache = new UploadCache(dir, 's1', 'a', 'k1');
  const chunks = [new Uint8Array([1, 2]), new Uint8Array([3])];
  cache.save({ digest: 'd1', contractHash: 'h', contextFingerprint: 'f', domainLength: 9, chunks });
  assert.equal(statSync(join(cache.dir, 'chunk-000000.ct')).mode & 0o777, 0o600);
  assert.deepEqual(cache.load('d1', 'h', 'f')?.chunks, chunks);
  assert.throws(() => cache.load('d2', 'h', 'f'), /the data differs from what the interrupted upload k1/);
  assert.equal(cache.load('d1', 'other', 'f'), undefined);
  assert.deepEqual(readdirSync(dir), []);
});
