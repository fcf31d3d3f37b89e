"""The Explorer widget driven from Python, on top of the real compiler (CPU machine is enough)."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")

import explorer as ex  # noqa: E402
from explorer.adjoint_options import ADJOINT_TILE  # noqa: E402
from explorer.widget import Explorer  # noqa: E402
from explorer.widget.controls import LOOKBACK_LAYOUT_CHOICES  # noqa: E402

AFFINE = ex.PRESETS["affine scan"]


@pytest.fixture(scope="module")
def widget() -> Explorer:
    return Explorer(AFFINE)


def _visible_text(html_text: str) -> str:
    return re.sub(r"<[^>]+>", "", html_text)


def test_constructs_and_compiles(widget: Explorer) -> None:
    assert widget.error is None, widget.error_box.value
    assert widget.compiled is not None
    assert widget.error_box.value == ""
    assert list(widget.tabs.titles) == list(Explorer.TAB_TITLES)
    assert "stages" in widget.status.value and "MLIR passes" in widget.status.value


def test_every_stage_view_draws(widget: Explorer) -> None:
    for title in Explorer.TAB_TITLES:
        widget.show_tab(title)
    assert "<svg" in widget.recurrence_view.graph.value
    assert "A_t" in widget.affine_view.math.value and "circ" in widget.affine_view.math.value
    assert "<svg" in widget.tree_view.picture.value
    assert "work =" in widget.tree_view.info.value
    assert 'class="sw-hl"' in widget.mlir.code.value
    llvm = _visible_text(widget.llvm_view.code.value)
    assert "define" in llvm
    ptx = _visible_text(widget.ptx_view.code.value)
    assert ".entry" in ptx
    # the views show exactly what the compiler recorded
    assert widget.compiled.stages["ptx"].text.splitlines()[-1].strip() in ptx


def test_stepping_the_scan_tree_highlights_each_level(widget: Explorer) -> None:
    widget.show_tab("Scan tree")
    view = widget.tree_view
    pictures = set()
    phases = []
    for position in range(view.step.max + 1):
        view.step.value = position
        pictures.add(view.picture.value)
        phases.append(_visible_text(view.level_label.value))
    assert len(pictures) == view.step.max + 1
    assert any("up-sweep" in p for p in phases) and any("down-sweep" in p for p in phases)


def _tree_svg(compiled: ex.Compiled, n: int, level: int | None = None) -> str:
    from explorer.widget.graphs import svg_or_message

    return svg_or_message(compiled.scan_plan.picture(n).to_dot(highlight_level=level),
                          shrink=False)


def test_the_scan_tree_is_the_plan_read_from_the_ir(monkeypatch) -> None:
    import explorer.passes.plans as plans

    def no_plan(*args, **kwargs):
        raise AssertionError("the widget built a plan of its own")

    monkeypatch.setattr(plans, "make_plan", no_plan)
    monkeypatch.setattr(ex, "make_plan", no_plan)
    widget = Explorer(AFFINE, target="cpu")
    view = widget.tree_view
    pictures = {}
    for strategy in ("blelloch", "kogge_stone", "warp_shuffle", "sequential"):
        widget.strategy.value = strategy
        assert widget.error is None, widget.error_box.value
        widget.show_tab("Scan tree")
        c = widget.compiled
        assert c.scan_plan.strategy == strategy
        info = _visible_text(view.info.value)
        assert "scan-plan" in info and "compiled.scan_plan" in info
        assert view.picture.value == _tree_svg(c, view.drawn.value)
        # the ops shown are the plan stage's, one scan.sweep a level of the block's tree
        ops = html.unescape(_visible_text(view.ops.value))
        assert ops.count('"scan.sweep"') == len(c.scan_plan.sweeps)
        assert '"scan.block"' in ops and '"scan.grid"' in ops
        for line in c.stages["plan"].text.splitlines():
            if line.startswith('"scan.'):
                assert line in ops
        pictures[strategy] = view.picture.value
    assert len(set(pictures.values())) == 4


def test_the_person_chooses_how_many_threads_to_draw() -> None:
    widget = Explorer(AFFINE, target="cpu", strategy="kogge_stone", block_size=128)
    widget.show_tab("Scan tree")
    view = widget.tree_view
    c = widget.compiled
    assert c.scan_plan.threads == 128
    assert list(view.drawn.options) == [2, 4, 8, 16, 32, 64]
    view.drawn.value = 64
    picture = c.scan_plan.picture(64)
    assert view.step.max == len(picture.levels) == 6
    assert view.picture.value == _tree_svg(c, 64)
    assert "first 64 of the 128" in _visible_text(view.info.value)
    for k, level in enumerate(picture.levels, start=1):
        view.step.value = k
        assert view.picture.value == _tree_svg(c, 64, k - 1)
        label = html.unescape(_visible_text(view.level_label.value))
        sweep = c.scan_plan.sweeps[k - 1]   # Kogge-Stone: level k is sweep k
        assert f"stride {sweep.stride}" in label and f"{sweep.active} threads" in label
        assert f"stride = {sweep.stride} : i64" in label
        steps = _visible_text(view.steps.value)
        assert f"{len(level.steps)} combines" in label
        assert all(f"{s.left}→{s.right}" in steps for s in level.steps)
    view.drawn.value = 8
    assert view.step.value == 0 and view.step.max == 3
    assert view.picture.value == _tree_svg(c, 8)
    # the choice is kept when the strategy changes
    widget.strategy.value = "blelloch"
    assert view.drawn.value == 8
    assert view.picture.value == _tree_svg(widget.compiled, 8)


def test_a_warp_shuffle_tree_names_its_shuffles_and_the_join() -> None:
    """Over 64 drawn threads (two warps): five shuffle levels, then one join; each level's
    label names its scan.sweep, the join the one "warps" sweep."""
    widget = Explorer(AFFINE, target="cpu", strategy="warp_shuffle", block_size=128)
    widget.show_tab("Scan tree")
    view = widget.tree_view
    c = widget.compiled
    view.drawn.value = 64
    picture = c.scan_plan.picture(64)
    assert [lv.phase for lv in picture.levels] == ["shuffle"] * 5 + ["warps"]
    assert "one barrier to join the warps" in _visible_text(view.info.value)
    for k, sweep in enumerate(c.scan_plan.sweeps, start=1):
        view.step.value = k
        label = html.unescape(_visible_text(view.level_label.value))
        assert f"sweep {k} of 6" in label and f"{sweep.active} threads" in label
        assert ("warps joined" if sweep.phase == "warps" else "shuffle inside each warp") in label
        assert view.picture.value == _tree_svg(c, 64, k - 1)


def test_a_blelloch_tree_over_the_whole_block_shows_its_root() -> None:
    widget = Explorer(AFFINE, target="cpu", strategy="blelloch", block_size=32)
    widget.show_tab("Scan tree")
    view = widget.tree_view
    plan = widget.compiled.scan_plan
    assert view.drawn.options[-1] == 32
    view.drawn.value = 32
    labels = []
    for k in range(1, view.step.max + 1):
        view.step.value = k
        labels.append(html.unescape(_visible_text(view.level_label.value)))
    assert len(labels) == 2 * 5
    root = next(i for i, sw in enumerate(plan.sweeps) if sw.phase == "up_root")
    # the up-sweep's last level and the root's swap are one scan.sweep of the IR
    assert 'phase = "up_root"' in labels[4] and 'phase = "up_root"' in labels[5]
    assert f"sweep {root + 1} of {len(plan.sweeps)}" in labels[5]
    assert "down-sweep" in labels[5] and "1 swap " in labels[5]
    assert all('phase = "down"' in label for label in labels[6:])


def test_the_reverse_box_compiles_a_reversed_scan() -> None:
    widget = Explorer(AFFINE, target="cpu")
    assert widget.options()["reverse"] is False
    widget.reverse.value = True
    assert widget.error is None, widget.error_box.value
    c = widget.compiled
    assert c.options["reverse"] is True and c.scan_plan.grid.direction == "reverse"
    widget.show_tab("Scan tree")
    assert "backwards in time" in _visible_text(widget.tree_view.info.value)
    assert 'direction = "reverse"' in html.unescape(_visible_text(widget.tree_view.ops.value))
    # the run panel checks it against the reference of the sequence flipped in time
    widget.run.length.value = 300
    widget.run.channels.value = 3
    rows = widget.run.run_and_check()
    assert rows and widget.run.passed(rows), widget.run.check.value
    widget.reverse.value = False
    assert widget.compiled.scan_plan.grid.direction == "forward"


def test_kogge_stone_is_offered_and_compiles() -> None:
    widget = Explorer(AFFINE, target="cpu")
    assert "kogge_stone" in [value for _, value in widget.strategy.options]
    widget.strategy.value = "kogge_stone"
    assert widget.error is None, widget.error_box.value
    assert widget.compiled.scan_plan.tree == "kogge_stone"


def test_stage_times_list_no_pass_twice(widget: Explorer) -> None:
    shown = _visible_text(widget.times.widget.value)
    for record in widget.compiled.passes:
        assert f" {record.name} " not in f" {shown} "
    assert f"{len(widget.compiled.passes)} passes" in shown


def test_switching_passes_changes_the_ir(widget: Explorer) -> None:
    widget.show_tab("MLIR")
    view = widget.mlir
    passes = widget.compiled.passes
    assert len(view.selector.options) == len(passes)
    changed = [i for i, record in enumerate(passes) if record.changed]
    assert len(changed) >= 2
    view.select(changed[0])
    first = view.code.value
    view.select(changed[-1])
    last = view.code.value
    assert first != last
    # what is shown is the recorded IR, character for character, once the markup is removed
    assert html.unescape(_visible_text(last)).strip() == passes[changed[-1]].ir.strip()
    # the slider follows the dropdown
    assert view.slider.value == view._visible.index(changed[-1])
    view.slider.value = view._visible.index(changed[0])
    assert view.selected == changed[0]
    assert view.code.value == first


def test_diff_against_the_pass_before(widget: Explorer) -> None:
    view = widget.mlir
    passes = widget.compiled.passes
    changed = next(i for i, record in enumerate(passes) if record.changed and i > 0)
    view.select(changed)
    view.mode.value = "diff"
    diff = _visible_text(view.code.value)
    assert "@@" in diff and f"after {passes[changed].name}" in diff
    unchanged = [i for i, record in enumerate(passes) if not record.changed]
    if unchanged:
        view.select(unchanged[0])
        assert "changed nothing" in view.code.value
    view.mode.value = "ir"


def test_hiding_unchanged_passes(widget: Explorer) -> None:
    view = widget.mlir
    passes = widget.compiled.passes
    view.hide_unchanged.value = True
    try:
        assert [value for _, value in view.selector.options] == [
            i for i, record in enumerate(passes) if record.changed]
        assert view.slider.max == len(view.selector.options) - 1
    finally:
        view.hide_unchanged.value = False
    assert len(view.selector.options) == len(passes)


def test_rendered_passes_are_cached(widget: Explorer) -> None:
    view = widget.mlir
    widget.tabs.selected_index = widget.TAB_TITLES.index("MLIR")   # the view draws when shown
    first = view.rendered(0, "ir")
    assert view.rendered(0, "ir") is first
    view.select(0)
    assert view.last_render_seconds < 0.05


def test_a_bad_recurrence_shows_its_caret_in_the_widget() -> None:
    widget = Explorer(AFFINE)
    good = widget.compiled
    assert widget.set_text("h[t] = a[t] * h[t-1] + * b[t]") is False
    assert isinstance(widget.error, ex.RecurrenceError)
    text = _visible_text(widget.error_box.value)
    assert "^" in text and "not valid" in text
    assert widget.compiled is good  # the tabs keep the last compilation that worked
    assert widget.set_text(AFFINE) is True
    assert widget.error_box.value == "" and widget.error is None


def test_error_text_is_escaped() -> None:
    widget = Explorer(AFFINE)
    bad = "h[t] = a[t] < h[t-1] & <b>x</b>"
    assert widget.set_text(bad) is False
    shown = widget.error_box.value
    assert "<b>x</b>" not in shown
    assert "&lt;" in shown
    message = str(widget.error)
    assert "<" in message  # the message quotes the source; the widget escapes it


def test_changing_a_control_recompiles() -> None:
    widget = Explorer(AFFINE)
    before = widget.compiled
    widget.strategy.value = "sequential"
    assert widget.error is None, widget.error_box.value
    assert widget.compiled is not before
    assert widget.compiled.strategy == "sequential"
    widget.show_tab("Scan tree")
    assert "sequential" in widget.tree_view.info.value


def test_presets_fill_the_box_and_compile() -> None:
    widget = Explorer(AFFINE)
    widget.preset.value = ex.PRESETS["selective scan"]
    assert widget.text.value == ex.PRESETS["selective scan"]
    assert widget.error is None, widget.error_box.value
    assert widget.compiled.recurrence.vector


def test_run_and_check_on_this_machine() -> None:
    widget = Explorer(AFFINE)
    panel = widget.run
    panel.length.value = 300
    panel.channels.value = 3
    rows = panel.run_and_check()
    assert rows and panel.passed(rows), panel.check.value
    device = widget.compiled.device
    assert ("GPU" if device == "cuda" else "CPU") in panel.device.value
    assert "PASS" in panel.check.value


def test_sweep_fills_the_plot_point_by_point() -> None:
    widget = Explorer(AFFINE)
    panel = widget.run
    panel.channels.value = 2
    sizes = [64, 128, 256]
    panel.sweep(sizes, wait=True)
    names = {m.name for m in panel.measurements}
    assert len(panel.measurements) == len(sizes) * len(names)
    for trace in panel.figure.data:
        assert list(trace.x) == sizes
        assert all(y > 0 for y in trace.y)
    assert panel.progress.value == len(sizes)
    assert panel.progress.bar_style == "success"


def test_stop_ends_a_background_sweep() -> None:
    widget = Explorer(AFFINE)
    panel = widget.run
    panel.channels.value = 64
    sizes = [2 ** k for k in range(10, 23)]
    panel.sweep(sizes, wait=False)
    assert panel.running
    panel.stop()
    panel.join(timeout=120)
    assert not panel.running
    assert len({m.length for m in panel.measurements}) < len(sizes)
    assert "stopped" in panel.status.value
    assert not panel.sweep_button.disabled and panel.stop_button.disabled


def test_a_compiled_result_is_shown_as_it_is(tmp_path, monkeypatch) -> None:
    from explorer import compiler

    compiled = ex.compile(ex.PRESETS["second order"], target="cuda", strategy="sequential",
                          block_size=64)
    loaded = compiler.load_compiled(compiled.dump(tmp_path / "second.json"))

    def no_compile(*args, **kwargs):
        raise AssertionError("the explorer compiled although it was given a compiled result")

    monkeypatch.setattr(ex, "compile", no_compile)
    widget = Explorer(loaded)
    assert widget.compiled is loaded
    assert widget.text.value == compiled.recurrence.text
    assert (widget.strategy.value, widget.block_size.value) == ("sequential", 64)
    widget.show_tab("PTX")
    assert "entry" in widget.ptx_view.code.value and "scanweaver_sequential" in \
        widget.ptx_view.code.value
    # the scan tree of a record is the record's plan, as it was read from the IR
    widget.show_tab("Scan tree")
    assert loaded.scan_plan == compiled.scan_plan
    assert widget.tree_view.picture.value == _tree_svg(loaded, widget.tree_view.drawn.value)
    assert "shown as recorded" in widget.status.value


@pytest.mark.parametrize("options, match", [
    ({"block_size": 3}, "block_size must be a power of two"),
    ({"block_size": 0}, "block_size must be a power of two"),
    ({"elements_per_thread": 0}, "elements_per_thread must be a power of two"),
    ({"elements_per_thread": 2.0}, "elements_per_thread must be an integer"),
    ({"strategy": "nope"}, "unknown strategy 'nope'"),
    ({"target": "tpu"}, "unknown target 'tpu'"),
    ({"chip": "sm_1"}, "unknown chip 'sm_1'"),
    ({"chip": None}, "unknown chip None"),
    ({"dtype": "float64"}, "unsupported dtype 'float64'"),
])
def test_bad_options_raise_option_error_before_any_control(options: dict, match: str,
                                                           monkeypatch) -> None:
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although an option was bad")

    monkeypatch.setattr(ex, "compile", no_compile)
    with pytest.raises(ex.OptionError, match=match):
        Explorer(AFFINE, **options)


def test_every_offered_value_is_accepted() -> None:
    from explorer.codegen.options import validate

    widget = Explorer(AFFINE, target="cpu")
    for control, name in ((widget.block_size, "block_size"),
                          (widget.elements_per_thread, "elements_per_thread"),
                          (widget.chip, "chip"), (widget.strategy, "strategy")):
        for value in (v[1] if isinstance(v, tuple) else v for v in control.options):
            validate(**{**{"strategy": "blelloch"}, name: value})


@pytest.mark.parametrize("text", ["h[t] = 0.9 * h[t-1] + 1", "h[t] = a * h[t-1] + 1"])
def test_run_a_recurrence_with_no_input_indexed_by_time(text: str) -> None:
    widget = Explorer(text, target="cpu")
    assert widget.error is None, widget.error_box.value
    panel = widget.run
    assert panel.length.layout.display != "none"
    assert "no input is indexed by time" in panel.length.description
    # channels are shown only where there are arrays to give them
    assert (panel.channels.layout.display == "none") == (not widget.compiled.recurrence.params)
    panel.length.value = 37
    panel.channels.value = 3
    rows = panel.run_and_check()
    assert rows and panel.passed(rows), panel.check.value
    expected_shape = (3, 37) if widget.compiled.recurrence.params else (37,)
    assert rows[0]["shape"] == expected_shape
    assert "PASS" in panel.check.value
    panel.sweep([16, 32], wait=True)
    assert panel.progress.bar_style == "success", panel.status.value
    assert {m.length for m in panel.measurements} == {16, 32}


def test_the_length_box_is_plain_for_inputs_indexed_by_time() -> None:
    widget = Explorer(AFFINE, target="cpu")
    assert widget.run.length.description == "L"
    assert widget.run.channels.layout.display != "none"


def test_the_grid_box_compiles_the_lookback_plan() -> None:
    """The grid of a tree plan is a control: look-back shows its plan ops and its kernel, and
    the sequential plan, which has no grid to choose, greys the box out."""
    # look-back tiles of 32 x 4 steps: the run below (2 channels x 700 steps) is cut into 6
    # tiles a sequence
    widget = Explorer(AFFINE, target="cpu", block_size=32, elements_per_thread=2)
    assert widget.options()["grid"] == "auto"
    widget.grid.value = "chunked"
    assert widget.error is None and widget.compiled.scan_plan.grid.scheme == "chunked"
    widget.grid.value = "lookback"
    assert widget.error is None, widget.error_box.value
    c = widget.compiled
    assert c.options["grid"] == "lookback" and c.scan_plan.grid.scheme == "lookback"
    assert any(k["name"].endswith("_lookback") for k in c.kernels)
    widget.show_tab("Scan tree")
    info = _visible_text(widget.tree_view.info.value)
    assert "tiles of 128 steps" in info and "32 a round trip" in html.unescape(info)
    assert '"scan.lookback"' in html.unescape(_visible_text(widget.tree_view.ops.value))
    assert "look-back block runs" not in info     # its threads are the block's here
    widget.run.length.value = 700
    widget.run.channels.value = 2
    rows = widget.run.run_and_check()
    assert rows and widget.run.passed(rows), widget.run.check.value
    widget.strategy.value = "sequential"
    assert widget.grid.disabled and widget.compiled.scan_plan.lookback is None


SELECTIVE = ex.PRESETS["selective scan"]


def _outputs_row(widget: Explorer) -> list:
    """The controls of the options row, in order (the box that holds the grid control)."""
    row = next(child for child in widget.children
               if hasattr(child, "children") and widget.grid in child.children)
    return list(row.children)


def test_the_outputs_box_is_in_the_options_row_and_reaches_the_compile(monkeypatch) -> None:
    """The outputs control offers the compiler's keywords, sits beside grid and dtype, is
    passed to ``explorer.compile`` and recompiles when it changes."""
    from explorer.codegen.options import OUTPUTS

    widget = Explorer(SELECTIVE, target="cpu")
    assert "sw-outputs" in widget.outputs._dom_classes
    assert widget.outputs in _outputs_row(widget)
    assert [value for _, value in widget.outputs.options] == list(OUTPUTS)
    labels = dict((value, label) for label, value in widget.outputs.options)
    assert labels["readouts"] == "readouts (default)" and labels["all"] == "states and readouts"
    assert "never written" in widget.outputs.tooltip
    assert widget.outputs.value == "readouts" and widget.options()["outputs"] == "readouts"
    assert widget.compiled.outputs == ("y",)
    seen = []
    compile_ = ex.compile

    def spy(text, **options):
        seen.append(options.get("outputs"))
        return compile_(text, **options)

    monkeypatch.setattr(ex, "compile", spy)
    before = widget.compiled
    widget.outputs.value = "all"
    assert seen == ["all"], seen
    assert widget.error is None, widget.error_box.value
    assert widget.compiled is not before and widget.compiled.options["outputs"] == "all"
    assert widget.compiled.outputs == ("h", "y")
    widget.outputs.value = "states"
    assert seen[-1] == "states" and widget.compiled.outputs == ("h",)
    widget.show_tab("Scan tree")
    info = html.unescape(_visible_text(widget.tree_view.info.value))
    assert "outputs option: 'states'" in info and 'scan.store {outputs = ["h"]}' in info
    assert "the readouts y are not computed" in info
    ops = html.unescape(_visible_text(widget.tree_view.ops.value))
    assert '"scan.store"() {outputs = ["h"]}' in ops
    assert "outputs='states': scan.store {outputs = [h]}" in ops
    widget.outputs.value = "readouts"
    info = html.unescape(_visible_text(widget.tree_view.info.value))
    assert "'readouts' (the default)" in info and "the states h are never written" in info


def test_the_explorer_restores_the_outputs_of_a_record_and_of_code(tmp_path, monkeypatch) -> None:
    from explorer import compiler

    compiled = ex.compile(SELECTIVE, target="cpu", outputs="all")
    loaded = compiler.load_compiled(compiled.dump(tmp_path / "all.json"))
    widget = Explorer(loaded)
    assert widget.compiled is loaded and widget.outputs.value == "all"
    assert widget.options()["outputs"] == "all"
    # names given by code are one more choice, labelled with them; a lone name is a tuple
    named = Explorer(SELECTIVE, target="cpu", outputs=["y", "h_last"])
    assert named.error is None, named.error_box.value
    assert named.outputs.value == ("y", "h_last")
    assert ("y, h_last", ("y", "h_last")) in list(named.outputs.options)
    assert named.compiled.outputs == ("y", "h_last")
    assert Explorer(AFFINE, target="cpu", outputs="h_last").outputs.value == ("h_last",)
    # a record of such a compile shows the names too
    again = Explorer(compiler.load_compiled(named.compiled.dump(tmp_path / "named.json")))
    assert again.outputs.value == ("y", "h_last") and again.outputs.label == "y, h_last"
    with pytest.raises(ex.OptionError, match="outputs must be one of"):
        Explorer(AFFINE, outputs=3)


@pytest.mark.parametrize("outputs, stored", [
    ("readouts", ("y",)), ("states", ("h",)), ("all", ("h", "y")),
    (("y", "h_last"), ("y", "h_last")),
])
def test_run_and_check_lists_every_stored_output(outputs, stored) -> None:
    """Whatever is stored, the check table has a row per stored output, each compared with
    the reference's same output (a last state: the state at the last step)."""
    widget = Explorer(SELECTIVE, target="cpu", outputs=outputs)
    assert widget.error is None, widget.error_box.value
    assert widget.compiled.outputs == stored
    panel = widget.run
    panel.length.value = 200
    panel.channels.value = 3
    panel.state_size.value = 4
    rows = panel.run_and_check()
    assert [r["output"] for r in rows] == list(stored), panel.check.value
    assert panel.passed(rows), panel.check.value
    shapes = {"y": (3, 200), "h": (3, 4, 200), "h_last": (3, 4)}
    assert all(r["shape"] == shapes[r["output"]] for r in rows)
    # the table: one row per stored output, naming what it was compared with
    table = re.findall(r"<tr class='sw-check-row'><td>([^<]*)</td><td>[^<]*</td><td>([^<]*)",
                       panel.check.value)
    assert [name for name, _ in table] == list(stored), panel.check.value
    assert all(html.unescape(ref).startswith(f"reference {name.removesuffix('_last')}")
               for name, ref in table)
    shown = html.unescape(_visible_text(panel.check.value))
    assert f"the compile stores {', '.join(stored)}" in shown
    if "h_last" in stored:
        assert "reference h[..., L-1] (the last state)" in shown
    # a sweep on the CPU path runs whatever the call returns
    panel.sweep([64, 128], wait=True)
    assert panel.progress.bar_style == "success", panel.status.value


def test_the_check_fails_for_an_output_the_call_did_not_return() -> None:
    from explorer.groundtruth import stored_reference
    from explorer.widget.data import compare

    rec = ex.Recurrence.parse(SELECTIVE)
    y = np.ones((2, 5))
    h = np.ones((2, 3, 5))
    expected, about = stored_reference(rec, {"h": h, "y": y}, ("y", "h_last"))
    assert np.array_equal(expected["h_last"], h[..., -1]) and about["y"] == "reference y"
    backwards, _ = stored_reference(rec, {"h": np.arange(10.0).reshape(1, 2, 5), "y": y},
                                     ("h_last",), reverse=True)
    assert list(backwards["h_last"][0]) == [0.0, 5.0]
    rows = compare({"y": y}, expected, ("y", "h_last"))
    assert [r["output"] for r in rows] == ["y", "h_last"] and rows[1].get("missing")
    from explorer.widget.run import RunPanel

    assert not RunPanel().passed(rows)
    with pytest.raises(ValueError, match="g_last"):
        stored_reference(rec, {"h": h, "y": y}, ("g_last",))


def test_a_record_keeps_its_options_without_a_control_through_recompiles() -> None:
    """A record compiled with options the options row has no control for (packed sequences,
    float32 outputs of 16-bit inputs, another chunk length) keeps them when a control
    recompiles it, and the row says which; a record with default options says nothing."""
    record = ex.compile(AFFINE, target="cpu", varlen=True, chunk_tiles=4)
    widget = Explorer(record)
    assert widget.kept_options == {"varlen": True, "chunk_tiles": 4}
    assert "varlen=True" in widget.kept.value and "chunk_tiles=4" in widget.kept.value
    widget.strategy.value = "kogge_stone"
    assert widget.error is None, widget.error
    assert widget.compiled is not record and widget.compiled.strategy == "kogge_stone"
    assert widget.compiled.options["varlen"] is True
    assert widget.compiled.options["chunk_tiles"] == 4
    plain = Explorer(ex.compile(AFFINE, target="cpu"))
    assert plain.kept_options == {} and plain.kept.value == ""


def test_the_fast_math_box_reaches_the_compile_and_its_pass_shows_the_flags() -> None:
    """The fast-math box sets ``fast_math``; the pass ``scan-fastmath`` of the compile shows
    the flags of the choice on the float ops, and none at all for ``none``."""
    from explorer.codegen.options import validate

    widget = Explorer(SELECTIVE, target="cpu")
    assert widget.options()["fast_math"] == "contract"
    assert [v for _, v in widget.fast_math.options] == ["contract", "fast", "none"]
    for _, value in widget.fast_math.options:
        validate("blelloch", fast_math=value)
    names = [p.name for p in widget.compiled.passes]
    at = names.index("scan-fastmath")
    assert names.index("scan-lower") == at - 1
    assert "fastmath<contract>" in widget.compiled.passes[at].ir
    widget.fast_math.value = "fast"
    assert widget.error is None, widget.error_box.value
    assert widget.compiled.options["fast_math"] == "fast"
    ir = widget.compiled.passes[at].ir
    assert "math.exp" in ir and "fastmath<contract,afn>" in ir
    widget.fast_math.value = "none"
    assert widget.error is None, widget.error_box.value
    assert "fastmath" not in widget.compiled.passes[at].ir
    # a record compiled with a choice shows it in the box
    assert Explorer(ex.compile(SELECTIVE, target="cpu", fast_math="fast")).fast_math.value \
        == "fast"


def test_the_tiles_box_reaches_the_compile_and_the_plan_shows_the_layout() -> None:
    """The tiles box sets ``tile_layout`` on the GPU target (``scan.thread {layout}`` in the
    plan's IR); on the CPU target it is off and the compile takes ``auto``."""
    from explorer.codegen.options import validate

    widget = Explorer(AFFINE, target="cuda")
    assert widget.error is None, widget.error_box.value
    assert [v for _, v in widget.tile_layout.options] == ["auto", "staged", "direct"]
    for _, value in widget.tile_layout.options:
        validate("blelloch", tile_layout=value)
    assert not widget.tile_layout.disabled
    assert 'layout = "staged"' in widget.compiled.stages["scan-plan"].text
    widget.tile_layout.value = "direct"
    assert widget.error is None, widget.error_box.value
    assert widget.compiled.options["tile_layout"] == "direct"
    assert 'layout = "direct"' in widget.compiled.stages["scan-plan"].text
    widget.target.value = "cpu"      # no direct layout on the host: the box is off
    assert widget.tile_layout.disabled and widget.error is None, widget.error_box.value
    assert widget.options()["tile_layout"] == "auto"
    assert 'layout = "staged"' in widget.compiled.stages["scan-plan"].text
    # a record compiled with a choice shows it in the box
    shown = Explorer(ex.compile(AFFINE, tile_layout="direct"))
    assert shown.tile_layout.value == "direct" and shown.kept_options == {}
    # 16-bit inputs: the Scan tree tab says which kernel meets its tiles how
    narrow = Explorer(AFFINE, target="cuda", dtype="bfloat16")
    narrow.tabs.selected_index = 2
    info = narrow.tree_view.info.value
    assert "16 elements composed in each thread (tiles direct)" in info
    assert "(128 threads x 32 elements, tiles packed)" in info


def test_the_short_kernel_box_switches_the_short_kernel_off_and_on() -> None:
    """The short-kernel box sets ``short_tile`` (``scan.short`` in the plan's IR and a kernel of
    its own in the PTX, or none); the sequential plan has no short kernel and the box is off
    there; a record's tile outside the box's choices is offered as one more."""
    from explorer.codegen.options import validate

    widget = Explorer(AFFINE, target="cuda")
    assert widget.error is None, widget.error_box.value
    for _, value in widget.short_tile.options:
        validate("blelloch", short_tile=value)
    assert widget.short_tile.value == "auto" and not widget.short_tile.disabled
    assert '"scan.short"' in widget.compiled.stages["scan-plan"].text
    assert "scanweaver_blelloch_short" in widget.compiled.ptx
    widget.short_tile.value = "none"
    assert widget.error is None, widget.error_box.value
    assert '"scan.short"' not in widget.compiled.stages["scan-plan"].text
    assert "scanweaver_blelloch_short" not in widget.compiled.ptx
    widget.short_tile.value = "64x16"
    assert widget.compiled.scan_plan.short.threads == 64
    widget.tabs.selected_index = 2
    assert "64 threads x 16 elements" in widget.tree_view.info.value
    widget.strategy.value = "sequential"
    assert widget.short_tile.disabled and widget.error is None, widget.error_box.value
    assert widget.options()["short_tile"] == "auto"
    widget.strategy.value = "blelloch"
    assert not widget.short_tile.disabled and widget.compiled.scan_plan.short.threads == 64
    shown = Explorer(ex.compile(AFFINE, short_tile="128x8"))
    assert shown.short_tile.value == "128x8" and ("128 x 8", "128x8") in shown.short_tile.options
    assert shown.kept_options == {}
    # an explicit tile beside a plan that sums lanes is refused, in the widget's error box
    summed = Explorer(ex.PRESETS["selective scan"], target="cuda")
    summed.short_tile.value = "32x16"
    assert summed.error is not None and "short_tile" in summed.error_box.value
    # the backward's plan chooses its own short kernel; the forward's box comes back
    summed.short_tile.value = "none"
    summed.backward.button.value = True
    assert summed.error is None, summed.error_box.value
    assert summed.short_tile.value == "auto"
    summed.backward.button.value = False
    assert summed.short_tile.value == "none" and summed.error is None


def test_the_lookback_tiles_box_sets_the_lookback_kernels_layout_alone() -> None:
    """The look-back tiles box sets ``lookback_layout`` (``scan.lookback {layout}`` in the
    plan's IR, a packed stage's 16-byte shared loads in the PTX), the plain kernel's layout
    left as it was; off for the sequential plan; a record's choice shows in it; the backward
    takes its own and gives the forward's back."""
    from explorer.codegen.options import LOOKBACK_LAYOUTS, validate

    assert sorted(v for _, v in LOOKBACK_LAYOUT_CHOICES) == sorted(LOOKBACK_LAYOUTS)
    widget = Explorer(AFFINE, target="cuda", dtype="bfloat16")
    assert widget.error is None, widget.error_box.value
    for _, value in widget.lookback_layout.options:
        validate("blelloch", lookback_layout=value)

    def lookback_ptx() -> str:
        ptx = widget.compiled.ptx
        return ptx[ptx.index(".entry scanweaver_blelloch_lookback"):]
    assert widget.compiled.scan_plan.lookback.layout == "packed"
    assert "ld.shared.v4" in lookback_ptx()
    widget.lookback_layout.value = "staged"
    assert widget.error is None, widget.error_box.value
    plan = widget.compiled.scan_plan
    assert (plan.lookback.layout, plan.layout) == ("staged", "direct")
    assert 'layout = "staged", threads = 256' in widget.compiled.stages["scan-plan"].text
    assert "ld.shared.v4" not in lookback_ptx()
    widget.tabs.selected_index = 2
    assert "tiles staged" in widget.tree_view.info.value
    # the CPU target has no direct layout: the compile says so in the error box
    widget.target.value = "cpu"
    widget.lookback_layout.value = "direct"
    assert widget.error is not None and "GPU&#x27;s threads" in widget.error_box.value
    widget.lookback_layout.value = "packed"
    assert widget.error is None and widget.compiled.scan_plan.lookback.layout == "packed"
    widget.strategy.value = "sequential"
    assert widget.lookback_layout.disabled and widget.error is None, widget.error_box.value
    assert widget.options()["lookback_layout"] == "auto"
    shown = Explorer(ex.compile(AFFINE, target="cuda", dtype="bfloat16",
                                lookback_layout="staged"))
    assert shown.lookback_layout.value == "staged" and shown.kept_options == {}
    # the backward of a scalar state reads its arrays in place (no packed tile): auto there,
    # and the forward's box comes back after it
    shown.backward.button.value = True
    assert shown.error is None, shown.error_box.value
    assert shown.lookback_layout.value == "auto"
    shown.backward.button.value = False
    assert shown.lookback_layout.value == "staged" and shown.error is None


def test_the_backward_toggle_shows_the_adjoint_and_gives_the_forward_back() -> None:
    text = ex.PRESETS["selective scan"]
    w = Explorer(text, target="cpu", strategy="sequential")
    assert w.compiled is not None and w.compiled.recurrence.text == text
    w.backward.button.value = True
    # the adjoint, compiled as ex.grad(text).compile() compiles it: backwards, every output
    assert w.error is None, w.error
    assert w.text.value == ex.grad(text).text
    assert w.compiled.recurrence.text == ex.grad(text).text
    assert w.compiled.options["reverse"] is True and w.reverse.value is True
    assert w.outputs.value == "all"
    assert set(w.compiled.recurrence.readouts) == {"grad_sum_dt", "grad_sum_x"}
    # the gradient formulas under the box: summed in the adjoint's kernel, or elementwise
    formulas = html.unescape(_visible_text(w.backward.formulas.value))
    assert "dL/dx = grad_sum_x  (the adjoint's readout)" in formulas
    assert "dL/dA = lam_h * (dt*h[t-1]*exp(A*dt))  summed over t" in formulas
    w.show_tab("Recurrence")
    assert "<svg" in w.recurrence_view.graph.value
    w.show_tab("Affine")
    assert "A_t" in w.affine_view.math.value
    w.backward.button.value = False
    assert w.text.value == text and w.reverse.value is False and w.outputs.value == "readouts"
    assert w.compiled.recurrence.text == text and w.error is None
    assert w.backward.formulas.value == ""


def test_the_backward_on_the_gpu_takes_the_adjoints_tiles() -> None:
    """As ex.grad(text).compile() does on the GPU: the Blelloch adjoint of a vector recurrence
    takes direct tiles (its lane loop streams lam out) of its own size; the forward gets "auto"
    and its tile back."""
    text = ex.PRESETS["selective scan"]
    w = Explorer(text)
    assert w.target.value == "cuda" and w.tile_layout.value == "auto"
    w.backward.button.value = True
    assert w.error is None, w.error
    want = ex.grad(text).compile(target="cuda")
    assert w.tile_layout.value == "direct"
    assert w.compiled.scan_plan.layout == want.scan_plan.layout == "direct"
    for k in ("block_size", "elements_per_thread"):
        assert w.compiled.options[k] == want.options[k] == ADJOINT_TILE[k], k
    assert w.compiled.options["param_rows"] == want.options["param_rows"] == "channel"
    assert w.compiled.key == want.key   # the same compile
    w.backward.button.value = False
    assert w.tile_layout.value == "auto" and w.compiled.recurrence.text == text
    assert w.compiled.options["param_rows"] == "auto" and "param_rows" not in w.kept_options
    assert (w.block_size.value, w.elements_per_thread.value) == ("auto", "auto")
    # a tile chosen in the controls is the adjoint's too, as one given to compile() is
    w.block_size.value = 256
    w.backward.button.value = True
    assert w.error is None, w.error
    assert w.compiled.options["block_size"] == 256
    assert w.compiled.options["elements_per_thread"] == ADJOINT_TILE["elements_per_thread"]
    assert ex.grad(text).compile(target="cuda", block_size=256).options["block_size"] == 256
    w.backward.button.value = False
    assert (w.block_size.value, w.elements_per_thread.value) == (256, "auto")


def test_the_backward_of_a_scalar_state_reads_the_forward_arrays_in_place() -> None:
    """The widget compiles the adjoint as ex.grad(text).compile() does: a_next and fwd_h_prev
    read in place (scan.read in the plan), said under the options row; the forward gets its
    own options back."""
    w = Explorer(AFFINE, target="cpu")
    w.backward.button.value = True
    assert w.error is None, w.error
    assert dict(w.compiled.options["read_offsets"]) == {"a_next": 1, "fwd_h_prev": -1}
    assert "read_offsets" in html.unescape(w.kept.value)
    w.show_tab("Scan tree")
    info = html.unescape(_visible_text(w.tree_view.info.value))
    assert "read in place at another time" in info and "a_next at t + 1" in info
    w.run.length.value = 200
    rows = w.run.run_and_check()      # against the reference of the moved inputs
    assert rows and w.run.passed(rows), w.run.check.value
    w.backward.button.value = False
    assert w.kept_options == {} and w.kept.value == ""
    assert not w.compiled.options["read_offsets"]


def test_the_backward_toggle_on_a_bad_text_says_why_and_stays_off() -> None:
    w = Explorer(AFFINE, target="cpu", strategy="sequential")
    w.text.value = "h[t] = a[t] * h[t-1] +"
    assert w.error is not None
    w.backward.button.value = True
    assert w.backward.button.value is False
    assert w.error is not None and w.error_box.value
    assert w.text.value == "h[t] = a[t] * h[t-1] +"


def test_the_scan_tree_names_a_lookback_block_of_its_own() -> None:
    """Where the look-back block has threads of its own (``lookback_threads``), the Scan tree
    tab says so: the same tree over its threads, and which block the picture draws."""
    widget = Explorer(ex.compile(AFFINE, target="cpu", block_size=32, elements_per_thread=2,
                                 grid="lookback", lookback_threads=64))
    assert widget.compiled.scan_plan.lookback.threads == 64
    widget.show_tab("Scan tree")
    info = html.unescape(_visible_text(widget.tree_view.info.value))
    assert "tiles of 256 steps (64 threads x 4 elements, tiles staged)" in info
    assert "a look-back block runs the same blelloch tree over its 64 threads (11 levels" in info
