import { describe, expect, it } from 'vitest';

import { unifiedDiff } from '../src/diff';
import { Token } from '../src/highlight';
import {
  describeLine,
  describeTerm,
  findTerms,
  LocationMap,
  Locations,
  mostSpecific,
  parseKey,
  segmentLine,
  TermRecord
} from '../src/locations';

const TEXT = 'h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\ny[t] = sum(C[t, n] * h[t, n]) + D * x[t]';

// the shape of Compiled.term_lines() for the selective scan (lines from 0)
const LOCATIONS: Locations = {
  '1:1': { 'scan-lower': [3, 4, 5, 9, 10], 'cse (gpu.module)': [1, 2], ptx: [20, 21, 22, 23] },
  '2:1': { 'scan-lower': [12], ptx: [30] },
  '1:15': { 'scan-lower': [4, 4], ptx: [21] },
  '1:61': { 'scan-lower': [9, 10, 10], ptx: [22, 23] },
  '2:33': { 'scan-lower': [12] }
};

const RECORDS: TermRecord[] = [
  { term: '1:1', kind: 'statement', name: 'h', line: 1, col: 0, end_col: 64 },
  { term: '2:1', kind: 'statement', name: 'y', line: 2, col: 0, end_col: 40 },
  { term: '1:15', kind: 'name', name: 'dt', line: 1, col: 14, end_col: 19 },
  { term: '1:61', kind: 'name', name: 'x', line: 1, col: 60, end_col: 64 },
  { term: '2:33', kind: 'name', name: 'D', line: 2, col: 32, end_col: 33 }
];

describe('terms of the recurrence', () => {
  it('parse keys', () => {
    expect(parseKey('12:5')).toEqual({ line: 12, col: 5 });
    expect(parseKey('ptx')).toBeNull();
  });

  it('come from the parser spans, statements before the names in them', () => {
    const terms = findTerms(TEXT, LOCATIONS, RECORDS);
    expect(terms.map(t => [t.key, t.kind, t.label])).toEqual([
      ['1:1', 'statement', 'statement h[t, n] = …'],
      ['1:15', 'name', 'dt[t]'],
      ['1:61', 'name', 'x[t]'],
      ['2:1', 'statement', 'statement y[t] = …'],
      ['2:33', 'name', 'D']
    ]);
  });

  it('are found in the text where the bundle has no spans', () => {
    const fromText = findTerms(TEXT, LOCATIONS, null);
    const fromSpans = findTerms(TEXT, LOCATIONS, RECORDS);
    expect(fromText).toEqual(fromSpans);
    // a statement after `;`, a comment, a name with spaces before its subscript
    const text = 'a[t] = x [t] * 2; b[t] = a[t] + y[t]  # two';
    const terms = findTerms(text, { '1:1': {}, '1:8': {}, '1:19': {}, '1:33': {}, '9:1': {} });
    expect(terms.map(t => [t.key, t.kind, text.slice(t.start, t.end)])).toEqual([
      ['1:1', 'statement', 'a[t] = x [t] * 2'],
      ['1:8', 'name', 'x [t]'],
      ['1:19', 'statement', 'b[t] = a[t] + y[t]'],
      ['1:33', 'name', 'y[t]']
    ]);
    expect(findTerms(TEXT, null)).toEqual([]);
  });

  it('cut the tokens of a line at their edges', () => {
    const terms = findTerms(TEXT, LOCATIONS, RECORDS).filter(t => t.line === 2 && t.kind === 'name');
    const tokens: Token[] = [['y', 'def'], ['[t] = sum(C[t, n] * h[t, n]) + ', null], ['D', 'var'], [' * x[t]', null]];
    const segments = segmentLine(tokens, terms);
    expect(segments.map(s => [s.term, s.tokens.map(t => t[0]).join('')])).toEqual([
      [null, 'y[t] = sum(C[t, n] * h[t, n]) + '],
      ['2:33', 'D'],
      [null, ' * x[t]']
    ]);
    // a term inside one token, and an origin other than the line's start
    const x = findTerms(TEXT, LOCATIONS, RECORDS).filter(t => t.key === '1:61');
    const inner = segmentLine([[' * x[t]', null]], x, 57);
    expect(inner.map(s => [s.term, s.tokens[0][0]])).toEqual([
      [null, ' * '],
      ['1:61', 'x[t]']
    ]);
  });
});

describe('the location map', () => {
  const map = new LocationMap(LOCATIONS);
  const terms = findTerms(TEXT, LOCATIONS, RECORDS);
  const x = terms.find(t => t.key === '1:61')!;

  it('gives a term its lines from 1, each once', () => {
    expect(map.lines('1:61', 'scan-lower')).toEqual([10, 11]);
    expect(map.lines('1:61', 'ptx')).toEqual([23, 24]);
    expect(map.lines('1:61', 'canonicalize')).toEqual([]);
    expect(map.has('scan-lower') && map.has('ptx') && map.has('cse (gpu.module)')).toBe(true);
    expect(map.has('canonicalize') || map.has(null)).toBe(false);
    expect(new LocationMap(null).empty).toBe(true);
  });

  it('names the terms a line came from, the most specific first', () => {
    expect(map.termsAt('scan-lower', 11).sort()).toEqual(['1:1', '1:61']);
    expect(map.termsAt('scan-lower', 1)).toEqual([]);
    expect(mostSpecific(map.termsAt('scan-lower', 11), terms, map, 'scan-lower')?.key).toBe('1:61');
    // dt has fewer lines than x in scan-lower; both beat the statement
    expect(mostSpecific(['1:1', '1:61', '1:15'], terms, map, 'scan-lower')?.key).toBe('1:15');
    expect(mostSpecific(['1:1'], terms, map, 'scan-lower')?.key).toBe('1:1');
    expect(mostSpecific([], terms, map, 'ptx')).toBeNull();
  });

  it('says what a term became', () => {
    expect(describeTerm(x, 'scan-lower', map)).toBe('x[t]: 2 ops in scan-lower, 2 PTX lines');
    expect(describeTerm(x, 'canonicalize', map)).toBe(
      'x[t]: 2 PTX lines; no locations recorded for this pass (canonicalize); ' +
        'ops in scan-lower (2), cse (gpu.module) (0)'
    );
    expect(describeTerm(x, null, map)).toBe('x[t]: 2 PTX lines; ops in scan-lower (2), cse (gpu.module) (0)');
    const d = terms.find(t => t.key === '2:33')!;
    expect(describeTerm(d, 'scan-lower', map)).toBe('D: 1 op in scan-lower, 0 PTX lines');
  });

  it('says where a line came from', () => {
    expect(describeLine('ptx', 24, terms, map).text).toBe(
      'PTX line 24 came from x[t] at 1:61 (also statement h[t, n] = …)'
    );
    expect(describeLine('ptx', 24, terms, map).term?.key).toBe('1:61');
    expect(describeLine('ptx', 1, terms, map)).toEqual({
      text: 'PTX line 1 came from no recorded term of the recurrence',
      term: null
    });
    expect(describeLine('cse', 3, terms, map).text).toBe('line 3 of cse: no locations recorded for this pass');
  });
});

describe('diff lines', () => {
  it('carry their number in the text after the pass', () => {
    const before = ['a', 'b', 'c', 'd'];
    const diff = unifiedDiff(before, [[1, 1, ['B', 'B2']]], 1);
    expect(diff.map(l => [l.kind, l.text, l.newLine])).toEqual([
      ['@', '@@ -1,3 +1,4 @@', undefined],
      [' ', 'a', 1],
      ['-', 'b', undefined],
      ['+', 'B', 2],
      ['+', 'B2', 3],
      [' ', 'c', 4]
    ]);
  });
});
