/**
 * LLVM IR (`.ll`), as printed by `mlir-translate --mlir-to-llvmir` and `llc`: instructions,
 * local (`%`) and global (`@`) names, metadata (`!`), attribute groups (`#`), types, labels.
 */
import type { StreamParser } from '@codemirror/language';

import { applyRules, Rule, words } from './rules';

const INSTRUCTIONS = words(
  'ret br switch indirectbr invoke resume unreachable callbr fneg add fadd sub fsub mul fmul ' +
    'udiv sdiv fdiv urem srem frem shl lshr ashr and or xor extractelement insertelement ' +
    'shufflevector extractvalue insertvalue alloca load store fence cmpxchg atomicrmw ' +
    'getelementptr trunc zext sext fptrunc fpext fptoui fptosi uitofp sitofp ptrtoint inttoptr ' +
    'bitcast addrspacecast icmp fcmp phi select freeze call va_arg landingpad define declare ' +
    'target datalayout triple source_filename attributes global constant type'
);

const MODIFIERS = words(
  'private internal external linkonce linkonce_odr weak weak_odr common appending ' +
    'extern_weak available_externally dso_local dso_preemptable hidden protected default ' +
    'unnamed_addr local_unnamed_addr align inbounds nuw nsw exact volatile atomic tail musttail ' +
    'notail fast nnan ninf nsz arcp contract afn reassoc eq ne ugt uge ult ule sgt sge slt sle ' +
    'oeq ogt oge olt ole one ord ueq une uno to nounwind readnone readonly writeonly noalias ' +
    'nocapture nonnull noundef zeroinitializer undef poison null true false x'
);

const TYPES = /^(?:i\d+|half|bfloat|float|double|fp128|x86_fp80|ppc_fp128|ptr|void|label|metadata|token|opaque)\b/;

const RULES: readonly Rule[] = [
  [/^;.*/, 'comment'],
  [/^c?"(?:\\.|[^"\\])*"/, 'string'],
  [/^%(?:"(?:\\.|[^"\\])*"|[-\w$.]+)/, 'variableName.special'],
  [/^@(?:"(?:\\.|[^"\\])*"|[-\w$.]+)/, 'variableName.definition'],
  [/^!(?:[-\w$.]+|\d+)/, 'meta'],
  [/^#\d+/, 'meta'],
  [/^0x[0-9a-fA-FKLMHR][0-9a-fA-F]*/, 'number'],
  [/^[-+]?\d+\.\d*(?:[eE][-+]?\d+)?/, 'number'],
  [/^[-+]?\d+/, 'number'],
  [/^[=*]/, 'operator'],
  [/^[(){}[\]<>,]/, 'punctuation']
];

export const llvm: StreamParser<null> = {
  name: 'llvm',
  token(stream) {
    if (stream.eatSpace()) {
      return null;
    }
    // a basic-block label at the start of a line: `12:` or `.lr.ph:`
    if (stream.sol() && stream.match(/^[-\w$.]+:/)) {
      return 'labelName';
    }
    if (stream.match(TYPES)) {
      return 'typeName';
    }
    const word = stream.match(/^[A-Za-z_][\w.]*/);
    if (word) {
      const text = (word as RegExpMatchArray)[0];
      if (INSTRUCTIONS.has(text)) {
        return 'keyword';
      }
      return MODIFIERS.has(text) ? 'modifier' : null;
    }
    return applyRules(stream, RULES);
  },
  languageData: {
    commentTokens: { line: ';' }
  }
};
