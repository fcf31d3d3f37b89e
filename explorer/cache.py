"""The compile cache: compiled results kept in memory and on disk, keyed by what made them.

:func:`explorer.compiler.compile` looks a key up here before compiling and remembers what it
compiled.  In memory: the last :data:`_MEMORY_LIMIT` results.  On disk: one record per compile
(:mod:`explorer.compiled_record`'s format) and the artifacts that CUDA runs saved, under
:func:`cache_dir`, bounded by :func:`cache_limit_bytes`.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from explorer.compiled import Compiled
from explorer.compiled_record import _KEY, RECORD_LIMIT, _decode, _encode, _write_bytes
from explorer.frontend.recurrence import Recurrence

_MEMORY: OrderedDict[str, Compiled] = OrderedDict()
_MEMORY_LIMIT = 64
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where compiled results are kept: $SCANWEAVER_CACHE, else ~/.cache/scanweaver."""
    root = os.environ.get("SCANWEAVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "scanweaver")
    return Path(root)


def _from_memory(key: str) -> Compiled | None:
    with _LOCK:
        hit = _MEMORY.get(key)
        if hit is not None:
            _MEMORY.move_to_end(key)
        return hit


def _remember(c: Compiled) -> None:
    with _LOCK:
        _MEMORY[c.key] = c
        while len(_MEMORY) > _MEMORY_LIMIT:
            _MEMORY.popitem(last=False)


# The disk cache holds one gzip-compressed record per compile (``<key>.json.gz``, a few hundred
# KB) and the artifacts that CUDA runs saved (``artifacts/<key>/``).  It is kept under
# $SCANWEAVER_CACHE_MB megabytes (default 256): after each write the least recently used entries
# go.  Only files with these names are ever read or deleted: the folder may hold other things.
_ENTRY = re.compile(r"([0-9a-f]{32})\.json(?:\.gz)?")   # .json: format 1
_ARTIFACT_FILES = re.compile(r"manifest\.json|[A-Za-z0-9_.-]+\.ptx|[^/]*\.tmp")


def cache_limit_bytes() -> int:
    """The disk cache's bound: $SCANWEAVER_CACHE_MB megabytes, 256 unless set."""
    raw = os.environ.get("SCANWEAVER_CACHE_MB", "256")
    try:
        mb = float(raw)
    except ValueError:
        mb = 256.0
    return max(0, int(mb * 1024 * 1024))


def _cache_entries(folder: Path) -> list[tuple[float, int, list[Path]]]:
    """(last use, bytes, files) of every entry of ours under ``folder``."""
    from explorer.files import is_own_file

    entries: dict[str, list[Path]] = {}
    try:
        for p in folder.iterdir():
            m = _ENTRY.fullmatch(p.name)
            if m and is_own_file(p):
                entries.setdefault(m.group(1), []).append(p)
        art = folder / "artifacts"
        if art.is_dir() and not art.is_symlink():
            for d in art.iterdir():
                if _KEY.fullmatch(d.name) and d.is_dir() and not d.is_symlink():
                    files = [f for f in d.iterdir()
                             if _ARTIFACT_FILES.fullmatch(f.name) and is_own_file(f)]
                    entries.setdefault(d.name, []).extend([*files, d])
    except OSError:
        return []
    out = []
    for files in entries.values():
        used, size = 0.0, 0
        for f in files:
            try:
                st = os.lstat(f)
            except OSError:
                continue
            used = max(used, st.st_mtime)
            size += st.st_size if f.is_file() else 0
        out.append((used, size, files))
    return out


def _remove(files: list[Path]) -> None:
    for f in sorted(files, key=lambda p: p.is_dir()):   # files first, then their folder
        try:
            if f.is_dir() and not f.is_symlink():
                f.rmdir()
            else:
                f.unlink()
        except OSError:
            pass


def _evict(folder: Path, keep: str | None = None) -> None:
    """Drop the least recently used entries until the cache fits its bound."""
    entries = sorted(_cache_entries(folder), key=lambda e: e[0])
    total = sum(size for _, size, _ in entries)
    limit = cache_limit_bytes()
    for _, size, files in entries:
        if total <= limit:
            break
        if keep is not None and any(keep in f.name for f in files):
            continue
        _remove(files)
        total -= size


# Entries are written by one background thread (encoding, the ptxas report and gzip cost a few
# hundred ms that a compile need not wait for); a read of the same key, clear_cache and the end
# of the process wait for the writes in flight.
_WRITER: Any = None
_WRITES: dict[str, Any] = {}


def _to_disk(c: Compiled) -> None:
    global _WRITER
    from concurrent.futures import ThreadPoolExecutor

    def write() -> None:
        folder = cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_bytes(folder / f"{c.key}.json.gz", _encode(c), compress=True)
            _evict(folder, keep=c.key)
        except OSError:
            pass  # a read-only home is no reason to fail a compile
        finally:
            with _LOCK:
                if _WRITES.get(c.key) is future:
                    del _WRITES[c.key]

    with _LOCK:
        if _WRITER is None:
            _WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scanweaver-cache")
        future = _WRITER.submit(write)
        _WRITES[c.key] = future


def wait_for_cache_writes(key: str | None = None) -> None:
    """Wait until the disk cache holds what was compiled (one key, or every write)."""
    with _LOCK:
        pending = [f for k, f in _WRITES.items() if key is None or k == key]
    for f in pending:
        f.result()


def _from_disk(key: str, rec: Recurrence) -> Compiled | None:
    from explorer.files import UnsafeFile, read_regular

    wait_for_cache_writes(key)
    path = cache_dir() / f"{key}.json.gz"
    try:
        raw = read_regular(path, RECORD_LIMIT, follow_links=False)
    except FileNotFoundError:
        return None
    except (OSError, UnsafeFile):
        return None   # not ours to read (a link, a FIFO, ...): compile again
    try:
        c = _decode(raw, rec, key)
    except ValueError:
        # a damaged entry is never trusted: drop it and compile again
        try:
            path.unlink()
        except OSError:
            pass
        return None
    try:
        os.utime(path)   # last use, for eviction
    except OSError:
        pass
    _remember(c)
    return c


def clear_cache() -> None:
    """Forget every compiled result, in memory and on disk (only the cache's own files)."""
    wait_for_cache_writes()
    with _LOCK:
        _MEMORY.clear()
    folder = cache_dir()
    for _, _, files in _cache_entries(folder):
        _remove(files)
    for empty in (folder / "artifacts", folder):
        try:
            empty.rmdir()   # only when nothing else is left in it
        except OSError:
            pass
