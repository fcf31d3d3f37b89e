/**
 * PTX (`.ptx`), NVIDIA's virtual ISA as emitted by the NVPTX backend: directives, instructions
 * with their modifiers (`ld.global.nc.f32`), registers, predicates, labels, `.loc` lines.
 */
import type { StreamParser } from '@codemirror/language';

import { applyRules, Rule } from './rules';

export interface PtxState {
  /** inside a block comment that began on an earlier line */
  inComment: boolean;
}

const TYPES = /^\.(?:[subf](?:8|16|32|64)(?:x2)?|b128|pred|f16x2|bf16(?:x2)?|tf32|e4m3x2|e5m2x2)\b/;

const RULES: readonly Rule[] = [
  [/^\/\/.*/, 'comment'],
  [/^"(?:\\.|[^"\\])*"/, 'string'],
  // directives: .version .target .entry .reg .param .shared .loc ...
  [/^\.[A-Za-z_]\w*/, 'meta'],
  // registers and special registers: %r1, %rd12, %f3, %p1, %tid.x, %ctaid.y
  [/^%[A-Za-z_$][\w$]*(?:\.[xyzw])?/, 'variableName.special'],
  // labels and their uses: $L__BB0_2
  [/^\$[\w$]+/, 'labelName'],
  // float literals in hex: 0f3F800000 (f32), 0d3FF0000000000000 (f64)
  [/^0[fFdD][0-9a-fA-F]+/, 'number'],
  [/^0[xX][0-9a-fA-F]+U?/, 'number'],
  [/^[-+]?\d+\.\d*(?:[eE][-+]?\d+)?/, 'number'],
  [/^[-+]?\d+U?/, 'number'],
  [/^[-+*/=!<>|&~^]/, 'operator'],
  [/^[(){}[\],;:]/, 'punctuation']
];

export const ptx: StreamParser<PtxState> = {
  name: 'ptx',
  startState: () => ({ inComment: false }),
  copyState: state => ({ ...state }),
  token(stream, state) {
    if (state.inComment) {
      if (stream.skipTo('*')) {
        stream.next();
        if (stream.eat('/')) {
          state.inComment = false;
        }
      } else {
        stream.skipToEnd();
      }
      return 'comment';
    }
    if (stream.eatSpace()) {
      return null;
    }
    if (stream.match('/*')) {
      state.inComment = true;
      return 'comment';
    }
    // a label definition at the start of a statement: `$L__BB0_1:` or `name:`
    if (stream.match(/^[$A-Za-z_][\w$]*:/)) {
      return 'labelName';
    }
    if (stream.match(TYPES)) {
      return 'typeName';
    }
    // a guard predicate: @%p1 or @!%p1
    if (stream.match(/^@!?%[\w$]+/)) {
      return 'variableName.special';
    }
    // an instruction with its modifiers, e.g. ld.global.nc.f32, setp.lt.s32, bar.sync
    const instruction = stream.match(/^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*/);
    if (instruction) {
      const text = (instruction as RegExpMatchArray)[0];
      // what precedes it on the line, less any comment that ends there
      const before = stream.string.slice(0, stream.start).replace(/^.*\*\//, '');
      // an instruction opens a statement: first on the line, after a label or a guard
      if (/^\s*(?:[$\w]+:\s*)?(?:@!?%[\w$]+\s+)?$/.test(before) || text.includes('.')) {
        return 'keyword';
      }
      return null;
    }
    if (stream.match(/^[A-Z_][\w$]*/)) {
      return null;
    }
    return applyRules(stream, RULES);
  },
  languageData: {
    commentTokens: { line: '//', block: { open: '/*', close: '*/' } }
  }
};
