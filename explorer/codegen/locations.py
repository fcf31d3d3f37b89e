"""Where each term of the recurrence went: IR lines after every pass, and PTX lines.

Our passes locate every op at the recurrence term it comes from (``loc("recurrence":L:C)``,
see :mod:`explorer.passes.lower`) and the upstream passes keep those locations through to the
PTX's ``.loc`` lines. The pipeline prints the module once after every pass (ours and upstream
alike), with its locations; :func:`split_locations` turns that into the plain text that is shown
and the map from each term (``"L:C"``: line and column in the recurrence, as MLIR counts them)
to the lines of that text whose ops came from it. :func:`ptx_locations` does the same for PTX,
from its ``.loc`` directives. The explorer uses these maps to link a term to its ops and
instructions.
"""

from __future__ import annotations

import re
from itertools import repeat

from explorer.dialect.scan import SOURCE

#: an alias definition of a location (printed before and after the module)
_ALIAS = re.compile(r"(#loc[0-9]*) = loc\((.*)\)$")
#: a location used by an op: an alias or an inline one (one level of nesting), on one line
_USE = re.compile(r" loc\((#loc[0-9]*|(?:[^()\n]|\([^()\n]*\))*)\)")
_SOURCE = re.compile(r'"' + re.escape(SOURCE) + r'":(\d+):(\d+)')
_REF = re.compile(r"#loc[0-9]*")

TermLines = dict[str, list[int]]
#: a line printed with locations -> (the line without them, the op's own location or None)
SeenLines = dict[str, tuple[str, str | None]]


def _terms(body: str, aliases: dict[str, str], depth: int = 0) -> list[str]:
    """The recurrence positions a location names (through aliases, fused and call sites)."""
    found = [f"{m.group(1)}:{m.group(2)}" for m in _SOURCE.finditer(body)]
    if depth < 8:
        for ref in _REF.findall(body):
            if ref in aliases:
                found += _terms(aliases[ref], aliases, depth + 1)
    return found


def _module_lines(asm: str, aliases: dict[str, str]) -> list[str]:
    """The lines of ``asm`` without its blank ends and location aliases (put in ``aliases``),
    and without the attribute aliases printed after the module (MLIR defers there those that
    only locations use, such as the debug info scopes of ensure-debug-info-scope-on-llvm-func);
    aliases are printed before and after the module, never inside it."""
    lines = asm.split("\n")
    end = len(lines)
    while end and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        m = _ALIAS.match(lines[end - 1])
        if m:
            aliases[m.group(1)] = m.group(2)
        end -= 1
    start = 0
    while start < end and not lines[start].strip():
        start += 1
    top = start
    while top < end and lines[top].startswith(("#", "!")):
        top += 1
    head = []
    for line in lines[start:top]:
        m = _ALIAS.match(line)
        if m:
            aliases[m.group(1)] = m.group(2)
        else:
            head.append(line)
    return head + lines[top:end]


def split_locations(asm: str, seen: SeenLines | None = None) -> tuple[str, TermLines]:
    """``asm`` (a module printed with locations) as plain text, and the lines of that text
    each recurrence term became.

    The plain text is the module as printed without locations. A line belongs to the terms
    of the last location on it, the op's own (its operands' and block arguments' come first;
    an op with regions prints its location after them, on the line that closes them).
    ``seen`` keeps what each line came to, for the next module printed (the modules after
    successive passes share about half their lines)."""
    if seen is None:
        seen = {}
    aliases: dict[str, str] = {}
    body = _module_lines(asm, aliases)
    missing = [line for line in body if line not in seen]
    if missing:
        # the op's own location: the last one on the line (rfind is -1 where there is none,
        # and the match at 0 then fails)
        owners = map(_USE.match, missing, map(str.rfind, missing, repeat(" loc(")))
        plain = _USE.sub("", "\n".join(missing)).split("\n")
        for line, text, m in zip(missing, plain, owners):
            seen[line] = (text, m.group(1) if m else None)
    parts = list(map(seen.__getitem__, body))
    at: dict[str, list[int]] = {}     # a location -> the lines it owns
    for index, (_, own) in enumerate(parts):
        if own is not None:
            found = at.get(own)
            if found is None:
                at[own] = [index]
            else:
                found.append(index)
    terms: TermLines = {}
    for own, indices in at.items():
        for term in dict.fromkeys(_terms(own, aliases)):
            terms.setdefault(term, []).extend(indices)
    for indices in terms.values():
        indices.sort()
    return "\n".join([text for text, _ in parts]) + ("\n" if asm.endswith("\n") else ""), terms


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
