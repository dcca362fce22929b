/**
 * Records from a CSV file to a contribution-bounded histogram, as the Python owner reads them
 * (parties/data_owner/dataset.py, `read_histogram`): the same file gives the same bins here and there.
 *
 * The file is UTF-8 (a byte-order mark is ignored) with a header row; fields are parsed as Python's csv
 * module does with its default dialect (',' separated, '"' quoted, '""' inside quotes), then stripped of
 * surrounding whitespace; completely empty lines are skipped. A value is *bad* when it is empty, not a number
 * (numeric domain; numbers are read as Python's float() reads them) or NaN, when the person id is empty, or
 * when the row has another number of fields than the header. With `onBadValue: 'error'` (default) the first
 * bad value throws, naming the line; with 'drop' such records are skipped and counted as outside the domain.
 * Values that parse but fall outside the domain (including +-inf) count as outside the domain.
 *
 * With `personColumn` each person's contribution is bounded (bounding.ts) with the given random choice;
 * `keyedRandom` makes that choice repeatable under a secret, so a re-run of an interrupted submit keeps the
 * very records the first run kept (and its encrypted chunks can be reused; resume.ts).
 */
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';

import { histogramFromRecords, type BoundedHistogram, type Bounds } from './bounding.ts';
import { DomainSpec, pyFloat } from './domain.ts';

export class RecordsError extends Error { override name = 'RecordsError'; }

export interface ReadOptions {
  personColumn?: string;
  bounds?: Bounds;
  onBadValue?: 'error' | 'drop';
  /** How the caller asks for dropping, named in the error (the CLI names its flag). */
  dropHint?: string;
  /** Uniform integer in [0, n): default node's CSPRNG; `keyedRandom(secret, label)` for a repeatable choice. */
  randomBelow?: (n: number) => number;
}

/** Python's csv.reader (excel dialect, non-strict) over a whole text: rows with the physical line each ended on. */
export function* csvRows(text: string): Generator<{ row: string[]; line: number }> {
  let i = 0, line = 0;
  const n = text.length;
  while (i < n) {
    const row: string[] = [];
    let field = '', quoted = false, inQuotes = false, started = false;
    line += 1;
    for (;;) {
      if (i >= n) {
        if (started || row.length) row.push(field);
        break;
      }
      const ch = text[i]!;
      if (inQuotes) {
        if (ch === '"') {
          if (text[i + 1] === '"') { field += '"'; i += 2; continue; }
          inQuotes = false; i += 1; continue;
        }
        if (ch === '\n' || (ch === '\r' && text[i + 1] !== '\n')) line += 1;
        field += ch; i += 1; continue;
      }
      if (ch === '"' && !started) { inQuotes = true; quoted = true; started = true; i += 1; continue; }
      if (ch === ',') { row.push(field); field = ''; quoted = false; started = false; i += 1; if (i >= n) { row.push(''); break; } continue; }
      if (ch === '\r' || ch === '\n') {
        i += ch === '\r' && text[i + 1] === '\n' ? 2 : 1;
        if (started || row.length) row.push(field);
        break;
      }
      field += ch; started = true; i += 1;
    }
    void quoted;
    yield { row, line };
  }
}

function columnIndex(header: string[], name: string, path: string, role: string): number {
  const hits = header.flatMap((h, i) => (h === name ? [i] : []));
  if (hits.length === 0) {
    const present = header.map((h) => `'${h}'`).join(', ') || '(none)';
    throw new RecordsError(`${path}: no ${role} column '${name}'; the columns present are ${present}. `
      + 'Pass one of these names (matching is exact and case-sensitive)');
  }
  if (hits.length > 1) throw new RecordsError(`${path}: column '${name}' appears ${hits.length} times in the header; rename the duplicates`);
  return hits[0]!;
}

/** Read a CSV file and build its contribution-bounded histogram over `domain` (see the module comment). */
export function readHistogram(path: string, domain: DomainSpec, opts: ReadOptions = {}): BoundedHistogram {
  const onBad = opts.onBadValue ?? 'error';
  const dropHint = opts.dropHint ?? "onBadValue: 'drop'";
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(readFileSync(path));
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    if (e.code) throw new RecordsError(`cannot read ${path}: ${e.message}`);
    throw new RecordsError(`${path} is not UTF-8 text: ${e.message}`);
  }
  if (text.startsWith('\uFEFF')) text = text.slice(1);
  const rows = csvRows(text);
  const first = rows.next();
  if (first.done) throw new RecordsError(`${path} is empty: expected a header row naming the columns`);
  const header = first.value.row.map((h) => h.trim());
  const vi = columnIndex(header, domain.column, path, 'value');
  const pi = opts.personColumn === undefined ? undefined : columnIndex(header, opts.personColumn, path, 'person id');
  const bins: number[] = [];
  const persons: string[] = [];
  let nBad = 0;
  for (const { row, line } of rows) {
    if (row.length === 0 || row.every((f) => !f.trim())) continue;
    let problem: string | undefined;
    const raw = vi < row.length ? row[vi]!.trim() : undefined;
    let person: string | undefined;
    if (raw === undefined) problem = `has no field for column '${domain.column}' (only ${row.length} fields)`;
    else if (row.length !== header.length) problem = `has ${row.length} fields but the header has ${header.length} (an unquoted comma in a value?)`;
    else if (raw === '') problem = `has an empty value in column '${domain.column}'`;
    if (problem === undefined && pi !== undefined) {
      person = pi < row.length ? row[pi]!.trim() : '';
      if (person === '') problem = `has no person id in column '${opts.personColumn}'`;
    }
    let bin = -1;
    if (problem === undefined) {
      if (domain.isCategorical) bin = domain.binOf(raw!);
      else {
        const v = pyFloat(raw!);
        if (v === undefined) problem = `has value '${raw}' in column '${domain.column}', which is not a number`;
        else if (Number.isNaN(v)) problem = `has value '${raw}' (NaN) in column '${domain.column}'`;
        else bin = domain.binOf(v);
      }
    }
    if (problem !== undefined) {
      if (onBad === 'drop') { nBad += 1; continue; }
      throw new RecordsError(`${path}: line ${line} ${problem}; fix the file or pass ${dropHint} to skip such records`);
    }
    bins.push(bin);
    if (person !== undefined) persons.push(person);
  }
  const hist = histogramFromRecords(bins, domain.nBins, pi === undefined ? undefined : persons, opts.bounds, opts.randomBelow);
  return { ...hist, recordsRead: hist.recordsRead + nBad, outOfDomain: hist.outOfDomain + nBad };
}

/**
 * A repeatable uniform integer source under a secret (>= 16 bytes): the i-th draw's 64-bit words are
 * HMAC-SHA256(secret, label | i | j), and a draw below n rejects the words above the largest multiple of n
 * (exactly uniform). Nobody without the secret can predict the choices; the same secret and label give the
 * same choices, so an interrupted submit re-reads the same bounded histogram.
 */
export function keyedRandom(secret: Uint8Array, label: string): (n: number) => number {
  if (secret.length < 16) throw new Error(`a keyed random source needs a secret of at least 16 bytes, got ${secret.length}`);
  let call = 0;
  return (n: number): number => {
    if (!Number.isSafeInteger(n) || n < 1) throw new Error(`randomBelow needs an integer >= 1, got ${n}`);
    call += 1;
    const bound = 1n << 64n;
    const limit = bound - (bound % BigInt(n));
    for (let j = 0; ; j++) {
      const mac = createHmac('sha256', secret).update(`${label}|${call}|${j}`).digest();
      const word = mac.readBigUInt64BE(0);
      if (word < limit) return Number(word % BigInt(n));
    }
  };
}

export { DomainSpec };
