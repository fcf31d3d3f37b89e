"""Syntax highlighting of the IR the compiler recorded (MLIR, LLVM IR, PTX, unified diffs).

Every function here returns HTML in which the source text is escaped: a ``<`` or ``&`` in the IR
can never become markup. Pygments provides the LLVM, PTX and diff lexers; MLIR has no Pygments
lexer, so :class:`MlirLexer` is a small regular-expression lexer of our own covering the generic
and custom assembly forms the pipeline prints (SSA values, block labels, symbols, attribute and
type aliases, dialect types, operation names, the quoted names of generic-form operations such as
our ``"scan.sweep"()``).
"""

from __future__ import annotations

import difflib
import html
import re
from typing import ClassVar

from pygments import highlight as _pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer, RegexLexer, bygroups
from pygments.lexers import DiffLexer, LlvmLexer, PtxLexer
from pygments.token import (
    Comment,
    Keyword,
    Name,
    Number,
    String,
    Text,
    Whitespace,
)

CSS_CLASS = "sw-hl"
"""CSS class of the ``<div>`` that wraps highlighted code; the style sheet is scoped to it."""

MAX_HIGHLIGHT_CHARS = 2_000_000
"""Above this size the text is shown escaped but without colours (lexing would take seconds)."""


class MlirLexer(RegexLexer):
    """Lexer for MLIR textual IR as printed by ``mlir-opt`` and the Python bindings."""

    name = "MLIR"
    aliases: ClassVar[list[str]] = ["mlir"]
    filenames: ClassVar[list[str]] = ["*.mlir"]

    _ident = r"[A-Za-z_$.\-][\w$.\-]*"
    tokens: ClassVar[dict] = {
        "root": [
            (r"\s+", Whitespace),
            (r"//.*?$", Comment.Single),
            # an operation in generic form, "scan.sweep"(...): its name, not a string
            (r'"[A-Za-z_][\w$]*\.[\w$.]+"(?=\()', Name.Builtin),
            (r'"(\\\\|\\"|[^"])*"', String),
            # %arg0, %0, %c1_i32, %0#1
            (r"%[\w$.\-]+(#\d+)?", Name.Variable),
            # ^bb0, ^bb1(
            (r"\^[\w$.\-]+", Name.Label),
            # @symbol, @"quoted symbol"
            (r'@("(\\\\|\\"|[^"])*"|[\w$.\-]+)', Name.Function),
            # #map = affine_map<...>, #gpu.address_space<workgroup>, #nvvm.target<...>
            (r"#[\w$.\-]+", Name.Constant),
            # !llvm.ptr, !gpu.async.token, !type_alias
            (r"![\w$.\-]+", Keyword.Type),
            # dialect.op (custom form) at the start of an operation, e.g. "arith.addf", "gpu.launch"
            (r"\b[a-z_]\w*\.[\w.]+\b", Name.Builtin),
            # builtin types
            (
                (r"\b(i\d+|si\d+|ui\d+|f16|bf16|f32|f64|f80|f128|tf32|index|none"
                r"|memref|tensor|vector|complex|tuple)\b"),
                Keyword.Type,
            ),
            (
                (r"\b(func|module|return|to|step|iter_args|ins|outs|dense|affine_map|affine_set"
                r"|loc|unknown|attributes|true|false|unit|kernel|blocks|threads|in|args)\b"
                 # but a name given a value in an attribute dictionary is the attribute's
                 r"(?!\s*=[^=])"),
                Keyword,
            ),
            (r"0x[0-9a-fA-F]+", Number.Hex),
            # the "x" of a shape, as in memref<4x?xf32>
            (r"(\d+|\?)(x)(i\d+|f\d+|bf16|tf32|index)?",
             bygroups(Number.Integer, Text, Keyword.Type)),
            (r"[-+]?\d+\.\d*([eE][-+]?\d+)?", Number.Float),
            (r"[-+]?\d+", Number.Integer),
            # punctuation stays uncoloured: in large IR a span per bracket would double the HTML
            (r"->|[=:*+\-(){}\[\]<>,?]", Text),
            (r"[A-Za-z_][\w$.]*", Text),
            (r".", Text),
        ],
    }


_LEXERS: dict[str, type[Lexer]] = {
    "mlir": MlirLexer,
    "llvm": LlvmLexer,
    "ptx": PtxLexer,
    "diff": DiffLexer,
}

_FORMATTER = HtmlFormatter(cssclass=CSS_CLASS, nowrap=False)
_WHITESPACE_SPAN = re.compile(r'<span class="w">(\s*)</span>')


def style_sheet() -> str:
    """The ``<style>`` element that colours highlighted code (scoped to :data:`CSS_CLASS`)."""
    rules = _FORMATTER.get_style_defs(f".{CSS_CLASS}")
    box = (
        f".{CSS_CLASS} pre {{ margin: 0; padding: 6px 8px; font-size: 12px; line-height: 1.35;"
        " white-space: pre; overflow: auto; max-height: 520px; background: #f8f8f8;"
        " border: 1px solid #e0e0e0; border-radius: 3px; }"
    )
    return f"<style>{rules}\n{box}</style>"


def plain_html(text: str) -> str:
    """Escaped text in the same frame as highlighted code, without colours."""
    return f'<div class="{CSS_CLASS}"><pre>{html.escape(text)}</pre></div>'


def highlight(text: str, language: str) -> str:
    """Return ``text`` as escaped, coloured HTML.

    ``language`` is one of ``"mlir"``, ``"llvm"``, ``"ptx"``, ``"diff"``; any other value (or a text
    above :data:`MAX_HIGHLIGHT_CHARS`) gives escaped text without colours.
    """
    lexer_type = _LEXERS.get(language)
    if lexer_type is None or len(text) > MAX_HIGHLIGHT_CHARS:
        return plain_html(text)
    lexer = lexer_type(stripnl=False, ensurenl=True)
    result: str = _pygments_highlight(text, lexer, _FORMATTER)
    # whitespace needs no colour: dropping its spans makes large IR about a third lighter
    return _WHITESPACE_SPAN.sub(r"\1", result)


def unified_diff(before: str, after: str, before_name: str, after_name: str,
                 context: int = 3) -> str:
    """The unified diff of two IR texts (empty string when they are equal)."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=before_name,
        tofile=after_name,
        n=context,
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n")
    return "".join(out)
