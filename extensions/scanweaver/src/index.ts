/**
 * The JupyterLab plugin: MLIR, LLVM IR, PTX and recurrence files (`.mlir`, `.ll`, `.ptx`, `.rec`)
 * open highlighted in JupyterLab's editor. The output renderer is in `mime.ts`.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IEditorLanguageRegistry } from '@jupyterlab/codemirror';
import { textEditorIcon } from '@jupyterlab/ui-components';

import { LANGUAGES, languageSupport } from './languages';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'scanweaver-explorer:languages',
  description: 'Syntax highlighting for MLIR, LLVM IR, PTX and recurrence files.',
  autoStart: true,
  requires: [IEditorLanguageRegistry],
  activate: (app: JupyterFrontEnd, languages: IEditorLanguageRegistry) => {
    for (const spec of LANGUAGES) {
      languages.addLanguage({
        name: spec.name,
        displayName: spec.displayName,
        mime: spec.mime,
        extensions: spec.extensions,
        load: async () => languageSupport(spec)
      });
      app.docRegistry.addFileType({
        name: spec.name,
        displayName: spec.displayName,
        extensions: spec.extensions.map(e => '.' + e),
        mimeTypes: [spec.mime],
        fileFormat: 'text',
        contentType: 'file',
        icon: textEditorIcon
      });
    }
  }
};

export default plugin;
