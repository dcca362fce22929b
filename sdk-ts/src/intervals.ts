/**
 * Confidence intervals for range counts of a released summary, typed: the computation lives in
 * `analyst/intervals.cjs` (plain JavaScript, so the CommonJS example client runs it on any Node), a port of the
 * Python SDK's he_partition/core/intervals.py and Summary.interval. Post-processing: no noise, no budget.
 */
import { createRequire } from 'node:module';

/** The released summary's fields the intervals read (GetRelease's ReleaseSummary, keepCase). */
export interface SummaryForIntervals {
  domain_size: number;
  starts: number[];
  sum_variance: number[];
  noise_parties: number;
  params_json: string;
  estimator: string;
  released?: { variance: number }[];
}

/** [lo, hi] with its level and method ("exact", "chernoff" or "bound"); lo/hi null with a reason where none is given. */
export interface Interval { lo: number | null; hi: number | null; confidence: number; method: string | null; reason?: string }

interface IntervalsModule {
  rangeInterval(summary: SummaryForIntervals, lo: number, hi: number, value: number, standardError: number, confidence: number): Interval;
  exactHalfwidth(variance: number, confidence: number, draws: number): number;
  exactSumHalfwidth(variances: number[], counts: number[], confidence: number, draws: number): number | null;
  exactCutHalfwidth(variances: number[], counts: number[], cutWeights: number[], cutVariances: number[], confidence: number, draws: number): number | null;
  chernoffHalfwidth(weights: number[], variances: number[], confidence: number, draws: number, counts?: number[]): number;
  drawsPerValue(summary: SummaryForIntervals): number;
}

const m = createRequire(import.meta.url)('../analyst/intervals.cjs') as IntervalsModule;

export const rangeInterval = m.rangeInterval;
export const exactHalfwidth = m.exactHalfwidth;
export const exactSumHalfwidth = m.exactSumHalfwidth;
export const exactCutHalfwidth = m.exactCutHalfwidth;
export const chernoffHalfwidth = m.chernoffHalfwidth;
export const drawsPerValue = m.drawsPerValue;

/** What an interval at `confidence` promises, in the Python SDK's words. */
export function describe(confidence: number): string {
  return `in at least ${Math.round(confidence * 1e6) / 1e4}% of releases the interval contains the true count, over the noise; `
    + 'the bias of spreading a count evenly inside a partition is not covered';
}
