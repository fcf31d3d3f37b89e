/**
 * MLIR textual IR, as printed by `mlir-opt` and the Python bindings (generic and custom forms):
 * SSA values, block labels, symbols, attribute and type aliases, dialect types, operation names.
 */
import type { StreamParser } from '@codemirror/language';

import { applyRules, Rule, words } from './rules';

const BUILTIN_TYPES =
  /^(?:[su]?i\d+|f16|bf16|f32|f64|f80|f128|tf32|f8E\w+|index|none|memref|tensor|vector|complex|tuple)\b/;

const KEYWORDS = words(
  'func module return to step iter_args ins outs dense affine_map affine_set loc unknown ' +
    'attributes unit kernel blocks threads in args dynamic_shared_memory_size ' +
    'workgroup private offset strides'
);

const RULES: readonly Rule[] = [
  [/^\/\/.*/, 'comment'],
  [/^"(?:\\.|[^"\\])*"/, 'string'],
  // %arg0, %0, %c1_i32, %0#1
  [/^%[\w$.-]+(?:#\d+)?/, 'variableName.special'],
  // ^bb0
  [/^\^[\w$.-]+/, 'labelName'],
  // @symbol, @"quoted symbol"
  [/^@(?:"(?:\\.|[^"\\])*"|[\w$.-]+)/, 'variableName.definition'],
  // #map, #gpu.address_space<workgroup>, #nvvm.target<...>
  [/^#[\w$.-]+/, 'meta'],
  // !llvm.ptr, !gpu.async.token, !alias
  [/^![\w$.-]+/, 'typeName'],
  [/^0x[0-9a-fA-F]+/, 'number'],
  [/^[-+]?\d+\.\d*(?:[eE][-+]?\d+)?/, 'number'],
  [/^[-+]?\d+/, 'number'],
  [/^->/, 'operator'],
  [/^[=:*+\-?]/, 'operator'],
  [/^[(){}[\]<>,]/, 'punctuation']
];

export const mlir: StreamParser<null> = {
  name: 'mlir',
  token(stream) {
    if (stream.eatSpace()) {
      return null;
    }
    // the x of a shape, as in memref<4x?xf32> or vector<4xf32>
    const previous = stream.pos > 0 ? stream.string[stream.pos - 1] : '';
    if (/[\d?]/.test(previous) && stream.eat('x')) {
      return 'punctuation';
    }
    // an operation in generic form: "scan.recurrence"() {...}
    if (stream.match(/^"[a-z_]\w*(?:\.\w+)+"(?=\s*\()/)) {
      return 'keyword';
    }
    // dialect.op, as in arith.addf, gpu.launch_func, memref.load
    if (stream.match(/^[a-z_]\w*(?:\.\w+)+/)) {
      return 'keyword';
    }
    if (stream.match(BUILTIN_TYPES)) {
      return 'typeName';
    }
    const word = stream.match(/^[A-Za-z_][\w$]*/);
    if (word) {
      const text = (word as RegExpMatchArray)[0];
      if (text === 'true' || text === 'false') {
        return 'bool';
      }
      return KEYWORDS.has(text) ? 'modifier' : null;
    }
    return applyRules(stream, RULES);
  },
  languageData: {
    commentTokens: { line: '//' }
  }
};
