import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';

import { applyEdits, CompileBundle, DecodedBundle, Edit, PACKING, unpackBundle } from '../src/bundle';
import { diffStats, unifiedDiff } from '../src/diff';
import { niceStep, throughputPlot, toSeries } from '../src/plot';

const BEFORE = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'];

describe('pass edits', () => {
  it('rebuild the text after a pass', () => {
    const edits: Edit[] = [
      [1, 1, ['B']],
      [3, 0, ['x', 'y']],
      [4, 1, []]
    ];
    expect(applyEdits(BEFORE, edits)).toEqual(['a', 'B', 'c', 'd', 'e', 'x', 'y', 'f', 'g', 'h', 'i']);
    expect(applyEdits(BEFORE, [])).toEqual(BEFORE);
  });

  it('give a unified diff with context', () => {
    const diff = unifiedDiff(BEFORE, [[1, 1, ['B']]], 1);
    expect(diff.map(l => l.kind + l.text)).toEqual(['@@@ -1,3 +1,3 @@', ' a', '-b', '+B', ' c']);
    expect(diffStats(diff)).toEqual({ added: 1, removed: 1 });
    // changes far apart make two hunks, close ones one
    expect(unifiedDiff(BEFORE, [[0, 1, []], [8, 1, []]], 1).filter(l => l.kind === '@')).toHaveLength(2);
    expect(unifiedDiff(BEFORE, [[0, 1, []], [2, 1, []]], 1).filter(l => l.kind === '@')).toHaveLength(1);
    expect(unifiedDiff(BEFORE, [])).toEqual([]);
  });
});

describe('a decoded bundle', () => {
  const bundle: CompileBundle = {
    format: 'scanweaver-compile/1',
    recurrence: 'h[t] = a[t] * h[t-1] + b[t]',
    strategy: 'blelloch',
    target: 'cuda',
    options: { block_size: 128 },
    stages: [
      { name: 'mlir', kind: 'mlir', seconds: 0.1, text: 'one\ntwo\nthree' },
      { name: 'cse', kind: 'mlir', seconds: 0.01, pass: 0 },
      { name: 'canonicalize', kind: 'mlir', seconds: 0.01, pass: 1 },
      { name: 'ptx', kind: 'ptx', seconds: 0.05, text: 'ret;' }
    ],
    pass_input: 'mlir',
    passes: [
      { name: 'cse', seconds: 0.01, changed: true, edits: [[1, 1, []]] },
      { name: 'canonicalize', seconds: 0.01, changed: false, edits: [] }
    ]
  };
  const data = new DecodedBundle(bundle);

  it('gives every stage its text', () => {
    expect(data.irAfter(-1)).toBe('one\ntwo\nthree');
    expect(data.irAfter(0)).toBe('one\nthree');
    expect(data.stageText('cse')).toBe('one\nthree');
    expect(data.stageText('canonicalize')).toBe('one\nthree');
    expect(data.stageText('ptx')).toBe('ret;');
    expect(data.stageText('llvm')).toBeUndefined();
  });
});

describe('a bundle with passes left out, packed', () => {
  // pass 2 (after cse) was not saved; pass 3's edits apply to the IR after pass 1
  const bundle: CompileBundle = {
    format: 'scanweaver-compile/2',
    recurrence: 'h[t] = a[t] * h[t-1] + b[t]',
    strategy: 'blelloch',
    target: 'cuda',
    options: {},
    stages: [
      { name: 'mlir', kind: 'mlir', seconds: 0.1 },
      { name: 'cse', kind: 'mlir', seconds: 0.01, pass: 0 },
      { name: 'big', kind: 'mlir', seconds: 0.01, pass: 1 },
      { name: 'lower', kind: 'mlir', seconds: 0.01, pass: 2 },
      { name: 'ptx', kind: 'ptx', seconds: 0.05 }
    ],
    pass_input: 'mlir',
    passes: [
      { name: 'cse', seconds: 0.01, changed: true },
      { name: 'big', seconds: 0.01, changed: true, omitted: { lines: 5000, chars: 400000 } },
      { name: 'lower', seconds: 0.01, changed: true, base: 0 }
    ],
    packed: {
      encoding: PACKING,
      data: gzipSync(
        JSON.stringify({
          stages: { mlir: 'one\ntwo\nthree', ptx: 'ret;' },
          edits: [[[1, 1, []]], null, [[1, 0, ['four']]]]
        })
      ).toString('base64')
    }
  };

  it('unpacks its texts and edits', async () => {
    const plain = await unpackBundle(bundle);
    expect(plain.packed).toBeNull();
    expect(plain.stages[0].text).toBe('one\ntwo\nthree');
    expect(plain.stages[4].text).toBe('ret;');
    expect(plain.stages[1].text).toBeUndefined();
    expect(plain.passes.map(p => p.edits)).toEqual([[[1, 1, []]], undefined, [[1, 0, ['four']]]]);
    // a bundle that is not packed comes back as it is
    expect(await unpackBundle(plain)).toBe(plain);
    await expect(unpackBundle({ ...bundle, packed: { encoding: 'zip', data: '' } })).rejects.toThrow('zip');
  });

  it('decodes around the pass left out', async () => {
    const data = new DecodedBundle(await unpackBundle(bundle));
    expect(data.irAfter(0)).toBe('one\nthree');
    expect(data.irAfter(1)).toBeNull();
    expect(data.stageText('big')).toBeUndefined();
    expect(data.linesBefore(1)).toEqual(['one', 'three']);
    expect(data.linesBefore(2)).toEqual(['one', 'three']); // its base, pass 1
    expect(data.irAfter(2)).toBe('one\nfour\nthree');
    expect(data.stageText('lower')).toBe('one\nfour\nthree');
  });
});

describe('the timing plot', () => {
  const measurements = [
    { name: 'compiled blelloch', length: 1024, channels: 64, seconds: 1e-5, bytes: 786432, device: 'cuda' },
    { name: 'compiled blelloch', length: 4096, channels: 64, seconds: 2e-5, bytes: 3145728, device: 'cuda' },
    { name: 'copy', length: 1024, channels: 64, seconds: 5e-6, bytes: 786432, device: 'cuda', kind: 'roofline' },
    { name: 'CUB <affine>', length: 1024, channels: 64, seconds: 0, bytes: 1, device: 'cuda', status: 'skipped' }
  ];

  it('groups points by implementation and drops what was not measured', () => {
    const series = toSeries(measurements);
    expect(series.map(s => s.name)).toEqual(['compiled blelloch', 'copy']);
    expect(series[0].points[1].gbps).toBeCloseTo(157.29, 1);
  });

  it('draws an SVG with a line per implementation, escaping names', () => {
    const svg = throughputPlot(measurements)!;
    expect(svg.startsWith('<svg')).toBe(true);
    expect(svg.match(/<polyline/g)).toHaveLength(2);
    expect(svg).toContain('stroke-dasharray');
    expect(throughputPlot([{ ...measurements[0], name: 'a<b' }])).toContain('a&#60;b');
    expect(throughputPlot([])).toBeNull();
  });

  it('picks round axis steps', () => {
    expect(niceStep(157)).toBe(50);
    expect(niceStep(1)).toBe(0.2);
    expect(niceStep(12)).toBe(2.5);
    expect(niceStep(3000)).toBe(1000);
  });
});
