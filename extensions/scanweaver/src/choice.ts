/**
 * Which copy of the explorer an output shows: the live widget or the saved view.
 *
 * The explorer's output holds both: the live widget (`application/vnd.jupyter.widget-view+json`,
 * a model in the kernel that displayed it) and the compile as saved output (this extension's
 * MIME type). While the widget's model lives, the widget alone shows; in a notebook opened again
 * (no kernel, or a new kernel that never ran the cell, so the model is gone) the saved view
 * shows instead of the widget manager's "Loading widget..." or "Error displaying widget".
 */

/** How long an output waits for its live widget before it shows the saved view. */
export const LIVE_GRACE_MS = 1000;

export type Shown = 'live' | 'saved' | 'none';

export interface LiveState {
  /** the output may show a live widget: it is trusted and names a widget model */
  possible: boolean;
  /** the widget's view is drawn */
  drawn: boolean;
  /** the widget manager answered without a view (no such model in this kernel) */
  failed: boolean;
  /** milliseconds the output has waited for the widget */
  waited: number;
}

/** The copy to show: the live widget once drawn, else the saved view (after a moment's grace
 * for the widget, so that a live output does not flash the saved one). */
export function chooseShown(state: LiveState): Shown {
  if (!state.possible) {
    return 'saved';
  }
  if (state.drawn) {
    return 'live';
  }
  if (state.failed || state.waited >= LIVE_GRACE_MS) {
    return 'saved';
  }
  return 'none';
}

/** The widget model an output's data names, if it names one. */
export function widgetModelId(data: Record<string, unknown>, mimeType: string): string | null {
  const view = data[mimeType] as { model_id?: unknown } | undefined;
  return view && typeof view.model_id === 'string' && view.model_id !== '' ? view.model_id : null;
}
