/**
 * A small rule-based tokenizer shared by the IR languages: at each position the first regular
 * expression that matches (anchored with `^`) gives the token and its highlighting tag.
 *
 * Tags are CodeMirror highlighting tag names (`keyword`, `typeName`, `variableName.special`,
 * ...), resolved by `StreamLanguage`; the same names become CSS classes in the output renderer
 * (see `highlight.ts`), so the editor and the renderer colour a token alike.
 */
import type { StringStream } from '@codemirror/language';

/** A rule: a pattern anchored at the current position, and the tag of what it matches. */
export type Rule = [RegExp, string | null];

/** Consume one token with the first matching rule; fall back to one character, untagged. */
export function applyRules(stream: StringStream, rules: readonly Rule[]): string | null {
  for (const [pattern, tag] of rules) {
    if (stream.match(pattern)) {
      return tag;
    }
  }
  stream.next();
  return null;
}

/** A word-set lookup built once: `words('a b c').has('b')`. */
export function words(list: string): ReadonlySet<string> {
  return new Set(list.split(/\s+/).filter(w => w.length > 0));
}
