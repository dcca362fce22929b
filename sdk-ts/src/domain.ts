/**
 * The agreed histogram domain: which CSV column, and how its values map to bins (the Python side:
 * parties/data_owner/domain.py, `DomainSpec`). The grammar is the one the study contract records in
 * `domain_spec`:
 *
 * - `age:0:100:50`: column `age`, 50 equal-width bins over [0, 100) (edges as numpy.linspace computes them);
 * - `age:edges:0,18,65,120`: explicit edges (finite, strictly increasing);
 * - `sector:categories:retail,health,other`: bin i holds the records whose value is the i-th category.
 *
 * Bin i of a numeric domain is [e_i, e_{i+1}); values below e_0, at or above the last edge, and NaN are
 * outside (-1). The column name may itself contain ':' (the spec is split from the right).
 */

const PARSE_HELP = "use 'column:lo:hi:n_bins' (n_bins equal-width bins over [lo, hi)), "
  + "'column:edges:e0,e1,...,ek' or 'column:categories:a,b,c'";

/** Python's float(): decimal or hex-free numbers with optional '_' between digits, inf/infinity/nan; else NaN + error. */
const PY_FLOAT = /^[+-]?((\d(_?\d)*)?\.?\d(_?\d)*([eE][+-]?\d(_?\d)*)?|\d(_?\d)*\.([eE][+-]?\d(_?\d)*)?)$/;
const PY_SPECIAL = /^[+-]?(inf|infinity|nan)$/i;

/** A number as Python's `float(text)` reads it; undefined where Python raises ValueError. */
export function pyFloat(text: string): number | undefined {
  const t = text.trim();
  if (PY_SPECIAL.test(t)) {
    const neg = t.startsWith('-');
    if (/nan/i.test(t)) return NaN;
    return neg ? -Infinity : Infinity;
  }
  if (!PY_FLOAT.test(t)) return undefined;
  return Number(t.replace(/_/g, ''));
}

/** Python's int() of a decimal text (the spec's n_bins); undefined where Python raises. */
function pyInt(text: string): number | undefined {
  const t = text.trim();
  if (!/^[+-]?\d(_?\d)*$/.test(t)) return undefined;
  return Number(t.replace(/_/g, ''));
}

export class DomainError extends Error { override name = 'DomainError'; }

export class DomainSpec {
  readonly column: string;
  readonly edges: readonly number[];
  readonly categories: readonly string[] | undefined;
  private readonly index: Map<string, number> | undefined;

  constructor(column: string, edges: readonly number[], categories?: readonly string[]) {
    if (typeof column !== 'string' || !column.trim()) throw new DomainError(`the domain's column name must be a non-empty string, got ${JSON.stringify(column)}`);
    if (edges.length < 2) throw new DomainError(`a domain needs at least 2 bin edges (one bin), got ${edges.length}`);
    const bad = edges.find((e) => !Number.isFinite(e));
    if (bad !== undefined) throw new DomainError(`bin edges must be finite, got ${bad}`);
    for (let i = 1; i < edges.length; i++) {
      if (!(edges[i]! > edges[i - 1]!)) throw new DomainError(`bin edges must be strictly increasing, but edge ${i} (${edges[i]}) <= edge ${i - 1} (${edges[i - 1]})`);
    }
    if (categories !== undefined) {
      if (categories.length === 0) throw new DomainError('a categorical domain needs at least one category');
      const seen = new Set<string>();
      for (const c of categories) {
        if (typeof c !== 'string' || !c) throw new DomainError(`categories must be non-empty strings, got ${JSON.stringify(c)}`);
        if (seen.has(c)) throw new DomainError(`category ${JSON.stringify(c)} is listed twice`);
        seen.add(c);
      }
      if (edges.length !== categories.length + 1 || edges.some((e, i) => e !== i)) {
        throw new DomainError("a categorical domain's edges must be (0, 1, ..., number of categories)");
      }
      this.index = new Map(categories.map((c, i) => [c, i]));
    }
    this.column = column;
    this.edges = Object.freeze([...edges]);
    this.categories = categories === undefined ? undefined : Object.freeze([...categories]);
  }

  static fromEdges(column: string, edges: readonly number[]): DomainSpec { return new DomainSpec(column, edges); }

  /** `nBins` equal-width bins over [lo, hi): edge i is lo + i * ((hi - lo) / nBins), the last one hi (numpy.linspace). */
  static equalWidth(column: string, lo: number, hi: number, nBins: number, maxBins?: number): DomainSpec {
    if (!Number.isSafeInteger(nBins) || nBins < 1) throw new DomainError(`n_bins must be an integer >= 1, got ${nBins}`);
    checkBins(nBins, maxBins);
    if (!Number.isFinite(lo) || !Number.isFinite(hi)) throw new DomainError(`domain bounds must be finite, got [${lo}, ${hi})`);
    if (!(hi > lo)) throw new DomainError(`the domain's upper bound must exceed its lower bound, got [${lo}, ${hi})`);
    const step = (hi - lo) / nBins;
    const edges = new Array<number>(nBins + 1);
    for (let i = 0; i < nBins; i++) edges[i] = i * step + lo;
    edges[nBins] = hi;
    return new DomainSpec(column, edges);
  }

  static categorical(column: string, categories: readonly string[]): DomainSpec {
    return new DomainSpec(column, categories.map((_, i) => i).concat(categories.length), categories);
  }

  /** Parse a spec in the contract's grammar; more than `maxBins` bins is refused before any edge is built. */
  static parse(text: string, maxBins?: number): DomainSpec {
    if (typeof text !== 'string') throw new DomainError(`a domain spec must be a string, got ${typeof text}`);
    const three = rsplit(text, ':', 2);
    if (three.length === 3 && (three[1] === 'edges' || three[1] === 'categories')) {
      const [column, kind, items] = three as [string, string, string];
      if (maxBins !== undefined) checkBins((items.match(/,/g)?.length ?? 0) + (kind === 'categories' ? 1 : 0), maxBins);
      const values = items.split(',').map((v) => v.trim());
      if (kind === 'categories') return DomainSpec.categorical(column, values);
      const edges = values.map((v) => pyFloat(v));
      const bad = values.find((_, i) => edges[i] === undefined);
      if (bad !== undefined) throw new DomainError(`domain spec ${JSON.stringify(text)}: bin edges must be numbers (could not convert ${JSON.stringify(bad)})`);
      return DomainSpec.fromEdges(column, edges as number[]);
    }
    const four = rsplit(text, ':', 3);
    if (four.length !== 4) throw new DomainError(`cannot parse domain spec ${JSON.stringify(text)}: ${PARSE_HELP}`);
    const [column, loS, hiS, nS] = four as [string, string, string, string];
    const lo = pyFloat(loS), hi = pyFloat(hiS);
    if (lo === undefined || hi === undefined) throw new DomainError(`domain spec ${JSON.stringify(text)}: lo and hi must be numbers; ${PARSE_HELP}`);
    const n = pyInt(nS);
    if (n === undefined) throw new DomainError(`domain spec ${JSON.stringify(text)}: n_bins must be an integer, got ${JSON.stringify(nS)}`);
    return DomainSpec.equalWidth(column, lo, hi, n, maxBins);
  }

  get nBins(): number { return this.edges.length - 1; }
  get isCategorical(): boolean { return this.categories !== undefined; }

  /** A copy reading another column (the CLI's --value-column). */
  withColumn(column: string): DomainSpec {
    return this.categories ? DomainSpec.categorical(column, this.categories) : new DomainSpec(column, this.edges);
  }

  /** The bin of one value (a number for a numeric domain, the field's text for a categorical one); -1 outside. */
  binOf(value: number | string): number {
    if (this.index) return this.index.get(String(value)) ?? -1;
    const v = typeof value === 'number' ? value : pyFloat(value);
    if (v === undefined) throw new DomainError(`values of numeric column ${JSON.stringify(this.column)} must be numbers, got ${JSON.stringify(value)}`);
    if (Number.isNaN(v)) return -1;
    // searchsorted(edges, v, side='right') - 1: the number of edges <= v, less one.
    let lo = 0, hi = this.edges.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.edges[mid]! <= v) lo = mid + 1; else hi = mid;
    }
    const idx = lo - 1;
    return idx >= 0 && idx < this.nBins ? idx : -1;
  }
}

function checkBins(n: number, maxBins: number | undefined): void {
  if (maxBins !== undefined && n > maxBins) throw new DomainError(`the domain has ${n.toLocaleString('en-US')} bins; a study holds 1 to ${maxBins.toLocaleString('en-US')} bins`);
}

/** Python's str.rsplit(sep, maxsplit). */
function rsplit(text: string, sep: string, maxsplit: number): string[] {
  const parts = text.split(sep);
  if (parts.length <= maxsplit + 1) return parts;
  return [parts.slice(0, parts.length - maxsplit).join(sep), ...parts.slice(parts.length - maxsplit)];
}
