/**
 * The JupyterLab renderer for `application/vnd.scanweaver.compile+json`: one copy of the explorer
 * per output, live or saved.
 *
 * The explorer's output carries the live widget beside the saved compile. This renderer ranks
 * ahead of the widget manager's (see `mime.ts`), so it sees every such output, and shows:
 *
 * - the live widget, drawn by the notebook's own widget renderer (taken from the output area's
 *   render registry, so it is bound to the notebook's widget manager), while the widget's model
 *   lives in the kernel: never the saved view under it;
 * - the saved view ({@link CompileView}) when there is no such model: a notebook opened with no
 *   kernel, or with a new kernel that has not run the cell; untrusted outputs, too (they never
 *   run widget code).
 *
 * It looks again every {@link POLL_MS} ms: the widget manager binds to the notebook once its
 * kernel is up, and a live view goes away when its kernel restarts.
 */
import { Panel, Widget } from '@lumino/widgets';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { CompileBundle, MIME_TYPE, unpackBundle } from './bundle';
import { chooseShown, Shown, widgetModelId } from './choice';
import { CompileView, el } from './view';

export const WIDGET_MIME_TYPE = 'application/vnd.jupyter.widget-view+json';

/** How often an output looks for its live widget's state, in milliseconds. */
export const POLL_MS = 250;

/** The part of JupyterLab's render registry this renderer uses. */
interface RenderRegistry {
  getFactory(mimeType: string): unknown;
  createRenderer(mimeType: string): IRenderMime.IRenderer;
}

function isRegistry(value: unknown): value is RenderRegistry {
  const r = value as Partial<RenderRegistry> | null;
  return !!r && typeof r.getFactory === 'function' && typeof r.createRenderer === 'function';
}

export class CompileRenderer extends Panel implements IRenderMime.IRenderer {
  readonly mimeType: string;
  private model: IRenderMime.IMimeModel | null = null;
  private saved: Widget | null = null;
  private savedPending: Promise<void> | null = null;
  private live: IRenderMime.IRenderer | null = null;
  private liveFactory: unknown = null;
  private liveFailed = false;
  private liveStarted = 0;
  private shown: Shown = 'none';
  private timer = 0;

  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this.mimeType = options.mimeType;
    this.addClass('sw-compile-output');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this.model = model;
    this.dropLive();
    this.saved?.dispose();
    this.saved = null;
    this.savedPending = null;
    this.shown = 'none';
    this.liveStarted = Date.now();
    if (!this.livePossible()) {
      window.clearInterval(this.timer);
      this.timer = 0;
      this.showCopy('saved');
      await this.savedPending;
      return;
    }
    this.reconsider();
    if (!this.timer) {
      this.timer = window.setInterval(() => this.reconsider(), POLL_MS);
    }
  }

  dispose(): void {
    window.clearInterval(this.timer);
    this.timer = 0;
    super.dispose();
  }

  protected onAfterAttach(msg: Parameters<Widget['processMessage']>[0]): void {
    super.onAfterAttach(msg);
    this.reconsider(); // the output area is there now: its registry can be read
  }

  /** Trusted, and naming a widget model: only then may a live widget show. */
  private livePossible(): boolean {
    const model = this.model;
    return !!model && model.trusted && widgetModelId(model.data, WIDGET_MIME_TYPE) !== null;
  }

  /** The render registry of the output area holding this output (a notebook's own). */
  private registry(): RenderRegistry | null {
    for (let w: Widget | null = this.parent; w; w = w.parent) {
      const candidate = (w as unknown as { rendermime?: unknown }).rendermime;
      if (isRegistry(candidate)) {
        return candidate;
      }
    }
    return null;
  }

  private liveDrawn(): boolean {
    // the widget renderer writes its placeholders as text; a view is an element
    return !!this.live && !this.live.isDisposed && this.live.node.childElementCount > 0;
  }

  /** Look at the widget's state again, and show the copy it calls for. */
  private reconsider(): void {
    if (this.isDisposed || !this.model) {
      return;
    }
    if (!this.livePossible()) {
      // the widget's view was closed (its renderer clears the model id): the saved view stays
      this.showCopy('saved');
      return;
    }
    const registry = this.registry();
    const factory = registry?.getFactory(WIDGET_MIME_TYPE);
    if (registry && factory && factory !== this.liveFactory) {
      // the first look, or the notebook's widget manager has bound a renderer of its own
      this.startLive(registry, factory);
    }
    this.showCopy(
      chooseShown({
        possible: true,
        drawn: this.liveDrawn(),
        failed: this.liveFailed,
        waited: Date.now() - this.liveStarted
      })
    );
  }

  private startLive(registry: RenderRegistry, factory: unknown): void {
    this.dropLive();
    this.liveFactory = factory;
    this.liveFailed = false;
    const live = registry.createRenderer(WIDGET_MIME_TYPE);
    live.hide();
    this.addWidget(live);
    this.live = live;
    const answered = (failed: boolean) => {
      if (this.live === live) {
        this.liveFailed = failed && !this.liveDrawn();
        this.reconsider();
      }
    };
    live.renderModel(this.model!).then(
      () => answered(true),
      () => answered(true)
    );
  }

  private dropLive(): void {
    this.live?.dispose();
    this.live = null;
    this.liveFactory = null;
    this.liveFailed = false;
  }

  private showCopy(shown: Shown): void {
    if (shown === this.shown) {
      return;
    }
    this.shown = shown;
    this.live?.setHidden(shown !== 'live');
    if (shown === 'saved') {
      this.savedPending = this.showSaved();
    } else {
      this.saved?.hide();
    }
  }

  private async showSaved(): Promise<void> {
    if (!this.saved) {
      const holder = new Widget();
      holder.addClass('sw-saved-output');
      this.saved = holder;
      this.addWidget(holder);
      const bundle = this.model!.data[this.mimeType ?? MIME_TYPE] as unknown as CompileBundle;
      try {
        holder.node.appendChild(new CompileView(await unpackBundle(bundle)).node);
      } catch (err) {
        holder.node.appendChild(el('pre', 'sw-error', `Could not show this explorer output: ${String(err)}`));
      }
    }
    this.saved.setHidden(this.shown !== 'saved');
  }
}
