"""Where each term of the recurrence went: IR lines after every pass, and PTX lines.

Our passes locate every op at the recurrence term it comes from (``loc("recurrence":L:C)``,
see :mod:`explorer.passes.lower`) and the upstream passes keep those locations through to the
PTX's ``.loc`` lines. The pipeline prints each pass's module once, with its locations;
:func:`split_locations` turns that into the plain text that is shown and the map from each term
(``"L:C"``: line and column in the recurrence, as MLIR counts them) to the lines of that text
whose ops came from it. :func:`ptx_locations` does the same for PTX, from its ``.loc``
directives. The explorer uses these maps to link a term to its ops and instructions.
"""

from __future__ import annotations

import re

from explorer.dialect.scan import SOURCE

#: an alias definition of a location, around a module printed with locations
_ALIAS = re.compile(r"^(#loc[0-9]*) = loc\((.*)\)$")
#: a location used by an op: an alias or an inline one (one level of nesting)
_USE = re.compile(r" loc\((#loc[0-9]*|(?:[^()]|\([^()]*\))*)\)")
_SOURCE = re.compile(r'"' + re.escape(SOURCE) + r'":(\d+):(\d+)')
_REF = re.compile(r"#loc[0-9]*")

TermLines = dict[str, list[int]]


def _terms(body: str, aliases: dict[str, str], depth: int = 0) -> list[str]:
    """The recurrence positions a location names (through aliases, fused and call sites)."""
    found = [f"{m.group(1)}:{m.group(2)}" for m in _SOURCE.finditer(body)]
    if depth < 8:
        for ref in _REF.findall(body):
            if ref in aliases:
                found += _terms(aliases[ref], aliases, depth + 1)
    return found


def split_locations(asm: str) -> tuple[str, TermLines]:
    """``asm`` (a module printed with locations) as plain text, and the lines of that text
    each recurrence term became."""
    lines = asm.splitlines()
    aliases: dict[str, str] = {}
    body: list[str] = []
    for line in lines:
        m = _ALIAS.match(line)
        if m:          # alias definitions come before and after the module
            aliases[m.group(1)] = m.group(2)
        else:
            body.append(line)
    while body and not body[-1].strip():
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    plain: list[str] = []
    terms: TermLines = {}
    resolved: dict[str, list[str]] = {}     # a location -> its terms, worked out once
    for line in body:
        uses = _USE.findall(line)
        if not uses:
            plain.append(line)
            continue
        # the op's own location is the last one on its line (operands' come first)
        own = uses[-1]
        if own not in resolved:
            resolved[own] = list(dict.fromkeys(_terms(own, aliases)))
        for term in resolved[own]:
            terms.setdefault(term, []).append(len(plain))
        plain.append(_USE.sub("", line))
    return "\n".join(plain) + ("\n" if asm.endswith("\n") else ""), terms


_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")


def ptx_locations(ptx: str) -> TermLines:
    """The PTX lines (0-based) of the instructions that came from each recurrence term."""
    files = {m.group(1) for m in map(_FILE.match, ptx.splitlines()) if m and
             m.group(2) == SOURCE}
    terms: TermLines = {}
    current: str | None = None
    for i, line in enumerate(ptx.splitlines()):
        m = _LOC.match(line)
        if m:
            line_no = int(m.group(2))
            # column 0: code of that line with no column of its own (its statement's)
            col = int(m.group(3)) or 1
            current = (f"{line_no}:{col}" if m.group(1) in files and line_no > 0 else None)
            continue
        stripped = line.strip()
        if current is None or not stripped or stripped.startswith(("//", "$", ".", "{", "}")):
            continue
        terms.setdefault(current, []).append(i)
    return terms
