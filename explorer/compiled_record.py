"""A compile on disk: :meth:`Compiled.dump` writes it, :func:`load_compiled` reads it back.

The record keeps every stage, pass and kernel as JSON (gzip-compressed when the name ends with
``.gz``); reading it needs no MLIR, and the disk cache (:mod:`explorer.cache`) stores its
entries in the same format.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from explorer.codegen.records import PassRecord
from explorer.compiled import _BACK, Compiled, Stage, _assemble
from explorer.errors import OptionError
from explorer.frontend.recurrence import Recurrence
from explorer.passes.affine import decompose

# A compiled record on disk: one line of JSON header (format, key, the sha256 of the payload's
# bytes), a newline, then the payload as JSON.  The checksum is over the bytes as written, so
# checking it costs one hash, not a second serialisation.  It detects damage, not intent: anyone
# can write a record with a valid checksum, so a decoded record is untrusted (``trusted=False``):
# its text is shown and its PTX runs on the GPU like any artifact, but its host code is rebuilt
# from the recurrence text and options (the lowered host module is not even stored).
_FORMAT = "scanweaver-compiled/5"
#: largest record read (uncompressed): a compile of the selective scan is a few MB
RECORD_LIMIT = 256 * 1024 * 1024
_KEY = re.compile(r"[0-9a-f]{32}")


def _encode(c: Compiled) -> bytes:
    """Everything a compile recorded, with a checksum over it."""
    payload = json.dumps({
        "recurrence": c.recurrence.text,
        "strategy": c.strategy, "target": c.target, "options": c.options,
        # each thing once: the passes' IR in the passes, the PTX and LLVM IR in their stages
        "stages": [asdict(s) for s in c.stages.values()
                   if s.name not in {p.name for p in c.passes}],
        # a pass that changed nothing keeps no copy of the IR (null: as the pass before)
        "passes": [dict(asdict(p), ir=p.ir if p.changed else None) for p in c.passes],
        "kernels": c.kernels, "plan": _plan_dict(c), "ptx_info": c.ptx_info,
    }).encode()
    header = json.dumps({"format": _FORMAT, "key": c.key,
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    return header + b"\n" + payload


def _plan_dict(c: Compiled) -> dict[str, Any]:
    """The plan as the record keeps it (the fused backward's: its tile; its terms are derived
    again from the recurrence when read)."""
    if c.options.get("backward"):
        return {"backward": [c.scan_plan.threads, c.scan_plan.elements]}
    return asdict(c.scan_plan)


def _decode(raw: bytes, rec: Recurrence | None = None, key: str | None = None) -> Compiled:
    """Rebuild a :class:`Compiled` from :func:`_encode`'s bytes (untrusted); ValueError when
    damaged or malformed, whatever is wrong with it."""
    from explorer.errors import RecurrenceError
    from explorer.files import gunzip_limited

    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_limited(raw, RECORD_LIMIT, "the compiled record")
    head, sep, body = raw.partition(b"\n")
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        header = None
    if not sep or not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise ValueError(f"not a compiled record (format {_FORMAT})")
    if not isinstance(header.get("key"), str) or not _KEY.fullmatch(header["key"]):
        raise ValueError("the record's key is malformed")
    if key is not None and header.get("key") != key:
        raise ValueError("the record belongs to another compile")
    if header.get("sha256") != hashlib.sha256(body).hexdigest():
        raise ValueError("the compiled record is damaged (checksum mismatch)")
    try:
        return _rebuild(json.loads(body), header["key"], rec)
    except RecurrenceError as err:
        raise ValueError(f"the record's recurrence does not parse: {err}") from None
    except OptionError as err:
        raise ValueError(f"the record's options are invalid: {err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError,
            AttributeError) as err:
        raise ValueError(f"the compiled record is malformed ({type(err).__name__}: {err})"
                         ) from None


def _rebuild(payload: Any, key: str, rec: Recurrence | None) -> Compiled:
    from explorer.codegen.options import validate

    def typed(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
        if not isinstance(value, kind):
            raise TypeError(f"{what} has the wrong type")
        return value

    typed(payload, dict, "the payload")
    text = typed(payload["recurrence"], str, "recurrence")
    if rec is None:
        rec = Recurrence.parse(text)
    elif rec.text != text:
        raise ValueError("the compiled record is of another recurrence")
    strategy = typed(payload["strategy"], str, "strategy")
    target = typed(payload["target"], str, "target")
    opts = typed(payload["options"], dict, "options")
    if "fast_math" not in opts:   # written before the option: no scan-fastmath pass ran
        opts = {**opts, "fast_math": "none"}
    kernels = typed(payload["kernels"], list, "kernels")
    for k in kernels:
        typed(k, dict, "a kernel")
    form = decompose(rec)
    opts = _param_rows(opts, form, kernels)
    checked = asdict(validate(strategy, target, **{k: v for k, v in opts.items()
                                                   if k not in ("strategy", "target")}))
    kept: list[Stage] = []
    for s in typed(payload["stages"], list, "stages"):
        stage = Stage(**typed(s, dict, "a stage"))
        for f in ("name", "text", "kind"):
            typed(getattr(stage, f), str, f"stage {f}")
        typed(stage.dot, (str, type(None)), "stage dot")
        typed(stage.seconds, (int, float), "stage seconds")
        kept.append(stage)
    passes: list[PassRecord] = []
    previous = next((s.text for s in kept if s.name == "mlir"), "")
    for p in typed(payload["passes"], list, "passes"):
        record = PassRecord(**typed(p, dict, "a pass"))
        if record.ir is None and not record.changed:
            record.ir = previous
        previous = record.ir
        for f in ("name", "ir", "pipeline"):
            typed(getattr(record, f), str, f"pass {f}")
        for term, lines in typed(record.locations, dict, "pass locations").items():
            typed(term, str, "a location's term")
            if not all(isinstance(i, int) and not isinstance(i, bool)
                       for i in typed(lines, list, "a location's lines")):
                raise TypeError("a location's lines are integers")
        passes.append(record)
    stages = _assemble([s for s in kept if s.name not in _BACK], passes,
                       [s for s in kept if s.name in _BACK])
    ptx = stages["ptx"].text if "ptx" in stages else None
    llvm_ir = stages["llvm"].text
    ptx_info = typed(payload["ptx_info"], (dict, type(None)), "ptx_info")
    if checked["backward"]:   # the fused backward: its terms derived again, its tile read
        from explorer.passes.backward import backward_plan_from_dict, reads_states

        bplan = backward_plan_from_dict(payload["plan"], form, kernels,
                                        reads_states(checked["backward"]))
        return Compiled(rec, form, bplan.picture(bplan.threads), strategy, target,
                        checked, stages, passes, kernels, "", ptx, llvm_ir, ptx_info, key,
                        from_cache=True, trusted=False, scan_plan=bplan)
    from explorer.passes.plan import plan_from_dict

    # an argument of one step in a tile is a fused backward's saved states alone: a forward
    # kernel reads every step of its inputs (the runtime would take a shorter array)
    if any(isinstance(a, dict) and "every" in a for k in kernels for a in k.get("args", ())):
        raise ValueError("the record's forward kernels take an argument of one step in a "
                         "tile, which only a fused backward's saved states are")
    plan = plan_from_dict(payload["plan"])
    _kernel_blocks(plan, kernels)
    return Compiled(rec, form, plan.picture(plan.threads), strategy, target, checked,
                    stages, passes, kernels, "", ptx, llvm_ir, ptx_info, key, from_cache=True,
                    trusted=False, scan_plan=plan)


def _kernel_blocks(plan: Any, kernels: list[dict[str, Any]]) -> None:
    """The plan's look-back threads are its look-back kernel's block, and its short kernel's
    threads and longest sequence the short kernel's: a record whose plan says otherwise is
    refused (the runtime would launch the kernels' blocks, the explorer show the plan's)."""
    def named(suffix: str) -> list[dict[str, Any]]:
        return [k for k in kernels if str(k.get("name", "")).endswith(suffix)]
    blocks = [k.get("block") for k in named("_lookback")]
    if plan.lookback is not None and blocks != [[plan.lookback.threads, 1, 1]]:
        raise ValueError(f"the record's plan (look-back blocks of {plan.lookback.threads} "
                         f"threads) disagrees with its look-back kernel's block "
                         f"({blocks!r:.60})")
    short = plan.short
    want = [[[short.threads, 1, 1], short.longest]] if short is not None else []
    got = [[k.get("block"), k.get("launch_unless_longer_than")] for k in named("_short")]
    if got != want:
        raise ValueError(f"the record's plan (short kernel {short}) disagrees with its short "
                         f"kernels ({got!r:.80})")


def _param_rows(opts: dict[str, Any], form: Any, kernels: list[dict[str, Any]]
                ) -> dict[str, Any]:
    """``opts`` with the ``param_rows`` the kernels were compiled with, checked against their
    arguments (the rule of ``codegen.contract``: a vector recurrence's kernels take a row
    modulus per parameter unless ``param_rows="channel"``): a record written before the option
    says what its kernels do (no modulus: ``channel``); one whose options disagree with its
    kernels is refused, as the runtime would follow the kernels and the explorer show the
    options."""
    moduli = {a.get("name") for k in kernels for a in k.get("args", ())
              if a.get("role") == "rowmod"}
    if "param_rows" not in opts:
        opts = {**opts, "param_rows": "channel" if form.vector and not moduli else "auto"}
    want = (set(form.params) if form.vector and opts["param_rows"] != "channel" else set())
    if moduli != want:
        raise ValueError(f"the record's options (param_rows={opts['param_rows']!r:.20}) "
                         f"disagree with its kernels' row moduli ({sorted(map(str, moduli))})")
    return opts


def load_compiled(path: str | os.PathLike[str]) -> Compiled:
    """Read a file written by :meth:`Compiled.dump`: every stage, without MLIR.

    The result runs (on the GPU through CuPy, or on the CPU when MLIR is present) and the
    explorer widget shows it: ``explorer.Explorer(load_compiled(path))``.
    """
    from explorer.files import read_regular

    try:
        return _decode(read_regular(path, RECORD_LIMIT))
    except (OSError, EOFError) as err:
        raise ValueError(f"{path} is not a compiled record: {err}") from None
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _write_bytes(path: Path, data: bytes, compress: bool = False) -> None:
    """Write atomically: a reader never sees half a file."""
    if compress:
        data = gzip.compress(data, compresslevel=6)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)

