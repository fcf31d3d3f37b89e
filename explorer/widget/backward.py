"""The explorer's *backward* toggle: the adjoint recurrence of the text in the box
(:func:`explorer.grad`), compiled as its own recurrence, the way ``ex.grad(text).compile()``
compiles it: backwards in time (``reverse``), storing every output (the adjoints and the
gradients summed over n), reading the forward's arrays at other times in place where the
derivation does (``read_offsets``, kept like a record's options without a control), and on
the GPU with the tiles and parameter rows it picks (:mod:`explorer.adjoint_options`).
Every tab
then shows the backward pass: its recurrence, affine form, plan, passes and PTX. Toggling it
off puts the forward's text and options back; nothing typed is lost."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

if TYPE_CHECKING:
    from explorer.widget.app import Explorer


class BackwardToggle:
    """The toggle and what it swaps in the explorer's box and controls."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.button = widgets.ToggleButton(
            value=False, description="backward", icon="exchange",
            tooltip="show the backward pass: the adjoint recurrence of the text in the box, "
                    "derived by the compiler and compiled backwards in time")
        self.button.add_class("sw-backward")
        #: the gradient formulas (``explorer.grad(text).summary()``), shown under the box while
        #: the backward is: which gradients the adjoint's kernel sums, which are elementwise
        self.formulas = widgets.HTML()
        self.formulas.add_class("sw-backward-formulas")
        #: the forward's text, reverse, outputs, kept options and tiles while the backward is
        #: shown
        self.forward: tuple[str, bool, Any, dict[str, Any], str, tuple[Any, Any], str,
                            str] | None = None
        self.button.observe(self._toggled, names="value")
        #: the fused backward kernel of the text: what the torch operator's backward runs on
        #: the GPU for a diagonal recurrence and a loss of its readouts alone (the usual one:
        #: ``compile(text, backward="readouts")``; ``backward=True`` for a recurrence without
        #: readouts, whose loss reads the states)
        self.kernel_button = widgets.ToggleButton(
            value=False, description="backward kernel", icon="compress",
            layout=widgets.Layout(width="170px"),
            tooltip="show the fused backward kernel the torch operator runs on the GPU: the "
                    "forward's states recomputed, the adjoint scanned back, every gradient "
                    "reduced in one kernel (compile(text, backward=\"readouts\") for a loss "
                    "of the readouts, as the operator runs it; backward=True without readouts)")
        self.kernel_button.add_class("sw-backward-kernel")
        #: the kept options while the kernel is shown
        self.kernel_kept: dict[str, Any] | None = None
        self.kernel_button.observe(self._kernel_toggled, names="value")

    def _kernel_toggled(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.show_kernel()
        else:
            self.hide_kernel()

    def _set(self, button: Any, value: bool, handler: Any) -> None:
        button.unobserve(handler, names="value")
        button.value = value
        button.observe(handler, names="value")

    def show_kernel(self) -> bool:
        """Compile the fused backward kernel of the text in the box (the adjoint's toggle goes
        off first); True on success. Where it does not apply (the CPU target, a recurrence it
        does not take) the reason is shown as an error and the toggle goes back off."""
        from explorer.frontend.recurrence import Recurrence
        from explorer.passes.affine import decompose
        from explorer.passes.fused_adjoint import derived
        from explorer.widget.controls import error_html, kept_html

        ex = self.explorer
        if self.button.value:
            self._set(self.button, False, self._toggled)
            self.show_forward()
        try:
            if ex.target.value != "cuda":
                from explorer.errors import OptionError

                raise OptionError("the fused backward kernel is a GPU kernel: choose the CUDA "
                                  "target (on the CPU the backward is the adjoint: the "
                                  "backward toggle)")
            rec = Recurrence.parse(ex.text.value)
            # the kernel the operator runs for a loss of the readouts (backward_kernel)
            which: bool | str = "readouts" if rec.readouts else True
            fused = derived(decompose(rec), states=which is True)
        except Exception as err:  # noqa: BLE001 - every error is shown in the widget
            ex.error = err
            ex.error_box.value = error_html(err)
            self._set(self.kernel_button, False, self._kernel_toggled)
            return False
        self.kernel_kept = dict(ex.kept_options)
        ex.kept_options = {**ex.kept_options, "backward": which}
        ex.kept.value = kept_html(ex.kept_options, "the backward kernel")
        loss = ("a loss of the readouts: backward=&quot;readouts&quot;" if which == "readouts"
                else "a loss of the states: backward=True")
        self.formulas.value = (
            f"<details open><summary>the fused backward kernel, derived ({loss})</summary><pre "
            "style='font-size:12px;margin:4px 0'>"
            f"{html.escape(fused.text())}</pre></details>")
        return ex.recompile()

    def hide_kernel(self) -> bool:
        """The forward again, its kept options back."""
        from explorer.widget.controls import kept_html

        ex = self.explorer
        if self.kernel_kept is not None:
            ex.kept_options = self.kernel_kept
            ex.kept.value = kept_html(self.kernel_kept)
            self.kernel_kept = None
        self.formulas.value = ""
        return ex.recompile()

    def _toggled(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.show_backward()
        else:
            self.show_forward()

    def show_backward(self) -> bool:
        """Derive the adjoint of the text in the box and compile it; True on success. A text
        without a backward (a parse error, a recurrence the derivation refuses) is shown as an
        error, and the toggle goes back off."""
        import explorer
        from explorer.widget.controls import error_html

        ex = self.explorer
        if self.kernel_button.value:   # one backward shown at a time
            self._set(self.kernel_button, False, self._kernel_toggled)
            self.hide_kernel()
        try:
            backward = explorer.grad(ex.text.value)
        except Exception as err:  # noqa: BLE001 - every error is shown in the widget
            ex.error = err
            ex.error_box.value = error_html(err)
            self.button.unobserve(self._toggled, names="value")
            self.button.value = False
            self.button.observe(self._toggled, names="value")
            return False
        self.forward = (ex.text.value, bool(ex.reverse.value), ex.outputs.value,
                        dict(ex.kept_options), ex.tile_layout.value,
                        (ex.block_size.value, ex.elements_per_thread.value),
                        ex.short_tile.value, ex.lookback_layout.value)
        from explorer.widget.controls import kept_html

        kept = {k: v for k, v in ex.kept_options.items() if k != "read_offsets"}
        if backward.names.read_offsets:
            kept["read_offsets"] = dict(backward.names.read_offsets)
        ex.kept_options = kept
        ex.kept.value = kept_html(kept, "the backward")
        self.formulas.value = (
            "<details open><summary>the gradients, from the adjoint</summary><pre "
            "style='font-size:12px;margin:4px 0'>"
            f"{html.escape(backward.summary())}</pre></details>")
        from explorer.adjoint_options import adjoint_defaults, chosen_tile

        # what Backward.compile gives the adjoint where the controls leave it open (its
        # lane loop streams lam out: direct tiles of its own size, parameters per channel)
        given = {"tile_layout": ex.tile_layout.value, **ex.kept_options, **chosen_tile({
            "block_size": ex.block_size.value,
            "elements_per_thread": ex.elements_per_thread.value})}
        chosen = adjoint_defaults(ex.target.value, ex.strategy.value,
                                  backward.forward.vector, given)
        with ex.holding():
            ex.reverse.value = True
            ex.outputs.value = "all"
            ex.short_tile.value = "auto"   # the adjoint's plan chooses (a lane sum takes none)
            ex.lookback_layout.value = "auto"   # and its look-back layout (read offsets stage)
            if "tile_layout" in chosen:
                ex.tile_layout.value = chosen["tile_layout"]
                ex.block_size.value = chosen.get("block_size", ex.block_size.value)
                ex.elements_per_thread.value = chosen.get("elements_per_thread",
                                                          ex.elements_per_thread.value)
            if "param_rows" in chosen:
                ex.kept_options = {**ex.kept_options, "param_rows": chosen["param_rows"]}
                ex.kept.value = kept_html(ex.kept_options, "the backward")
            ex.text.value = backward.text
        return ex.recompile()

    def show_forward(self) -> bool:
        """Put the forward's text and options back and compile it; True on success."""
        ex = self.explorer
        if self.forward is None:
            return ex.recompile()
        from explorer.widget.controls import kept_html

        text, reverse, outputs, kept, tiles, (block, elements), short, look = self.forward
        self.forward = None
        self.formulas.value = ""
        ex.kept_options = kept
        ex.kept.value = kept_html(kept)
        with ex.holding():
            ex.reverse.value = reverse
            ex.outputs.value = outputs
            ex.tile_layout.value = tiles
            ex.block_size.value = block
            ex.elements_per_thread.value = elements
            ex.short_tile.value = short
            ex.lookback_layout.value = look
            ex.text.value = text
        return ex.recompile()
