/**
 * An analyst's typed client (the Python side: parties.analyst.client.AnalystClient and
 * ComputationClient.release_status): list a study's releases, a release's status, its summary, and range counts
 * with confidence intervals computed here from the summary as the Python SDK computes them (intervals.ts).
 * Every query is post-processing of a release: it spends no budget. The services are the Analyst service and,
 * for the status, the computation server's ReleaseStatus (both at the computation server, DNS name
 * `computation.dpagg`; the analyst role may call both).
 */
import * as grpc from '@grpc/grpc-js';

import { type Client, type Connection, ServiceError, loadClient, unary } from './grpc.ts';
import { type Interval, type SummaryForIntervals, rangeInterval } from './intervals.ts';

export interface ReleaseInfo { releaseId: string; studyId: string; epsilon: number; domainSize: number; partitions: number; createdAt: string }

/** A released summary as GetRelease sends it (proto field names). */
export interface ReleaseSummary extends SummaryForIntervals {
  release_id: string; study_id: string; epsilon: number; strategy: string; contribution_bound: number;
  sums: number[]; owners: string[]; contract_hash: string; created_at: string;
}

export interface ReleaseStatus {
  releaseId: string; studyId: string; state: 'RUNNING' | 'DONE' | 'FAILED' | 'STATE_UNSPECIFIED'; epsilon: number;
  owners: string[]; errorCode: string; errorMessage: string; seconds: number;
}

export interface RangeCount {
  lo: number; hi: number; value: number; standardError: number;
  /** With `confidence`: the interval (null where this client gives none: `intervalNote` says why) and its method. */
  ciLo?: number | null; ciHi?: number | null; confidence?: number; intervalMethod?: string | null; intervalNote?: string;
}

export class Analyst {
  readonly analyst: Client;
  readonly computation: Client;
  private readonly timeout: number;

  constructor(conn: Connection) {
    this.analyst = loadClient('Analyst', conn, 'computation.dpagg');
    this.computation = loadClient('Computation', conn, 'computation.dpagg');
    this.timeout = conn.timeoutSeconds ?? 30;
  }

  close(): void { this.analyst.close(); this.computation.close(); }

  /** Finished releases, newest first (of one study, or all). An unknown study and one without releases both give []. */
  async listReleases(studyId = ''): Promise<ReleaseInfo[]> {
    const res = await unary<object, { releases: Record<string, unknown>[] }>(this.analyst, 'ListReleases', { study_id: studyId }, this.timeout);
    return res.releases.map((r) => ({ releaseId: r.release_id as string, studyId: r.study_id as string, epsilon: r.epsilon as number,
      domainSize: r.domain_size as number, partitions: r.partitions as number, createdAt: r.created_at as string }));
  }

  /** Where a release stands (RUNNING, DONE, FAILED with the error's code and message). */
  async releaseStatus(releaseId: string): Promise<ReleaseStatus> {
    const r = await unary<object, Record<string, unknown>>(this.computation, 'ReleaseStatus', { release_id: releaseId }, this.timeout);
    return { releaseId: r.release_id as string, studyId: r.study_id as string, state: r.state as ReleaseStatus['state'],
      epsilon: r.epsilon as number, owners: r.owners as string[], errorCode: r.error_code as string,
      errorMessage: r.error_message as string, seconds: r.seconds as number };
  }

  /** A finished release's summary (one message: a summary too large for one is refused by the server; the Python
   *  SDK reads those in pages). */
  async getRelease(releaseId: string): Promise<ReleaseSummary> {
    const res = await unary<object, { summary: ReleaseSummary }>(this.analyst, 'GetRelease', { release_id: releaseId }, this.timeout);
    return res.summary;
  }

  /** Counts over half-open bin ranges [lo, hi), each with the standard error of its noise; with `confidence`
   *  (e.g. 0.95) each also carries ciLo, ciHi: in at least that share of releases the interval contains the true
   *  count, over the noise (the bias of spreading a count evenly inside a partition is not covered). */
  async rangeCounts(releaseId: string, ranges: readonly (readonly [number, number])[], opts: { confidence?: number } = {}): Promise<RangeCount[]> {
    for (const [lo, hi] of ranges) {
      if (!Number.isSafeInteger(lo) || !Number.isSafeInteger(hi) || lo < 0 || hi <= lo) {
        throw new ServiceError(grpc.status[grpc.status.INVALID_ARGUMENT], `a range is [lo, hi) of bin indices with 0 <= lo < hi, got [${lo}, ${hi})`, 'RangeCounts');
      }
    }
    const res = await unary<object, { counts: { lo: number; hi: number; value: number; standard_error: number }[] }>(
      this.analyst, 'RangeCounts', { release_id: releaseId, ranges: ranges.map(([lo, hi]) => ({ lo, hi })) }, this.timeout);
    const counts: RangeCount[] = res.counts.map((c) => ({ lo: Number(c.lo), hi: Number(c.hi), value: c.value, standardError: c.standard_error }));
    if (opts.confidence === undefined) return counts;
    const summary = await this.getRelease(releaseId);
    return counts.map((c) => {
      const ci: Interval = rangeInterval(summary, c.lo, c.hi, c.value, c.standardError, opts.confidence!);
      return { ...c, ciLo: ci.lo, ciHi: ci.hi, confidence: ci.confidence, intervalMethod: ci.method,
        ...(ci.reason ? { intervalNote: ci.reason } : {}) };
    });
  }
}
