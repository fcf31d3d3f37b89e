"""Build the artifacts the GPU tests load, on a machine with the compiler (MLIR) and nvcc.

    python tests/gpu/build_artifacts.py            # writes tests/gpu/artifacts/ (git-ignored)

Then, on the GPU machine (which needs only NumPy and CuPy; torch for the torch cases, sympy for
the references of recurrences other than the affine scan), with the folder copied beside the
tests:

    python -m pytest tests/gpu -q

On a machine that cannot reach a package index, ``source tests/gpu/device_setup.sh`` first installs
the benchmark's peers from wheels carried in ``.whl/`` and prints what is there.

What is built:
- ``abi-affine``, ``abi-selective``: hand-written CUDA kernels (``abi_kernels.cu``, compiled to
  PTX with nvcc) that follow the kernel ABI. They test the runtime on its own, whatever the code
  generator does.
- ``<preset>-<strategy>``: every preset recurrence (:data:`explorer.presets.PRESETS`) compiled
  with every strategy by :func:`explorer.compile`, when the compiler imports here (the trees
  also with the smallest tiles, ``-small``, with the look-back grid, ``-lookback``, and the
  Blelloch and warp-shuffle trees with ``fast_math="fast"``, ``-fast``; a
  recurrence with readouts, which stores them alone by default, also with every output stored,
  ``-all``); and ``compiled/<preset>-<strategy>.json``, the whole compiled record
  (``Compiled.dump``), which the explorer widget loads on the GPU machine without MLIR.

- ``narrow/<preset>-<strategy>-<dtype>``: the affine scan and the selective scans compiled with
  16-bit inputs (``dtype="bfloat16"``/``"float16"``; ``-out32``: ``out_dtype="float32"``), for
  ``test_dtype16_gpu.py``; listed under ``narrow`` in the index, apart from the float32 ones.
- ``varlen/<preset>-<strategy>[-small|-lookback]``: the affine scan and the selective scan with
  ``varlen=True`` (packed sequences, ``cu_seqlens``), storing the last state beside ``h`` or
  ``y``, with their own ``varlen/index.json`` (``test_varlen_gpu``; the other tests do not see
  them). ``--varlen-only`` builds these alone.

- ``wide/<name>``: tree plans with wide tile accesses (``vector_width``) and the same plans
  with scalar ones (``-v1``), float32 and 16-bit, each grid and direction, for
  ``test_wide_gpu.py``; listed under ``wide`` in the index.

``index.json`` lists what was built and what failed to compile (with the error), so the tests
report compile failures instead of silently testing less.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_OUT = HERE / "artifacts"
#: options of the small-tile variants
SMALL = {"block_size": 32, "elements_per_thread": 1, "chunk_tiles": 1}

sys.path.insert(0, str(ROOT))

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"
SELECTIVE = ("h[t, n] = exp(dt[t] * A[n]) * h[t-1, n] + dt[t] * B[t, n] * x[t]\n"
             "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]")


def _arg(name: str, role: str, timed: bool = False, lane: bool = False) -> dict[str, object]:
    return {"name": name, "role": role, "timed": timed, "lane": lane,
            "dtype": "int64" if role == "size" else "float32"}


SIZES = [_arg("C", "size"), _arg("N", "size"), _arg("L", "size")]

ABI = {
    "abi-affine": {
        "recurrence": AFFINE, "outputs": ["h"], "vector": False,
        "kernel": "abi_affine",
        "args": [_arg("a", "input", True), _arg("b", "input", True), _arg("h0", "h0"),
                 _arg("h", "output", True)] + SIZES,
    },
    "abi-selective": {
        "recurrence": SELECTIVE, "outputs": ["h", "y"], "vector": True,
        "kernel": "abi_selective",
        "args": [_arg("dt", "input", True), _arg("B", "input", True, True),
                 _arg("x", "input", True), _arg("C", "input", True, True),
                 _arg("A", "param", False, True), _arg("D", "param"),
                 _arg("h0", "h0", False, True), _arg("h", "output", True, True),
                 _arg("y", "output", True)] + SIZES,
    },
}


def build_abi(out: Path, chip: str) -> dict[str, object]:
    from explorer.runtime.artifact import write_artifact

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return {"error": "nvcc not found"}
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path = Path(tmp) / "abi.ptx"
        arch = chip.replace("sm_", "compute_")
        subprocess.run([nvcc, f"-arch={arch}", "-ptx", "-O3", str(HERE / "abi_kernels.cu"),
                        "-o", str(ptx_path)], check=True)
        ptx = ptx_path.read_text()
    built: dict[str, object] = {}
    for name, spec in ABI.items():
        manifest = {
            "format": "scanweaver-artifact/1", "recurrence": spec["recurrence"],
            "strategy": "abi-reference", "options": {"block_size": 128}, "chip": chip,
            "dtype": "float32",
            "kernels": [{"name": spec["kernel"], "ptx": "kernel.ptx", "block": [128, 1, 1],
                         "sequences_per_block": 128, "shared_bytes": 0,
                         "args": spec["args"]}],
            "outputs": spec["outputs"], "vector": spec["vector"],
            "versions": {"nvcc": _nvcc_version(nvcc)},
        }
        write_artifact(out / name, ptx, manifest)
        built[name] = {"recurrence": spec["recurrence"], "strategy": "abi-reference",
                       "vector": spec["vector"], "source": "nvcc"}
    return built


def _nvcc_version(nvcc: str) -> str:
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+)", text)
    return m.group(1) if m else "?"


def build_compiled(out: Path, strategies: list[str] | None) -> tuple[dict[str, object],
                                                                     dict[str, str]]:
    try:
        import explorer
        from explorer.codegen.options import STRATEGIES
        from explorer.presets import PRESETS
    except Exception as err:  # no compiler here
        return {}, {"*": f"explorer.compile unavailable: {type(err).__name__}: {err}"}
    built: dict[str, object] = {}
    failed: dict[str, str] = {}
    variants: list[tuple[str, str, dict[str, int]]] = [
        (s, "", {}) for s in strategies or list(STRATEGIES)]
    # the smallest tiles of each tree: one element per thread, 32 threads, one-tile chunks
    # (every level of the block tree and the chunked scheme at small L)
    variants += [(s, "-small", SMALL) for s in strategies or list(STRATEGIES)
                 if s != "sequential"]
    # the trees' other grid scheme (the default is the chunked scan)
    variants += [(s, f"{suffix}-lookback", {**options, "grid": "lookback"})
                 for s, suffix, options in list(variants) if s != "sequential"]
    # approximate exp, log and division (fast_math="fast"), for the two block trees
    variants += [(s, "-fast", {"fast_math": "fast"}) for s in ("blelloch", "warp_shuffle")
                 if s in (strategies or list(STRATEGIES))]
    # every output stored (the states beside the readouts), for the recurrences with readouts
    stored = [(s, f"{suffix}-all", {**options, "outputs": "all"})
              for s, suffix, options in variants]
    for preset, text in PRESETS.items():
        readouts = explorer.Recurrence.parse(text).readouts
        for strategy, suffix, options in variants + (stored if readouts else []):
            name = f"{_slug(preset)}-{strategy}{suffix}"
            try:
                compiled = explorer.compile(text, target="cuda", strategy=strategy, **options)
                compiled.save(out / name)
                # the whole compiled record too: the explorer widget runs it on the GPU machine
                compiled.dump(out / "compiled" / f"{name}.json.gz")
                built[name] = {"recurrence": text, "strategy": strategy,
                               "vector": bool(compiled.form.vector), "source": "explorer",
                               "outputs": list(compiled.outputs)}
            except Exception as err:
                failed[name] = f"{type(err).__name__}: {err}"
                traceback.print_exc()
    return built, failed


#: the 16-bit variants: (preset, strategy, options)
NARROW_VARIANTS = [
    *((p, s, {"dtype": d}) for p in ("affine scan", "selective scan", "Mamba selective scan")
      for s in ("blelloch", "sequential") for d in ("bfloat16", "float16")),
    ("affine scan", "blelloch", {"dtype": "bfloat16", "grid": "lookback"}),
    ("affine scan", "blelloch", {"dtype": "bfloat16", "out_dtype": "float32"}),
    ("affine scan", "sequential", {"dtype": "float16", "out_dtype": "float32"}),
]


def _compile_each(folder: Path, prefix: str,
                  jobs: Iterable[tuple[str, str, str, dict[str, Any], dict[str, Any]]]
                  ) -> tuple[dict[str, object], dict[str, str]]:
    """Compile each job ``(name, recurrence, strategy, options, index fields)`` for CUDA into
    ``folder/name``: the index entries of what was built, and the errors of what failed (keyed
    ``prefix + name``)."""
    import explorer

    built: dict[str, object] = {}
    failed: dict[str, str] = {}
    for name, text, strategy, options, extra in jobs:
        try:
            compiled = explorer.compile(text, target="cuda", strategy=strategy, **options)
            compiled.save(folder / name)
            built[name] = {"recurrence": text, "strategy": strategy,
                           "vector": bool(compiled.form.vector),
                           "outputs": list(compiled.outputs), **extra}
        except Exception as err:
            failed[prefix + name] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
    return built, failed


def _slug(preset: str) -> str:
    """A preset's name in artifact names: ``Mamba selective scan`` -> ``mamba-selective-scan``."""
    return re.sub(r"[^a-z0-9]+", "-", preset.lower()).strip("-")


def build_narrow(out: Path) -> tuple[dict[str, object], dict[str, str]]:
    """The 16-bit artifacts (:data:`NARROW_VARIANTS`) in ``out/narrow``."""
    try:
        from explorer.presets import PRESETS
    except Exception as err:  # no compiler here
        return {}, {"narrow": f"explorer.compile unavailable: {type(err).__name__}: {err}"}

    def jobs() -> Iterator[tuple[str, str, str, dict[str, Any], dict[str, Any]]]:
        for preset, strategy, options in NARROW_VARIANTS:
            suffix = "".join(f"-{v}" for k, v in options.items() if k != "out_dtype")
            suffix += "-out32" if options.get("out_dtype") == "float32" else ""
            yield (f"{_slug(preset)}-{strategy}{suffix}", PRESETS[preset], strategy, options,
                   {"options": options})
    return _compile_each(out / "narrow", "narrow/", jobs())


#: the varlen variants: (preset, outputs) x (strategy, suffix, options)
VARLEN_PRESETS = {"affine scan": ("h", "h_last"), "selective scan": ("y", "h_last")}
VARLEN_PLANS = [("sequential", "", {}), ("blelloch", "", {}), ("kogge_stone", "", {}),
                ("blelloch", "-small", SMALL), ("blelloch", "-lookback", {"grid": "lookback"})]


def build_varlen(out: Path) -> int:
    """The varlen artifacts into ``out`` with their own ``index.json``; the failures' count."""
    from explorer.presets import PRESETS

    out.mkdir(parents=True, exist_ok=True)
    built, failed = _compile_each(out, "", (
        (f"{preset.replace(' ', '-')}-{strategy}{suffix}", PRESETS[preset], strategy,
         {"varlen": True, "outputs": outputs, **options}, {"source": "explorer"})
        for preset, outputs in VARLEN_PRESETS.items()
        for strategy, suffix, options in VARLEN_PLANS))
    (out / "index.json").write_text(json.dumps({"artifacts": built, "failed": failed},
                                               indent=2) + "\n")
    print(f"{len(built)} varlen artifacts in {out}; {len(failed)} failed")
    return len(failed)


#: the wide-access variants: (name, preset, strategy, options); each with ``vector_width``
#: "auto" and with 1 (``-v1``): the same arithmetic, so their outputs agree to the bit
WIDE_VARIANTS = [
    *((f"affine-{d}", "affine scan", "blelloch", {"dtype": d})
      for d in ("float32", "bfloat16", "float16")),
    ("affine-float32-chunked", "affine scan", "blelloch", {"grid": "chunked"}),
    ("affine-float32-reverse", "affine scan", "blelloch", {"reverse": True}),
    ("affine-float32-kogge", "affine scan", "kogge_stone", {}),
    ("affine-bfloat16-out32", "affine scan", "blelloch", {"dtype": "bfloat16",
                                                          "out_dtype": "float32"}),
    ("selective-float32", "selective scan", "blelloch", {}),
    *((f"affine-{d}-e16", "affine scan", "blelloch", {"dtype": d, "elements_per_thread": 16})
      for d in ("float32", "bfloat16", "float16")),
    # the direct tile layout (scan.thread {layout = "direct"}): every grid and tree, a tail,
    # reverse time, 16-bit inputs and streamed states of the lane loop
    *((f"affine-{d}-direct", "affine scan", "blelloch", {"dtype": d, "tile_layout": "direct"})
      for d in ("float32", "bfloat16", "float16")),
    ("affine-float32-direct-chunked", "affine scan", "blelloch",
     {"grid": "chunked", "tile_layout": "direct"}),
    ("affine-float32-direct-reverse", "affine scan", "warp_shuffle",
     {"reverse": True, "tile_layout": "direct"}),
    ("affine-float32-direct-kogge", "affine scan", "kogge_stone", {"tile_layout": "direct"}),
    ("affine-bfloat16-direct-out32", "affine scan", "warp_shuffle",
     {"dtype": "bfloat16", "out_dtype": "float32", "tile_layout": "direct"}),
    ("affine-float32-direct-e16", "affine scan", "warp_shuffle",
     {"elements_per_thread": 16, "tile_layout": "direct"}),
    *((f"selective-float32-{lay}-all", "selective scan", "blelloch",
       {"tile_layout": lay, "outputs": "all"}) for lay in ("direct", "staged")),
    # tiles past CUDA's 48 KiB of static shared memory (dynamic shared memory): 512 threads,
    # and 32 elements a thread of the look-back kernel
    ("affine-float32-b512", "affine scan", "blelloch", {"block_size": 512}),
    ("affine-bfloat16-lookback32", "affine scan", "blelloch",
     {"dtype": "bfloat16", "block_size": 256, "lookback_elements": 32}),
    ("affine-float32-b1024-e16-chunked", "affine scan", "warp_shuffle",
     {"block_size": 1024, "elements_per_thread": 16, "grid": "chunked"}),
    # inputs read in place at another time (read_offsets): staged (the stage moves them, the
    # edge values loaded one a thread), direct (element by element), reverse, 16-bit, and the
    # lane loop's lane and channel inputs
    ("affine-float32-offsets", "affine scan", "blelloch", {"read_offsets": {"a": 1, "b": -1}}),
    ("affine-float32-offsets-direct", "affine scan", "blelloch",
     {"read_offsets": {"a": 1, "b": -1}, "tile_layout": "direct"}),
    ("affine-float32-offsets-reverse", "affine scan", "warp_shuffle",
     {"reverse": True, "read_offsets": {"a": 1, "b": -2}}),
    ("affine-bfloat16-offsets", "affine scan", "blelloch",
     {"dtype": "bfloat16", "read_offsets": {"a": -1}}),
    *((f"selective-float32-offsets-{lay}-all", "selective scan", "blelloch",
       {"tile_layout": lay, "outputs": "all", "read_offsets": {"B": -1, "dt": 1}})
      for lay in ("direct", "staged")),
]


def build_wide(out: Path) -> tuple[dict[str, object], dict[str, str]]:
    """The wide-access artifacts (:data:`WIDE_VARIANTS`) in ``out/wide``."""
    try:
        from explorer.presets import PRESETS
    except Exception as err:  # no compiler here
        return {}, {"wide": f"explorer.compile unavailable: {type(err).__name__}: {err}"}

    def jobs() -> Iterator[tuple[str, str, str, dict[str, Any], dict[str, Any]]]:
        for base, preset, strategy, options in WIDE_VARIANTS:
            for suffix, width in (("", "auto"), ("-v1", 1)):
                opts = {**options, "vector_width": width}
                yield (base + suffix, PRESETS[preset], strategy, opts,
                       {"options": opts, "scalar_twin": base + "-v1"})
    return _compile_each(out / "wide", "wide/", jobs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--chip", default="sm_90")
    parser.add_argument("--strategies", default=None,
                        help="comma list (default: every strategy the compiler has)")
    parser.add_argument("--narrow-only", action="store_true",
                        help="build the 16-bit artifacts alone (narrow/)")
    parser.add_argument("--varlen-only", action="store_true",
                        help="build the varlen artifacts alone (into OUT/varlen)")
    parser.add_argument("--wide-only", action="store_true",
                        help="build the wide-access artifacts alone (wide/)")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.varlen_only:
        if (out / "varlen").exists():
            shutil.rmtree(out / "varlen")
        return 0 if build_varlen(out / "varlen") == 0 else 1
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    failed: dict[str, str] = {}
    abi: dict[str, object] = {}
    compiled: dict[str, object] = {}
    if not args.narrow_only and not args.wide_only:
        abi = build_abi(out, args.chip)
        if "error" in abi:
            failed["abi"] = str(abi.pop("error"))
        compiled, failed_c = build_compiled(
            out, args.strategies.split(",") if args.strategies else None)
        failed.update(failed_c)
        if not failed_c.get("*") and build_varlen(out / "varlen"):
            failed["varlen"] = "see varlen/index.json"
    narrow: dict[str, object] = {}
    if not args.wide_only:
        narrow, failed_n = build_narrow(out)
        failed.update(failed_n)
    wide: dict[str, object] = {}
    if not args.narrow_only:
        wide, failed_w = build_wide(out)
        failed.update(failed_w)
    index = {"artifacts": {**abi, **compiled}, "narrow": narrow, "wide": wide,
             "failed": failed, "chip": args.chip}
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"{len(index['artifacts'])} artifacts, {len(narrow)} 16-bit and {len(wide)} wide "
          f"ones in {out}; "
          f"{len(failed)} failed"
          + "".join(f"\n  {k}: {v.splitlines()[0]}" for k, v in failed.items()))
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
