/**
 * The four languages of the explorer, each described once: its name, MIME type, file
 * extensions and stream parser. The JupyterLab plugin registers them with the editor and the
 * document registry; the output renderer highlights with the same parsers.
 */
import {
  HighlightStyle,
  LanguageSupport,
  StreamLanguage,
  StreamParser,
  syntaxHighlighting
} from '@codemirror/language';
import { tags } from '@lezer/highlight';

import { llvm } from './llvm';
import { mlir } from './mlir';
import { ptx } from './ptx';
import { recurrence } from './recurrence';

export { llvm, mlir, ptx, recurrence };

/** One language as the editor, the file browser and the renderer know it. */
export interface LanguageSpec {
  /** the name JupyterLab's language registry knows it by (lower case) */
  name: string;
  displayName: string;
  mime: string;
  /** file extensions, without the dot */
  extensions: string[];
  parser: StreamParser<any>;
}

export const LANGUAGES: readonly LanguageSpec[] = [
  { name: 'mlir', displayName: 'MLIR', mime: 'text/x-mlir', extensions: ['mlir'], parser: mlir },
  {
    name: 'llvm',
    displayName: 'LLVM IR',
    mime: 'text/x-llvm-ir',
    extensions: ['ll'],
    parser: llvm
  },
  { name: 'ptx', displayName: 'PTX', mime: 'text/x-ptx', extensions: ['ptx'], parser: ptx },
  {
    name: 'recurrence',
    displayName: 'Recurrence',
    mime: 'text/x-scanweaver-recurrence',
    extensions: ['rec'],
    parser: recurrence
  }
];

/** The language spec called `name` (or whose extension is `name`), if any. */
export function findLanguage(name: string): LanguageSpec | undefined {
  const key = name.toLowerCase();
  return LANGUAGES.find(spec => spec.name === key || spec.extensions.includes(key));
}

/**
 * JupyterLab's editor theme colours most tags; these few that the IR languages lean on
 * (types, modifiers) it leaves plain, so they get colours here, scoped to our languages.
 */
function extraStyle(language: StreamLanguage<unknown>): HighlightStyle {
  return HighlightStyle.define(
    [
      { tag: tags.typeName, color: 'var(--jp-mirror-editor-variable-3-color, #085)' },
      { tag: tags.modifier, color: 'var(--jp-mirror-editor-attribute-color, #00c)' }
    ],
    { scope: language }
  );
}

/** CodeMirror 6 support (language and extra highlighting) for one spec. */
export function languageSupport(spec: LanguageSpec): LanguageSupport {
  const language = StreamLanguage.define(spec.parser);
  return new LanguageSupport(language, [syntaxHighlighting(extraStyle(language))]);
}
