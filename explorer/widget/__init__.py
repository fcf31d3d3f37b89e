"""The notebook UI: :class:`Explorer`, one widget that shows every stage of a compilation."""

from explorer.widget.app import Explorer

__all__ = ["Explorer"]
