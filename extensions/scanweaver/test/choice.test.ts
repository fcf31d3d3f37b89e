import { describe, expect, it } from 'vitest';

import { chooseShown, LIVE_GRACE_MS, widgetModelId } from '../src/choice';

const WIDGET = 'application/vnd.jupyter.widget-view+json';

describe('the copy an explorer output shows', () => {
  const waiting = { possible: true, drawn: false, failed: false, waited: 0 };

  it('is the live widget once drawn, never the saved view as well', () => {
    expect(chooseShown({ ...waiting, drawn: true })).toBe('live');
    expect(chooseShown({ ...waiting, drawn: true, waited: 10 * LIVE_GRACE_MS })).toBe('live');
    // a view drawn after the manager first said no (it restored the model later)
    expect(chooseShown({ ...waiting, drawn: true, failed: true })).toBe('live');
  });

  it('waits a moment for the widget, then shows the saved view', () => {
    expect(chooseShown(waiting)).toBe('none');
    expect(chooseShown({ ...waiting, waited: LIVE_GRACE_MS - 1 })).toBe('none');
    expect(chooseShown({ ...waiting, waited: LIVE_GRACE_MS })).toBe('saved');
  });

  it('shows the saved view at once when the model is gone or cannot be', () => {
    expect(chooseShown({ ...waiting, failed: true })).toBe('saved');
    expect(chooseShown({ ...waiting, possible: false, drawn: true })).toBe('saved');
  });

  it('reads the widget model an output names', () => {
    expect(widgetModelId({ [WIDGET]: { model_id: 'abc', version_major: 2 } }, WIDGET)).toBe('abc');
    expect(widgetModelId({ [WIDGET]: { model_id: '' } }, WIDGET)).toBeNull();
    expect(widgetModelId({ 'text/plain': 'x' }, WIDGET)).toBeNull();
    expect(widgetModelId({ [WIDGET]: { model_id: 3 } }, WIDGET)).toBeNull();
  });
});
