/**
 * Unified diffs of one pass, read straight from its recorded edits (no diff is recomputed).
 */
import type { Edit } from './bundle';

export interface DiffLine {
  /** ' ' context, '-' removed, '+' added, '@' hunk header */
  kind: ' ' | '-' | '+' | '@';
  text: string;
  /** the line's number (from 1) in the text after the pass, for context and added lines */
  newLine?: number;
}

/**
 * The unified diff (with `context` lines around each change) that takes `before` to the text
 * after `edits`. Empty when the edits change nothing.
 */
export function unifiedDiff(before: readonly string[], edits: readonly Edit[], context = 3): DiffLine[] {
  // changes as [start line in before, lines dropped, lines inserted, start line in after]
  const changes: { oldStart: number; drop: number; insert: string[]; newStart: number }[] = [];
  let position = 0;
  let shift = 0;
  for (const [keep, drop, insert] of edits) {
    position += keep;
    if (drop > 0 || insert.length > 0) {
      changes.push({ oldStart: position, drop, insert, newStart: position + shift });
    }
    position += drop;
    shift += insert.length - drop;
  }
  const out: DiffLine[] = [];
  let i = 0;
  while (i < changes.length) {
    // gather changes whose contexts touch into one hunk
    let j = i;
    while (
      j + 1 < changes.length &&
      changes[j + 1].oldStart - (changes[j].oldStart + changes[j].drop) <= 2 * context
    ) {
      j++;
    }
    const first = changes[i];
    const last = changes[j];
    const oldFrom = Math.max(0, first.oldStart - context);
    const oldTo = Math.min(before.length, last.oldStart + last.drop + context);
    const newFrom = oldFrom + (first.newStart - first.oldStart);
    let oldCount = 0;
    let newCount = 0;
    const body: DiffLine[] = [];
    let cursor = oldFrom;
    const next = () => newFrom + newCount + 1; // the after-text number of the next new line
    for (let k = i; k <= j; k++) {
      const change = changes[k];
      for (; cursor < change.oldStart; cursor++) {
        body.push({ kind: ' ', text: before[cursor], newLine: next() });
        oldCount++;
        newCount++;
      }
      for (let d = 0; d < change.drop; d++) {
        body.push({ kind: '-', text: before[cursor + d] });
        oldCount++;
      }
      cursor += change.drop;
      for (const line of change.insert) {
        body.push({ kind: '+', text: line, newLine: next() });
        newCount++;
      }
    }
    for (; cursor < oldTo; cursor++) {
      body.push({ kind: ' ', text: before[cursor], newLine: next() });
      oldCount++;
      newCount++;
    }
    out.push({
      kind: '@',
      text: `@@ -${oldFrom + 1},${oldCount} +${newFrom + 1},${newCount} @@`
    });
    out.push(...body);
    i = j + 1;
  }
  return out;
}

/** How many lines a diff adds and removes. */
export function diffStats(lines: readonly DiffLine[]): { added: number; removed: number } {
  let added = 0;
  let removed = 0;
  for (const line of lines) {
    if (line.kind === '+') {
      added++;
    } else if (line.kind === '-') {
      removed++;
    }
  }
  return { added, removed };
}
