"""Benchmark results: one record per (size, method), the summary table, JSON and the figure.

Nothing here touches the GPU: records can be built, formatted and saved anywhere (the unit tests
do).  Ratios follow the design notes: ``of_copy`` is the copy's time over the method's time (the
fraction of the memory roofline reached; 1.0 means as fast as a copy of the same bytes; for a
recurrence other than the affine scan it is the ratio of bandwidths), and
``vs_best`` is the best correct baseline's time over the method's time (above 1.0: faster than
every baseline at that size).
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("ok", "wrong", "skipped", "error")


@dataclass
class Record:
    """The outcome of one method at one size."""

    method: str
    kind: str  # "roofline" | "baseline" | "generated"
    C: int
    L: int
    status: str  # "ok" | "wrong" | "skipped" | "error"
    time_ms: float | None = None
    gbps: float | None = None
    of_copy: float | None = None
    vs_best: float | None = None
    max_rel_err: float | None = None
    reason: str = ""
    timer: str = ""
    reps: int = 0
    spread: float | None = None
    setup_s: float | None = None
    bytes_moved: int | None = None  # None: the affine scan's 12 bytes an element
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> tuple[int, int]:
        return (self.C, self.L)

    @property
    def bytes(self) -> int:
        return self.bytes_moved if self.bytes_moved is not None else 12 * self.C * self.L

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        known = {f for f in cls.__dataclass_fields__}
        data = {k: v for k, v in d.items() if k in known}
        for k in ("time_ms", "gbps", "of_copy", "vs_best", "max_rel_err", "spread", "setup_s"):
            if isinstance(data.get(k), str):
                data[k] = float(data[k])
        return cls(**data)


def gbps(C: int, L: int, time_ms: float, nbytes: int | None = None) -> float:
    """Effective bandwidth in GB/s: ``nbytes`` (default 12 bytes an element: read a, b; write h)
    over the time."""
    moved = 12 * C * L if nbytes is None else nbytes
    return moved / (time_ms * 1e-3) / 1e9


def finalize(records: Sequence[Record]) -> list[Record]:
    """Fill ``of_copy`` and ``vs_best`` of every timed record from the others at its size."""
    by_size: dict[tuple[int, int], list[Record]] = {}
    for r in records:
        by_size.setdefault(r.size, []).append(r)
    for group in by_size.values():
        copy = [r.gbps for r in group if r.kind == "roofline" and r.status == "ok" and r.gbps]
        base = [r.time_ms for r in group if r.kind == "baseline" and r.status == "ok"
                and r.time_ms]
        for r in group:
            if r.status != "ok" or not r.time_ms:
                continue
            # bandwidth over the copy's: the copy's time over this one's when the bytes agree
            r.of_copy = r.gbps / copy[0] if copy and r.gbps else None
            same_problem = r.bytes_moved is None
            r.vs_best = (min(base) / r.time_ms if base and r.kind != "roofline" and same_problem
                         else None)
    return list(records)


def best_baseline(records: Iterable[Record], C: int, L: int) -> Record | None:
    ok = [r for r in records if r.size == (C, L) and r.kind == "baseline" and r.status == "ok"
          and r.time_ms]
    return min(ok, key=lambda r: r.time_ms or math.inf) if ok else None


# --- the table -------------------------------------------------------------------------------

def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _size(C: int, L: int) -> str:
    def short(n: int) -> str:
        if n >= 1 << 10 and n & (n - 1) == 0:
            return f"2^{n.bit_length() - 1}"
        return str(n)

    return f"{C}x{short(L)}"


def kernels_text(ran: Any) -> str:
    """``"ran <kernels>"``: the kernels a measurement ran (a record's ``extra.kernels``);
    empty where it names none, or where a file read back holds anything else there."""
    if isinstance(ran, list | tuple) and ran and all(isinstance(k, str) for k in ran):
        return "ran " + " + ".join(k[:60] for k in ran[:8])
    return ""


def _ran(r: Record) -> str:
    """``"; ran <kernels>"`` of a record (:func:`kernels_text`), or empty."""
    text = kernels_text(r.extra.get("kernels") if isinstance(r.extra, dict) else None)
    return f"; {text}" if text else ""


def format_table(records: Sequence[Record], title: str | None = None) -> str:
    """A plain-text table, one row per record, grouped by size in the order given."""
    finalize(records)
    head = ("size (CxL)", "method", "status", "time ms", "GB/s", "of copy", "vs best base",
            "max rel err", "note")
    rows: list[tuple[str, ...]] = []
    for r in records:
        if r.status == "ok":
            note = f"{r.reps} reps, {r.timer}{_ran(r)}"
        else:
            note = r.reason
        rows.append((
            _size(r.C, r.L), r.method, r.status,
            _fmt(r.time_ms, ".4f"), _fmt(r.gbps, ".1f"), _fmt(r.of_copy, ".3f"),
            _fmt(r.vs_best, ".3f"),
            _fmt(r.max_rel_err, ".1e") if r.max_rel_err is not None else "-", note))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    widths[-1] = min(widths[-1], 70)

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            c = c if len(c) <= widths[i] else c[: widths[i] - 3] + "..."
            out.append(c.rjust(widths[i]) if 3 <= i <= 7 else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    text = [title] if title else []
    text += [line(head), line(["-" * w for w in widths])]
    last = None
    for r, row in zip(records, rows):
        if last is not None and r.size != last:
            text.append("")
        last = r.size
        text.append(line(row))
    return "\n".join(text)


# --- environment and JSON --------------------------------------------------------------------

def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def environment() -> dict[str, Any]:
    """GPU name, driver and CUDA versions, library versions (what the numbers depend on)."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import cupy as cp

        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        env["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        env["compute_capability"] = f"{props['major']}.{props['minor']}"
        env["multiprocessors"] = int(props["multiProcessorCount"])
        env["l2_bytes"] = int(props["l2CacheSize"])
        env["memory_bytes"] = int(props["totalGlobalMem"])
        env["cuda_driver_api"] = int(cp.cuda.runtime.driverGetVersion())
        env["cuda_runtime"] = int(cp.cuda.runtime.runtimeGetVersion())
    except Exception as err:
        env["gpu"] = None
        env["gpu_error"] = str(err)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        if out.returncode == 0:
            env["driver"] = out.stdout.strip().splitlines()[0].split(",")[0].strip()
    except Exception:
        pass
    libs = {}
    for dist in ("numpy", "cupy-cuda13x", "cupy-cuda12x", "cupy", "torch", "triton", "jax",
                 "jaxlib", "cuda-cccl", "numba", "numba-cuda", "accelerated-scan",
                 "scanweaver-explorer"):
        v = _version(dist)
        if v:
            libs[dist] = v
    try:
        import explorer

        libs.setdefault("explorer", explorer.__version__)
    except Exception:
        pass
    env["libraries"] = libs
    return env


def to_json(records: Sequence[Record], env: dict[str, Any] | None = None,
            meta: dict[str, Any] | None = None) -> dict[str, Any]:
    finalize(records)
    return {"format": "scanweaver-bench/1",
            "bytes_per_element": 12,
            "definitions": {
                "gbps": "bytes moved / median time; 12 bytes an element (read a, b; write h) "
                        "for the affine scan, inputs + outputs for other recurrences "
                        "(bytes_moved)",
                "of_copy": "method GB/s / copy GB/s (for the affine scan: copy time / method time; "
                           "1.0 = as fast as a copy of the same bytes)",
                "vs_best": "best correct baseline's time / method time (> 1: faster)",
                "max_rel_err": "max|out - ref| / max|ref| against a float64 reference",
            },
            "environment": env if env is not None else environment(),
            "meta": meta or {},
            "results": [r.as_dict() for r in records]}


def save_json(path: str | os.PathLike[str], records: Sequence[Record],
              env: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(to_json(records, env, meta), indent=2) + "\n")
    return p


def load_json(path: str | os.PathLike[str]) -> tuple[list[Record], dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    return [Record.from_dict(r) for r in data["results"]], data.get("environment", {})


# --- the figure ------------------------------------------------------------------------------

def figure(records: Sequence[Record], title: str | None = None) -> Any:
    """A plotly figure: GB/s against L, one line per method, the copy roofline dashed."""
    import plotly.graph_objects as go

    finalize(records)
    fig = go.Figure()
    methods: list[str] = []
    for r in records:
        if r.method not in methods:
            methods.append(r.method)
    for m in methods:
        rows = sorted((r for r in records if r.method == m and r.status == "ok" and r.gbps),
                      key=lambda r: (r.L, r.C))
        if not rows:
            continue
        roof = rows[0].kind == "roofline"
        fig.add_trace(go.Scatter(
            x=[r.L for r in rows], y=[r.gbps for r in rows], name=m,
            mode="lines+markers",
            line={"dash": "dash", "color": "black", "width": 3} if roof else {},
            text=[f"C={r.C}, L={r.L}<br>{r.time_ms:.4f} ms"
                  + (f"<br>{r.of_copy:.2f} of copy" if r.of_copy else "") for r in rows],
            hovertemplate="%{text}<br>%{y:.0f} GB/s<extra>" + m + "</extra>"))
    fig.update_layout(title=title or "Affine scan: effective bandwidth (12 B/element)",
                      xaxis={"title": "sequence length L (channels C in the hover text)",
                             "type": "log"},
                      yaxis={"title": "GB/s", "rangemode": "tozero"},
                      template="plotly_white", legend={"title": "method"})
    return fig


def save_html(path: str | os.PathLike[str], records: Sequence[Record],
              title: str | None = None, include_plotlyjs: bool | str = True) -> Path:
    """Write the figure as a standalone HTML page (plotly.js embedded unless told "cdn")."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    figure(records, title).write_html(str(p), include_plotlyjs=include_plotlyjs)
    return p
