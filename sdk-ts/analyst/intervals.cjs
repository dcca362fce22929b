// Confidence intervals for range counts of a released summary: a port of the Python SDK's
// he_partition/core/intervals.py and Summary.interval (post-processing: no noise, no budget).
//
// Meaning, as in Python: in at least `confidence` of releases (over the noise, for any true data)
// the interval contains the true count; the bias of spreading a partition's count evenly over its
// bins (ranges that cut a partition) is not covered.
//
// What is ported, and where this client is wider than Python (never narrower):
// - "exact" for one whole partition (one or two discrete Laplace draws): the closed-form tail,
//   the same half-width as Python.
// - "exact" for a sum of whole partitions: the noise's distribution on the integer lattice by
//   direct convolution (Python uses an FFT; both keep a 1e-9 slack on the tail), up to
//   MAX_DIRECT_WORK multiply-adds; beyond that the Chernoff bound.
// - "exact" for a range that cuts partitions: the cut values' noise enumerated atom by atom, as Python
//   does (exactCutHalfwidth), within the same MAX_DIRECT_WORK budget for the whole part.
// - "exact" also for a "tree" of one released partition (auto's one count per bin), which answers as
//   the partition estimator does (its ranges take the partition paths above), as in Python.
// - "chernoff" wherever the draws per value are not whole or the direct computation does not fit.
// - "bound" for the least-squares estimators (a "tree" of more than one level, "haar"): from the
//   answer's standard error and the smallest released variance. Python uses the Chernoff bound on
//   the estimator's exact weights there ("chernoff", about 25% narrower); this client does not
//   compute the least-squares weights: wider, never narrower. "haar_nonnegative" is not linear: Python centres
//   its interval on the linear estimate, which needs the inverse Haar transform; this client gives
//   no interval there (null, with the reason).
'use strict';

const TAIL_SLACK = 1e-9;
const MAX_DIRECT_WORK = 5e7;

function checkConfidence(c) {
  if (!(c > 0 && c < 1)) throw new Error(`confidence must be strictly between 0 and 1, got ${c}`);
  return c;
}

// q = exp(-1/scale) of the discrete Laplace draw of variance v = 2q/(1 - q)^2.
function qFromVariance(v) {
  return (v + 1.0 - Math.sqrt(2.0 * v + 1.0)) / v;
}

// P[D1 + D2 > k] for two independent discrete Laplace draws with parameter q, k >= 0.
function twoDrawTail(q, k) {
  const c2 = ((1.0 - q) / (1.0 + q)) ** 2;
  const a = 1.0 + (2.0 * q * q) / (1.0 - q * q);
  const t = k + 1;
  const geo = q ** t / (1.0 - q);
  const lin = (q ** t * (t * (1.0 - q) + q)) / (1.0 - q) ** 2;
  return c2 * (lin + a * geo);
}

function oneDrawTail(q, k) {
  return q ** (k + 1) / (1.0 + q);
}

// Least integer k with P[|noise| > k] <= 1 - confidence, noise = `draws` (1 or 2) draws of total variance.
function exactHalfwidth(variance, confidence, draws) {
  const alpha = 1.0 - checkConfidence(confidence);
  if (variance <= 0) return 0;
  const q = qFromVariance(variance / draws);
  const tail = draws === 2 ? twoDrawTail : oneDrawTail;
  let hi = 1;
  while (2.0 * tail(q, hi) > alpha) hi *= 2;
  let lo = 0;
  if (2.0 * tail(q, 0) <= alpha) return 0;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (2.0 * tail(q, mid) > alpha) lo = mid; else hi = mid;
  }
  return hi;
}

// pmf of N - N' on [-L+1, L-1] for N, N' ~ NB(r, q), or null when the direct computation is too large.
function nbDifferencePmf(q, r, budget) {
  const mean = (r * q) / (1.0 - q);
  const sd = Math.sqrt(r * q) / (1.0 - q);
  let length = Math.floor(mean + 40.0 * sd + 64.0);
  let p;
  for (;;) {
    if (length * length > budget.left) return null;
    p = new Float64Array(length);
    let logp = r * Math.log1p(-q);
    p[0] = Math.exp(logp);
    let total = p[0];
    for (let k = 1; k < length; k++) {
      logp += Math.log((q * (k + r - 1.0)) / k);
      p[k] = Math.exp(logp);
      total += p[k];
    }
    if (1.0 - total < 1e-11) break;
    length *= 2;
  }
  budget.left -= length * length;
  const out = new Float64Array(2 * length - 1);
  for (let d = 0; d < length; d++) {
    let s = 0;
    for (let k = 0; k + d < length; k++) s += p[k + d] * p[k];
    out[length - 1 + d] = s;
    out[length - 1 - d] = s;
  }
  return out;
}

function convolve(a, b, budget) {
  if (a.length * b.length > budget.left) return null;
  budget.left -= a.length * b.length;
  const out = new Float64Array(a.length + b.length - 1);
  for (let i = 0; i < a.length; i++) {
    const ai = a[i];
    if (ai === 0) continue;
    for (let j = 0; j < b.length; j++) out[i + j] += ai * b[j];
  }
  return out;
}

// Least integer k with P[|noise| > k] <= 1 - confidence for a sum of whole values: counts[g] values of
// variance variances[g], each `draws` draws; null when it does not fit MAX_DIRECT_WORK.
function exactSumHalfwidth(variances, counts, confidence, draws) {
  const alpha = 1.0 - checkConfidence(confidence);
  const budget = { left: MAX_DIRECT_WORK };
  let pmf = Float64Array.of(1);
  for (let g = 0; g < variances.length; g++) {
    if (variances[g] <= 0 || counts[g] <= 0) continue;
    const part = nbDifferencePmf(qFromVariance(variances[g] / draws), counts[g] * draws, budget);
    if (part === null) return null;
    pmf = convolve(pmf, part, budget);
    if (pmf === null) return null;
  }
  const half = pmf.length >> 1;
  const upper = pmf.subarray(half + 1);
  // tails[i] = P[noise >= i + 1] = P[noise > i]; the least i with 2 (tails[i] + slack) <= alpha.
  let tail = 0;
  const tails = new Float64Array(upper.length);
  for (let i = upper.length - 1; i >= 0; i--) { tail += upper[i]; tails[i] = tail; }
  for (let i = 0; i < tails.length; i++) if (2.0 * (tails[i] + TAIL_SLACK) <= alpha) return i;
  return upper.length;
}

// pmf on [-H, H] (index H is 0) of the noise of a sum of whole values (counts[g] values of variance
// variances[g], each `draws` draws); null when it does not fit the budget.
function sumPmf(variances, counts, draws, budget) {
  let pmf = Float64Array.of(1);
  for (let g = 0; g < variances.length; g++) {
    if (variances[g] <= 0 || counts[g] <= 0) continue;
    const part = nbDifferencePmf(qFromVariance(variances[g] / draws), counts[g] * draws, budget);
    if (part === null) return null;
    pmf = convolve(pmf, part, budget);
    if (pmf === null) return null;
  }
  return pmf;
}

// Most atoms of the fractional part of a cut range's noise that exactCutHalfwidth enumerates (as Python).
const MAX_CUT_ATOMS = 1 << 18;

// Half-width t with P[|noise| > t] <= 1 - confidence for a range that cuts partitions: the noise is a sum of
// whole values (variances/counts, as exactSumHalfwidth) plus cutWeights[j] times the noise of value j. A port
// of Python's exact_cut_halfwidth: the cut values' noise enumerated atom by atom, t found by bisection on the
// covering side; null when the supports are too large (then the Chernoff bound).
function exactCutHalfwidth(variances, counts, cutWeights, cutVariances, confidence, draws) {
  const alpha = 1.0 - checkConfidence(confidence);
  const budget = { left: MAX_DIRECT_WORK };
  let atoms = Float64Array.of(0); let probs = Float64Array.of(1);
  let lost = 0.0;
  for (let j = 0; j < cutWeights.length; j++) {
    const w = cutWeights[j]; const v = cutVariances[j];
    if (w === 0 || v <= 0) continue;
    const pmf = sumPmf([v], [1], draws, budget);
    if (pmf === null || pmf.length * atoms.length > 4 * MAX_CUT_ATOMS) return null;
    const mid = pmf.length >> 1;
    const nextA = []; const nextP = [];
    for (let a = 0; a < atoms.length; a++) {
      for (let k = 0; k < pmf.length; k++) {
        const p = probs[a] * pmf[k];
        if (p >= 1e-15) { nextA.push(atoms[a] + w * (k - mid)); nextP.push(p); } else lost += p;
      }
    }
    atoms = Float64Array.from(nextA); probs = Float64Array.from(nextP);
    if (atoms.length > MAX_CUT_ATOMS) return null;
  }
  const base = sumPmf(variances, counts, draws, budget);
  if (base === null) return null;
  const h = base.length >> 1;
  // above[i] = P[Y >= i - h] for i = 0 .. 2h + 1 (0 beyond the support)
  const above = new Float64Array(base.length + 1);
  for (let i = base.length - 1; i >= 0; i--) above[i] = above[i + 1] + base[i];
  const exceed = (x) => above[Math.min(Math.max(Math.floor(x) + 1 + h, 0), 2 * h + 1)];
  const tail = (t) => {
    let s = 0;
    for (let a = 0; a < atoms.length; a++) s += probs[a] * (exceed(t - atoms[a]) + exceed(t + atoms[a]));
    return s + lost + TAIL_SLACK;
  };
  let maxAbs = 0;
  for (let a = 0; a < atoms.length; a++) maxAbs = Math.max(maxAbs, Math.abs(atoms[a]));
  let loT = 0.0; let hiT = h + maxAbs + 1.0;
  if (tail(hiT) > alpha) return null;
  if (tail(loT) <= alpha) return 0.0;
  for (let i = 0; i < 60; i++) { // tail(loT) > alpha >= tail(hiT)
    const m = 0.5 * (loT + hiT);
    if (tail(m) > alpha) loT = m; else hiT = m;
    if (hiT - loT < 1e-6 * Math.max(1.0, hiT)) break;
  }
  return hiT;
}

function logMgf(u, w, v, n, draws) {
  let s = 0;
  for (let j = 0; j < w.length; j++) {
    const wu = w[j] * u;
    const x = ((v[j] / draws) * Math.expm1(wu) ** 2) / (2.0 * Math.exp(wu)); // (v/draws)(cosh(wu) - 1)
    if (x >= 1.0) return Infinity;
    s += n[j] * draws * -Math.log1p(-x);
  }
  return s;
}

// Half-width t with P[|sum_j a_j N_j| >= t] <= 1 - confidence by the Chernoff bound on the exact MGF
// (golden-section search on log u; any u gives a valid bound).
function chernoffHalfwidth(weights, variances, confidence, draws, counts) {
  const alpha = 1.0 - checkConfidence(confidence);
  const w = []; const v = []; const n = [];
  for (let j = 0; j < weights.length; j++) {
    const c = counts ? counts[j] : 1;
    if (weights[j] !== 0 && variances[j] > 0 && c > 0) { w.push(Math.abs(weights[j])); v.push(variances[j]); n.push(c); }
  }
  if (w.length === 0) return 0.0;
  const c = Math.log(2.0 / alpha);
  let uMax = Infinity;
  for (let j = 0; j < w.length; j++) uMax = Math.min(uMax, Math.acosh(1.0 + draws / v[j]) / w[j]);
  const f = (logU) => {
    const u = Math.exp(logU);
    const k = logMgf(u, w, v, n, draws);
    return Number.isFinite(k) ? (k + c) / u : Infinity;
  };
  let sigma2 = 0;
  for (let j = 0; j < w.length; j++) sigma2 += n[j] * w[j] * w[j] * v[j];
  let a = Math.log(uMax) - 40.0;
  let b = Math.log(uMax) - 1e-12;
  a = Math.min(a, Math.log(1e-6 / Math.sqrt(sigma2)));
  const g = (Math.sqrt(5.0) - 1.0) / 2.0;
  let x1 = b - g * (b - a); let x2 = a + g * (b - a);
  let f1 = f(x1); let f2 = f(x2);
  for (let i = 0; i < 200; i++) {
    if (f1 <= f2) { b = x2; x2 = x1; f2 = f1; x1 = b - g * (b - a); f1 = f(x1); }
    else { a = x1; x1 = x2; f1 = f2; x2 = a + g * (b - a); f2 = f(x2); }
    if (b - a < 1e-10) break;
  }
  return Math.min(f1, f2) * (1.0 + 1e-9);
}

// Draws' worth of noise per released value: noise_parties, or one server draw plus the key holders'
// K/(K - T) when the summary states holder noise (a threshold study).
function drawsPerValue(summary) {
  let params = {};
  try { params = JSON.parse(summary.params_json || '{}') || {}; } catch (e) { params = {}; }
  const holder = params.holder_noise;
  if (holder && typeof holder === 'object' && 'holder_variance_factor' in holder) {
    return Number(summary.noise_parties) - 1.0 + Number(holder.holder_variance_factor);
  }
  return Math.max(Number(summary.noise_parties), 1);
}

// {lo, hi, confidence, method} for range [lo, hi) answered as `value` with `standardError`, from the
// summary (GetRelease's). {lo: null, hi: null, method: null, reason} where this client cannot give one.
function rangeInterval(summary, lo, hi, value, standardError, confidence) {
  checkConfidence(confidence);
  const draws = drawsPerValue(summary);
  const estimator = summary.estimator || 'partition';
  const done = (half, method) => ({ lo: value - half, hi: value + half, confidence, method });
  if (estimator === 'haar_nonnegative') {
    return { lo: null, hi: null, confidence, method: null,
             reason: 'haar_nonnegative is not linear: its interval is centred on the linear estimate, '
                     + 'which this client does not compute; use the Python SDK' };
  }
  // A "tree" of one released partition (auto's one count per bin) estimates each cell by its released
  // value: it answers as the "partition" estimator does, and gets the partition's intervals.
  const rel = summary.released || [];
  const oneLevel = estimator === 'tree' && rel.length === 1 && rel[0].kind === 'partition_sums'
    && (rel[0].starts || []).length === summary.starts.length
    && (rel[0].starts || []).every((x, i) => Number(x) === Number(summary.starts[i]));
  if (estimator !== 'partition' && !oneLevel) {
    const released = (summary.released || []).map((r) => r.variance).filter((x) => x > 0);
    const minVar = released.length ? Math.min(...released)
      : Math.min(...summary.sum_variance.filter((x) => x > 0), Infinity);
    if (!(standardError > 0) || !Number.isFinite(minVar)) return done(0.0, 'bound');
    return done(chernoffHalfwidth([standardError / Math.sqrt(minVar)], [minVar], confidence, draws), 'bound');
  }
  const starts = summary.starts.map(Number);
  const n = Number(summary.domain_size);
  const weights = []; const vars = [];
  for (let j = 0; j < starts.length; j++) {
    const s = starts[j]; const e = j + 1 < starts.length ? starts[j + 1] : n;
    if (e <= lo || s >= hi) continue;
    weights.push((Math.min(e, hi) - Math.max(s, lo)) / (e - s));
    vars.push(Number(summary.sum_variance[j]));
  }
  const wholeDraws = Number.isInteger(draws) && (draws === 1 || draws === 2);
  if (weights.length === 1 && weights[0] === 1.0) {
    if (vars[0] <= 0) return done(0.0, 'exact');
    if (wholeDraws) return done(exactHalfwidth(vars[0], confidence, draws), 'exact');
    return done(chernoffHalfwidth([1.0], [vars[0]], confidence, draws), 'chernoff');
  }
  // Whole partitions grouped by variance (sorted, as numpy.unique does), then the cut ones.
  const groups = new Map();
  const cutW = []; const cutV = [];
  for (let j = 0; j < weights.length; j++) {
    if (weights[j] === 1.0) groups.set(vars[j], (groups.get(vars[j]) || 0) + 1);
    else { cutW.push(weights[j]); cutV.push(vars[j]); }
  }
  const uniq = [...groups.keys()].sort((x, y) => x - y);
  const counts = uniq.map((x) => groups.get(x));
  if (Number.isInteger(draws)) {
    const exact = cutW.length === 0 ? exactSumHalfwidth(uniq, counts, confidence, draws)
      : exactCutHalfwidth(uniq, counts, cutW, cutV, confidence, draws);
    if (exact !== null) return done(exact, 'exact');
  }
  return done(chernoffHalfwidth([...uniq.map(() => 1.0), ...cutW], [...uniq, ...cutV], confidence, draws,
                                [...counts, ...cutW.map(() => 1)]), 'chernoff');
}

module.exports = { rangeInterval, exactHalfwidth, exactSumHalfwidth, exactCutHalfwidth, chernoffHalfwidth, drawsPerValue };
