/**
 * The recurrence language (`.rec`): Python-like statements such as
 * `h[t] = a[t] * h[t-1] + b[t]`, separated by new lines or `;`, `#` comments.
 * The name a statement defines is tagged as a definition, the time and state axes (`t`, `n`)
 * as atoms, the functions of the language as standard names.
 */
import type { StreamParser } from '@codemirror/language';

import { words } from './rules';

export interface RecurrenceState {
  /** true until the statement's defined name has been read */
  atStatementStart: boolean;
}

const FUNCTIONS = words('exp log sigmoid softplus tanh sqrt abs max min sum');
const AXES = words('t n');

export const recurrence: StreamParser<RecurrenceState> = {
  name: 'recurrence',
  startState: () => ({ atStatementStart: true }),
  copyState: state => ({ ...state }),
  token(stream, state) {
    if (stream.sol()) {
      state.atStatementStart = true;
    }
    if (stream.eatSpace()) {
      return null;
    }
    if (stream.match(/^#.*/)) {
      return 'comment';
    }
    if (stream.eat(';')) {
      state.atStatementStart = true;
      return 'punctuation';
    }
    if (stream.match(/^(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?/)) {
      return 'number';
    }
    const word = stream.match(/^[A-Za-z_]\w*/);
    if (word) {
      const text = (word as RegExpMatchArray)[0];
      if (state.atStatementStart) {
        state.atStatementStart = false;
        return 'variableName.definition';
      }
      if (FUNCTIONS.has(text) && stream.match(/^\s*\(/, false)) {
        return 'variableName.standard';
      }
      if (AXES.has(text)) {
        return 'atom';
      }
      return 'variableName';
    }
    if (stream.match(/^(?:\*\*|[-+*/=])/)) {
      state.atStatementStart = false;
      return 'operator';
    }
    if (stream.match(/^[()[\],]/)) {
      return 'punctuation';
    }
    stream.next();
    return null;
  },
  languageData: {
    commentTokens: { line: '#' }
  }
};
