"""Highlighting, diffs and pictures used by the widget (no compiler needed)."""

from __future__ import annotations

import shutil

import pytest
from pygments.token import Error, Keyword, Name, String

from explorer.widget.graphs import dependence_dot, dot_to_svg
from explorer.widget.highlight import MlirLexer, highlight, plain_html, unified_diff

MLIR = """\
#map = affine_map<(d0) -> (d0 * 4)>
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @scan(%arg0: memref<?x4xf32>, %arg1: i64) kernel {
      %c0 = arith.constant 0 : index
      %0 = memref.load %arg0[%c0, %c0] : memref<?x4xf32>
      cf.br ^bb1(%0 : f32)
    ^bb1(%1: f32):
      "test.op"() {note = "a < b && c > d"} : () -> ()
      gpu.return
    }
  }
}
"""


@pytest.mark.parametrize("language", ["mlir", "llvm", "ptx", "diff", "unknown"])
def test_highlight_escapes_markup_characters(language: str) -> None:
    text = 'x = "<script>alert(1)</script>" & y < z\n'
    out = highlight(text, language)
    assert "<script>" not in out
    assert "&lt;" in out and "&amp;" in out
    assert "alert(1)" in out


def test_plain_html_escapes() -> None:
    assert plain_html("a < b & c") == '<div class="sw-hl"><pre>a &lt; b &amp; c</pre></div>'


def test_mlir_lexer_classifies_the_pieces_of_mlir() -> None:
    tokens = [(kind, value) for kind, value in MlirLexer().get_tokens(MLIR) if value.strip()]
    assert not [value for kind, value in tokens if kind is Error]
    kinds = {value: kind for kind, value in tokens}
    assert kinds["%arg0"] is Name.Variable
    assert kinds["^bb1"] is Name.Label
    assert kinds["@scan"] is Name.Function
    assert kinds["#map"] is Name.Constant
    assert kinds["f32"] is Keyword.Type
    assert kinds["memref"] in (Keyword.Type, Name.Builtin)
    assert kinds["arith.constant"] is Name.Builtin and kinds["gpu.return"] is Name.Builtin
    # the text round-trips exactly
    assert "".join(v for _, v in MlirLexer(stripnl=False).get_tokens(MLIR)) == MLIR


def test_generic_form_operation_names_are_names_not_strings() -> None:
    op = '"scan.sweep"() {active = 64 : i64, phase = "up", stride = 1 : i64} : () -> ()'
    tokens = [(kind, value) for kind, value in MlirLexer().get_tokens(op) if value.strip()]
    kinds = {value: kind for kind, value in tokens}
    assert kinds['"scan.sweep"'] is Name.Builtin
    assert kinds['"up"'] in String  # an attribute's text stays a string
    block = '"scan.block"() {threads = 128 : i64, tree = "blelloch"} : () -> ()'
    kinds = {v: k for k, v in MlirLexer().get_tokens(block)}
    assert kinds["threads"] is not Keyword  # an attribute's name, not gpu.launch's keyword
    launch = "gpu.launch blocks(%bx) in (%gx = %c1) threads(%tx) in (%sx = %c1)"
    kinds = {v: k for k, v in MlirLexer().get_tokens(launch)}
    assert kinds["threads"] is Keyword and kinds["blocks"] is Keyword
    # a quoted string that is not followed by operands is not an operation
    text = 'text = "h.x"'
    assert dict((v, k) for k, v in MlirLexer().get_tokens(text))['"h.x"'] in String


def test_highlight_keeps_every_line() -> None:
    out = highlight(MLIR, "mlir")
    assert out.count("\n") >= MLIR.count("\n")


def test_unified_diff_shows_removed_and_added_lines() -> None:
    before = "a\nb\nc\n"
    after = "a\nB\nc\n"
    diff = unified_diff(before, after, "before", "after")
    assert "-b\n" in diff and "+B\n" in diff
    assert unified_diff(before, before, "x", "y") == ""


def test_dependence_dot_of_a_companion_form() -> None:
    from explorer.frontend import Recurrence
    from explorer.passes.affine import decompose

    form = decompose(Recurrence.parse("h[t] = a[t] * h[t-1] + c * h[t-2] + x[t]\n"
                                      "y[t] = 2 * h[t]"))
    dot = dependence_dot(form)
    # h[t] reads h[t-1] and h[t-2]; the companion row copies h[t-1] forward, and nothing else
    assert "prev0 -> cur0" in dot and "prev1 -> cur0" in dot and "prev0 -> cur1" in dot
    assert "prev1 -> cur1" not in dot
    assert "in_x -> cur0" in dot and "in_c -> cur0" in dot and "in_a -> cur0" in dot
    assert "cur0 -> out_y" in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_dot_to_svg_gives_a_scalable_svg_element() -> None:
    svg = dot_to_svg('digraph g { a -> b [label="x<y"]; }')
    assert svg.lstrip().startswith("<svg")
    assert "max-width:100%" in svg
    assert "x&lt;y" in svg
