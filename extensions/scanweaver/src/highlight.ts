/**
 * Static highlighting for the output renderer: runs a language's stream parser over a text and
 * returns its tokens line by line, or an element of `<span class="sw-t-...">` per token.
 *
 * Every line becomes its own element carrying `data-line` (1-based), so that a later source
 * location record can mark the lines that came from a term of the recurrence.
 */
import { StreamParser, StringStream } from '@codemirror/language';

/** One token: its text and its highlighting tag (null for plain text). */
export type Token = [text: string, tag: string | null];

/** Above this many characters a text is shown without colours (tokenizing would lag). */
export const MAX_HIGHLIGHT_CHARS = 1_500_000;

/** The tokens of every line of `text` under `parser`. */
export function tokenize(text: string, parser: StreamParser<any>): Token[][] {
  const state = parser.startState ? parser.startState(2) : null;
  const lines = text.split('\n');
  const out: Token[][] = [];
  for (const line of lines) {
    const tokens: Token[] = [];
    if (line.length === 0) {
      parser.blankLine?.(state, 2);
    }
    const stream = new StringStream(line, 4, 2);
    let guard = 0;
    while (!stream.eol() && guard++ < 10_000) {
      stream.start = stream.pos;
      const tag = parser.token(stream, state) ?? null;
      if (stream.pos === stream.start) {
        stream.next(); // a parser that consumed nothing must not stall us
      }
      const piece = line.slice(stream.start, stream.pos);
      const last = tokens[tokens.length - 1];
      if (last && last[1] === tag) {
        last[0] += piece; // merge neighbours of one kind: fewer elements
      } else {
        tokens.push([piece, tag]);
      }
    }
    if (!stream.eol()) {
      tokens.push([line.slice(stream.pos), null]);
    }
    out.push(tokens);
  }
  return out;
}

/** The CSS class of a tag: `variableName.special` -> `sw-t-variableName-special`. */
export function tagClass(tag: string): string {
  return 'sw-t-' + tag.replace(/[.\s]+/g, '-');
}

/**
 * A `<pre>` holding `text`, highlighted with `parser` when one is given and the text is not too
 * long. Each line is a `<span class="sw-line" data-line="N">` followed by a newline.
 */
export function renderCode(text: string, parser: StreamParser<any> | null): HTMLPreElement {
  const pre = document.createElement('pre');
  pre.className = 'sw-code';
  const lines: Token[][] =
    parser && text.length <= MAX_HIGHLIGHT_CHARS
      ? tokenize(text, parser)
      : text.split('\n').map(line => [[line, null] as Token]);
  const fragment = document.createDocumentFragment();
  lines.forEach((tokens, index) => {
    const line = document.createElement('span');
    line.className = 'sw-line';
    line.dataset.line = String(index + 1);
    for (const [piece, tag] of tokens) {
      if (tag) {
        const span = document.createElement('span');
        span.className = tagClass(tag);
        span.textContent = piece;
        line.appendChild(span);
      } else {
        line.appendChild(document.createTextNode(piece));
      }
    }
    fragment.appendChild(line);
    fragment.appendChild(document.createTextNode('\n'));
  });
  pre.appendChild(fragment);
  return pre;
}
