"""The ``scanweaver`` command line's grammar: its subcommands, their arguments and checks.

:func:`build_parser` is read by :func:`explorer.cli.main`; a usage error is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

DEFAULT_SIZES = "4096x1024,16x2^20,131072x2048,1x2^26"


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``scanweaver compile: ... (see --help)``)."""

    def error(self, message: str) -> Any:  # the base class exits too
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _option_value(text: str) -> Any:
    """``--option k=v`` values: JSON when it parses (numbers, booleans), else the string."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _integer(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}"
                                             ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scanweaver",
        description="Compile affine recurrences to GPU kernels, run and benchmark them.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    count = _integer(1)

    c = sub.add_parser("compile", help="compile a recurrence into an artifact directory")
    c.add_argument("recurrence", help="the recurrence text, e.g. 'h[t] = a[t] * h[t-1] + b[t]' "
                                      "(a file name or '-' reads it from that file / stdin)")
    c.add_argument("-o", "--output", required=True, help="artifact directory to write")
    c.add_argument("--strategy", default="blelloch", help="scan strategy (default: blelloch)")
    c.add_argument("--target", default="cuda",
                   help="cuda (default; an artifact is PTX, so the only target here)")
    c.add_argument("--block-size", type=int, default=None, help="threads per block")
    c.add_argument("--elements-per-thread", type=int, default=None)
    c.add_argument("--chip", default=None, help="e.g. sm_90")
    c.add_argument("--backward", action="store_true",
                   help="compile the recurrence's backward pass instead: its adjoint recurrence "
                        "(explorer.grad), backwards in time, every output stored")
    c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other compile option (repeatable)")

    r = sub.add_parser("run", help="run an artifact on random inputs and check it")
    r.add_argument("artifact", help="artifact directory")
    r.add_argument("--channels", "-C", type=count, default=4096)
    r.add_argument("--length", "-L", type=count, default=1024)
    r.add_argument("--state-size", "-N", type=count, default=16,
                   help="lane count N for vector (Mamba) states (default 16)")
    r.add_argument("--seed", type=_integer(0), default=0)
    r.add_argument("--tolerance", type=_positive_number, default=None,
                   help="max allowed max|out-ref|/max|ref| (default 1e-4)")

    b = sub.add_parser("bench", help="benchmark artifacts against baselines and a copy")
    b.add_argument("artifacts", nargs="*", help="artifact directories (none: baselines only)")
    b.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"CxL list, e.g. 4096x1024,16x2^20 (default {DEFAULT_SIZES})")
    b.add_argument("--baselines", default="all",
                   help="comma list: cuda, torch, torch-scan, jax, cub, accelerated-scan; "
                        "'all' or 'none' (default all)")
    b.add_argument("--no-copy", action="store_true", help="leave out the copy roofline")
    b.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="the inputs' dtype (default float32): 16-bit inputs are rounded to it, "
                        "the reference is that of the rounded inputs, and the baselines that "
                        "cannot run in it are skipped; artifacts must be compiled for it")
    b.add_argument("--json", dest="json_path", default=None, help="write results as JSON")
    b.add_argument("--html", dest="html_path", default=None, help="write the plotly figure")
    b.add_argument("--table", dest="table_path", default=None, help="write the text table")
    b.add_argument("--tolerance", type=_positive_number, default=None)
    b.add_argument("--budget-ms", type=_positive_number, default=300.0,
                   help="timing budget per method and size (default 300 ms)")
    b.add_argument("--seed", type=_integer(0), default=0)
    b.add_argument("--no-flush", action="store_true",
                   help="do not evict L2 between timed launches")
    b.add_argument("--state-size", "-N", type=count, default=16,
                   help="lanes N for artifacts with vector (Mamba) states (default 16)")
    b.add_argument("--quiet", action="store_true", help="no progress display")

    p = sub.add_parser("report", help="table and figure from a bench JSON file, and one HTML "
                                      "file of a compile (no GPU needed)")
    p.add_argument("json_in", metavar="JSON", nargs="?", default=None,
                   help="a file written by scanweaver bench --json (with --snapshot: the "
                        "timings it shows)")
    p.add_argument("--html", dest="html_path", default=None, help="write the plotly figure")
    p.add_argument("--table", dest="table_path", default=None, help="write the text table")
    p.add_argument("--snapshot", dest="snapshot_path", default=None, metavar="HTML",
                   help="write one self-contained HTML file of a compile: its stages, the pass "
                        "list with diffs, the PTX resources, the JSON's timings and their plot")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--recurrence", default=None,
                        help="the recurrence to compile for --snapshot (its text, a file "
                             "holding it, or '-' for stdin)")
    source.add_argument("--record", default=None,
                        help="a compile record written by Compiled.dump, for --snapshot (read "
                             "without MLIR)")
    p.add_argument("--strategy", default="blelloch",
                   help="scan strategy of --recurrence (default: blelloch)")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--elements-per-thread", type=int, default=None)
    p.add_argument("--chip", default=None, help="e.g. sm_90")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other compile option of --recurrence (repeatable)")
    return parser
