"""A packed variable-length batch against the same sequences padded to the longest one.

    python bench/varlen_speed.py --build .artifacts/varlen        # here: compile (needs MLIR)
    python bench/varlen_speed.py --artifacts .artifacts/varlen \\
        --sequences 8 --total 2^17 --channels 1536 --json out.json  # GPU: numpy, cupy, torch

The recurrence is the preset "Mamba selective scan" (N = 16 lanes). ``--sequences`` sequences
of random lengths (seeded) summing to ``--total`` steps, ``--channels`` channels each:

- ``packed``: the compile with ``varlen=True``, one batch row of ``(1, D, total)`` with
  ``cu_seqlens`` (``B`` and ``C`` ``(1, 1, N, total)``, shared by the D channels);
- ``padded``: the default compile (whole sequences), ``(sequences, D, longest)`` with each
  sequence zero-padded at its end (what a caller without packing does).

Both store ``y`` alone. Each is checked first: the packed ``y`` against the float64 reference
of each of a few sequences alone (sampled channels), and the padded ``y`` against the packed
one on every sequence's steps. Then each is timed with CUDA events (L2 flushed, median,
:mod:`explorer.bench.timing`): the kernels alone (a launch prepared once) and the whole call
(marshalling, and for the packed batch the marks built from ``cu_seqlens``).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explorer.bench.sweep import parse_count  # noqa: E402

PRESET = "Mamba selective scan"
#: the compiles ``--build`` makes, named as in ``bench/mamba_speed.py`` (its ``VARIANTS``)
STRATEGIES = ("blelloch", "sequential", "warp32-fast")
#: max |y - y_float64| / max |y_float64| on the sampled channels before a method is timed
CHECK_TOL = 2e-3


def build(folder: Path, strategies: tuple[str, ...]) -> None:
    """``folder/packed-<name>`` (varlen) and ``folder/padded-<name>`` artifacts of each variant
    named (``bench/mamba_speed.py``'s ``VARIANTS``: a strategy and its options)."""
    import explorer as ex
    from explorer.presets import PRESETS

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mamba_speed import variants

    for s, strategy, options in variants(strategies):
        ex.compile(PRESETS[PRESET], strategy=strategy, varlen=True, **options).save(
            folder / f"packed-{s}")
        ex.compile(PRESETS[PRESET], strategy=strategy, **options).save(folder / f"padded-{s}")
        print(f"compiled {s} -> {folder}/packed-{s}, {folder}/padded-{s}")


def lengths_of(sequences: int, total: int, seed: int) -> list[int]:
    """Random lengths (each at least 1) summing to ``total``."""
    import numpy as np

    w = np.random.default_rng(seed).uniform(0.2, 1.0, sequences)
    out = np.maximum(1, np.floor(w / w.sum() * total)).astype(int)
    out[-1] += total - int(out.sum())
    return [int(v) for v in out]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    import explorer as ex
    from explorer.bench.timing import Flusher, time_cuda
    from explorer.presets import PRESETS

    text = PRESETS[PRESET]
    lengths = lengths_of(args.sequences, args.total, args.seed)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    D, N, T, S, Lmax = args.channels, 16, args.total, args.sequences, max(lengths)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "lengths": lengths,
                              "channels": D, "N": N, "total": T, "rows": []}
    print(f"GPU: {report['device']}; {S} sequences x {D} channels, N={N}, lengths {lengths} "
          f"(total {T}, longest {Lmax}: padded {S * Lmax} steps, {S * Lmax / T:.2f}x)")
    g = torch.Generator(device="cuda").manual_seed(args.seed)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, generator=g, device="cuda") * scale
    packed = {"x": randn(1, D, T), "dt": randn(1, D, T, scale=0.5) - 1.0, "z": randn(1, D, T),
              "B": randn(1, 1, N, T), "C": randn(1, 1, N, T),
              "A": -torch.rand(D, N, generator=g, device="cuda") * 2.0 - 0.1,
              "D": randn(D), "dt_bias": randn(D, scale=0.1)}
    padded = {n: v for n, v in packed.items() if n in ("A", "D", "dt_bias")}
    for n in ("x", "dt", "z", "B", "C"):
        v = packed[n]
        out = torch.zeros((S, *v.shape[1:-1], Lmax), device="cuda")
        for j in range(S):
            out[j, ..., :lengths[j]] = v[0, ..., cu[j]:cu[j + 1]]
        padded[n] = out
    offsets = torch.as_tensor(cu, device="cuda")
    flush = Flusher()
    for s in args.strategies:
        kp = ex.load(args.artifacts / f"packed-{s}")
        kd = ex.load(args.artifacts / f"padded-{s}")
        yp = kp(**packed, cu_seqlens=offsets)
        yd = kd(**padded)
        err = _check(text, packed, yp, cu, args.sampled)
        agree = max(float((yd[j, :, :lengths[j]] - yp[0, :, cu[j]:cu[j + 1]]).abs().max()
                          / yp[0, :, cu[j]:cu[j + 1]].abs().max()) for j in range(S))
        row: dict[str, Any] = {"strategy": s, "packed_err": err, "padded_vs_packed": agree}
        print(f"{s}: packed y vs float64 (sampled) {err:.1e}; padded vs packed {agree:.1e}")
        if err > CHECK_TOL or agree > CHECK_TOL:
            row["skipped"] = "wrong"
            report["rows"].append(row)
            continue
        pp = kp.prepare(**packed, cu_seqlens=offsets)
        pd = kd.prepare(**padded)
        # the chunk length each call chose (the chunk rule) and the kernels it launches
        for what, run in (("packed", pp), ("padded", pd)):
            row[f"{what}_time_chunk"] = run.sizes.get("time_chunk")
            row[f"{what}_kernels"] = [k.name for k, *_ in run._bound]
            print(f"  {what}: time_chunk {row[f'{what}_time_chunk']}, kernels "
                  f"{', '.join(row[f'{what}_kernels'])}")
        t = {"packed kernels": time_cuda(pp.launch, flush=flush).median_ms,
             "padded kernels": time_cuda(pd.launch, flush=flush).median_ms,
             "packed call": time_cuda(partial(kp, **packed, cu_seqlens=offsets),
                                      flush=flush).median_ms,
             "padded call": time_cuda(partial(kd, **padded), flush=flush).median_ms}
        row.update({k.replace(" ", "_").replace("=", "_") + "_ms": v for k, v in t.items()})
        row["kernels_padded_over_packed"] = t["padded kernels"] / t["packed kernels"]
        row["call_padded_over_packed"] = t["padded call"] / t["packed call"]
        # the packed kernels with chunk lengths forced (the chunk rule counts C * N lane
        # sequences, while the lane loop's grid has a block per channel and chunk)
        for tc in args.time_chunk if s != "sequential" else ():
            forced = kp.prepare(**packed, cu_seqlens=offsets, time_chunk=tc)
            forced.launch()
            yf = forced.result()
            if float((yf - yp).abs().max() / yp.abs().max()) > CHECK_TOL:
                raise SystemExit(f"packed {s} with time_chunk={tc} disagrees")
            t[f"packed kernels tc={tc}"] = time_cuda(forced.launch, flush=flush).median_ms
            del forced, yf
        for k, v in t.items():
            print(f"  {k:<24} {v:9.3f} ms")
        print(f"  padded / packed: kernels {row['kernels_padded_over_packed']:.2f}x, "
              f"call {row['call_padded_over_packed']:.2f}x")
        report["rows"].append(row)
        del pp, pd, yp, yd
        torch.cuda.empty_cache()
    return report


def _check(text: str, packed: dict[str, Any], y: Any, cu: Any, sampled: int) -> float:
    """max relative error of the packed y against float64, on a few channels of the shortest
    and the last sequence, each run alone."""
    import numpy as np

    import explorer as ex

    D = packed["x"].shape[1]
    lengths = np.diff(cu)
    worst = 0.0
    for j in sorted({int(np.argmin(lengths)), len(lengths) - 1}):
        s, e = int(cu[j]), int(cu[j + 1])
        for d in np.linspace(0, D - 1, sampled).astype(int):
            def host(v: Any) -> Any:
                return v.detach().double().cpu().numpy()
            ref = ex.reference(text, x=host(packed["x"][0, d, s:e]),
                               dt=host(packed["dt"][0, d, s:e]), z=host(packed["z"][0, d, s:e]),
                               B=host(packed["B"][0, 0, :, s:e]), C=host(packed["C"][0, 0, :, s:e]),
                               A=host(packed["A"][d]), D=float(packed["D"][d]),
                               dt_bias=float(packed["dt_bias"][d]))["y"]
            got = y[0, d, s:e].detach().double().cpu().numpy()
            worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)))
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, help="compile the artifacts into this folder")
    p.add_argument("--artifacts", type=Path, help="run: the folder --build wrote")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--total", type=parse_count, default=2**17)
    p.add_argument("--channels", type=int, default=1536)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampled", type=int, default=3, help="channels checked per sequence")
    p.add_argument("--time-chunk", default="", help="comma list: also time the packed tree "
                   "kernels with these chunk lengths forced (multiples of the tile)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.strategies = tuple(args.strategies.split(","))
    args.time_chunk = [parse_count(v) for v in args.time_chunk.split(",") if v]
    if args.build is not None:
        build(args.build, args.strategies)
        return 0
    if args.artifacts is None:
        p.error("give --build (here) or --artifacts (on the GPU)")
    report = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
