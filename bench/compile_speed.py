"""Compile speed: recurrence text -> PTX, as a user meets it.

For the affine scan and the selective scan, every strategy, each in ``--processes`` fresh
processes (medians over them, so that other work on the machine shows less):

* ``first``: the first ``explorer.compile`` of a fresh process, the imports included (what the
  first click on Compile costs in a new notebook kernel);
* ``uncached``: ``explorer.compile(..., cache=False)`` again in that process (the median of
  ``--repeat`` runs in each process), ``cpu`` the CPU time of that compile, and where its time
  goes: our passes (``scan-*``), the upstream passes, the NVPTX backend
  (``gpu-module-to-binary``) and the rest (parsing, building, copying the module after each
  pass, the passes after the backend and their records). The backend runs in a thread of its
  own with the GIL released while the IR after the passes before it is printed and recorded,
  so ``cpu`` may exceed ``uncached`` and the printing shows in ``rest`` only where it outlasts
  the backend;
* ``memory`` and ``disk``: the same compile from the in-memory cache and from the disk cache as a
  new process finds it (the entry written by the background writer).

Python compiles a module's source to bytecode when it finds none cached beside it, and where
``PYTHONDONTWRITEBYTECODE`` is set (as on our development machines) it does so again in every
process: ``first`` and ``disk`` then include compiling explorer's own modules (about 0.1 s).
``--bytecode`` measures as an installed package runs instead: every module's bytecode is
written once, into a folder of the run's own (``PYTHONPYCACHEPREFIX``), before the timed
processes, which read it from there.

    python bench/compile_speed.py [--repeat 5] [--processes 3] [--chip sm_90]
                                  [--case "affine scan"] [--strategy blelloch] [--bytecode]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "affine scan": "h[t] = a[t] * h[t-1] + b[t]",
    "selective scan": ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
                       "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]"),
}
STRATEGIES = ("sequential", "blelloch", "kogge_stone")

# runs in a fresh interpreter: prints one JSON line
_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import explorer
from explorer import compiler
text, strategy, chip, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
explorer.compile(text, strategy=strategy, chip=chip, cache=False)
first = time.perf_counter() - t0
runs = []
for _ in range(repeat):
    t, cpu = time.perf_counter(), time.process_time()
    c = explorer.compile(text, strategy=strategy, chip=chip, cache=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    ours = sum(p.seconds for p in c.passes if p.name.startswith("scan-"))
    backend = sum(p.seconds for p in c.passes if p.name.startswith("gpu-module-to-binary"))
    upstream = sum(p.seconds for p in c.passes) - ours - backend
    runs.append({"uncached": wall, "cpu": cpu, "ours": ours, "upstream": upstream,
                 "backend": backend})
explorer.compile(text, strategy=strategy, chip=chip)
compiler.wait_for_cache_writes()
t = time.perf_counter()
explorer.compile(text, strategy=strategy, chip=chip)
memory = time.perf_counter() - t
print(json.dumps({"first": first, "runs": runs, "memory": memory}))
"""

_DISK = r"""
import sys, time
import explorer
t = time.perf_counter()
c = explorer.compile(sys.argv[1], strategy=sys.argv[2], chip=sys.argv[3])
print(time.perf_counter() - t if c.from_cache else -1.0)
"""


def _run(code: str, *argv: str, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         env=env, check=True, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1]


def _environment(cache: str, bytecode: str | None) -> dict[str, str]:
    env = dict(os.environ, SCANWEAVER_CACHE=cache,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    if bytecode is not None:
        env["PYTHONPYCACHEPREFIX"] = bytecode
    return env


def write_bytecode(folder: str, text: str, strategy: str, chip: str) -> None:
    """Run what the timed processes run, once, with bytecode written into ``folder``: every
    module they import then has its bytecode there (the standard library's too, which Python
    looks for in that folder alone once it is set)."""
    with tempfile.TemporaryDirectory() as cache:
        env = _environment(cache, folder)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        _run(_CHILD, text, strategy, chip, "1", env=env)
        _run(_DISK, text, strategy, chip, env=env)


def measure(text: str, strategy: str, chip: str, repeat: int, processes: int,
            bytecode: str | None = None) -> dict[str, float]:
    """Medians over ``processes`` fresh processes (``uncached`` and its parts: of the median
    run of all of them); ``bytecode``: the folder of every module's bytecode, None to leave
    Python as it is set up."""
    firsts, runs, memory, disk = [], [], [], []
    for _ in range(processes):
        with tempfile.TemporaryDirectory() as cache:
            env = _environment(cache, bytecode)
            r = json.loads(_run(_CHILD, text, strategy, chip, str(repeat), env=env))
            disk.append(float(_run(_DISK, text, strategy, chip, env=env)))
        firsts.append(r["first"])
        runs += r["runs"]
        memory.append(r["memory"])
    runs.sort(key=lambda run: run["uncached"])
    mid = runs[len(runs) // 2]
    return {"first": statistics.median(firsts), **mid,
            "cpu": statistics.median(run["cpu"] for run in runs),
            "rest": mid["uncached"] - mid["ours"] - mid["upstream"] - mid["backend"],
            "memory": statistics.median(memory), "disk": statistics.median(disk)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--chip", default="sm_90")
    ap.add_argument("--case", action="append", choices=list(CASES),
                    help="only this case (again for more)")
    ap.add_argument("--strategy", action="append", choices=STRATEGIES,
                    help="only this strategy (again for more)")
    ap.add_argument("--bytecode", action="store_true",
                    help="with every module's bytecode written before, as installed")
    args = ap.parse_args()
    print(f"{'case':<16}{'strategy':<13}{'first':>8}{'uncached':>10}{'cpu':>7}{'ours':>7}"
          f"{'upstream':>10}{'backend':>9}{'rest':>7}{'memory':>9}{'disk':>8}   (seconds, "
          f"medians of {args.processes} processes x {args.repeat} runs"
          f"{', bytecode written before' if args.bytecode else ''})")
    with tempfile.TemporaryDirectory() as folder:
        bytecode = folder if args.bytecode else None
        for name in args.case or CASES:
            for strategy in args.strategy or STRATEGIES:
                if bytecode is not None:
                    write_bytecode(bytecode, CASES[name], strategy, args.chip)
                r = measure(CASES[name], strategy, args.chip, args.repeat, args.processes,
                            bytecode)
                print(f"{name:<16}{strategy:<13}{r['first']:8.3f}{r['uncached']:10.3f}"
                      f"{r['cpu']:7.3f}{r['ours']:7.3f}{r['upstream']:10.3f}"
                      f"{r['backend']:9.3f}{r['rest']:7.3f}{r['memory']:9.5f}"
                      f"{r['disk']:8.4f}", flush=True)


if __name__ == "__main__":
    main()
