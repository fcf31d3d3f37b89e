"""Compile speed: recurrence text -> PTX, as a user meets it.

For the affine scan and the selective scan, every strategy, each in fresh processes:

* ``first``: the first ``explorer.compile`` of a fresh process, the imports included (what the
  first click on Compile costs in a new notebook kernel);
* ``uncached``: ``explorer.compile(..., cache=False)`` again in that process (the median of
  ``--repeat`` runs), and where its time goes: our passes (``scan-*``), the upstream passes, the
  NVPTX backend (``gpu-module-to-binary``) and the rest (parsing, printing the IR after every
  pass, the records);
* ``memory`` and ``disk``: the same compile from the in-memory cache and from the disk cache as a
  new process finds it (the entry written by the background writer).

    python bench/compile_speed.py [--repeat 5] [--chip sm_90]
"""

from __future__ import annotations

import argparse
import json
import os
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
import json, statistics, sys, time
t0 = time.perf_counter()
import explorer
from explorer import compiler
text, strategy, chip, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
explorer.compile(text, strategy=strategy, chip=chip, cache=False)
first = time.perf_counter() - t0
runs, parts = [], []
for _ in range(repeat):
    t = time.perf_counter()
    c = explorer.compile(text, strategy=strategy, chip=chip, cache=False)
    runs.append(time.perf_counter() - t)
    ours = sum(p.seconds for p in c.passes if p.name.startswith("scan-"))
    backend = sum(p.seconds for p in c.passes if p.name.startswith("gpu-module-to-binary"))
    upstream = sum(p.seconds for p in c.passes) - ours - backend
    parts.append((ours, upstream, backend))
best = sorted(range(repeat), key=lambda i: runs[i])[repeat // 2]
t = time.perf_counter()
explorer.compile(text, strategy=strategy, chip=chip)
compiler.wait_for_cache_writes()
t = time.perf_counter()
explorer.compile(text, strategy=strategy, chip=chip)
memory = time.perf_counter() - t
print(json.dumps({"first": first, "uncached": runs[best], "ours": parts[best][0],
                  "upstream": parts[best][1], "backend": parts[best][2], "memory": memory}))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chip", default="sm_90")
    args = ap.parse_args()
    print(f"{'case':<16}{'strategy':<13}{'first':>8}{'uncached':>10}{'ours':>8}{'upstream':>10}"
          f"{'backend':>9}{'rest':>8}{'memory':>9}{'disk':>8}   (seconds)")
    for name, text in CASES.items():
        for strategy in STRATEGIES:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, SCANWEAVER_CACHE=cache,
                           PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                      os.environ.get("PYTHONPATH")])))
                r = json.loads(_run(_CHILD, text, strategy, args.chip, str(args.repeat),
                                    env=env))
                disk = float(_run(_DISK, text, strategy, args.chip, env=env))
            rest = r["uncached"] - r["ours"] - r["upstream"] - r["backend"]
            print(f"{name:<16}{strategy:<13}{r['first']:8.3f}{r['uncached']:10.3f}"
                  f"{r['ours']:8.3f}{r['upstream']:10.3f}{r['backend']:9.3f}{rest:8.3f}"
                  f"{r['memory']:9.5f}{disk:8.4f}")


if __name__ == "__main__":
    main()
