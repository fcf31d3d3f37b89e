"""``python -m explorer.cli``: the ``scanweaver`` command."""

from explorer.cli import main

raise SystemExit(main())
