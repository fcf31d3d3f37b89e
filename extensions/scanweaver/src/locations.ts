/**
 * Links between the recurrence and the code it became, read from the bundle's `locations` (the
 * compiler's record: for each term `"line:col"`, the lines, from 0, it became in the IR after
 * each pass that recorded them and in the PTX) and `terms` (where each term is written).
 *
 * Pure logic, no DOM: which characters of the recurrence are a term, which lines of a pass's IR
 * or of the PTX a term became, which term a line came from, and the sentences that say so.
 * Lines handed out here count from 1, like the `data-line` of the rendered code.
 */
import type { Token } from './highlight';

/** The key of the PTX's lines in a term's record (the others are pass names). */
export const PTX = 'ptx';

export type Locations = Record<string, Record<string, number[]>>;

/** Where a term is written, as `explorer.widget.bundle.term_records` stores it. */
export interface TermRecord {
  term: string;
  kind: 'statement' | 'name';
  name: string;
  /** from 1 */
  line: number;
  /** from 0; `end_col` excluded */
  col: number;
  end_col: number;
}

/** A term of the recurrence: where it is written and what to call it. */
export interface Term {
  key: string;
  kind: 'statement' | 'name';
  /** line of the recurrence, from 1 */
  line: number;
  /** characters [start, end) of that line */
  start: number;
  end: number;
  /** what the sentences call it: `x[t]`, or `statement h[t, n] = …` */
  label: string;
}

/** `"12:5"` -> line 12, column 5; null for anything else. */
export function parseKey(key: string): { line: number; col: number } | null {
  const m = /^(\d+):(\d+)$/.exec(key);
  return m ? { line: Number(m[1]), col: Number(m[2]) } : null;
}

function statementLabel(text: string): string {
  const target = text.split('=')[0].trim();
  return `statement ${target} = …`;
}

/** The end of the name (and its subscript) that starts at `start` of `line`. */
function nameEnd(line: string, start: number): number {
  const m = /^[A-Za-z_][A-Za-z_0-9]*/.exec(line.slice(start));
  let end = start + (m ? m[0].length : 1);
  let k = end;
  while (line[k] === ' ') {
    k++;
  }
  if (line[k] === '[') {
    let depth = 0;
    for (; k < line.length; k++) {
      if (line[k] === '[') {
        depth++;
      } else if (line[k] === ']' && --depth === 0) {
        end = k + 1;
        break;
      }
    }
  }
  return end;
}

/** The end of the statement that starts at `start` of `line` (before `;`, `#` or the end). */
function statementEnd(line: string, start: number): number {
  let end = line.length;
  for (const stop of [';', '#']) {
    const at = line.indexOf(stop, start);
    if (at >= 0 && at < end) {
      end = at;
    }
  }
  while (end > start && line[end - 1] === ' ') {
    end--;
  }
  return end;
}

/**
 * The terms of `recurrence` that `locations` names, in order of position (statements before the
 * names inside them). Where they are written comes from `records` (the parser's spans); a term
 * without a record is found in the text: a statement starts its line or follows a `;`,
 * anything else is a name with its subscript.
 */
export function findTerms(
  recurrence: string,
  locations: Locations | null | undefined,
  records?: readonly TermRecord[] | null
): Term[] {
  if (!locations) {
    return [];
  }
  const lines = recurrence.split('\n');
  const byKey = new Map((records ?? []).map(r => [r.term, r]));
  const out: Term[] = [];
  for (const key of Object.keys(locations)) {
    const at = parseKey(key);
    if (!at || at.line < 1 || at.line > lines.length) {
      continue;
    }
    const text = lines[at.line - 1];
    const record = byKey.get(key);
    let kind: 'statement' | 'name';
    let start: number;
    let end: number;
    if (record && record.line === at.line) {
      kind = record.kind === 'statement' ? 'statement' : 'name';
      start = record.col;
      end = Math.min(text.length, record.end_col);
    } else {
      start = at.col - 1;
      const before = text.slice(0, start);
      const statementStart = /(^|;)\s*$/.test(before);
      kind = statementStart ? 'statement' : 'name';
      end = statementStart ? statementEnd(text, start) : nameEnd(text, start);
    }
    if (start < 0 || start >= text.length || end <= start) {
      continue;
    }
    const written = text.slice(start, end);
    out.push({
      key,
      kind,
      line: at.line,
      start,
      end,
      label: kind === 'statement' ? statementLabel(written) : written
    });
  }
  out.sort((a, b) => a.line - b.line || a.start - b.start || (a.kind === 'statement' ? -1 : 1));
  return out;
}

/** A run of tokens of one recurrence line, inside the name term `term` or outside any (null). */
export interface Segment {
  term: string | null;
  tokens: Token[];
}

/**
 * Cut a line's tokens where the given terms of that line begin and end, so that each term
 * becomes one element around its own tokens (`origin`: the column of the first token). Called
 * with the statements of a line, then with the names inside each statement.
 */
export function segmentLine(
  tokens: readonly Token[],
  names: readonly Term[],
  origin = 0
): Segment[] {
  const ranges = [...names].sort((a, b) => a.start - b.start);
  const out: Segment[] = [];
  const push = (term: string | null, token: Token) => {
    const last = out[out.length - 1];
    if (last && last.term === term) {
      last.tokens.push(token);
    } else {
      out.push({ term, tokens: [token] });
    }
  };
  let position = origin;
  for (const [text, tag] of tokens) {
    let offset = 0;
    while (offset < text.length) {
      const at = position + offset;
      const inside = ranges.find(r => r.start <= at && at < r.end);
      const after = ranges.filter(r => r.start > at).map(r => r.start);
      const next = inside ? inside.end : Math.min(Infinity, ...after);
      const take = Math.min(text.length - offset, next - at);
      push(inside ? inside.key : null, [text.slice(offset, offset + take), tag]);
      offset += take;
    }
    position += text.length;
  }
  return out;
}

/** The location record, indexed both ways. */
export class LocationMap {
  private readonly locations: Locations;
  /** per code (pass name or `ptx`): line (from 1) -> the terms it came from */
  private readonly reverse = new Map<string, Map<number, string[]>>();
  /** the codes (pass names, `ptx`) that recorded any term's lines */
  readonly codes: Set<string>;

  constructor(locations: Locations | null | undefined) {
    this.locations = locations ?? {};
    this.codes = new Set(Object.values(this.locations).flatMap(r => Object.keys(r)));
  }

  /** Whether the record has any term. */
  get empty(): boolean {
    return this.codes.size === 0;
  }

  /** Whether `code` (a pass name or `ptx`) recorded where its lines came from. */
  has(code: string | null | undefined): boolean {
    return !!code && this.codes.has(code);
  }

  /** The lines (from 1, sorted, each once) that `term` became in `code`. */
  lines(term: string, code: string): number[] {
    const found = this.locations[term]?.[code] ?? [];
    return [...new Set(found)].sort((a, b) => a - b).map(line => line + 1);
  }

  /** The terms that line `line` (from 1) of `code` came from. */
  termsAt(code: string, line: number): string[] {
    let index = this.reverse.get(code);
    if (!index) {
      index = new Map();
      for (const [term, record] of Object.entries(this.locations)) {
        for (const l of new Set(record[code] ?? [])) {
          const list = index.get(l + 1) ?? [];
          list.push(term);
          index.set(l + 1, list);
        }
      }
      this.reverse.set(code, index);
    }
    return index.get(line) ?? [];
  }
}

/**
 * Of the terms a line came from, the one to name: a name over the statement it is in (it says
 * more), and of several names the one with the fewest lines in that code.
 */
export function mostSpecific(
  keys: readonly string[],
  terms: readonly Term[],
  map: LocationMap,
  code: string
): Term | null {
  const found = keys.map(k => terms.find(t => t.key === k)).filter((t): t is Term => !!t);
  if (found.length === 0) {
    return null;
  }
  const rank = (t: Term) => (t.kind === 'name' ? 0 : 1e9) + map.lines(t.key, code).length;
  return found.reduce((best, t) => (rank(t) < rank(best) ? t : best));
}

function count(n: number, one: string, many: string): string {
  return `${n} ${n === 1 ? one : many}`;
}

/**
 * What `term` became: `x[t]: 66 ops in scan-lower, 84 PTX lines`. `pass` is the pass whose IR
 * is shown (null: none); a pass without a location map is said to have none, and the passes
 * that have one are named with their counts.
 */
export function describeTerm(term: Term, pass: string | null, map: LocationMap): string {
  const parts: string[] = [];
  const elsewhere = () =>
    [...map.codes]
      .filter(code => code !== PTX)
      .map(code => `${code} (${map.lines(term.key, code).length})`)
      .join(', ');
  let note = '';
  if (pass !== null && map.has(pass)) {
    parts.push(`${count(map.lines(term.key, pass).length, 'op', 'ops')} in ${pass}`);
  } else if (pass !== null) {
    const others = elsewhere();
    note = `no locations recorded for this pass (${pass})` + (others ? `; ops in ${others}` : '');
  }
  if (map.has(PTX)) {
    parts.push(count(map.lines(term.key, PTX).length, 'PTX line', 'PTX lines'));
  }
  if (pass === null) {
    const others = elsewhere();
    if (others) {
      note = `ops in ${others}`;
    }
  }
  return `${term.label}: ` + [parts.join(', '), note].filter(Boolean).join('; ');
}

/** Which term line `line` (from 1) of `code` came from, as a sentence (and that term). */
export function describeLine(
  code: string,
  line: number,
  terms: readonly Term[],
  map: LocationMap
): { text: string; term: Term | null } {
  const where = code === PTX ? `PTX line ${line}` : `line ${line} of ${code}`;
  if (!map.has(code)) {
    return { text: `${where}: no locations recorded for this ${code === PTX ? 'code' : 'pass'}`, term: null };
  }
  const keys = map.termsAt(code, line);
  const term = mostSpecific(keys, terms, map, code);
  if (!term) {
    return { text: `${where} came from no recorded term of the recurrence`, term: null };
  }
  const also = keys
    .map(k => terms.find(t => t.key === k))
    .filter((t): t is Term => !!t && t.key !== term.key)
    .map(t => t.label);
  const rest = also.length ? ` (also ${also.join(', ')})` : '';
  return { text: `${where} came from ${term.label} at ${term.line}:${term.start + 1}${rest}`, term };
}
