"""The outputs a compile stores, chosen by the ``outputs`` option: what ``scan-plan`` writes as
``scan.store {outputs}``, which states' last states that list holds, and the plan's outputs in
words."""

from __future__ import annotations

from typing import Any

from explorer.frontend.names import LAST_SUFFIX


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


def outputs_text(plan: Any, states: tuple[str, ...] = ()) -> str:
    """What the plan writes and where it sums the lanes of its readouts, in words (the plan
    stage's "what the plan does"); ``states``: the recurrence's states, to name those it
    leaves out."""
    kept = ", ".join(plan.stored)
    dropped = [s for s in states if s not in plan.stored]
    lines = [f"scan.store: the kernels write {kept}"
             + (f"; the states {', '.join(dropped)} are never written to memory (nobody asked "
                "for them: outputs='all' stores them)" if dropped and (
                    plan.lane_sum is None or plan.lane_sum.fused) else "")]
    last = [o for o in plan.stored
            if o.endswith(LAST_SUFFIX) and o[:-len(LAST_SUFFIX)] in states]
    if last:
        lines.append(f"scan.store: {', '.join(last)}: the state after the last step of each "
                     "sequence, written once by the thread that computes it")
    if plan.segments:
        lines.append("scan.segments: packed sequences (cu_seqlens); at each sequence start the "
                     "leaf element becomes (0, A_t h0 + b_t): the state restarts from that "
                     "sequence's initial state, in every tree and grid")
    ls = plan.lane_sum
    if ls is not None:
        ys = ", ".join(ls.readouts)
        B = plan.threads
        lines.append({
            "lanes-in-block":
                f"scan.lane_sum (lanes-in-block): the N lanes of a channel are consecutive "
                f"threads of a block (floor({B} / N) channels a block, so N <= {B}); after each "
                f"warp tile every thread leaves its lane's terms in shared memory, then the "
                f"block sums them for each (channel, step) and writes {ys}, coalesced along time",
            "lane-loop":
                f"scan.lane_sum (lane-loop): a block of the scan kernel takes a chunk of a whole "
                f"channel and scans its N lanes one after another, tile by tile, each lane from "
                f"its own state before the tile (its carry), adding the lane's terms into a "
                f"shared-memory row of the tile; then it writes {ys} for the tile (the reduce and "
                f"carry kernels still run per lane)",
            "readout-kernel":
                "scan.lane_sum (readout-kernel): the look-back scan does not sum the lanes: a "
                "readout kernel after it reads the states back from memory"
                + (f" (a workspace of the call: {', '.join(dropped)} not returned)"
                   if dropped else "") + f" and writes {ys}",
        }[ls.scheme])
    return "\n".join("  " + line for line in lines)
