/**
 * The read-only view of a compile bundle: one tab per stage, the MLIR passes stepped one by one
 * (the IR after each, or its diff against the pass before), the pictures the compiler drew, the
 * PTX resources, and the timing plot. It needs no kernel, and no JupyterLab: everything comes
 * from the bundle, and the DOM is all it uses (the JupyterLab renderer in `renderer.ts` and the
 * HTML snapshot in `snapshot.ts` both show this view).
 *
 * Untrusted notebooks render it too: text goes in through `textContent`, and the SVG pictures
 * are shown as images (an SVG in an `<img>` runs no script).
 */
import { CompileBundle, DecodedBundle } from './bundle';
import { diffStats, unifiedDiff } from './diff';
import { renderCode } from './highlight';
import { findLanguage, recurrence as recurrenceParser } from './languages';
import { TermLinker } from './linker';
import { PTX } from './locations';
import { throughputPlot } from './plot';

const TITLES: Record<string, string> = {
  recurrence: 'Recurrence',
  affine: 'Affine',
  plan: 'Scan tree',
  llvm: 'LLVM IR',
  ptx: 'PTX'
};

const PTX_LABELS: [string, string][] = [
  ['registers', 'registers / thread'],
  ['spills_stores', 'spill stores'],
  ['spills_loads', 'spill loads'],
  ['shared_bytes', 'shared memory (bytes)'],
  ['stack_bytes', 'stack (bytes)'],
  ['barriers', 'barriers']
];

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export function formatSeconds(seconds: number | null | undefined): string {
  if (!seconds) {
    return '-';
  }
  if (seconds < 1e-3) {
    return `${(seconds * 1e6).toFixed(0)} µs`;
  }
  if (seconds < 1) {
    return `${(seconds * 1e3).toFixed(1)} ms`;
  }
  return `${seconds.toFixed(2)} s`;
}

function svgImage(svg: string, alt: string): HTMLImageElement {
  const img = el('img', 'sw-graph');
  img.alt = alt;
  img.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(svg);
  return img;
}

function parserFor(kind: string) {
  return findLanguage(kind)?.parser ?? null;
}

/** A tab: its title and a function that draws its panel the first time it is shown. */
interface Tab {
  title: string;
  draw: (panel: HTMLElement) => void;
}

/** The explorer's saved output as a DOM tree (also usable outside JupyterLab). */
export class CompileView {
  readonly node: HTMLElement;
  private readonly data: DecodedBundle;
  private readonly tabs: Tab[];
  private readonly buttons: HTMLButtonElement[] = [];
  private readonly panels: HTMLElement[] = [];
  private readonly drawn = new Set<number>();
  /** links the recurrence's terms to the IR and PTX lines they became */
  readonly linker: TermLinker;

  constructor(bundle: CompileBundle) {
    this.data = new DecodedBundle(bundle);
    this.linker = new TermLinker(bundle);
    this.node = el('div', 'sw-compile');
    this.tabs = this.makeTabs();
    this.node.appendChild(this.header());
    const bar = el('div', 'sw-tabbar');
    bar.setAttribute('role', 'tablist');
    const body = el('div', 'sw-panels');
    this.tabs.forEach((tab, index) => {
      const button = el('button', 'sw-tab', tab.title);
      button.type = 'button';
      button.setAttribute('role', 'tab');
      button.dataset.tab = tab.title;
      button.addEventListener('click', () => this.select(index));
      bar.appendChild(button);
      this.buttons.push(button);
      const panel = el('div', 'sw-panel');
      panel.dataset.tab = tab.title;
      panel.setAttribute('role', 'tabpanel');
      body.appendChild(panel);
      this.panels.push(panel);
    });
    this.node.appendChild(bar);
    this.node.appendChild(body);
    this.select(0);
  }

  /** Show tab `index` (drawing it the first time). */
  select(index: number): void {
    this.buttons.forEach((b, i) => b.classList.toggle('sw-active', i === index));
    this.panels.forEach((p, i) => (p.hidden = i !== index));
    if (!this.drawn.has(index)) {
      this.drawn.add(index);
      this.tabs[index].draw(this.panels[index]);
    }
    this.linker.shown();
  }

  private header(): HTMLElement {
    const b = this.data.bundle;
    const head = el('div', 'sw-header');
    head.appendChild(el('div', 'sw-title', 'ScanWeaver Explorer'));
    head.appendChild(this.linker.renderRecurrence(b.recurrence, recurrenceParser));
    head.appendChild(this.linker.bar);
    const options = Object.entries(b.options ?? {})
      .filter(([key]) => !['strategy', 'target'].includes(key))
      .map(([key, value]) => `${key} ${String(value)}`)
      .join(', ');
    const facts = [
      `strategy ${b.strategy}`,
      `target ${b.target}`,
      options,
      `${b.stages.length} stages, ${b.passes.length} MLIR passes`
    ].filter(Boolean);
    head.appendChild(el('div', 'sw-facts', facts.join(' · ')));
    return head;
  }

  private makeTabs(): Tab[] {
    const b = this.data.bundle;
    const tabs: Tab[] = [];
    let passTabAdded = false;
    for (const stage of b.stages) {
      const isPassStage = stage.pass !== undefined || stage.name === b.pass_input;
      if (isPassStage && b.passes.length > 0) {
        if (!passTabAdded) {
          passTabAdded = true;
          tabs.push({ title: 'MLIR', draw: panel => new PassStepper(this.data, panel, this.linker) });
        }
        continue;
      }
      tabs.push({
        title: TITLES[stage.name] ?? stage.name,
        draw: panel => this.drawStage(stage.name, panel)
      });
    }
    tabs.push({ title: 'Timing', draw: panel => this.drawTiming(panel) });
    return tabs;
  }

  private drawStage(name: string, panel: HTMLElement): void {
    const record = this.data.stage(name);
    const text = this.data.stageText(name) ?? '';
    if (!record) {
      return;
    }
    const lines = text.length ? text.split('\n').length : 0;
    panel.appendChild(
      el('div', 'sw-info', `${TITLES[name] ?? name}: ${lines} lines, stage time ${formatSeconds(record.seconds)}`)
    );
    if (name === 'ptx') {
      panel.appendChild(this.ptxInfo());
    }
    const graph = this.data.bundle.graphs?.[name];
    if (graph) {
      const caption = name === 'plan' ? 'Scan tree' : name === 'recurrence' ? 'Dependence graph' : name;
      panel.appendChild(el('div', 'sw-caption', caption));
      panel.appendChild(svgImage(graph, caption));
    }
    const code = renderCode(text, parserFor(record.kind));
    panel.appendChild(code);
    if (name === 'ptx') {
      this.linker.attach(PTX, code, PTX);
    }
  }

  private ptxInfo(): HTMLElement {
    const info = this.data.bundle.ptx_info;
    const box = el('div', 'sw-ptx-info');
    if (!info || 'unavailable' in info) {
      const why = info ? ` (${String(info.unavailable)})` : '';
      box.textContent =
        `No ptxas report where this was compiled${why}: ` +
        'register, spill and shared-memory counts are unknown.';
      return box;
    }
    const chip = String(this.data.bundle.options?.chip ?? '');
    const kernel = info.kernel ? `, kernel ${String(info.kernel)}` : '';
    box.appendChild(el('span', 'sw-ptx-title', `ptxas ${chip}${kernel}: `));
    for (const [key, label] of PTX_LABELS) {
      if (key in info) {
        const value = info[key];
        const badge = el('span', 'sw-badge', `${label}: ${String(value)}`);
        if (key.startsWith('spills') && value !== 0 && value !== '0') {
          badge.classList.add('sw-alarm');
        }
        box.appendChild(badge);
      }
    }
    if (info.other_kernels) {
      box.appendChild(el('div', 'sw-info', `other kernels: ${String(info.other_kernels)}`));
    }
    return box;
  }

  private drawTiming(panel: HTMLElement): void {
    const measurements = this.data.bundle.measurements ?? [];
    const svg = throughputPlot(measurements);
    if (!svg) {
      panel.appendChild(
        el('div', 'sw-info', 'No measurements were saved with this compile (run a sweep, then save).')
      );
    } else {
      const devices = [...new Set(measurements.map(m => m.device))].join(', ');
      const channels = [...new Set(measurements.map(m => m.channels))].join(', ');
      panel.appendChild(
        el('div', 'sw-info', `${measurements.length} measurements on ${devices}, ${channels} channels`)
      );
      panel.appendChild(svgImage(svg, 'throughput against L'));
    }
    // the pass times, as recorded
    const table = el('table', 'sw-pass-times');
    const head = table.createTHead().insertRow();
    for (const title of ['#', 'pass', 'time', 'changed']) {
      head.appendChild(el('th', undefined, title));
    }
    const body = table.createTBody();
    this.data.bundle.passes.forEach((p, i) => {
      const row = body.insertRow();
      row.insertCell().textContent = String(i + 1);
      row.insertCell().textContent = p.name;
      row.insertCell().textContent = formatSeconds(p.seconds);
      row.insertCell().textContent = p.changed ? 'yes' : 'no';
    });
    panel.appendChild(el('div', 'sw-caption', 'Compile time of every MLIR pass'));
    panel.appendChild(table);
  }
}

/** Prev/next through the pass list, showing the IR after a pass or its diff. */
export class PassStepper {
  private readonly data: DecodedBundle;
  private readonly select: HTMLSelectElement;
  private readonly info: HTMLElement;
  private readonly code: HTMLElement;
  private readonly prev: HTMLButtonElement;
  private readonly next: HTMLButtonElement;
  private readonly modeButtons: HTMLButtonElement[] = [];
  private readonly links: HTMLElement;
  private readonly linker: TermLinker | null;
  /** -1: the IR before the first pass; i: the IR after pass i */
  index = -1;
  mode: 'ir' | 'diff' = 'ir';

  constructor(data: DecodedBundle, panel: HTMLElement, linker: TermLinker | null = null) {
    this.data = data;
    this.linker = linker;
    const controls = el('div', 'sw-pass-controls');
    this.prev = el('button', 'sw-pass-prev', '◀ prev');
    this.next = el('button', 'sw-pass-next', 'next ▶');
    this.select = el('select', 'sw-pass-select');
    const input = data.bundle.pass_input ?? 'input';
    this.select.appendChild(new Option(`0. ${input} (before the passes)`, '-1'));
    data.bundle.passes.forEach((p, i) => {
      const mark = p.changed ? '' : ', unchanged';
      this.select.appendChild(new Option(`${i + 1}. ${p.name} (${formatSeconds(p.seconds)}${mark})`, String(i)));
    });
    this.prev.type = this.next.type = 'button';
    this.prev.addEventListener('click', () => this.show(this.index - 1));
    this.next.addEventListener('click', () => this.show(this.index + 1));
    this.select.addEventListener('change', () => this.show(Number(this.select.value)));
    controls.append(this.prev, this.select, this.next);
    const modes = el('span', 'sw-modes');
    for (const [mode, label] of [
      ['ir', 'IR after pass'],
      ['diff', 'diff vs. pass before']
    ] as const) {
      const button = el('button', 'sw-mode', label);
      button.type = 'button';
      button.dataset.mode = mode;
      button.addEventListener('click', () => {
        this.mode = mode;
        this.show(this.index);
      });
      modes.appendChild(button);
      this.modeButtons.push(button);
    }
    controls.appendChild(modes);
    this.info = el('div', 'sw-pass-info');
    this.links = el('div', 'sw-pass-links');
    this.code = el('div', 'sw-pass-code');
    panel.append(controls, this.info, this.links, this.code);
    this.show(-1);
  }

  show(index: number): void {
    const passes = this.data.bundle.passes;
    this.index = Math.max(-1, Math.min(passes.length - 1, index));
    this.select.value = String(this.index);
    this.prev.disabled = this.index <= -1;
    this.next.disabled = this.index >= passes.length - 1;
    this.modeButtons.forEach(b => b.classList.toggle('sw-active', b.dataset.mode === this.mode));
    this.code.replaceChildren();
    const mlir = findLanguage('mlir')!.parser;
    const name = this.index === -1 ? null : passes[this.index].name;
    this.showLinks(name);
    if (this.index === -1) {
      const text = this.data.irAfter(-1) ?? '';
      this.info.textContent = `the IR the passes start from (${text.split('\n').length} lines); step with next ▶`;
      this.showCode(renderCode(text, mlir), name);
      return;
    }
    const record = passes[this.index];
    const after = this.data.irAfter(this.index);
    const before = this.data.linesBefore(this.index);
    const base = record.base ?? this.index - 1;
    if (after === null || !record.edits || before === null) {
      const size = record.omitted ? ` (${record.omitted.lines} lines)` : '';
      this.info.textContent =
        `pass ${this.index + 1} of ${passes.length}: ${record.name}, ${formatSeconds(record.seconds)}; ` +
        `the IR after it${size} was not saved, to keep the notebook small (Explorer.snapshot(path) ` +
        'keeps every pass)';
      this.showCode(el('pre', 'sw-code sw-omitted'), name);
      return;
    }
    const diff = unifiedDiff(before, record.edits);
    const { added, removed } = diffStats(diff);
    const against = base === this.index - 1 ? '' : ` (against pass ${base + 1}: the IR between was not saved)`;
    const change = record.changed ? `+${added} −${removed} lines${against}` : 'changed nothing';
    this.info.textContent =
      `pass ${this.index + 1} of ${passes.length}: ${record.name}, ${formatSeconds(record.seconds)}, ` +
      `${change}; ${after.split('\n').length} lines after it`;
    if (record.pipeline) {
      this.info.title = record.pipeline;
    }
    if (this.mode === 'ir') {
      this.showCode(renderCode(after, mlir), name);
      return;
    }
    if (diff.length === 0) {
      this.code.appendChild(el('div', 'sw-info', 'This pass left the IR as it was.'));
      this.linker?.setPass(name);
      this.linker?.attach('mlir', el('pre'), null);
      return;
    }
    const pre = el('pre', 'sw-code sw-diff');
    for (const line of diff) {
      const kind = { ' ': 'sw-diff-ctx', '-': 'sw-diff-del', '+': 'sw-diff-add', '@': 'sw-diff-hunk' }[line.kind];
      const span = el('span', kind, (line.kind === '@' ? '' : line.kind) + line.text);
      if (line.newLine !== undefined) {
        // the line's number after the pass: the term links mark it as in the IR view
        span.classList.add('sw-line');
        span.dataset.line = String(line.newLine);
      }
      pre.append(span, '\n');
    }
    this.showCode(pre, name);
  }

  private showCode(pre: HTMLElement, pass: string | null): void {
    this.code.appendChild(pre);
    this.linker?.setPass(pass);
    this.linker?.attach('mlir', pre, pass);
  }

  /** Whether this pass recorded where its ops came from, and the passes that did. */
  private showLinks(pass: string | null): void {
    this.links.replaceChildren();
    const linker = this.linker;
    if (!linker) {
      return;
    }
    if (!linker.enabled) {
      this.links.textContent = 'no locations recorded for this compile';
      return;
    }
    if (pass !== null && linker.map.has(pass)) {
      this.links.classList.remove('sw-no-links');
      this.links.textContent =
        'locations recorded for this pass: a term of the recurrence marks its ops, a click on a line names its term';
      return;
    }
    this.links.classList.add('sw-no-links');
    this.links.append(
      pass === null
        ? 'no locations recorded for the IR before the passes; passes with locations: '
        : 'no locations recorded for this pass; passes with locations: '
    );
    this.data.bundle.passes.forEach((p, i) => {
      if (linker.map.has(p.name)) {
        const jump = el('button', 'sw-pass-jump', p.name);
        jump.type = 'button';
        jump.addEventListener('click', () => this.show(i));
        this.links.append(jump, ' ');
      }
    });
  }
}
