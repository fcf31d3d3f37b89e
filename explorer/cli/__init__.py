"""The ``scanweaver`` console command: compile a recurrence, run an artifact, benchmark artifacts.

    scanweaver compile "h[t] = a[t] * h[t-1] + b[t]" --strategy blelloch -o out/blelloch
    scanweaver run out/blelloch --channels 4096 --length 1024
    scanweaver bench out/blelloch out/sequential --sizes 4096x1024,16x2^20 \\
        --baselines all --json bench.json --html bench.html
    scanweaver report bench.json --html bench.html     # figure from saved results
    scanweaver report bench.json --snapshot scan.html --recurrence "h[t] = a[t] * h[t-1] + b[t]"

``compile`` needs the compiler (sympy, MLIR); ``run`` and ``bench`` need NumPy and CuPy only
(PyTorch, JAX, cuda-cccl and accelerated-scan are used by ``bench`` when they import).
``report --snapshot`` writes the HTML file ``Explorer.snapshot`` writes (every stage, the pass
list with diffs, the PTX resources, the timings of the JSON with their plot): of a recurrence it
compiles (``--recurrence``), or of a record ``Compiled.dump`` wrote (``--record``, no MLIR needed).

This module parses the command line and turns whatever ends a command into one line on stderr;
each subcommand is a module of its own (``compile_command``, ``gpu_commands`` for run and
bench, ``report_command``), beside the grammar (``parser``), the files named on the command
line (``paths``) and the errors (``errors``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from explorer.cli.compile_command import cmd_compile, compile_options
from explorer.cli.errors import CliError, _say, describe_error
from explorer.cli.gpu_commands import cmd_bench, cmd_run, reference_outputs
from explorer.cli.parser import DEFAULT_SIZES, build_parser
from explorer.cli.paths import RECURRENCE_LIMIT, RESULTS_LIMIT, check_output
from explorer.cli.paths import _read_recurrence as _read_recurrence
from explorer.cli.report_command import cmd_report, load_results

__all__ = [
    "DEFAULT_SIZES", "RECURRENCE_LIMIT", "RESULTS_LIMIT", "CliError", "build_parser",
    "check_output", "cmd_bench", "cmd_compile", "cmd_report", "cmd_run", "compile_options",
    "describe_error", "load_results", "main", "reference_outputs",
]


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(argv) if argv is not None else sys.argv[1:]
    parser = build_parser()
    args, extra = parser.parse_known_args(raw)
    if extra:   # said by the subcommand, with its usage
        commands = next(a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = raw
    handler = {"compile": cmd_compile, "run": cmd_run, "bench": cmd_bench,
               "report": cmd_report}[args.command]
    try:
        return handler(args)
    except BrokenPipeError:   # the reader of our output went away (| head)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the one place errors end
        if os.environ.get("SCANWEAVER_DEBUG") and not isinstance(err, KeyboardInterrupt):
            raise
        message, status = describe_error(err)
        _say(f"scanweaver {args.command}: {message}")
        return status
