"""Host time of the torch operator (``compiled.torch()``): forward and backward calls on CUDA
tensors, timed back to back (what the host spends enqueueing them; the fastest of several
rounds) and one at a time with CUDA events (median).

    python bench/grad_speed.py --build .artifacts/grad           # here: forward + adjoint records
    python bench/op_host.py --records .artifacts/grad            # GPU: numpy, sympy, cupy, torch

Problems: the affine scan at 4096 x 1024 and the selective scan at 2 x 512 x 16 x 1024 (the
small shapes of ``grad_speed.py``, where a call is bound by its host time).  For the affine scan
also the parts of its backward: with the eager formulas (``never``) and the traced ones
(``traced``, :mod:`explorer.fused_backward`; with the adjoint's launch plan bound and without),
accelerated-scan's backward where it is installed, the adjoint's runner alone, and the autograd
engine's floor (a Python autograd function that hands its gradient back).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: rounds of ``n`` calls; the fastest round is reported (the host's own noise, other processes
#: and frequency changes, only ever adds time)
ROUNDS = 7


def timed(label: str, fn: Callable[[], Any], n: int = 100) -> dict[str, float]:
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rounds.append((t1 - t0, t2 - t0))
    enqueue, wall = min(r[0] for r in rounds), min(r[1] for r in rounds)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one = []
    for _ in range(31):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        one.append(start.elapsed_time(end) * 1e3)
    one.sort()
    row = {"enqueue_us": 1e6 * enqueue / n, "back_to_back_us": 1e6 * wall / n,
           "one_call_us": one[len(one) // 2]}
    print(f"  {label:<9} enqueue {row['enqueue_us']:7.0f} us   back to back "
          f"{row['back_to_back_us']:7.0f} us   one call (events) {row['one_call_us']:7.0f} us")
    return row


def run(records: Path) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from grad_speed import record_op

    texts = list(json.loads((records / "index.json").read_text()))

    def op_of(text: str) -> Any:
        return record_op(records, text)

    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    op = op_of(texts[0])
    a = torch.rand(4096, 1024, device="cuda", requires_grad=True)
    b = torch.randn(4096, 1024, device="cuda", requires_grad=True)
    y = op(a=a, b=b)
    g = torch.randn_like(y)
    print("affine 4096 x 1024")
    report["affine 4096x1024"] = {
        "forward": timed("forward", lambda: op(a=a, b=b)),
        "backward": timed("backward", lambda: torch.autograd.grad(y, (a, b), g,
                                                                 retain_graph=True))}
    # the backward's parts: each policy of its formulas, the adjoint's runner alone, and the
    # autograd engine's floor (a Python autograd function that hands its gradient back)
    before = op.fuse_backward
    for policy in ("never", "traced"):
        def backward(policy: str = policy) -> Any:
            op.fuse_backward = policy
            return torch.autograd.grad(y, (a, b), g, retain_graph=True)
        report["affine 4096x1024"][f"backward {policy}"] = timed(policy[:9], backward)
    # the traced backward without its bound launch plan (a second graph, traced while the
    # runner binds nothing), the two graphs taking turns with the rest
    from explorer.torch_runner import Runner

    op.fuse_backward = "traced"
    torch.autograd.grad(y, (a, b), g, retain_graph=True)
    key, bound = next((k, r) for k, r in op.fused._fused.items() if k[0] == "traced")
    bind = Runner.bind
    Runner.bind = lambda self, *args: None   # type: ignore[method-assign]
    try:
        del op.fused._fused[key]
        torch.autograd.grad(y, (a, b), g, retain_graph=True)
        unbound = op.fused._fused[key]
    finally:
        Runner.bind = bind   # type: ignore[method-assign]

    def graph(run: Any) -> Callable[[], Any]:
        def backward() -> Any:
            op.fused._fused[key] = run
            return torch.autograd.grad(y, (a, b), g, retain_graph=True)
        return backward

    report["affine 4096x1024"]["backward traced, unbound"] = timed("unbound", graph(unbound))
    report["affine 4096x1024"]["backward traced, bound"] = timed("bound", graph(bound))
    op.fuse_backward = before
    try:   # accelerated-scan's backward, launched as grad_speed.py launches it
        from grad_speed import _accelerated

        scan = _accelerated("scalar")
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        h2 = scan(a2, b2)
        report["affine 4096x1024"]["accelerated-scan"] = timed(
            "acc-scan", lambda: torch.autograd.grad(h2, (a2, b2), g, retain_graph=True))
    except Exception as err:  # noqa: BLE001 - a missing peer is reported, not fatal
        print(f"  accelerated-scan skipped: {type(err).__name__}: {err}"[:200])
    ad, yd = a.detach(), y.detach()
    report["affine 4096x1024"]["adjoint runner"] = timed(
        "adjoint", lambda: op.adjoint_runner(ad, g, yd, None))

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 1.0

        @staticmethod
        def backward(ctx: Any, gx: Any) -> Any:
            return gx

    z = Identity.apply(a)
    report["affine 4096x1024"]["engine floor"] = timed(
        "floor", lambda: torch.autograd.grad(z, (a,), g, retain_graph=True))
    op = op_of(texts[1])
    Bt, D, N, L = 2, 512, 16, 1024
    xs = {"dt": (torch.rand(Bt, D, L, device="cuda") * 0.1).requires_grad_(),
          "A": (-torch.rand(D, N, device="cuda")).requires_grad_(),
          "B": torch.randn(Bt, 1, N, L, device="cuda").requires_grad_(),
          "x": torch.randn(Bt, D, L, device="cuda").requires_grad_(),
          "C": torch.randn(Bt, 1, N, L, device="cuda").requires_grad_(),
          "D": torch.randn(D, device="cuda").requires_grad_()}
    yy = op(**xs)["y"]
    gy = torch.randn_like(yy)
    print("selective 2 x 512 x 16 x 1024")
    report["selective 2x512x16x1024"] = {
        "forward": timed("forward", lambda: op(**xs)),
        "backward": timed("backward", lambda: torch.autograd.grad(
            yy, list(xs.values()), gy, retain_graph=True))}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, required=True,
                    help="folder of `grad_speed.py --build` (its index.json)")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)
    report = run(args.records)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
