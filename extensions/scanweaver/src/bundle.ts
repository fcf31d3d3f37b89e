/**
 * The compile bundle: what `explorer.widget.bundle.mime_bundle` stores in a notebook under
 * `application/vnd.scanweaver.compile+json`. The renderer only reads it; it recomputes nothing.
 *
 * To keep notebooks small, the IR after each pass is stored as edits against the IR before it
 * (`passes[i].edits`; after a pass whose IR was left out, against the IR after pass `base`); the
 * IR before the first pass is the stage named `pass_input`. A stage whose text is a pass's IR
 * names that pass (`pass`) instead of repeating the text. A notebook's bundle carries the stage
 * texts and the edits compressed in `packed` ({@link unpackBundle} puts them back), and passes
 * past a size budget carry no IR (`omitted`).
 */

import type { TermRecord } from './locations';

export const MIME_TYPE = 'application/vnd.scanweaver.compile+json';
/** The format written now; bundles of format 1 (texts not packed) read the same. */
export const FORMAT = 'scanweaver-compile/2';
export const PACKING = 'gzip+base64';

/** Copy `keep` lines of the text before, skip the next `drop`, then insert `insert`. */
export type Edit = [keep: number, drop: number, insert: string[]];

export interface StageRecord {
  name: string;
  /** text | mlir | llvm | ptx: which highlighting applies */
  kind: string;
  seconds: number;
  /** the stage's text, unless it is the IR after pass number `pass` */
  text?: string;
  pass?: number;
}

export interface PassRecord {
  name: string;
  seconds: number;
  changed: boolean;
  pipeline?: string;
  /** the edits that make the IR after this pass (absent: its IR was not saved) */
  edits?: Edit[];
  /** the pass whose IR `edits` apply to (-1: the input); absent: the pass before */
  base?: number;
  /** the size of the IR that was left out */
  omitted?: { lines: number; chars: number };
}

export interface Measurement {
  name: string;
  length: number;
  channels: number;
  seconds: number;
  bytes: number;
  device: string;
  /** generated | baseline | roofline (absent: generated) */
  kind?: string;
  /** ok, or why the point was not measured */
  status?: string;
}

export interface CompileBundle {
  format: string;
  explorer_version?: string;
  recurrence: string;
  strategy: string;
  target: string;
  options: Record<string, unknown>;
  stages: StageRecord[];
  pass_input?: string | null;
  passes: PassRecord[];
  ptx_info?: Record<string, unknown> | null;
  /** SVG pictures by stage name (recurrence: dependence graph, plan: scan tree) */
  graphs?: Record<string, string>;
  measurements?: Measurement[] | null;
  /**
   * The compiler's source locations: for each recurrence term (`"line:col"`), the lines (from 0)
   * it became in the IR after each pass that recorded them (by pass name) and in the PTX
   * (`"ptx"`). The renderer links terms and lines with them (`src/locations.ts`).
   */
  locations?: Record<string, Record<string, number[]>> | null;
  /** where each located term is written in `recurrence` (the parser's spans) */
  terms?: TermRecord[] | null;
  /** the stage texts and pass edits, as gzip-compressed JSON in base64 */
  packed?: { encoding: string; data: string } | null;
}

/** What `packed` holds: every stage text by name, and each pass's edits (null: not saved). */
interface PackedTexts {
  stages: Record<string, string>;
  edits: (Edit[] | null)[];
}

function base64Bytes(data: string): Uint8Array {
  const binary = atob(data);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) {
    bytes[i] = binary.charCodeAt(i);
  }
  return bytes;
}

/** The bundle with its packed texts back in their records (a bundle not packed as it is). */
export async function unpackBundle(bundle: CompileBundle): Promise<CompileBundle> {
  const packed = bundle.packed;
  if (!packed) {
    return bundle;
  }
  if (packed.encoding !== PACKING) {
    throw new Error(`unknown packing ${String(packed.encoding)}`);
  }
  const stream = new Blob([base64Bytes(packed.data)]).stream().pipeThrough(new DecompressionStream('gzip'));
  const texts = JSON.parse(await new Response(stream).text()) as PackedTexts;
  return {
    ...bundle,
    packed: null,
    stages: bundle.stages.map(s => (s.name in texts.stages ? { ...s, text: texts.stages[s.name] } : s)),
    passes: bundle.passes.map((p, i) => {
      const edits = texts.edits[i];
      return edits ? { ...p, edits } : p;
    })
  };
}

/** Apply `edits` to the lines of the text before a pass; returns the lines after it. */
export function applyEdits(before: readonly string[], edits: readonly Edit[]): string[] {
  const out: string[] = [];
  let position = 0;
  for (const [keep, drop, insert] of edits) {
    for (let i = 0; i < keep; i++) {
      out.push(before[position + i]);
    }
    position += keep + drop;
    for (const line of insert) {
      out.push(line);
    }
  }
  for (let i = position; i < before.length; i++) {
    out.push(before[i]);
  }
  return out;
}

/** The texts of a bundle, decoded once: every stage's text and the IR around every pass. */
export class DecodedBundle {
  readonly bundle: CompileBundle;
  /**
   * IR before the first pass, then the IR after each pass: `passLines[i + 1]` is after pass i
   * (null where it was not saved)
   */
  private readonly passLines: (string[] | null)[];

  constructor(bundle: CompileBundle) {
    this.bundle = bundle;
    const input = bundle.pass_input ? this.stageText(bundle.pass_input) ?? '' : '';
    this.passLines = [input.split('\n')];
    bundle.passes.forEach((record, index) => {
      const before = this.passLines[(record.base ?? index - 1) + 1] ?? null;
      this.passLines.push(record.edits && before ? applyEdits(before, record.edits) : null);
    });
  }

  /** The stage record called `name`. */
  stage(name: string): StageRecord | undefined {
    return this.bundle.stages.find(s => s.name === name);
  }

  /** The text of stage `name` (from the pass it names, if it names one). */
  stageText(name: string): string | undefined {
    const record = this.stage(name);
    if (!record) {
      return undefined;
    }
    if (record.text !== undefined) {
      return record.text;
    }
    if (record.pass !== undefined && this.passLines && record.pass + 1 < this.passLines.length) {
      return this.passLines[record.pass + 1]?.join('\n');
    }
    return undefined;
  }

  /** The IR after pass `index` (`index = -1`: the IR the passes start from); null: not saved. */
  irAfter(index: number): string | null {
    return this.passLines[index + 1]?.join('\n') ?? null;
  }

  /** Lines of the IR the edits of pass `index` apply to (the IR before it, or after its `base`). */
  linesBefore(index: number): string[] | null {
    const base = this.bundle.passes[index]?.base ?? index - 1;
    return this.passLines[base + 1] ?? null;
  }
}
