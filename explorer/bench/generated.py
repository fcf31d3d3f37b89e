"""What the benchmark runs of ours: a compiled artifact, timed beside the baselines.

The plain affine scan runs on the sweep's ``(a, b)``; any other recurrence (the selective scan,
say) runs on its own random inputs and is checked against the float64 reference, on a sample of
it past :data:`GENERAL_REFERENCE_MAX` elements (:class:`GeneralProblem`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorer.bench.affine import affine_roles
from explorer.bench.methods import Method, Prepared, Problem, Skip


def artifact_roles(art: Any) -> tuple[str, str, str]:
    """(state, a, b) for an artifact whose recurrence decomposes into the scalar affine scan
    (:func:`explorer.bench.affine.affine_roles`); Skip for anything else."""
    roles = affine_roles(art.recurrence)
    if roles is None:
        raise Skip(f"the benchmark times the scalar affine scan h[t] = a[t]*h[t-1] + b[t]; "
                   f"this artifact computes {art.recurrence!r}")
    return roles


def reversed_in_time(art: Any) -> bool:
    """True for an artifact compiled with ``reverse=True``: ``h[t] = A_t h[t+1] + b_t``, the
    forward scan of the inputs flipped in time, flipped back."""
    return bool(art.options.get("reverse", False))


#: the CPU float64 reference of a general recurrence covers at most this many elements: beyond
#: it, a sample of the channels (and, if one channel is too long, the first steps) is checked
GENERAL_REFERENCE_MAX = 1 << 24


def generated(path: str | os.PathLike[str], name: str | None = None,
              state_size: int = 16) -> Method:
    """A method running a compiled artifact through :class:`explorer.runtime.cuda.CudaKernel`.

    The plain affine scan runs on the sweep's ``(a, b)``, beside the baselines (compiled with
    ``reverse=True`` it checks itself against the reference of the flipped sequence).  Any
    other recurrence (the selective scan, say) runs on its own random inputs (``state_size``
    lanes for vector states), is checked against :func:`explorer.reference` (float64, CPU), and
    counts the bytes of all its inputs and outputs; no baseline solves that problem.
    """
    from explorer.runtime.artifact import load_artifact

    art = load_artifact(path)
    label = name or f"scanweaver-{art.strategy or Path(path).name}"
    try:
        state, a_name, b_name = artifact_roles(art)
        if art.options.get("read_offsets"):
            raise Skip("reads inputs at other times (read_offsets)")
        if art.outputs and art.outputs[0] != state:
            # the affine path compares the state's whole trajectory: a compile storing its
            # last state alone goes the general way (which says what it can check)
            raise Skip(f"stores {', '.join(art.outputs)}, not the trajectory of {state}")
    except Skip:
        return Method(label, "generated", lambda p: _general_setup(art, p, state_size),
                      art.describe(), artifact=str(path))
    reverse = reversed_in_time(art)

    def setup(p: Problem) -> Prepared:
        if art.dtype != p.dtype:
            raise Skip(f"compiled for {art.dtype} inputs, not {p.dtype} (compile with "
                       f"dtype={p.dtype!r})")
        import cupy as cp

        from explorer.bench.affine import affine_scan_f64, max_rel_error
        from explorer.runtime.cuda import CudaKernel
        from explorer.runtime.dtypes import from_storage

        kernel = CudaKernel.from_artifact(art, poison=True)
        # 16-bit inputs as torch tensors of their dtype (read where they are, no rounding)
        a, b = (p.a, p.b) if p.dtype == "float32" else (p.torch("a"), p.torch("b"))
        launch = kernel.prepare(**{a_name: a, b_name: b})
        out_name = kernel.output_names[0]
        out_dtype = kernel.narrow.get(out_name, "float32")

        def output() -> Any:
            return from_storage(launch.outputs[out_name], out_dtype, cp).reshape(p.C, p.L)

        check = None
        if reverse:
            ref = affine_scan_f64(p.a[:, ::-1], p.b[:, ::-1], xp=cp)[:, ::-1]

            def check() -> float:
                return max_rel_error(output(), ref, xp=cp)

        return Prepared(launch.launch, output, note=art.describe(), check=check,
                        kernels=kernels_run(art, launch))

    return Method(label, "generated", setup, art.describe(), artifact=str(path),
                  dtypes=(art.dtype,))


def kernels_run(art: Any, launch: Any) -> tuple[str, ...]:
    """Which of the artifact's kernels a call launches (by the manifest's launch bounds for
    its length): the short, plain, look-back or chunked ones."""
    return tuple(k.name.removeprefix("scanweaver_") for k in art.kernels
                 if k.launched(launch.L, launch.sizes))


@dataclass
class GeneralProblem:
    """Inputs and float64 reference of a recurrence other than the affine scan, for one size.

    The reference covers the channels ``channels`` over the steps ``steps`` of the full
    ``(C, L)`` problem (all of it when it is small enough): channels are independent, and the
    first steps of a scan (the last, scanning backwards) depend on those steps' inputs alone.
    """

    arrays: dict[str, Any]      # NumPy float32, time the last axis
    L: int | None               # the length to pass: only when no input is indexed by time
    refs: dict[str, Any]        # output name -> float64 reference of the sample
    lanes: int                  # N for a vector state, else 1
    C: int = 0
    length: int = 0             # the full problem's L
    channels: Any = None        # the sampled channels (an index array), None: all
    steps: slice = field(default_factory=lambda: slice(None))  # the sampled steps

    def sample(self, full: Any, name: str) -> Any:
        """The sampled part of the output ``name``, given the whole of it (NumPy or CuPy,
        any shape of its ``C * [N] * L`` elements): what ``refs[name]`` is the reference of."""
        inner = tuple(self.refs[name].shape[1:-1])
        shaped = full.reshape((self.C, *inner, self.length))
        channels = self.channels
        if channels is not None and type(full).__module__.startswith("cupy"):
            import cupy

            channels = cupy.asarray(channels)   # the index on the array's device
        picked = shaped if channels is None else shaped[channels]
        return picked[..., self.steps]

    @property
    def described(self) -> str:
        span = len(range(self.length)[self.steps])
        if self.channels is None and span == self.length:
            return "checked whole"
        n = "all" if self.channels is None else str(len(self.channels))
        return f"checked on {n} of {self.C} channels x {span} of {self.length} steps"


def sample_channels(C: int, count: int) -> Any:
    """``count`` channels spread over ``0 .. C-1``, the first and the last among them (None:
    all of them)."""
    import numpy as np

    if count >= C:
        return None
    return np.unique(np.linspace(0, C - 1, max(1, count)).round().astype(np.int64))


def general_problem(art: Any, kernel: Any, C: int, L: int, N: int,
                    limit: int = GENERAL_REFERENCE_MAX) -> GeneralProblem:
    """Random inputs for ``kernel`` at ``(C, L)`` (``N`` lanes for a vector state) and their
    float64 reference, on at most ``limit`` elements: beyond it, on channels sampled across
    the batch, and if one channel is longer than the limit, on its first steps (its last when
    scanning backwards).

    With no input indexed by time the arrays cannot say how long the sequence is, so ``L`` is
    passed to the reference and to the kernel; a reversed artifact is checked against the
    forward reference of its inputs flipped in time, flipped back.
    """
    import numpy as np

    import explorer
    from explorer.bench.inputs import random_inputs
    from explorer.groundtruth import at_offsets, named_outputs

    lanes = N if kernel.vector else 1
    arrays = random_inputs(kernel, C, L, N, seed=C + L)
    timed_length = any(s.timed for s in kernel.specs)
    length = None if timed_length else L
    reverse = reversed_in_time(art)
    timed = {s.name for s in kernel.specs if s.timed}
    channels = sample_channels(C, limit // max(1, L * lanes))
    count = C if channels is None else len(channels)
    span = min(L, max(1, limit // (count * lanes)))
    steps = slice(L - span, L) if reverse else slice(0, span)

    def flip(x: Any) -> Any:
        return np.ascontiguousarray(np.asarray(x)[..., ::-1])

    def part(name: str, x: Any) -> Any:
        x = x if channels is None else x[channels]
        return x[..., steps] if name in timed else x

    shifted = at_offsets(arrays, art.options.get("read_offsets"))
    given = {k: flip(part(k, v)) if reverse and k in timed else part(k, v)
             for k, v in shifted.items()}
    ref = explorer.reference(art.recurrence, L=None if timed_length else span, **given)
    # the outputs over time (a last state cannot be checked on the first steps sampled)
    refs = named_outputs(art.recurrence, ref)
    # what the kernel writes (a compile may store its readouts alone)
    refs = {k: v for k, v in refs.items() if k in kernel.output_names}
    if reverse:
        refs = {k: flip(v) for k, v in refs.items()}
    return GeneralProblem(arrays, length, refs, lanes, C, L, channels, steps)


def _general_setup(art: Any, p: Problem, N: int) -> Prepared:
    from explorer.runtime.cuda import CudaKernel

    kernel = CudaKernel.from_artifact(art, poison=True)
    g = general_problem(art, kernel, p.C, p.L, N)
    if not g.refs:
        raise Skip(f"the compile stores {', '.join(kernel.output_names)} only (last states): "
                   "the sweep checks outputs over time against float64, so compile it with "
                   "outputs='states' or 'all' to time it here")
    import cupy as cp
    import numpy as np

    from explorer.bench.affine import max_rel_error

    launch = kernel.prepare(L=g.L, **{k: cp.asarray(v) for k, v in g.arrays.items()})

    def check() -> float:
        # the sample is cut on the GPU: only it comes back
        errs = [max_rel_error(cp.asnumpy(g.sample(launch.outputs[n], n)), g.refs[n])
                for n in kernel.output_names if n in g.refs]
        return max(errs) if errs else float("inf")

    moved = 4 * (sum(int(np.size(v)) for v in g.arrays.values())
                 + sum(int(v.size) for v in launch.outputs.values()))
    return Prepared(launch.launch, lambda: None, check=check, bytes_moved=moved,
                    kernels=kernels_run(art, launch),
                    note=f"{art.describe()}; own inputs (N={g.lanes}), bytes = inputs + outputs; "
                         f"{g.described}")
