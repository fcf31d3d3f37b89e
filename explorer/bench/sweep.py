"""The benchmark loop: for each size, check every method against float64, then time it.

``sweep(...)`` is a generator yielding one :class:`Record` at a time, so a notebook widget can
draw results as they arrive and stop the sweep (``stop=threading.Event()`` set, or simply stop
iterating).  ``run(...)`` collects a whole sweep.  Per size the order is: inputs and the float64
reference, the copy roofline, the baselines, the generated kernels (so a generated kernel's
ratio to the best baseline is final when it is yielded).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorer.bench.affine import TOLERANCE, affine_scan_f64, max_rel_error, random_problem
from explorer.bench.generated import generated
from explorer.bench.methods import COPY, Method, Prepared, Problem, Skip, baselines
from explorer.bench.results import Record, finalize, gbps
from explorer.bench.timing import Flusher, time_cuda, time_host
from explorer.runtime.dtypes import from_storage, to_storage

ProgressFn = Callable[[int, int, Record], None]


def parse_sizes(text: str | Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``"4096x1024,16x2^20"`` (or pairs) -> ``[(4096, 1024), (16, 1048576)]``."""
    if not isinstance(text, str):
        return [(int(c), int(n)) for c, n in text]
    sizes = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if part.count("x") != 1:
            raise ValueError(f"a size is CxL, e.g. 4096x1024 or 1x2^26; got {part!r}")
        c, n = part.split("x")
        sizes.append((parse_count(c), parse_count(n)))
    if not sizes:
        raise ValueError("no sizes given")
    return sizes


def parse_count(text: str) -> int:
    """A positive integer written ``131072``, ``2^17`` or ``2**17``; ValueError otherwise."""
    try:
        if "^" in text:
            base, exp = text.split("^")
            value = int(base) ** int(exp)
        elif "**" in text:
            base, exp = text.split("**")
            value = int(base) ** int(exp)
        else:
            value = int(text)
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"sizes must be positive, got {text!r}")
    return value


class _Printer:
    """The progress display when tqdm is absent: one line per record on stderr."""

    def __init__(self, total: int) -> None:
        self.total = total

    def __call__(self, done: int, total: int, rec: Record) -> None:
        what = (f"{rec.time_ms:.4f} ms, {rec.gbps:.0f} GB/s" if rec.status == "ok" and
                rec.time_ms and rec.gbps else f"{rec.status}: {rec.reason}")
        print(f"[{done}/{total}] {rec.C}x{rec.L} {rec.method}: {what}", file=sys.stderr,
              flush=True)

    def close(self) -> None:
        pass


class _Tqdm:
    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="run")

    def __call__(self, done: int, total: int, rec: Record) -> None:
        self.bar.set_postfix_str(f"{rec.C}x{rec.L} {rec.method} {rec.status}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def progress_display(total: int) -> Any:
    """tqdm when it imports, else a plain printer."""
    try:
        return _Tqdm(total)
    except Exception:
        return _Printer(total)


@dataclass
class Options:
    tolerance: float = TOLERANCE
    #: the dtype of the inputs (float32, bfloat16, float16): methods that cannot run in it are
    #: skipped; the reference is that of the inputs rounded to it
    dtype: str = "float32"
    warmup: int = 3
    budget_ms: float = 300.0
    min_reps: int = 5
    max_reps: int = 100
    flush_l2: bool = True
    seed: int = 0
    slow_s: float = 1.0  # a check run longer than this: no more warm-up, slow_reps repetitions
    slow_reps: int = 3


def distinct_names(methods: list[Method]) -> list[Method]:
    """Two artifacts of one strategy are told apart by their folder names."""
    names = [m.name for m in methods]
    for m, name in zip(methods, names):
        if names.count(name) > 1:
            m.name = f"{name} ({Path(m.artifact or '').name})"
    return methods


def _to_cupy(x: Any) -> Any:
    import cupy as cp

    if isinstance(x, cp.ndarray):
        return x
    if str(getattr(x, "dtype", "")) == "torch.bfloat16":   # CuPy has no bfloat16
        x = x.float()
    return cp.from_dlpack(x)


def _release() -> None:
    gc.collect()
    try:
        import cupy as cp

        cp.get_default_memory_pool().free_all_blocks()
    except Exception:
        pass
    if "torch" in sys.modules:
        try:
            sys.modules["torch"].cuda.empty_cache()
        except Exception:
            pass


def _call(prepared: Prepared, cp: Any) -> tuple[Any, float]:
    """One call of a prepared method, waited for: (its output, seconds)."""
    t0 = time.perf_counter()
    got = prepared.run()
    if prepared.block is not None:
        prepared.block(got)
    cp.cuda.get_current_stream().synchronize()
    return got, time.perf_counter() - t0


def _measure(method: Method, problem: Problem, ref: Any, opts: Options,
             flusher: Flusher | None) -> Record:
    import cupy as cp

    rec = Record(method=method.name, kind=method.kind, C=problem.C, L=problem.L, status="ok")
    t0 = time.perf_counter()
    prepared: Prepared | None = None
    if problem.dtype not in method.dtypes:
        rec.status, rec.reason = "skipped", f"runs in {', '.join(method.dtypes)} only"
        return rec
    try:
        prepared = method.setup(problem)
        rec.note = prepared.note
        if prepared.kernels:
            rec.extra["kernels"] = list(prepared.kernels)
        check_s = 0.0
        if method.kind != "roofline":
            got, check_s = _call(prepared, cp)
            rec.setup_s = time.perf_counter() - t0
            if check_s > opts.slow_s:
                # the first call may have compiled something (torch.compile, jit): a second
                # call says whether the launches themselves are slow
                got, check_s = _call(prepared, cp)
            if prepared.check is not None:
                err = prepared.check()
            else:
                err = max_rel_error(_to_cupy(prepared.output()), ref, xp=cp)
            rec.max_rel_err = err
            if not err <= opts.tolerance:
                rec.status = "wrong"
                rec.reason = f"wrong: max rel err {err:.2e} > {opts.tolerance:.0e}"
                return rec
        else:
            rec.setup_s = time.perf_counter() - t0
        budget = prepared.budget_ms or opts.budget_ms
        warmup, min_reps, max_reps = opts.warmup, opts.min_reps, opts.max_reps
        if check_s > opts.slow_s:
            # seconds a launch (a sequential walk over 2**26 steps): the check run was the
            # warm-up, and a few repetitions say enough
            warmup, min_reps, max_reps = 0, opts.slow_reps, opts.slow_reps
            rec.extra["slow_path"] = (f"a launch took {check_s:.1f} s: no more warm-up, "
                                      f"{opts.slow_reps} repetitions")
        if prepared.timer == "host":
            block = prepared.block or (lambda r: r)
            timing = time_host(prepared.run, block, warmup, budget, min_reps, max_reps, flusher)
        else:
            timing = time_cuda(prepared.run, warmup, budget, min_reps, max_reps, flusher)
        rec.time_ms = timing.median_ms
        rec.bytes_moved = prepared.bytes_moved or (problem.bytes if problem.dtype != "float32"
                                                   else None)
        rec.gbps = gbps(problem.C, problem.L, timing.median_ms, rec.bytes_moved)
        rec.timer = timing.timer
        rec.reps = timing.reps
        rec.spread = timing.spread
    except Skip as why:
        rec.status, rec.reason = "skipped", f"skipped: {why}"
    except Exception as err:  # a failing peer must not end the sweep
        rec.status = "error"
        rec.reason = f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    finally:
        if prepared is not None and prepared.cleanup is not None:
            try:
                prepared.cleanup()
            except Exception:
                pass
        del prepared
        _release()
    return rec


def sweep(sizes: str | Sequence[tuple[int, int]], artifacts: Sequence[str] = (),
          baseline_names: str | list[str] | None = None, include_copy: bool = True,
          options: Options | None = None, progress: bool | ProgressFn | None = None,
          stop: Any = None, methods: Sequence[Method] | None = None,
          state_size: int = 16) -> Iterator[Record]:
    """Yield one :class:`Record` per (size, method), checked then timed.

    ``sizes``: ``"4096x1024,16x2^20"`` or ``[(C, L), ...]``.  ``artifacts``: directories written
    by ``scanweaver compile`` (a recurrence other than the affine scan is timed on its own
    inputs, ``state_size`` lanes for vector states).  ``baseline_names``: names or aliases (see
    :func:`explorer.bench.methods.baselines`), None for all.  ``progress``: True for a bar (tqdm
    when present), or a callable ``(done, total, record)``.  ``stop``: an object with
    ``is_set()`` (``threading.Event``) or a callable; the sweep ends before the next method once
    it is true.
    """
    import cupy as cp

    opts = options or Options()
    size_list = parse_sizes(sizes)
    if methods is None:
        chosen = ([COPY] if include_copy else []) + baselines(baseline_names)
        chosen += distinct_names([generated(p, state_size=state_size) for p in artifacts])
    else:
        chosen = list(methods)
    total = len(size_list) * len(chosen)
    display: Any = None
    if progress is True:
        display = progress_display(total)
        report: ProgressFn | None = display
    elif callable(progress):
        report = progress
    else:
        report = None

    def stopped() -> bool:
        if stop is None:
            return False
        if hasattr(stop, "is_set"):
            return bool(stop.is_set())
        return bool(stop())

    flusher = Flusher() if opts.flush_l2 else None
    done = 0
    try:
        for index, (C, L) in enumerate(size_list):
            if stopped():
                return
            group: list[Record] = []
            try:
                a, b = random_problem(C, L, seed=opts.seed + index, xp=cp)
                if opts.dtype != "float32":   # rounded to the dtype: what every method reads
                    a, b = (to_storage(n, x, opts.dtype, cp) for n, x in (("a", a), ("b", b)))
                ref = affine_scan_f64(from_storage(a, opts.dtype, cp),
                                      from_storage(b, opts.dtype, cp), xp=cp)
                _release()
                problem = Problem(C, L, a, b, ref, dtype=opts.dtype)
            except Exception as err:  # out of memory, typically
                reason = f"skipped: inputs or reference failed ({type(err).__name__}: {err})"
                for m in chosen:
                    rec = Record(m.name, m.kind, C, L, "skipped", reason=reason)
                    done += 1
                    if report:
                        report(done, total, rec)
                    yield rec
                _release()
                continue
            for m in chosen:
                if stopped():
                    return
                rec = _measure(m, problem, ref, opts, flusher)
                group.append(rec)
                finalize(group)
                done += 1
                if report:
                    report(done, total, rec)
                yield rec
            del problem, a, b, ref
            _release()
    finally:
        if display is not None:
            display.close()


@dataclass
class BenchResult:
    records: list[Record]
    environment: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def table(self, title: str | None = None) -> str:
        from explorer.bench.results import format_table

        return format_table(self.records, title)

    def save_json(self, path: str) -> Any:
        from explorer.bench.results import save_json

        return save_json(path, self.records, self.environment, self.meta)

    def save_html(self, path: str, title: str | None = None) -> Any:
        from explorer.bench.results import save_html

        return save_html(path, self.records, title)

    def figure(self, title: str | None = None) -> Any:
        from explorer.bench.results import figure

        return figure(self.records, title)


def run(sizes: str | Sequence[tuple[int, int]], artifacts: Sequence[str] = (),
        baseline_names: str | list[str] | None = None, **kwargs: Any) -> BenchResult:
    """A whole sweep, collected; the environment (GPU, driver, versions) is recorded."""
    from explorer.bench.results import environment

    records = finalize(list(sweep(sizes, artifacts, baseline_names, **kwargs)))
    meta = run_meta(sizes, artifacts, kwargs.get("options") or Options())
    return BenchResult(records, environment(), meta)


def run_meta(sizes: str | Sequence[tuple[int, int]], artifacts: Sequence[str],
             opts: Options) -> dict[str, Any]:
    """How a sweep was run, for the JSON file."""
    return {"sizes": [list(s) for s in parse_sizes(sizes)], "artifacts": list(artifacts),
            "tolerance": opts.tolerance, "l2_flush": opts.flush_l2, "seed": opts.seed,
            "budget_ms": opts.budget_ms, "warmup": opts.warmup, "slow_s": opts.slow_s,
            "slow_reps": opts.slow_reps, "outputs_poisoned_with_nan": True,
            "dtype": opts.dtype,
            "time_unit": "ms (median of the repetitions)"}


__all__ = ["BenchResult", "Options", "parse_sizes", "progress_display", "run", "sweep"]
