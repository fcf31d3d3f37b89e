/**
 * The HTML snapshot's script: `explorer.widget.bundle.snapshot` writes one self-contained file
 * holding the compile record (`<script type="application/json" id="sw-record">`), the same
 * record as script-free HTML (`<noscript id="sw-static">`), and this script, bundled with its
 * styles (esbuild, `npm run build:snapshot`). It draws the record with the view the JupyterLab
 * extension draws saved outputs with ({@link CompileView}: tabs, pass stepping with diffs, the
 * pictures, the timing plot), opened from disk with no server and no network. Should anything
 * fail, the script-free HTML is shown instead, with the reason.
 */
import { CompileBundle, unpackBundle } from './bundle';
import { CompileView, el } from './view';

import styles from '../style/base.css';

const PAGE_STYLES = `
body { margin: 16px 24px; background: #fff; }
.sw-snapshot-note { color: #666; font: 12px sans-serif; margin: 12px 0 0; }
`;

function addStyles(): void {
  const style = document.createElement('style');
  style.textContent = styles + PAGE_STYLES;
  document.head.appendChild(style);
}

/** The script-free report the page also carries, shown in place of the view. */
function showStatic(root: HTMLElement, why: string): void {
  const fallback = document.getElementById('sw-static');
  root.replaceChildren(el('pre', 'sw-error', `The interactive view could not be drawn (${why}); the page shows its static copy.`));
  if (fallback) {
    const holder = document.createElement('div');
    holder.innerHTML = fallback.textContent ?? '';
    root.appendChild(holder);
  }
}

async function main(): Promise<void> {
  const root = document.getElementById('sw-snapshot');
  const source = document.getElementById('sw-record');
  if (!root || !source) {
    return;
  }
  addStyles();
  try {
    const bundle = JSON.parse(source.textContent ?? '') as CompileBundle;
    const view = new CompileView(await unpackBundle(bundle));
    root.replaceChildren(view.node);
    root.appendChild(
      el('div', 'sw-snapshot-note', `Written by ScanWeaver Explorer ${String(bundle.explorer_version ?? '')}.`)
    );
    root.dataset.ready = 'true';
  } catch (err) {
    showStatic(root, String(err));
    root.dataset.ready = 'static';
  }
}

void main();
