"""The fused backward (``compile(text, backward=True)``): its derived terms, its algorithm (the
NumPy model of the kernel: tiles from the last, states recomputed from the saved ones, the
adjoint as a suffix scan of ``mu``) against torch autograd through a float64 loop, its plan in
the IR and in a record, and what it refuses. The kernel itself runs in
``tests/gpu/test_autodiff_gpu.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import explorer as ex
from explorer.errors import CompileError, OptionError
from explorer.frontend.recurrence import Recurrence
from explorer.passes.affine import decompose
from explorer.passes.fused_adjoint import derive, run_model, supported
from tests.unit.test_autodiff import _inputs, _reference_grads, _rel, torch_reference

#: diagonal recurrences the fused backward takes (the GPU tests' KERNEL_ONLY besides presets)
TEXTS = {
    "selective scan": ex.PRESETS["selective scan"],
    "Mamba selective scan": ex.PRESETS["Mamba selective scan"],
    "sigmoid gate": "h[t, n] = sigmoid(f[t, n]) * h[t-1, n] + x[t] * B[t, n]\n"
                    "y[t] = sum(C[t, n] * h[t, n]) * x[t]",
    "two readouts": "h[t, n] = exp(-softplus(u[t]) * A[n] * A[n]) * h[t-1, n] + B[t, n] * x[t]\n"
                    "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]\n"
                    "z[t] = sum(h[t, n]) * u[t]",
    # the corpus's other diagonal recurrences: no readout (the state's cotangent alone), and
    # softplus in the decay
    "diagonal, no readout": "h[t, n] = r[n] * h[t-1, n] + x[t]",
    "softplus step": "h[t, n] = exp(softplus(dt[t]) * A[n]) * h[t-1, n]"
                     " + softplus(dt[t]) * B[t, n] * x[t]\n"
                     "y[t] = sum(C[t, n] * h[t, n]) + D * x[t]",
    # inputs named as the backward's own arrays would be: the kernel's names move aside
    "names that collide": "h[t, n] = exp(-fwd_h[t] * A[n] * A[n]) * h[t-1, n]"
                          " + grad_x[t] * B[t, n]\ny[t] = sum(C[t, n] * h[t, n]) + grad_y[t]",
}


def _canonical(rec: Recurrence, arrays: dict[str, np.ndarray], C: int, N: int
               ) -> dict[str, np.ndarray]:
    """Batch (2, 3) flattened to C channels; parameters given for the first batch axis as 1
    broadcast to every channel."""
    lanes = rec.lane_names
    out = {}
    for name, v in arrays.items():
        if name in rec.params or name.endswith("0"):
            shape = (2, 3, N) if name in lanes or name.endswith("0") else (2, 3)
            out[name] = np.broadcast_to(v, shape).reshape(C, -1 if shape[-1] == N else 1)
            out[name] = out[name][:, 0] if shape[-1] != N else out[name]
        else:
            shape = (2, 3, N, v.shape[-1]) if name in lanes else (2, 3, v.shape[-1])
            out[name] = np.broadcast_to(v, shape).reshape(C, *shape[2:])
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


@pytest.mark.parametrize("name", list(TEXTS))
@pytest.mark.parametrize("tile", [8, 64])
def test_the_kernels_algorithm_gives_torch_autograds_gradients(name: str, tile: int):
    """Tiles of 8 steps (five, the last ragged) and of 64 (one): every gradient, the initial
    state's and the parameters' (summed over the channels that share them) included."""
    _model_against_autograd(TEXTS[name], tile, states=True)


@pytest.mark.parametrize("name", [n for n in TEXTS if n != "diagonal, no readout"])
def test_the_readouts_kernels_algorithm_gives_the_gradients_of_a_loss_of_its_readouts(name):
    """``backward="readouts"``: c[t] without the states' cotangent, none read; the gradients
    of a loss of the readouts alone."""
    fa = _model_against_autograd(TEXTS[name], 8, states=False)
    assert fa.state not in fa.cotangents and "grad_h" not in str(fa.inject)


def _model_against_autograd(text: str, tile: int, states: bool) -> object:
    rec = Recurrence.parse(text)
    fa = derive(decompose(rec), states)
    arrays, h0 = _inputs(text, batch=(2, 3), n=4, length=37)
    if states:
        cot, ref = _reference_grads(rec, arrays, h0)
    else:
        cot, ref = _readouts_grads(rec, arrays, h0)
    C, N = 6, 4
    given = _canonical(rec, {**arrays, **h0}, C, N)
    f = ex.compile(text, target="cpu", outputs="all").torch()
    out = f(**{k: torch.tensor(v, dtype=torch.float64) for k, v in {**arrays, **h0}.items()})
    out = out if isinstance(out, dict) else {fa.state: out}   # one output comes back bare
    # the states the kernel reads: the last step of each whole tile
    saved = out[fa.state].detach().numpy().reshape(C, N, -1)[..., tile - 1::tile]
    cots = {o: np.broadcast_to(np.asarray(g, dtype=np.float64), out[o].shape).reshape(
        (C, N, -1) if o in rec.states else (C, -1)) for o, g in cot.items()}
    got = run_model(fa, given, saved, cots, T=tile)
    for g in fa.gradients:
        want = np.asarray(ref[g.of])
        mine = got[g.target]
        if g.over in ("time", "all"):      # per channel: summed over the rows given as 1
            mine = mine.reshape(2, 3, *mine.shape[1:]).sum(axis=0, keepdims=True)
            mine = mine.reshape(want.shape)
        else:
            want = np.broadcast_to(want, (2, 3, *want.shape[2:])).reshape(mine.shape)
        assert _rel(np.asarray(mine), np.asarray(want, dtype=np.float64)) < 1e-10, g.target
    return fa


def _readouts_grads(rec: Recurrence, arrays: dict[str, np.ndarray], h0: dict[str, np.ndarray]
                    ) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """(cotangents, gradients) of a loss of the readouts alone, through the float64 loop."""
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in {**arrays, **h0}.items()}
    out = torch_reference(rec, {k: leaves[k] for k in arrays}, {k: leaves[k] for k in h0})
    gen = torch.Generator().manual_seed(11)
    cot = {k: torch.randn(out[k].shape, dtype=torch.float64, generator=gen)
           for k in rec.readouts}
    sum((out[k] * cot[k]).sum() for k in cot).backward()
    return cot, {k: v.grad.numpy() for k, v in leaves.items()}


def test_the_terms_are_the_recurrences_and_read_h_at_the_step_before():
    fa = derive(decompose(Recurrence.parse(ex.PRESETS["selective scan"])))
    terms = {g.target: (g.of, g.over, g.expr()) for g in fa.gradients}
    assert terms["grad_A"] == ("A", "time", "dt*h[t-1]*lam[t]*exp(A*dt)")
    assert terms["grad_B"][1] == "rows" and terms["grad_dt"][1] == "lanes"
    assert terms["grad_D"][1] == "all" and terms["grad_h0"] == ("h0", "first", "mu[0]")
    assert str(fa.inject) == "C*grad_y + grad_h"


@pytest.mark.parametrize("text, why", [
    ("h[t] = a[t] * h[t-1] + b[t]", "diagonal"),
    (ex.PRESETS["second order"], "diagonal"),
    ("h[t, n] = f[t, n] * h[t-1, n] + x[t]\ny[t] = sum(h[t, n]) ** 2", "linear in their sums"),
    ("h[t, n] = f[t, n] * h[t-1, n] + x[t]\ng[t, n] = h[t, n] * x[t]", "lane readouts"),
])
def test_what_the_fused_backward_refuses(text: str, why: str):
    form = decompose(Recurrence.parse(text))
    assert why in (supported(form) or "")
    with pytest.raises(OptionError, match=why):
        derive(form)


@pytest.mark.parametrize("options, what", [
    ({"target": "cpu"}, "target='cuda'"),
    ({"reverse": True}, "no reverse"),
    ({"backward": "yes"}, "True, False or .readouts."),
    ({"dtype": "bfloat16"}, "float32"),
])
def test_the_option_is_checked(options: dict, what: str):
    opts = {"backward": True, **options}
    target = opts.pop("target", "cuda")
    with pytest.raises(OptionError, match=what):
        ex.compile(ex.PRESETS["selective scan"], target=target, **opts)


@pytest.fixture(scope="module")
def backward_compile():
    return ex.compile(ex.PRESETS["selective scan"], target="cuda", backward=True)


def test_the_plan_is_in_the_ir_and_the_kernel_writes_every_gradient(backward_compile):
    c = backward_compile
    plan = c.stages["plan"].text
    for op in ('"scan.recompute"() {every = 512', '"scan.adjoint"() {c = "C*grad_y + grad_h", '
               'state = "lam_h", tree = "suffix"}', 'target = "grad_A"'):
        assert op in plan
    assert c.outputs == ("grad_dt", "grad_B", "grad_x", "grad_C", "grad_A", "grad_D", "grad_h0")
    (kernel,) = c.kernels
    assert kernel["block"] == [32, 1, 1] and kernel["channels"] == "block"
    # the suffix scan shuffles down, the forward's up
    assert "shfl.sync.down" in c.ptx and "shfl.sync.up" in c.ptx
    assert "red.global.add.f32" in c.ptx or "atom.global.add.f32" in c.ptx


def test_a_plan_edited_to_other_terms_is_refused(backward_compile):
    from mlir.ir import Context, Module

    from explorer.dialect import scan
    from explorer.passes.backward import read_plan

    ir = next(p.ir for p in backward_compile.passes if p.name == "scan-plan")
    edited = ir.replace('expr = "dt*h[t-1]*lam[t]*exp(A*dt)"', 'expr = "dt*h[t]*lam[t]"')
    assert edited != ir
    fa = derive(backward_compile.form)
    with Context() as ctx:
        scan.load(ctx)
        read_plan(Module.parse(ir).operation, fa)     # as compiled: read back
        with pytest.raises(CompileError, match="not the gradients"):
            read_plan(Module.parse(edited).operation, fa)
        retiled = ir.replace("elements = 16", "elements = 8")
        with pytest.raises(CompileError, match="recomputes every 512"):
            read_plan(Module.parse(retiled).operation, fa)
        # its tree: the warp-shuffle levels the lowering runs, as any warp-shuffle plan's
        resweep = ir.replace("stride = 16 : i64", "stride = 32 : i64")
        assert resweep != ir
        with pytest.raises(CompileError, match="sweeps of the backward"):
            read_plan(Module.parse(resweep).operation, fa)
        retree = ir.replace('tree = "warp_shuffle"', 'tree = "blelloch"')
        with pytest.raises(CompileError, match="lowered as a warp_shuffle tree"):
            read_plan(Module.parse(retree).operation, fa)


def test_a_record_keeps_the_tile_and_refuses_another(backward_compile, tmp_path):
    from explorer.compiler import load_compiled
    from tests.unit.test_hostile_records import _rewrite

    path = backward_compile.dump(tmp_path / "bw.json.gz")
    back = load_compiled(path)
    assert (back.scan_plan.threads, back.scan_plan.elements) == (32, 16)
    assert back.outputs == backward_compile.outputs
    _rewrite(path, lambda payload: payload.update(plan={"backward": [64, 16]}))
    with pytest.raises(ValueError, match="disagrees"):
        load_compiled(path)


def test_the_kernel_reads_the_states_one_step_a_tile_and_its_record_says_so(
        backward_compile, tmp_path):
    """The saved states' argument holds one step in the tile (``every``: the state at each
    tile's last step), read back from a record; a record whose ``every`` is not its tile, or
    that has none (a kernel that read every state), is refused: the kernel indexes them by its
    tile, the runtime would check the shape by ``every``."""
    from explorer.compiler import load_compiled
    from tests.unit.test_hostile_records import _rewrite

    fa = backward_compile.scan_plan.adjoint
    tile = backward_compile.scan_plan.tile
    (saved,) = [a for a in backward_compile.contract[0].args
                if a.name == fa.saved and a.role == "input"]
    assert (saved.role, saved.timed, saved.lane, saved.every) == ("input", True, True, tile)
    path = backward_compile.dump(tmp_path / "bw.json.gz")
    assert load_compiled(path).contract[0].args == backward_compile.contract[0].args

    def every(value: object) -> object:
        def edit(payload: dict) -> None:
            for a in payload["kernels"][0]["args"]:
                if a["name"] == fa.saved and a["role"] == "input":
                    if value is None:
                        a.pop("every")
                    else:
                        a["every"] = value
        return edit
    for value in (tile * 2, 1, None):
        path = backward_compile.dump(tmp_path / f"bw{value}.json.gz")
        _rewrite(path, every(value))
        with pytest.raises(ValueError, match=f"one step in {value}, not in its tile of {tile}"):
            load_compiled(path)


def test_the_readouts_compile_reads_no_state_cotangent_and_its_record_says_so(tmp_path):
    from mlir.ir import Context, Module

    from explorer.compiler import load_compiled
    from explorer.dialect import scan
    from explorer.passes.backward import read_plan
    from tests.unit.test_hostile_records import _rewrite

    c = ex.compile(ex.PRESETS["selective scan"], target="cuda", backward="readouts")
    assert '"scan.adjoint"() {c = "C*grad_y", state = "lam_h"' in c.stages["plan"].text
    args = [a["name"] for a in c.kernels[0]["args"] if a["role"] == "input"]
    assert "grad_y" in args and "grad_h" not in args
    assert c.outputs[-1] == "grad_h0" and "grad_h" not in c.ptx
    back = load_compiled(c.dump(tmp_path / "r.json.gz"))
    assert back.options["backward"] == "readouts"
    assert str(back.scan_plan.adjoint.inject) == "C*grad_y"
    # a plan whose adjoint reads another c[t] than the options' is refused
    ir = next(p.ir for p in c.passes if p.name == "scan-plan")
    edited = ir.replace('c = "C*grad_y"', 'c = "C*grad_y + grad_h"')
    assert edited != ir
    with Context() as ctx:
        scan.load(ctx)
        with pytest.raises(CompileError, match="adjoint reads c"):
            read_plan(Module.parse(edited).operation, back.scan_plan.adjoint)
    with pytest.raises(OptionError, match="no readouts"):
        ex.compile(TEXTS["diagonal, no readout"], target="cuda", backward="readouts")
    # a record whose option is edited to the other kernel's is refused (its plan would say a
    # c[t] its kernel does not compute)
    path = tmp_path / "r.json.gz"
    _rewrite(path, lambda payload: payload["options"].update(backward=True))
    with pytest.raises(ValueError, match="backward kernel reads"):
        load_compiled(path)


def test_the_kernel_policy_keeps_the_formulas_on_the_cpu():
    """fuse_backward="kernel" on CPU tensors: the kernel is a GPU one, the eager formulas
    run (same gradients as "never")."""
    text = ex.PRESETS["selective scan"]
    f = ex.compile(text, target="cpu", outputs="all").torch()
    arrays, h0 = _inputs(text)
    grads = {}
    for policy in ("never", "kernel"):
        f.fuse_backward = policy
        leaves = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
        f(**leaves)["y"].sum().backward()
        grads[policy] = {k: v.grad for k, v in leaves.items()}
    f.fuse_backward = "auto"
    assert all(torch.equal(grads["never"][k], grads["kernel"][k]) for k in arrays)


def test_the_explorer_shows_the_backward_kernel(backward_compile):
    """Every stage of the fused backward's compile in the widget: its plan in the Scan tree
    tab (the terms, the forward's tree drawn), its PTX; the Run tab says where it runs."""
    import html
    import re

    w = ex.Explorer(backward_compile)
    assert w.error is None
    w.show_tab("Scan tree")
    info = html.unescape(re.sub("<[^>]+>", "", w.tree_view.info.value))
    assert "the fused backward kernel" in info and "grad_A = dt*h[t-1]*lam[t]*exp(A*dt)" in info
    assert "<svg" in w.tree_view.picture.value
    assert "scan.recompute" in w.tree_view.ops.value
    assert w.run.run_button.disabled and w.run.sweep_button.disabled
    assert w.run.run_and_check() == [] and "torch operator" in w.run.check.value


def test_the_backward_kernel_toggle_shows_what_the_operator_runs():
    """The *backward kernel* toggle compiles ``compile(text, backward="readouts")`` from the
    box (the kernel ``c.torch()``'s backward runs on CUDA tensors for a loss of the readouts;
    ``backward=True`` for a recurrence without readouts), gives the forward back, refuses the
    CPU target and a recurrence it does not take in the error box, and is one of two: the
    adjoint's toggle turns it off."""
    import html

    text = ex.PRESETS["selective scan"]
    w = ex.Explorer(text, target="cuda")
    forward_key = w.compiled.key
    w.backward.kernel_button.value = True
    assert w.error is None, w.error_box.value
    assert w.compiled.options["backward"] == "readouts" and w.compiled.recurrence.text == text
    assert w.compiled.key == ex.compile(text, target="cuda", backward="readouts").key
    assert "scan.recompute" in w.compiled.stages["plan"].text
    shown = html.unescape(w.backward.formulas.value)
    assert "grad_A = dt*h[t-1]*lam[t]*exp(A*dt)" in shown and 'backward="readouts"' in shown
    assert "c[t] = C*grad_y " in shown   # of the readouts alone (no grad_h)
    no_readouts = ex.Explorer("h[t, n] = a[t, n] * h[t-1, n] + b[t, n]", target="cuda")
    no_readouts.backward.kernel_button.value = True
    assert no_readouts.error is None, no_readouts.error_box.value
    assert no_readouts.compiled.options["backward"] is True
    w.backward.button.value = True       # the adjoint instead
    assert not w.backward.kernel_button.value and w.error is None
    assert w.compiled.recurrence.text == ex.grad(text).text
    w.backward.button.value = False
    assert w.compiled.key == forward_key and "backward" not in w.kept_options
    w.backward.kernel_button.value = True
    w.backward.kernel_button.value = False
    assert w.compiled.key == forward_key and w.backward.formulas.value == ""
    w.target.value = "cpu"
    w.backward.kernel_button.value = True
    assert not w.backward.kernel_button.value and "GPU kernel" in w.error_box.value
    scalar = ex.Explorer(ex.PRESETS["affine scan"], target="cuda")
    scalar.backward.kernel_button.value = True
    assert not scalar.backward.kernel_button.value and "diagonal" in scalar.error_box.value


def test_run_and_bench_refuse_a_backward_artifact(tmp_path, capsys):
    """``scanweaver run`` would compare a backward kernel's gradients with no reference (a
    check that cannot fail): refused, before the GPU is looked at, as bench refuses it."""
    from explorer.cli import main

    out = tmp_path / "bw"
    assert main(["compile", ex.PRESETS["selective scan"], "--option", "backward=true",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out)]) != 0
    assert main(["bench", str(out)]) != 0
    err = capsys.readouterr().err
    assert err.count("is a fused backward kernel") == 2, err
