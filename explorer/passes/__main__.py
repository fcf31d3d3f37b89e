"""Replay one of our passes on a module file: ``python -m explorer.passes FILE --pass NAME
--options JSON`` prints the IR after it (what a :class:`CompileError`'s reproducer says)."""

from __future__ import annotations

import argparse
import json
import sys

from explorer.dialect import scan


def main(argv: list[str] | None = None) -> int:
    from mlir.ir import Context, Location, Module
    from mlir.passmanager import PassManager

    from explorer.codegen.options import validate
    from explorer.codegen.steps import scan_steps
    from explorer.frontend.recurrence import Recurrence
    from explorer.passes.affine import decompose
    from explorer.passes.state import ScanState

    ap = argparse.ArgumentParser(prog="python -m explorer.passes", description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--pass", dest="name", required=True)
    ap.add_argument("--options", default="{}")
    a = ap.parse_args(argv)
    raw = json.loads(a.options)
    options = validate(raw.pop("strategy", "blelloch"), raw.pop("target", "cuda"), **raw)
    with open(a.file, encoding="utf-8") as f:
        text = f.read()
    with Context() as ctx, Location.unknown():
        scan.load(ctx)
        module = Module.parse(text)
        recs = scan.ops(module.operation, "recurrence")
        if len(recs) != 1:
            print("the module has no scan.recurrence: nothing of ours to replay", file=sys.stderr)
            return 2
        state = ScanState(Recurrence.parse(scan.attrs(recs[0])["text"]), options)
        if scan.ops(module.operation, "affine"):
            state.form = decompose(state.recurrence)
        steps = {s.name: s for s in scan_steps(state)}
        if a.name not in steps:
            print(f"unknown pass {a.name!r}; ours are {', '.join(steps)}", file=sys.stderr)
            return 2
        pm = PassManager()
        pm.add(steps[a.name].run, a.name)
        pm.run(module.operation)
        print(module.operation.get_asm(enable_debug_info=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
