"""``scanweaver compile``: a recurrence (text, file or stdin) into an artifact directory (PTX
and its manifest). Needs the compiler (sympy, MLIR)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from explorer.cli.errors import CliError
from explorer.cli.parser import _option_value
from explorer.cli.paths import _read_recurrence, check_output


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.block_size is not None:
        opts["block_size"] = args.block_size
    if args.elements_per_thread is not None:
        opts["elements_per_thread"] = args.elements_per_thread
    if args.chip is not None:
        opts["chip"] = args.chip
    for item in args.option:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise CliError(f"--option takes KEY=VALUE, got {item!r}")
        opts[key.strip().replace("-", "_")] = _option_value(value)
    return opts


def cmd_compile(args: argparse.Namespace) -> int:
    from explorer.codegen.options import validate

    opts = compile_options(args)
    validate(args.strategy, args.target, **opts)   # OptionError before anything is read
    if args.target != "cuda":
        raise CliError(f"--target {args.target}: an artifact holds PTX, so compile makes cuda "
                       "artifacts only (explorer.compile(..., target='cpu') runs on the CPU)")
    check_output(args.output, "-o", directory=True)
    text = _read_recurrence(args.recurrence)

    import explorer

    t0 = time.perf_counter()
    what = ""
    if args.backward:
        if "reverse" in opts:
            raise CliError("--backward: the adjoint always runs backwards in time; leave out "
                           "--option reverse=...")
        backward = explorer.grad(text)
        compiled = backward.compile(target=args.target, strategy=args.strategy, **opts)
        what = f", the backward: {backward.text.splitlines()[0]}"
    else:
        compiled = explorer.compile(text, target=args.target, strategy=args.strategy, **opts)
    compiled.save(args.output)
    print(f"wrote {args.output} ({args.strategy}, {args.target}{what}) in "
          f"{time.perf_counter() - t0:.2f} s")
    return 0
