"""The options row's choices and the lines under it: what each control offers (read from the
compiler's option checker where it can be) and how an error or a kept option is shown."""

from __future__ import annotations

import html
import traceback
from typing import Any

_STRATEGY_LABELS = {"blelloch": "Blelloch (work-efficient tree)", "sequential": "sequential",
                    "kogge_stone": "Kogge-Stone", "warp_shuffle": "warp shuffles"}
#: "auto": the plan's tile for the recurrence (both left open; see *Options* in the README)
BLOCK_SIZES: list[int | str] = ["auto", 32, 64, 128, 256, 512, 1024]
ELEMENTS_PER_THREAD: list[int | str] = ["auto", 1, 2, 4, 8, 16]
#: the labels of the ``outputs`` option's keywords (explorer.codegen.options.OUTPUTS)
OUTPUTS_LABELS = {"readouts": "readouts (default)", "states": "states",
                  "all": "states and readouts"}
OUTPUTS_TOOLTIP = ("what the kernels store and a call returns (the plan's scan.store): "
                   "readouts: the readouts alone (y), or the states of a recurrence that has "
                   "none; states: the states alone (no readout is computed); states and "
                   "readouts: both. A state nobody asked for is never written to memory.")


def choices() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """Strategies, chips and dtypes the compiler accepts (read from its option checker)."""
    from explorer.codegen import options

    strategies = [(_STRATEGY_LABELS.get(s, s), s) for s in options.STRATEGIES]
    strategies.sort(key=lambda pair: pair[1] != "blelloch")
    chips = sorted(options.CHIP_PTX, key=lambda c: (int("".join(filter(str.isdigit, c))), c))
    return strategies, chips, list(options.DTYPES)


def outputs_choices(chosen: str | tuple[str, ...] = "readouts") -> list[tuple[str, Any]]:
    """The outputs dropdown's (label, value) pairs: the keywords of the ``outputs`` option and,
    when ``chosen`` is a tuple of output names (given by code, or read from a record), that
    tuple as one more choice, labelled with its names."""
    from explorer.codegen.options import OUTPUTS

    choices: list[tuple[str, Any]] = [(OUTPUTS_LABELS.get(o, o), o) for o in OUTPUTS]
    if chosen not in OUTPUTS:
        names = (chosen,) if isinstance(chosen, str) else tuple(chosen)
        choices.append((", ".join(names), names))
    return choices


def error_html(err: BaseException) -> str:
    """The error as the person should read it: the message (with its caret) and, for an error we
    did not expect, the traceback folded away."""
    from explorer.errors import CompileError, OptionError, RecurrenceError

    if isinstance(err, RecurrenceError):
        title = "The recurrence is not valid"
        body = str(err)
    elif isinstance(err, OptionError):
        title = "That option is not supported"
        body = str(err)
    elif isinstance(err, CompileError):
        title = "Compilation failed"
        body = str(err)
    else:
        title = f"Internal error ({type(err).__name__})"
        body = str(err)
    out = (f"<div class='sw-error'><b style='color:#a00000'>{html.escape(title)}</b>"
           f"<pre>{html.escape(body)}</pre>")
    if not isinstance(err, RecurrenceError | OptionError | CompileError):
        trace = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        out += ("<details><summary>traceback</summary>"
                f"<pre>{html.escape(trace)}</pre></details>")
    return out + "</div>"


#: the compile options the options row has a control for
CONTROLLED = frozenset({"target", "strategy", "block_size", "elements_per_thread", "chip",
                        "dtype", "reverse", "grid", "outputs", "fast_math", "tile_layout",
                        "short_tile", "lookback_layout"})
#: the fast-math box: (label, value of the option ``fast_math``)
FAST_MATH_CHOICES = (("FMA contraction (nvcc's default)", "contract"),
                     ("fast: approximate exp, log, division", "fast"),
                     ("none: every operation rounded", "none"))
#: the tiles box: (label, value of the option ``tile_layout``)
TILE_LAYOUT_CHOICES = (("auto", "auto"), ("staged (shared memory)", "staged"),
                       ("direct (registers)", "direct"))
#: the look-back tiles box: (label, value of the option ``lookback_layout``)
LOOKBACK_LAYOUT_CHOICES = (("auto", "auto"), ("staged (float32 scalars)", "staged"),
                           ("packed (as loaded, 16-byte vectors)", "packed"),
                           ("direct (registers)", "direct"))
#: the short-kernel box: (label, value of the option ``short_tile``)
SHORT_TILE_CHOICES = (("auto", "auto"), ("off", "none"), ("32 x 16", "32x16"),
                      ("32 x 8", "32x8"), ("64 x 16", "64x16"), ("64 x 8", "64x8"))


def short_tile_choices(chosen: str = "auto") -> list[tuple[str, str]]:
    """The short-kernel box's (label, value) pairs, with ``chosen`` (another tile, given by
    code or read from a record) as one more choice."""
    pairs = list(SHORT_TILE_CHOICES)
    if chosen not in dict(pairs).values():
        pairs.append((str(chosen).replace("x", " x "), str(chosen)))
    return pairs


def kept_html(kept: dict[str, Any], source: str = "the compiled record") -> str:
    """The line under the options row naming the options kept without a control (a record's,
    or the adjoint's while the backward is shown)."""
    if not kept:
        return ""
    listed = ", ".join(f"{k}={v!r}" for k, v in sorted(kept.items()))
    return (f"<div style='font-size:12px;color:#555'>also kept from {html.escape(source)} (no "
            f"control here; every compile from these controls uses them): "
            f"<code>{html.escape(listed)}</code></div>")
