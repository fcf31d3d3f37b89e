/**
 * Click-to-highlight in the saved output: the recurrence drawn with each located term as an
 * element one can hover, click or focus; the term marks the lines it became in the IR of the
 * pass shown and in the PTX, and a click on such a line names the term it came from.
 *
 * The mapping itself (which lines, which term, the sentences) is `src/locations.ts`; this file
 * only draws it and keeps what is marked in step with what is shown.
 */
import type { StreamParser } from '@codemirror/language';

import type { CompileBundle } from './bundle';
import { tagClass, tokenize, Token } from './highlight';
import {
  describeLine,
  describeTerm,
  findTerms,
  LocationMap,
  segmentLine,
  Term
} from './locations';

const HINT =
  'Hover or click a term of the recurrence to mark the ops and PTX lines it became; ' +
  'click a line of the IR or the PTX to see its term.';

/** A drawn code block whose lines are linked to `code` (a pass name or `ptx`; null: none). */
interface LinkedView {
  code: string | null;
  pre: HTMLElement;
  lines: Map<number, HTMLElement>;
  marked: HTMLElement[];
  /** which of the marked lines the step buttons reached (-1: none yet) */
  cursor: number;
}

function appendTokens(parent: HTMLElement, tokens: readonly Token[]): void {
  for (const [piece, tag] of tokens) {
    if (tag) {
      const span = document.createElement('span');
      span.className = tagClass(tag);
      span.textContent = piece;
      parent.appendChild(span);
    } else {
      parent.appendChild(document.createTextNode(piece));
    }
  }
}

export class TermLinker {
  readonly map: LocationMap;
  readonly terms: Term[];
  /** the line under the recurrence: `info` and the buttons that step through marked lines */
  readonly bar: HTMLElement;
  /** the sentence: what the marked term became, or where a line came from */
  readonly info: HTMLElement;
  private readonly steps: HTMLElement;
  private readonly stepCount: HTMLElement;
  private pinned: Term | null = null;
  private hovered: Term | null = null;
  /** the pass whose IR the MLIR tab shows (null: the IR before the passes, or none) */
  private pass: string | null = null;
  private readonly views = new Map<string, LinkedView>();
  private readonly termNodes = new Map<string, HTMLElement>();
  /** the line last clicked and what it said */
  private picked: { slot: string; line: number; text: string } | null = null;

  constructor(bundle: CompileBundle) {
    this.map = new LocationMap(bundle.locations);
    this.terms = findTerms(bundle.recurrence, bundle.locations, bundle.terms);
    this.bar = document.createElement('div');
    this.bar.className = 'sw-link-bar';
    this.info = document.createElement('span');
    this.info.className = 'sw-link-info';
    this.info.setAttribute('aria-live', 'polite');
    this.steps = document.createElement('span');
    this.steps.className = 'sw-link-steps';
    this.stepCount = document.createElement('span');
    this.stepCount.className = 'sw-link-count';
    for (const [label, delta, title] of [
      ['▲', -1, 'the marked line before'],
      ['▼', 1, 'the next marked line']
    ] as const) {
      const button = document.createElement('button');
      button.type = 'button';
      button.className = delta < 0 ? 'sw-link-prev' : 'sw-link-next';
      button.textContent = label;
      button.title = title + ' in the code shown';
      button.addEventListener('click', () => this.step(delta));
      this.steps.appendChild(button);
    }
    this.steps.appendChild(this.stepCount);
    this.bar.append(this.info, this.steps);
    this.refresh();
  }

  /** Whether the bundle links any term to any line. */
  get enabled(): boolean {
    return this.terms.length > 0 && !this.map.empty;
  }

  /** The term marked now: the one under the pointer, else the one clicked. */
  get active(): Term | null {
    return this.hovered ?? this.pinned;
  }

  /** The recurrence, highlighted, with every located term an element of its own. */
  renderRecurrence(text: string, parser: StreamParser<any> | null): HTMLPreElement {
    const pre = document.createElement('pre');
    pre.className = 'sw-code sw-recurrence-code';
    const lines: Token[][] = parser ? tokenize(text, parser) : text.split('\n').map(l => [[l, null]]);
    lines.forEach((tokens, index) => {
      const line = document.createElement('span');
      line.className = 'sw-line';
      line.dataset.line = String(index + 1);
      const here = this.terms.filter(t => t.line === index + 1);
      const statements = here.filter(t => t.kind === 'statement');
      const names = here.filter(t => t.kind === 'name');
      let column = 0;
      for (const outer of segmentLine(tokens, statements)) {
        const holder = outer.term ? this.termNode(outer.term, 'sw-term-statement') : line;
        for (const inner of segmentLine(outer.tokens, names, column)) {
          appendTokens(inner.term ? holder.appendChild(this.termNode(inner.term, 'sw-term-name')) : holder, inner.tokens);
        }
        column += outer.tokens.reduce((n, [piece]) => n + piece.length, 0);
        if (holder !== line) {
          line.appendChild(holder);
        }
      }
      pre.append(line, '\n');
    });
    if (this.enabled) {
      pre.addEventListener('mouseover', event => this.hover(this.termOf(event.target)));
      pre.addEventListener('mouseleave', () => this.hover(null));
      pre.addEventListener('click', event => {
        const term = this.termOf(event.target);
        if (term) {
          this.pin(this.pinned?.key === term.key ? null : term, true);
        }
      });
      pre.addEventListener('keydown', event => {
        const term = this.termOf(event.target);
        if (term && (event.key === 'Enter' || event.key === ' ')) {
          event.preventDefault();
          this.pin(this.pinned?.key === term.key ? null : term, true);
        }
      });
      pre.addEventListener('focusin', event => this.hover(this.termOf(event.target)));
      pre.addEventListener('focusout', () => this.hover(null));
    }
    return pre;
  }

  /** Link the code block `pre` (its `.sw-line` elements) to `code`; replaces the block that
   * was in `slot` before (the MLIR tab draws a new block for every pass). */
  attach(slot: string, pre: HTMLElement, code: string | null): void {
    const lines = new Map<number, HTMLElement>();
    pre.querySelectorAll<HTMLElement>('.sw-line[data-line]').forEach(node => {
      lines.set(Number(node.dataset.line), node);
    });
    const view: LinkedView = { code, pre, lines, marked: [], cursor: -1 };
    this.views.set(slot, view);
    if (this.picked?.slot === slot) {
      this.picked = null;
    }
    if (!this.enabled) {
      return;
    }
    if (code !== null && this.map.has(code)) {
      pre.classList.add('sw-linkable');
    }
    pre.addEventListener('click', event => {
      const node = (event.target as Element | null)?.closest?.('.sw-line[data-line]') as HTMLElement | null;
      if (!node || this.views.get(slot) !== view || code === null) {
        return;
      }
      const line = Number(node.dataset.line);
      const { text, term } = describeLine(code, line, this.terms, this.map);
      this.picked = { slot, line, text };
      this.pin(term, false);
    });
    this.mark(view);
    if (this.pinned && !this.picked) {
      this.scrollTo(view, 0); // a block drawn while a term is chosen opens at its first line
    }
    this.refreshSteps();
  }

  /** Another tab is shown: the step buttons now step through its code. */
  shown(): void {
    this.refreshSteps();
  }

  /** The MLIR tab now shows the IR after pass `name` (null: before the passes). */
  setPass(name: string | null): void {
    this.pass = name;
    this.refresh();
  }

  private termNode(key: string, className: string): HTMLElement {
    const node = document.createElement('span');
    node.className = `sw-term ${className}`;
    node.dataset.term = key;
    node.tabIndex = 0;
    const term = this.terms.find(t => t.key === key);
    if (term) {
      node.title = describeTerm(term, null, this.map);
    }
    this.termNodes.set(key, node);
    return node;
  }

  private termOf(target: EventTarget | null): Term | null {
    const node = (target as Element | null)?.closest?.('[data-term]') as HTMLElement | null;
    const key = node?.dataset.term;
    return key ? this.terms.find(t => t.key === key) ?? null : null;
  }

  private hover(term: Term | null): void {
    if (term?.key !== this.hovered?.key) {
      this.hovered = term;
      this.refresh();
    }
  }

  /** Mark `term` until another is chosen; `fromTerm`: chosen in the recurrence (not a line). */
  private pin(term: Term | null, fromTerm: boolean): void {
    this.pinned = term;
    if (fromTerm) {
      this.picked = null;
      this.hovered = term; // the pointer is on it
    }
    this.refresh();
    if (fromTerm && term) {
      this.scrollToMarked();
    }
  }

  private mark(view: LinkedView): void {
    for (const node of view.marked) {
      node.classList.remove('sw-linked', 'sw-line-picked', 'sw-line-current');
    }
    view.marked = [];
    view.cursor = -1;
    const term = this.active;
    if (term && view.code !== null && this.map.has(view.code)) {
      for (const line of this.map.lines(term.key, view.code)) {
        const node = view.lines.get(line);
        if (node) {
          node.classList.add('sw-linked');
          view.marked.push(node);
        }
      }
    }
    const slot = [...this.views.entries()].find(([, v]) => v === view)?.[0];
    if (this.picked && this.picked.slot === slot) {
      const node = view.lines.get(this.picked.line);
      if (node) {
        node.classList.add('sw-line-picked');
        view.marked.push(node);
      }
    }
  }

  private refresh(): void {
    const active = this.active;
    for (const [key, node] of this.termNodes) {
      node.classList.toggle('sw-term-active', active?.key === key);
      node.classList.toggle('sw-term-pinned', this.pinned?.key === key);
    }
    for (const view of this.views.values()) {
      this.mark(view);
    }
    this.refreshSteps();
    if (!this.enabled) {
      this.info.textContent = 'No locations recorded for this compile: terms are not linked to lines.';
      return;
    }
    if (active) {
      const what = describeTerm(active, this.pass, this.map);
      this.info.textContent = this.picked && !this.hovered ? `${this.picked.text}. ${what}` : what;
    } else {
      this.info.textContent = this.picked ? this.picked.text : HINT;
    }
  }

  /** Bring the first marked line of every visible code block into its view. */
  private scrollToMarked(): void {
    for (const view of this.views.values()) {
      this.scrollTo(view, 0);
    }
  }

  /** The marked lines of `view` (not the line clicked, unless it is one). */
  private linkedLines(view: LinkedView): HTMLElement[] {
    return view.marked.filter(node => node.classList.contains('sw-linked'));
  }

  /** Scroll `view`'s block to its marked line number `index`, if the block is shown. */
  private scrollTo(view: LinkedView, index: number): boolean {
    const linked = this.linkedLines(view);
    const node = linked[index];
    if (!node || view.pre.offsetParent === null) {
      return false;
    }
    const top = node.getBoundingClientRect().top - view.pre.getBoundingClientRect().top;
    view.pre.scrollTop += top - view.pre.clientHeight / 3;
    return true;
  }

  /** Go to the next (`delta` 1) or previous (-1) marked line of the code shown. */
  private step(delta: number): void {
    for (const view of this.views.values()) {
      const linked = this.linkedLines(view);
      if (!linked.length || view.pre.offsetParent === null) {
        continue;
      }
      linked[view.cursor]?.classList.remove('sw-line-current');
      view.cursor = view.cursor < 0 && delta < 0 ? linked.length - 1 : (view.cursor + delta + linked.length) % linked.length;
      linked[view.cursor].classList.add('sw-line-current');
      this.scrollTo(view, view.cursor);
    }
    this.refreshSteps();
  }

  private refreshSteps(): void {
    const shown = [...this.views.values()].filter(v => v.pre.offsetParent !== null && this.linkedLines(v).length);
    this.steps.hidden = shown.length === 0;
    this.stepCount.textContent = shown
      .map(v => `${v.cursor < 0 ? '–' : v.cursor + 1}/${this.linkedLines(v).length}`)
      .join(' ');
  }
}
