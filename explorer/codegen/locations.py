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
from itertools import accumulate, compress, repeat
from operator import gt, itemgetter

from explorer.dialect.scan import SOURCE

#: an alias definition of a location (printed before and after the module)
_ALIAS = re.compile(r"(#loc[0-9]*) = loc\((.*)\)$")
#: a location used by an op: an alias or an inline one (one level of nesting), on one line
_USE = re.compile(r" loc\((#loc[0-9]*|(?:[^()\n]|\([^()\n]*\))*)\)")
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


def _module(asm: str, aliases: dict[str, str]) -> tuple[list[str], str]:
    """The alias lines kept before the module, and the module's own text, of ``asm``: without
    blank ends, without location aliases (put in ``aliases``) and without the attribute
    aliases printed after the module (MLIR defers there those that only locations use, such as
    the debug info scopes of ensure-debug-info-scope-on-llvm-func). Aliases are printed before
    and after the module, never inside it."""
    end = len(asm)
    while end > 0:
        cut = asm.rfind("\n", 0, end)
        line = asm[cut + 1:end]
        if line.strip() and not line.startswith("#"):
            break
        m = _ALIAS.match(line)
        if m:
            aliases[m.group(1)] = m.group(2)
        end = max(cut, 0)
    head: list[str] = []
    start = 0
    while start < end:
        cut = asm.find("\n", start, end)
        stop = end if cut < 0 else cut
        line = asm[start:stop]
        if line.strip() and not line.startswith(("#", "!")):
            break
        m = _ALIAS.match(line)
        if m:
            aliases[m.group(1)] = m.group(2)
        elif line.strip():
            head.append(line)
        start = end if cut < 0 else cut + 1
    return head, asm[start:end]


def split_locations(asm: str) -> tuple[str, TermLines]:
    """``asm`` (a module printed with locations) as plain text, and the lines of that text
    each recurrence term became.

    The plain text is the module as printed without locations. A line belongs to the terms
    of the last location on it, the op's own (its operands' and block arguments' come first;
    an op with regions prints its location after them, on the line that closes them).

    The module is cut at each ``" loc("``: a piece then starts with a location and runs to the
    next, and the newlines in the pieces before a location give its line. Done with the
    string methods over all pieces at once, this takes a third of the time of going through
    the lines (the pipeline does it after every pass); a location holding parentheses (a call
    site) takes the line-by-line way."""
    aliases: dict[str, str] = {}
    head, body = _module(asm, aliases)
    pieces = body.split(" loc(")
    # (location, ")", the text after it up to the next location)
    parts = list(map(str.partition, pieces[1:], repeat(")")))
    locations = list(map(itemgetter(0), parts))
    if not all(map(itemgetter(1), parts)) or any("(" in loc or "\n" in loc
                                                 for loc in locations):
        return _split_lines(asm)
    # location k is on line lines[k] (the newlines before it), and is the last on its line
    # when a newline comes before the next location
    lines = list(accumulate(map(str.count, pieces, repeat("\n"))))
    last = [*map(gt, lines[1:], lines[:-1]), True]
    at: dict[str, list[int]] = {}     # a location -> the lines it owns
    for loc, line in zip(compress(locations, last), compress(lines, last)):
        found = at.get(loc)
        if found is None:
            at[loc] = [line + len(head)]
        else:
            found.append(line + len(head))
    terms: TermLines = {}
    for loc, indices in at.items():
        for term in dict.fromkeys(_terms(loc, aliases)):
            terms.setdefault(term, []).extend(indices)
    for indices in terms.values():
        indices.sort()
    plain = "".join([*(line + "\n" for line in head), pieces[0], *map(itemgetter(2), parts)])
    return plain + ("\n" if asm.endswith("\n") else ""), terms


def _split_lines(asm: str) -> tuple[str, TermLines]:
    """:func:`split_locations` one line at a time, with a regular expression for the
    locations (one level of parentheses inside)."""
    aliases: dict[str, str] = {}
    head, body = _module(asm, aliases)
    plain: list[str] = []
    terms: TermLines = {}
    for line in [*head, *body.split("\n")]:
        uses = _USE.findall(line)
        if uses:
            for term in dict.fromkeys(_terms(uses[-1], aliases)):
                terms.setdefault(term, []).append(len(plain))
            line = _USE.sub("", line)
        plain.append(line)
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
