"""The base of the stage views: a panel that draws one compilation's record once.

Every tab of the explorer is a :class:`View` (:mod:`explorer.widget.views`,
:mod:`explorer.widget.tree_view`, :mod:`explorer.widget.mlir_view`): it has a ``widget`` and a
``show(compiled)`` that draws only when the compilation changed.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import ipywidgets as widgets

if TYPE_CHECKING:
    from explorer.compiler import Compiled, Stage


def _message(text: str, color: str = "#666") -> str:
    return f'<div style="color:{color};padding:4px 0">{html.escape(text)}</div>'


def stage(compiled: Compiled, name: str) -> Stage | None:
    """The recorded stage ``name`` of ``compiled``, or ``None`` when it was not recorded (no
    PTX for the CPU target)."""
    return compiled.stages.get(name)


class View:
    """Base of the stage views: remembers which compilation it drew."""

    title = ""

    def __init__(self) -> None:
        self.widget: widgets.Widget = widgets.VBox()
        self._drawn_for: int | None = None

    def show(self, compiled: Compiled) -> None:
        """Draw ``compiled`` unless this very compilation is already drawn."""
        if self._drawn_for == id(compiled):
            return
        self._drawn_for = id(compiled)
        self.draw(compiled)

    def reset(self) -> None:
        self._drawn_for = None

    def draw(self, compiled: Compiled) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
