"""Artifacts: the compiled kernel (PTX) and its JSON manifest, as a directory on disk.

This is the hand-off between the compiler (which writes an artifact with :func:`write_artifact`)
and the runtimes (which read it with :func:`load_artifact`).  Both sides use this one module so
the format has one definition.  Only the standard library and NumPy are imported: an artifact
compiled on a machine with MLIR loads on a GPU server that has NumPy and CuPy alone.

Layout of an artifact directory::

    manifest.json   the manifest (format ``scanweaver-artifact/1``)
    kernel.ptx      the PTX of the kernels (one file per distinct ``ptx`` name in the manifest)

Kernels are launched in list order, all with the same arguments.  Beyond the contract's
geometry a kernel may give ``time_chunk`` (one block per chunk of that many steps: grid_x is
multiplied by ``ceil(L / time_chunk)``) and ``launch_when_longer_than`` (launched only when L is
longer), and an argument of role ``workspace`` is a zeroed float32 scratch buffer of
``C * N * ceil(L / time_chunk) * per_chunk`` floats, after the sizes.

Chunk length chosen per call: ``time_chunk`` and ``launch_when_longer_than`` (of a kernel or a
workspace) are either an integer fixed at compile time or the *name* of a size argument whose
value the runtime chooses for each call.  The only such size argument is ``time_chunk`` (int64,
after the workspaces); it carries its rule as
``chunk_rule = {"tile", "min_tiles", "fill", "unchunked_from"}`` (see :func:`choose_time_chunk`):
with ``slots = SMs * resident blocks per SM`` of the machine,

* ``C * N >= unchunked_from * slots``: no chunking, ``time_chunk = tile * ceil(L / tile)``
  (>= L), so the kernels launched only when ``L > time_chunk`` are skipped and one block scans
  a sequence (inputs read once);
* otherwise the fewest chunks per sequence that give ``fill * slots`` blocks:
  ``chunks = ceil(fill * slots / (C * N))`` and
  ``time_chunk = tile * max(min_tiles, ceil(ceil(L / tile) / chunks))``.

The same value is passed to every kernel and sizes the workspaces, so the grid and workspace
formulas above hold with it.  A manifest with integers only (older artifacts) launches as before.

The manifest's ``hash`` is the SHA-256 of its own canonical JSON (sorted keys, without the
``hash`` field) followed by the bytes of every PTX file in kernel order.  It is mandatory:
:func:`load_artifact` refuses a manifest without one, and an artifact whose files were changed
after it was written.  The hash detects damage, not intent (anyone can write a matching one).

An artifact comes from elsewhere, so :func:`load_artifact` trusts nothing in it: the manifest
and the PTX files must be regular files inside the directory (not links, FIFOs or directories),
at most :data:`MANIFEST_LIMIT` / :data:`PTX_LIMIT` bytes, UTF-8, and every field is checked for
its type and range.  Every failure is an :class:`ArtifactError` naming the file or the field.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorer.runtime.contract import (
    _IDENT,
    DEFAULT_PTX,
    ArgInfo,
    ArtifactError,
    ChunkRule,
    KernelInfo,
    Machine,
    _need,
    _show,
    choose_time_chunk,
    parse_kernels,
    size_values,
)

# the kernel contract, its types and their checks, is owned by explorer.runtime.contract; the
# names below are what the rest of the project imports from here
from explorer.runtime.dtypes import ARRAY_DTYPES

__all__ = ["DEFAULT_PTX", "FORMAT", "MANIFEST", "ArgInfo", "Artifact", "ArtifactError",
           "ChunkRule", "KernelInfo", "Machine", "choose_time_chunk", "content_hash",
           "load_artifact", "size_values", "validate_manifest", "write_artifact"]

FORMAT = "scanweaver-artifact/1"
MANIFEST = "manifest.json"
#: largest manifest read (the selective scan's is about 7 KB)
MANIFEST_LIMIT = 2 * 1024 * 1024
#: largest PTX file read (the selective scan's is about 60 KB)
PTX_LIMIT = 16 * 1024 * 1024
#: deepest nesting of JSON values in a manifest (the format itself needs 5)
MAX_DEPTH = 32
_HASH = re.compile(r"[0-9a-f]{64}")
@dataclass
class Artifact:
    """A loaded artifact: the parsed manifest plus the PTX text of every kernel."""

    path: Path | None
    manifest: dict[str, Any]
    kernels: tuple[KernelInfo, ...]
    ptx_text: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def recurrence(self) -> str:
        return str(self.manifest.get("recurrence", ""))

    @property
    def strategy(self) -> str:
        return str(self.manifest.get("strategy", ""))

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.manifest.get("options") or {})

    @property
    def chip(self) -> str:
        return str(self.manifest.get("chip", ""))

    @property
    def dtype(self) -> str:
        return str(self.manifest.get("dtype", "float32"))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.manifest.get("outputs") or ())

    @property
    def vector(self) -> bool:
        return bool(self.manifest.get("vector", False))

    @property
    def hash(self) -> str:
        return str(self.manifest.get("hash", ""))

    def ptx_path(self, kernel: KernelInfo) -> Path:
        if self.path is None:
            raise ArtifactError("this artifact was not loaded from a directory")
        return self.path / kernel.ptx

    def describe(self) -> str:
        """One line for tables and logs: strategy, options and the short hash."""
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items())
                         if k not in ("strategy", "target"))
        return f"{self.strategy} [{opts}] {self.hash[:10]}"
def validate_manifest(manifest: Mapping[str, Any]) -> tuple[KernelInfo, ...]:
    """Check a manifest against the format; return its kernels.  Raises :class:`ArtifactError`."""
    if not isinstance(manifest, Mapping):
        raise ArtifactError(f"the manifest must be a JSON object, got {_show(manifest)}")
    _check_values(manifest)
    fmt = _need(manifest, "format", "manifest")
    if fmt != FORMAT:
        raise ArtifactError(f"manifest: format {_show(fmt)} is not {FORMAT!r}")
    dtype = manifest.get("dtype", "float32")
    if dtype not in ARRAY_DTYPES:
        raise ArtifactError(f"manifest: dtype {_show(dtype)} is not supported (one of "
                            f"{', '.join(ARRAY_DTYPES)})")
    for key, kind, what in _TOP_FIELDS:
        if key in manifest and not isinstance(manifest[key], kind):
            raise ArtifactError(f"manifest: field {key!r} must be {what}, "
                                f"got {_show(manifest[key])}")
    if "hash" in manifest and not _HASH.fullmatch(manifest["hash"]):
        raise ArtifactError(f"manifest: field 'hash' must be 64 hex digits (SHA-256), "
                            f"got {_show(manifest['hash'])}")
    kernels = parse_kernels(_need(manifest, "kernels", "manifest"), "manifest: kernels")
    # the inputs are what the manifest's dtype says (the launchers round into each argument's)
    for i, k in enumerate(kernels):
        other = sorted({a.dtype for a in k.args_with_role("input")} - {dtype})
        if other:
            raise ArtifactError(f"manifest: kernels[{i}].args ({k.name!r}) take {other} inputs, "
                                f"but the manifest's dtype is {dtype!r}")
    for field_name in ("outputs", "lane_outputs"):
        names = manifest.get(field_name)
        if names is not None and not all(isinstance(o, str) and _IDENT.fullmatch(o)
                                         for o in names):
            raise ArtifactError(f"manifest: {field_name} must be a list of names, "
                                f"got {_show(names)}")
    outputs = manifest.get("outputs")
    if outputs is not None:
        for i, k in enumerate(kernels):
            written = {a.name for a in k.args_with_role("output")}
            unknown = sorted(written - set(outputs))
            if unknown:
                raise ArtifactError(f"manifest: kernels[{i}].args ({k.name!r}) write {unknown}, "
                                    f"which are not in outputs {list(outputs)}")
        produced = set().union(*({a.name for a in k.args_with_role("output")} for k in kernels))
        missing = [o for o in outputs if o not in produced]
        if missing:
            raise ArtifactError(f"manifest: outputs {missing} are written by no kernel (no "
                                "argument of role 'output' in kernels[].args)")
    return kernels
#: optional top-level fields: (name, type, what the message says it must be)
_TOP_FIELDS: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("recurrence", str, "a string"), ("strategy", str, "a string"),
    ("options", dict, "an object"), ("chip", str, "a string"), ("vector", bool, "true or false"),
    ("outputs", list, "a list of names"), ("lane_outputs", list, "a list of names"),
    ("versions", dict, "an object"), ("key", str, "a string"), ("hash", str, "a string"),
)
def _check_values(manifest: Mapping[str, Any]) -> None:
    """Refuse values nested deeper than :data:`MAX_DEPTH` and numbers JSON cannot hold (NaN,
    infinities), anywhere in the manifest (checked without recursion)."""
    stack: list[tuple[Any, int, str]] = [(manifest, 1, "manifest")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise ArtifactError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, float) and not math.isfinite(value):
            raise ArtifactError(f"{where}: {value} is not a JSON number")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))
def content_hash(manifest: Mapping[str, Any], ptx_text: Mapping[str, str]) -> str:
    """SHA-256 of the manifest (sorted keys, no ``hash``) and the PTX files in kernel order."""
    body = {k: v for k, v in manifest.items() if k != "hash"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                       default=str).encode())
    seen: list[str] = []
    for k in body.get("kernels", ()):
        ptx = k.get("ptx", DEFAULT_PTX) if isinstance(k, Mapping) else DEFAULT_PTX
        if ptx not in seen:
            seen.append(ptx)
    for name in seen:
        digest.update(b"\0" + name.encode() + b"\0")
        digest.update(ptx_text.get(name, "").encode())
    return digest.hexdigest()
def load_artifact(path: str | os.PathLike[str]) -> Artifact:
    """Read an artifact directory (or its ``manifest.json``) and check it.

    The content hash is mandatory and recomputed.  Raises :class:`ArtifactError` naming the
    file or field for anything wrong: a missing or unreadable file, a FIFO, directory or
    symbolic link in place of a file, a file over its size cap, bytes that are not UTF-8, JSON
    that does not parse or nests too deeply, a field of the wrong type, a missing or wrong hash.
    """
    p = Path(path)
    try:
        if p.name == MANIFEST and not p.is_dir():
            p = p.parent
        if not p.is_dir():
            raise ArtifactError(f"{p}: not an artifact directory (it {_what_is(p)})")
        mpath = p / MANIFEST
        if not os.path.lexists(mpath):
            raise ArtifactError(f"{p}: not an artifact directory (no {MANIFEST})")
        manifest = _parse_json(_read_text(mpath, MANIFEST_LIMIT, MANIFEST), mpath)
        try:
            kernels = validate_manifest(manifest)
        except ArtifactError as err:
            raise ArtifactError(f"{mpath}: {err}") from None
        if "hash" not in manifest:
            raise ArtifactError(f"{mpath}: missing field 'hash': every artifact carries the "
                                "SHA-256 of its manifest and PTX (write it with "
                                "write_artifact or Compiled.save)")
        ptx_text: dict[str, str] = {}
        for i, k in enumerate(kernels):
            if k.ptx not in ptx_text:
                fpath = p / k.ptx
                if not os.path.lexists(fpath):
                    raise ArtifactError(f"{p}: kernels[{i}].ptx names {k.ptx!r} (kernel "
                                        f"{k.name!r}), which is missing")
                ptx_text[k.ptx] = _read_text(fpath, PTX_LIMIT, f"kernels[{i}].ptx {k.ptx!r}")
            entry = re.search(rf"\.entry\s+{re.escape(k.name)}\s*\(([^)]*)\)",
                              ptx_text[k.ptx])
            if entry is None:
                raise ArtifactError(f"{p / k.ptx}: no .entry {k.name!r} in the PTX "
                                    f"(kernels[{i}].name)")
            # every argument is launched as 8 bytes (a pointer or an int64): the entry must take
            # as many 64-bit parameters as the manifest lists, or the launch would shift them
            params = re.findall(r"\.param\s+\.(\w+)", entry.group(1))
            if len(params) != len(k.args) or any(t not in ("u64", "s64", "b64") for t in params):
                raise ArtifactError(f"{p / k.ptx}: .entry {k.name!r} takes {len(params)} "
                                    f"parameters ({', '.join(sorted(set(params))) or 'none'}); "
                                    f"kernels[{i}].args lists {len(k.args)} of 64 bits")
        expect = content_hash(manifest, ptx_text)
        if expect != manifest["hash"]:
            raise ArtifactError(f"{p}: content hash mismatch (manifest {manifest['hash'][:12]}, "
                                f"files {expect[:12]}): the artifact was changed after it was "
                                "written")
        return Artifact(path=p.resolve(), manifest=manifest, kernels=kernels,
                        ptx_text=ptx_text)
    except OSError as err:
        raise ArtifactError(f"{err.filename or p}: cannot read the artifact "
                            f"({err.strerror or err})") from None
    except ValueError as err:   # an embedded NUL in the path, and the like
        if isinstance(err, ArtifactError):
            raise
        raise ArtifactError(f"{p}: not a usable artifact path ({err})") from None
def _what_is(path: Path) -> str:
    """'does not exist', 'is a file', 'is a FIFO', ... for a message."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "does not exist"
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"is {name}"
    return "is not a directory"
def _read_text(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of the regular file ``path`` (no link, FIFO, device; at most ``limit``
    bytes); opening never blocks."""
    from explorer.files import UnsafeFile, read_regular

    try:
        raw = read_regular(path, limit, follow_links=False)
    except UnsafeFile as err:     # a directory, link, FIFO, device or oversized file
        raise ArtifactError(f"{what}: {err}") from None
    except OSError as err:
        raise ArtifactError(f"{what}: cannot read {path} ({err.strerror or err})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ArtifactError(f"{what}: {path} is not UTF-8 text (byte {err.start})") from None
def _refuse_constant(name: str) -> Any:
    raise ArtifactError(f"{name} is not a JSON number")
def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ArtifactError as err:
        raise ArtifactError(f"{path}: {err}") from None
    except RecursionError:
        raise ArtifactError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:   # JSONDecodeError, an integer of too many digits
        raise ArtifactError(f"{path}: not valid JSON ({err})") from None
def write_artifact(path: str | os.PathLike[str], ptx: str | Mapping[str, str],
                   manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` and the PTX file(s) into ``path`` (created if needed).

    ``ptx`` is the PTX text (written to the file every kernel names, ``kernel.ptx`` by default)
    or a mapping file name -> text.  ``format`` and ``dtype`` are filled in when absent, the
    manifest is validated, and ``hash`` is computed; the written manifest is returned by
    :func:`load_artifact` unchanged.  Returns the directory.
    """
    body = copy.deepcopy(dict(manifest))
    body.setdefault("format", FORMAT)
    body.setdefault("dtype", "float32")
    body.pop("hash", None)
    kernels = validate_manifest(body)
    names = []
    for k in kernels:
        if k.ptx not in names:
            names.append(k.ptx)
    if isinstance(ptx, str):
        if len(names) != 1:
            raise ArtifactError(f"the kernels name several PTX files {names}: pass a mapping")
        files = {names[0]: ptx}
    else:
        files = dict(ptx)
        missing = [n for n in names if n not in files]
        if missing:
            raise ArtifactError(f"no PTX given for {missing}")
        extra = sorted(set(files) - set(names))
        if extra:
            raise ArtifactError(f"PTX given for {extra}, which no kernel names")
    for name, text in files.items():
        if not isinstance(text, str):
            raise ArtifactError(f"the PTX of {name!r} must be text, got {type(text).__name__}")
    body["hash"] = content_hash(body, files)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # each file replaces what was there (a FIFO, a link) instead of writing through it
    for name, text in files.items():
        _replace(out / name, text)
    _replace(out / MANIFEST, json.dumps(body, indent=2, sort_keys=False, default=str) + "\n")
    return out
def _replace(path: Path, text: str) -> None:
    """Write ``text`` to a new file beside ``path`` and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
