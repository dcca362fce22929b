// The typed analyst API without a server: its intervals against values the Python SDK computes
// (he_partition.core.intervals; tests/parties/test_ts_sdk.py compares whole releases through the services),
// and the ranges it refuses before any call.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Analyst } from '../src/analyst.ts';
import { exactCutHalfwidth, exactHalfwidth, exactSumHalfwidth, rangeInterval } from '../src/intervals.ts';

test('intervals equal the Python SDK\'s: one value, a sum of whole values, ranges that cut values', () => {
  assert.equal(exactHalfwidth(50.0, 0.95, 2), 15);                    // exact_halfwidth(50.0, 0.95, 2)
  assert.equal(exactSumHalfwidth([2.0, 8.0], [3, 1], 0.95, 2), 7);    // exact_sum_halfwidth([2, 8], [3, 1], 0.95, 2)
  const cut = exactCutHalfwidth([8.0], [3], [0.25], [8.0], 0.95, 2)!;  // exact_cut_halfwidth(...) = 10.0000059902668
  assert.ok(Math.abs(cut - 10.0000059902668) < 2e-5, String(cut));
  const two = exactCutHalfwidth([], [], [0.5, 0.1], [2.0, 50.0], 0.9, 2)!;  // 1.6000008583068848
  assert.ok(Math.abs(two - 1.6000008583068848) < 2e-6, String(two));
  const summary = { domain_size: 20, starts: [0, 10], sum_variance: [8.0, 8.0], noise_parties: 2, params_json: '{}', estimator: 'partition' };
  assert.deepEqual(rangeInterval(summary, 0, 10, 100, 2.83, 0.95).method, 'exact');
  const cutting = rangeInterval(summary, 0, 15, 100, 3, 0.95);
  assert.equal(cutting.method, 'exact');
  assert.ok(cutting.lo! < 100 && cutting.hi! > 100);
});

test('a range that is not [lo, hi) of bin indices is refused before any call', async () => {
  const an = new Analyst({ target: '127.0.0.1:1', insecure: true, timeoutSeconds: 1 });
  try {
    for (const bad of [[5, 5], [-1, 3], [0.5, 2]] as [number, number][]) {
      await assert.rejects(an.rangeCounts('rel-1', [bad]), /INVALID_ARGUMENT: a range is \[lo, hi\)/);
    }
    await assert.rejects(an.listReleases('s1'), /UNAVAILABLE/);
  } finally {
    an.close();
  }
});
