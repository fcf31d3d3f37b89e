"""Runtime, PyTorch side: a compiled recurrence as a differentiable torch operator.

``compiled.torch()`` gives a :class:`RecurrenceOp`; calling it runs the recurrence on tensors::

    f = ex.compile(ex.PRESETS["selective scan"], target="cpu").torch()
    y = f(dt=dt, A=A, B=B, x=x, C=C, D=D)          # or positionally: inputs, then parameters
    y.sum().backward()                               # gradients of every tensor, h0 included

Inputs and parameters are tensors shaped as for ``compiled(...)`` (time the last axis, batch
dimensions broadcast); the initial states ``<state>0=`` are optional.  One output comes back as a
tensor, several as a dict, like ``compiled(...)``.

Each compile defines two operators with :func:`torch.library.custom_op` (qualified names from the
compile's key, so one pair per compile): ``scanweaver::fwd_<key>`` runs the forward,
``scanweaver::bwd_<key>`` the adjoint scan of :func:`explorer.autodiff.grad`, and the forward's
autograd formula (``register_autograd``) calls the adjoint then computes the gradients with torch
elementwise operations.  Both have a fake implementation (``register_fake``: output shapes from
input shapes), so the op works in eager mode and inside ``torch.compile``, forward and backward.
In eager mode on plain tensors a call skips the dispatcher (:func:`explorer.torch_eager.eager`):
the same forward, autograd formula and adjoint run as a plain ``torch.autograd.Function``
(:class:`_Eager`), a few microseconds of host time less per operator than the custom operators'
dispatch (``bench/op_host.py`` times the operator's host work); where autograd would record
nothing (``torch.no_grad()``, inference mode, no tensor asking for a gradient:
:func:`explorer.torch_eager.records`) it is the forward's launch alone.

Where it runs: on the tensors' device.  CUDA tensors run the PTX kernels through CuPy on torch's
current stream (no synchronisation); CPU tensors run the same kernels as host code
(``target="cpu"``); a compile for the other target is made on first use.  The kernels compute in
float32: float32 tensors run them.  float64 tensors run the float64 reference of the same
recurrence and of the same adjoint recurrence instead (:func:`explorer.reference`, NumPy on the
host; slow, for checking the derivation, for instance with ``torch.autograd.gradcheck``), and
the results are float64.  Other dtypes are refused.

Saved for backward: the tensors given (inputs, parameters, initial states) and the forward's
state outputs; everything else is recomputed (see :mod:`explorer.autodiff`).  Where the fused
backward kernel will run (eager mode, CUDA; :mod:`explorer.backward_kernel`) it reads the states
at its tiles' last steps alone: there the forward saves those (one step in 512) instead, and the
kernel reads them as saved (``op.checkpoints``: ``"auto"`` and True do so, False saves every
state).  What the backward
lays out on the GPU, for ``h[t] = a[t] * h[t-1] + b[t]``: ``a_next[t] = a[t+1]`` (one copy: the
adjoint kernel reads its inputs in step), the adjoint ``lam`` (the kernel's output), and
``dL/da = lam * h[t-1]`` computed on the shifted saved trajectory (no tensor of ``h[t-1]``, no
zeros, no concatenation); ``dL/db`` is ``lam`` itself.  In general a past state ``s[t-k]`` is
laid out (one new tensor, its first ``k`` steps the initial state or zeros) only where an
expression reads it other than as a factor of a product, and a gradient with one term is that
term, not a sum into zeros.  For the selective scan the adjoint reads ``h[t-1]`` (one shifted copy
of the saved states) and returns ``dL/ddt`` and ``dL/dx`` summed over n as its readouts
(:mod:`explorer.autodiff`); ``dL/dB``, ``dL/dC`` and ``dL/dA`` are torch operations on ``lam``.

Fused backward: in eager mode the backward of a vector recurrence on float32 CUDA tensors
runs, from the second call of the same shapes, as one graph traced from these formulas and
compiled by ``torch.compile`` (:mod:`explorer.fused_backward`; ``fuse_backward=`` of
:func:`torch_op`); that of a scalar recurrence as the same graph replayed unfused, the
adjoint called directly (``"traced"``: the formulas' Python is what its host time was).

Host time: CUDA calls go through :meth:`explorer.runtime.cuda.CudaKernel.launch_torch`, which
keeps a launch plan per shapes and strides (:mod:`explorer.runtime.cuda_plan`), so a repeated
call checks and binds nothing again.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from explorer import backward_kernel
from explorer.adjoint_options import ADJOINT_TILE, chosen_tile
from explorer.autodiff import Backward, grad
from explorer.fused_backward import FusedBackward, check_policy
from explorer.gradients import gradients
from explorer.runtime.cuda_plan import PlanCache, current_stream
from explorer.torch_arrays import TorchOps
from explorer.torch_eager import eager, records
from explorer.torch_runner import Runner as _Runner
from explorer.torch_runner import Specs as _Specs

if TYPE_CHECKING:
    from explorer.compiler import Compiled
    from explorer.frontend.recurrence import Recurrence

#: the namespace of the operators
NAMESPACE = "scanweaver"

_OPS: dict[tuple[str, bool], RecurrenceOp] = {}
_LOCK = threading.Lock()


def torch_op(compiled: Compiled, adjoint: Compiled | None = None,
             fuse_backward: str | bool | None = None,
             lane_gradients: bool = False) -> RecurrenceOp:
    """The differentiable torch operator of a compile (one per compile key, made once).

    ``adjoint``: the compile of the adjoint recurrence to use (by default it is compiled on
    first use); a record read with :func:`explorer.compiler.load_compiled` lets a machine
    without MLIR run the backward on the GPU, as it runs the forward.  ``fuse_backward``:
    when the eager backward runs its gradient formulas fused by ``torch.compile`` or traced
    (:mod:`explorer.fused_backward`: ``"auto"``, the default, ``"always"``, ``"traced"`` or
    ``"never"``);
    None leaves the operator's setting as it is. ``lane_gradients``: the backward of
    :func:`explorer.autodiff.grad` with lane gradients (an operator of its own).
    """
    policy = None if fuse_backward is None else check_policy(fuse_backward)
    if compiled.options.get("dtype", "float32") != "float32":
        from explorer.errors import OptionError

        raise OptionError(f"the torch operator runs float32 compiles only; this one takes "
                          f"{compiled.options['dtype']} inputs (call the compile directly)")
    if compiled.options.get("read_offsets"):
        from explorer.errors import OptionError

        raise OptionError("the torch operator differentiates the recurrence as written; this "
                          "compile reads inputs at other times (read_offsets)")
    with _LOCK:
        op = _OPS.get((compiled.key, bool(lane_gradients)))
        if op is None:
            op = RecurrenceOp(compiled, bool(lane_gradients))
            _OPS[(compiled.key, bool(lane_gradients))] = op
    if adjoint is not None and adjoint.options.get("backward"):
        # the fused backward kernel (compile(text, backward=True or "readouts")) of this
        # recurrence
        if adjoint.recurrence.text != op.compiled.recurrence.text:
            raise ValueError("adjoint= is a backward kernel of another recurrence "
                             f"({adjoint.recurrence.text!r})")
        with op._compile_lock:
            op._compiles[("backward", str(adjoint.options["backward"]))] = adjoint
            op.bindings = backward_kernel.bindings()   # calls bound to another kernel
        adjoint = None
    if adjoint is not None:
        if adjoint.recurrence.text != op.backward.text or not adjoint.options.get("reverse"):
            raise ValueError("adjoint= is not the reverse compile of this recurrence's adjoint "
                             f"({op.backward.text!r}; a record made by an older version of "
                             "the compiler may hold another adjoint: make it again)")
        moved = dict(adjoint.options.get("read_offsets") or ())
        if moved != op.backward.names.read_offsets:
            raise ValueError(f"adjoint= reads {moved or 'no array'} at other times; the "
                             f"backward passes {op.backward.names.read_offsets} to be read in "
                             "place (a record made by an older version of the compiler: make "
                             "it again with ex.grad(rec).compile())")
        stored = set(adjoint.outputs)
        needed = set(op.backward.recurrence.states) | set(op.backward.recurrence.readouts)
        if not needed <= stored:
            raise ValueError(f"adjoint= stores {sorted(stored)}, the backward reads "
                             f"{sorted(needed)}: compile it with outputs='all' (as "
                             "ex.grad(rec).compile() does)")
        with op._compile_lock:
            op._compiles[("adjoint", adjoint.target)] = adjoint
    if policy is not None:
        op.fuse_backward = policy
    return op


class RecurrenceOp:
    """A compiled recurrence as a differentiable torch operator (see the module docstring)."""

    def __init__(self, compiled: Compiled, lane_gradients: bool = False) -> None:
        import torch

        self.compiled = _storing_every_output(compiled)
        self.lane_gradients = lane_gradients
        rec = compiled.recurrence
        self.backward: Backward = grad(rec, lane_gradients)
        self.reverse = bool(compiled.options.get("reverse", False))
        self.specs = _Specs(rec)
        #: made once for every call: the positional names, all names, the states' outputs
        self._arg_names = [n for n, _, _ in self.specs.args]
        self._known = set(self.specs.names)
        self._state_outputs = [self.specs.outputs.index(s) for s in rec.states]
        self.adjoint_specs = _Specs(self.backward.recurrence, sums=True)
        self._compiles: dict[tuple[str, str], Compiled] = {}
        self._compile_lock = threading.Lock()
        self.ops = TorchOps()
        self._fuse_backward = "auto"
        self._no_kernel = False
        self.fused = FusedBackward(self)
        #: the fused backward kernel's calls, bound per signature
        self.bindings = backward_kernel.bindings()
        #: whether the fused backward kernel takes the recurrence (decided on first use)
        self.kernel_form: bool | None = None
        #: whether the eager forward saves the state one step in the fused backward kernel's
        #: tile alone where that kernel will run (``backward_kernel.checkpoints``): True,
        #: False (every state) or "auto" (the same as True)
        self.checkpoints: bool | str = "auto"
        #: the eager forward's launches, bound per signature (:meth:`forward_call`)
        self.forward_bound = PlanCache(backward_kernel.KEPT)
        key = compiled.key + ("_lane" if lane_gradients else "")
        forward = _Runner(self.specs, self.reverse, self._forward_for)
        adjoint = _Runner(self.adjoint_specs, True, self._adjoint_for,
                          self.backward.names.read_offsets)
        self.forward_runner, self.adjoint_runner = forward, adjoint
        self.forward_op = torch.library.custom_op(
            f"{NAMESPACE}::fwd_{key}", _function(forward), mutates_args=(),
            schema=self.specs.schema())
        self.forward_op.register_fake(_function(forward.fake))
        self.adjoint_op = torch.library.custom_op(
            f"{NAMESPACE}::bwd_{key}", _function(adjoint), mutates_args=(),
            schema=self.adjoint_specs.schema())
        self.adjoint_op.register_fake(_function(adjoint.fake))
        #: the adjoint's operator overload, as a traced backward calls it
        self.adjoint_overload = getattr(getattr(torch.ops, NAMESPACE), f"bwd_{key}").default
        self.forward_op.register_autograd(self._backward, setup_context=self._setup)
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                  for n, _, _ in self.specs.args]
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
                   for n, _, _ in self.specs.h0]
        params.append(inspect.Parameter("L", inspect.Parameter.KEYWORD_ONLY, default=None))
        self.__signature__ = inspect.Signature(params)

    @property
    def fuse_backward(self) -> str:
        """When the eager backward runs its gradient formulas fused: one of
        :data:`explorer.fused_backward.POLICIES` (see that module); True and False are read as
        ``"always"`` and ``"never"``, anything else is refused."""
        return self._fuse_backward

    @fuse_backward.setter
    def fuse_backward(self, value: str | bool) -> None:
        self._fuse_backward = check_policy(value)

    def __repr__(self) -> str:
        args = ", ".join(self.specs.names)
        return (f"RecurrenceOp({NAMESPACE}::fwd_{self.compiled.key}({args}) -> "
                f"{', '.join(self.specs.outputs)})")

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args: Any, L: int | None = None, **kwargs: Any) -> Any:
        names = self._arg_names
        if len(args) > len(names):
            raise TypeError(f"{len(args)} positional tensors given, the recurrence takes "
                            f"{len(names)} ({', '.join(names)}); give initial states by name")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in given:
                raise TypeError(f"{k} given twice")
            given[k] = v
        extra = sorted(set(given) - self._known)
        if extra:
            raise TypeError(f"unexpected tensors: {', '.join(extra)} (the recurrence takes "
                            f"{', '.join(self.specs.names)})")
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing tensors: {', '.join(missing)}")
        values: list[Any] = [given.get(n) for n in self.specs.names]
        if self.specs.needs_length:
            if L is None:
                raise TypeError("no input is indexed by time: pass L=")
            values.append(L)
        elif L is not None:
            raise TypeError("L is given by the inputs' last axis")
        if not eager(values):
            out = self.forward_op(*values)
        elif records(values):
            out = _Eager.apply(self, *values)
        else:   # no graph to record (no_grad, inference, no tensor asks for a gradient)
            out = self.forward_call(values)
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) == 1:
            return outs[0]
        return dict(zip(self.specs.outputs, outs))

    def forward_call(self, values: Sequence[Any]) -> Any:
        """The forward on the operator's arguments in eager mode (:class:`_Eager`): on float32
        CUDA tensors the launch bound to their signature (``Runner.bind``: the launch plan
        looked up once, not per call; on another stream it takes the checking path), else the
        runner. The key: torch's stream, each tensor's shape, strides, dtype and device, the
        length given."""
        first = next((x for x in values if type(x) is torch.Tensor), None)
        if first is None or not first.is_cuda:
            return self.forward_runner(*values)
        key = (current_stream(first.get_device()),
               *(None if x is None else x if isinstance(x, int) else
                 (x.shape, x.stride(), x.dtype, x.device) for x in values))
        launch = self.forward_bound.get(key)
        if launch is None:
            launch = self.forward_runner.bind(*values) or False   # False: the runner, kept
            self.forward_bound.put(key, launch)
        return launch(*values) if launch else self.forward_runner(*values)

    # -- the compiles --------------------------------------------------------------------------
    def _options(self) -> dict[str, Any]:
        """The compile options the adjoint shares (it stores its states, its only outputs).
        The forward's tile is the adjoint's only where it is not the default one: the adjoint
        picks its own (:data:`explorer.adjoint_options.ADJOINT_TILE`)."""
        shared = {k: v for k, v in self.compiled.options.items()
                  if k not in ("strategy", "target", "reverse", "outputs", "read_offsets",
                               "param_rows",
                               *ADJOINT_TILE)}
        return {**shared, **chosen_tile(self.compiled.options)}

    def _forward_for(self, target: str) -> Compiled:
        if target == self.compiled.target or target == "cpu":
            return self.compiled   # a CUDA compile runs on the host too (compiled there)
        return self._cached(("forward", target), lambda: _compile(
            self.compiled.recurrence, target, self.compiled.strategy,
            reverse=self.reverse, outputs="all", **self._options()))

    def _adjoint_for(self, target: str) -> Compiled:
        return self._cached(("adjoint", target), lambda: self.backward.compile(
            target=target, strategy=self.compiled.strategy, **self._options()))

    def _backward_kernel(self, states: bool = True) -> Compiled | None:
        """The fused backward kernel, reading the states' cotangents or (``states`` False)
        the readouts' alone: the ``backward="readouts"`` compile, else (one kept or compiled
        before, none compiled here) the ``backward=True`` one, which reads zeros for them.
        None where neither can be compiled here: the backward then runs the adjoint and its
        formulas, with one warning."""
        if self._no_kernel:
            return None
        kinds: tuple[bool | str, ...] = (True,) if states else ("readouts", True)
        with self._compile_lock:
            for which in kinds:
                hit = self._compiles.get(("backward", str(which)))
                if hit is not None:
                    return hit
        fast = self.compiled.options.get("fast_math") or "contract"
        failed: Exception | None = None
        for which in kinds:
            def make(which: bool | str = which) -> Compiled:
                return _compile(self.compiled.recurrence, "cuda", self.compiled.strategy,
                                backward=which, fast_math=fast)
            try:
                return self._cached(("backward", str(which)), make)
            except Exception as err:   # no MLIR here, a pass that failed: said once
                failed = failed or err
        import warnings

        self._no_kernel = True
        warnings.warn(f"the fused backward kernel could not be compiled ({failed}); the "
                      "backward runs the adjoint scan and its formulas", stacklevel=2)
        return None

    def kernel_for(self, arrays: dict[str, Any], states: dict[str, Any],
                   cotangents: dict[str, Any]) -> Compiled | None:
        """The fused backward kernel this backward runs (None where it does not apply or
        cannot be compiled: :mod:`explorer.backward_kernel`)."""
        if not backward_kernel.applies(self, arrays, states):
            return None
        return self._backward_kernel(backward_kernel.reads_states(self, cotangents))

    def _cached(self, key: tuple[str, str], make: Callable[[], Compiled]) -> Compiled:
        with self._compile_lock:
            hit = self._compiles.get(key)
            if hit is None:
                hit = make()
                self._compiles[key] = hit
            return hit

    # -- autograd ------------------------------------------------------------------------------
    def _setup(self, ctx: Any, inputs: tuple[Any, ...], output: Any,
               every: int | None = None) -> None:
        """What the backward reads, saved: the tensors given and the states; with ``every``
        (the eager forward, where the fused kernel will run: ``backward_kernel.checkpoints``)
        the state one step in ``every`` alone, the steps the kernel recomputes from."""
        outs = output if isinstance(output, tuple) else (output,)
        ctx.set_materialize_grads(False)   # an output the loss does not read stays None
        n = len(self.specs.names)
        tensors = list(inputs[:n])
        ctx.present = tuple(x is not None for x in tensors)
        states = [outs[i] for i in self._state_outputs]
        ctx.every, ctx.full = every, None
        if every:
            ctx.full = tuple(states[0].shape)
            states = [backward_kernel.tile_ends(states[0], every).contiguous()]
        ctx.save_for_backward(*[x for x in tensors if x is not None], *states)

    def _backward(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        """The registered autograd formula (traced as it is inside ``torch.compile``)."""
        arrays, states, cotangents, needed = self._unpack(ctx, grads, None)
        return self._pack(arrays, self.gradients(arrays, states, cotangents, needed))

    def _unpack(self, ctx: Any, grads: Sequence[Any], needs: Sequence[bool] | None,
                saved: Sequence[Any] | None = None
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], set[str]]:
        """(arrays, states, cotangents, the names whose gradients are asked for) of a
        backward, from what the forward saved (``ctx.saved_tensors`` unless given) and the
        output gradients given."""
        saved = list(ctx.saved_tensors if saved is None else saved)
        names = self.specs.names
        given = [n for n, p in zip(names, ctx.present) if p]
        arrays = dict(zip(given, saved[:len(given)]))
        states = dict(zip(self.specs.rec.states, saved[len(given):]))
        cotangents = {o: g for o, g in zip(self.specs.outputs, grads) if g is not None}
        if needs is None:
            needs = getattr(ctx, "needs_input_grad", None) or [True] * len(names)
        return arrays, states, cotangents, {n for n, need in zip(names, needs)
                                            if need and n in arrays}

    def _pack(self, arrays: dict[str, Any], res: dict[str, Any]) -> tuple[Any, ...]:
        """The gradients in the forward's argument order, each in its array's dtype."""
        out: list[Any] = []
        for n in self.specs.names:
            g = res.get(n)
            if g is not None and g.dtype != arrays[n].dtype:
                g = g.to(arrays[n].dtype)
            out.append(g)
        if self.specs.needs_length:
            out.append(None)
        return tuple(out)

    def gradients(self, arrays: dict[str, Any], states: dict[str, Any],
                  cotangents: dict[str, Any], needed: set[str]) -> dict[str, Any]:
        """The gradients of ``needed`` (names of the forward's arguments): the adjoint scan,
        then the gradient formulas as torch operations."""
        kernel = self.kernel_for(arrays, states, cotangents)
        if kernel is not None:
            return backward_kernel.gradients(self, kernel, arrays, states, cotangents, needed)
        dtype = next(iter(states.values())).dtype
        work = {n: (x.to(dtype) if x.dtype != dtype else x) for n, x in arrays.items()}
        cots = {o: (g.to(dtype) if g.dtype != dtype else g) for o, g in cotangents.items()}
        return gradients(self.backward, self.ops, work, states, cots, self._adjoint,
                         reverse=self.reverse, needed=needed,
                         in_place=self.backward.names.read_offsets)

    def _adjoint(self, call: dict[str, Any], sums: dict[str, tuple[int, ...]] | None = None
                 ) -> dict[str, Any]:
        """The adjoint scan on ``call``; ``sums``: its lane readouts summed in its kernel to
        these batch shapes (the gradients of inputs given with a row per block of channels)."""
        values: list[Any] = [call[n] for n in self.adjoint_specs.names if n in call]
        values += [None] * (len(self.adjoint_specs.names) - len(values))
        values += [list((sums or {})[o]) if o in (sums or {}) else None
                   for o in self.adjoint_specs.sums]
        out = self.adjoint_runner(*values) if eager(values) else self.adjoint_op(*values)
        outs = out if isinstance(out, tuple) else (out,)
        return dict(zip(self.adjoint_specs.outputs, outs))


class _Eager(torch.autograd.Function):
    """The operator's forward and autograd formula as a plain autograd function (eager mode
    only, see :func:`explorer.torch_eager.eager`): what the custom operators compute, without
    their dispatch."""

    @staticmethod
    def forward(ctx: Any, op: RecurrenceOp, *values: Any) -> Any:
        out = op.forward_call(values)
        ctx.op = op
        op._setup(ctx, tuple(values), out, backward_kernel.checkpoints(op, ctx, values, out))
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        op = ctx.op
        saved = ctx.saved_tensors
        # a signature whose backward is the fused kernel alone, bound: launched directly
        done = backward_kernel.fast(op, ctx, saved, grads)
        if done is not None:
            return (None, *done)
        return (None, *op.fused.eager(ctx, saved, grads))


def _function(f: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function around a bound method (what ``custom_op`` wraps)."""

    def run(*args: Any) -> Any:
        return f(*args)

    return run


def _storing_every_output(compiled: Compiled) -> Compiled:
    """``compiled``, or the same compile with ``outputs="all"`` when it leaves outputs out:
    the operator returns every state and readout, and its backward reads the states."""
    rec = compiled.recurrence
    stored = set(compiled.outputs)
    if stored >= set(rec.states) | set(rec.readouts):
        return compiled
    options = {k: v for k, v in compiled.options.items() if k not in ("strategy", "target")}
    try:
        return _compile(rec, compiled.target, compiled.strategy, **{**options, "outputs": "all"})
    except ImportError as err:
        from explorer.errors import OptionError

        raise OptionError("the torch operator returns every output and its backward reads the "
                          f"states; this compile stores {sorted(stored)} and the compiler is not "
                          f"here to compile it again ({err}): compile with outputs='all'"
                          ) from None


def _compile(rec: Recurrence, target: str, strategy: str, **options: Any) -> Compiled:
    from explorer.compiler import compile as compile_

    return compile_(rec, target=target, strategy=strategy, **options)
