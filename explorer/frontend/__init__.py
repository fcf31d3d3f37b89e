"""The front end: recurrence text -> :class:`Recurrence` (parsed with ``ast``, never executed)."""

from explorer.frontend.recurrence import Recurrence, Statement

__all__ = ["Recurrence", "Statement"]
