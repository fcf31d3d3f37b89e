/**
 * The mime renderer extension: saved explorer output (`application/vnd.scanweaver.compile+json`)
 * is drawn by {@link CompileRenderer}, in a notebook with or without a kernel; where the output
 * also holds the live widget, the renderer shows that widget while its model lives.
 */
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { MIME_TYPE } from './bundle';
import { CompileRenderer } from './renderer';

export const rendererFactory: IRenderMime.IRendererFactory = {
  // safe: the renderer inserts no markup from the bundle (text as text, SVG as images)
  safe: true,
  mimeTypes: [MIME_TYPE],
  createRenderer: options => new CompileRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'scanweaver-explorer:compile-renderer',
  description: 'Renders saved ScanWeaver Explorer output without a kernel.',
  rendererFactory,
  // ahead of the widget manager's renderer (rank -10), so that an output holding both the live
  // widget and the saved compile comes here (the renderer shows one of them), and ahead of
  // text/html (rank 50), which stays in the bundle for viewers without the extension
  rank: -20,
  dataType: 'json'
};

export default extension;
