"""The outputs a compile stores, chosen by the ``outputs`` option: what ``scan-plan`` writes as
``scan.store {outputs}``, and which states' last states that list holds."""

from __future__ import annotations

from typing import Any


def stored_outputs(rec: Any, outputs: str | tuple[str, ...]) -> tuple[str, ...]:
    """The outputs of ``rec`` (a :class:`~explorer.frontend.recurrence.Recurrence`) that the
    option ``outputs`` asks for, in the recurrence's order (states, then readouts);
    :class:`~explorer.errors.OptionError` for a name that is not an output."""
    from explorer.errors import OptionError
    from explorer.frontend.names import last_name

    states, readouts = tuple(rec.states), tuple(rec.readouts)
    if outputs == "all":
        return states + readouts
    if outputs == "states":
        return states
    if outputs == "readouts":
        return readouts or states
    if isinstance(outputs, str):
        outputs = (outputs,)
    # the last state of each state, unless the recurrence itself uses that name
    names = set(rec.inputs) | set(rec.params) | set(states) | set(readouts)
    lasts = tuple(last_name(s) for s in states if last_name(s) not in names)
    unknown = [o for o in outputs if o not in states + readouts + lasts]
    if unknown:
        raise OptionError(f"outputs names {', '.join(unknown)}, not an output of the "
                          f"recurrence (its states: {', '.join(states)}"
                          + (f"; its readouts: {', '.join(readouts)}" if readouts else "")
                          + (f"; last states: {', '.join(lasts)})" if lasts else ")"))
    return tuple(o for o in states + readouts + lasts if o in outputs)


def last_states(rec: Any, stored: tuple[str, ...]) -> tuple[str, ...]:
    """The states whose last state ``stored`` holds (``h`` for ``h_last``), in order."""
    from explorer.frontend.names import last_name

    own = set(rec.states) | set(rec.readouts)
    return tuple(s for s in rec.states if last_name(s) in stored and last_name(s) not in own)
