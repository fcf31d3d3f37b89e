"""Malformed and hostile artifacts: every failure of :func:`load_artifact` is an ArtifactError
that names the file or the field, and nothing it opens can block or exhaust memory.

The manifest is fuzzed field by field (every value of a real manifest replaced by values of
every JSON type), then the files on disk: non-UTF-8 bytes, deep nesting, oversized files,
FIFOs, directories and symbolic links in place of files, PTX names that leave the directory.
"""

from __future__ import annotations

import copy
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from explorer.runtime import contract as contract_mod
from explorer.runtime.artifact import (
    MANIFEST_LIMIT,
    PTX_LIMIT,
    ArtifactError,
    load_artifact,
    validate_manifest,
    write_artifact,
)
from tests.unit.test_runtime_artifact import PTX, _manifest, _per_call, ptx_entry

#: values of every JSON type (and a few edge cases) put in place of each field
WRONG = [None, True, False, 0, -1, 2**70, 10**400, 1.5, float("nan"), "", "x", "../x",
         "\u0000", [], [1], ["a"], {}, {"a": 1}, [[[[[]]]]]]


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """Fail, rather than hang, a test that opens something that blocks (a FIFO)."""
    def boom(*_: object) -> None:
        raise TimeoutError("the loader blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into a JSON value (keys and indices), the root excluded."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k)
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*path, i)
            yield from _paths(v, (*path, i))


def _set(m: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        m = m[p]
    m[path[-1]] = value


def _names_a_field_of(message: str, path: tuple[Any, ...]) -> bool:
    """The message names the changed field, or (for a check across fields) one it is in."""
    return any(p in message for p in path if isinstance(p, str))


@pytest.mark.parametrize("base", [_manifest(), _per_call()], ids=["plain", "per-call"])
def test_every_field_with_every_type(base: dict[str, Any], tmp_path: Path) -> None:
    from explorer.errors import LaunchError
    from explorer.runtime.cuda import CudaKernel

    tried = accepted = 0
    for path in _paths(base):
        for value in WRONG:
            m = copy.deepcopy(base)
            _set(m, path, value)
            tried += 1
            try:
                validate_manifest(m)
            except ArtifactError as err:
                assert _names_a_field_of(str(err), path), (path, value, str(err))
                assert len(str(err)) < 400, str(err)   # the value is shown cut short
                continue
            # accepted: then it also round-trips through the disk and describes itself
            accepted += 1
            loaded = load_artifact(write_artifact(tmp_path / f"a{tried}", _ptx_for(m), m))
            loaded.describe()
            assert loaded.manifest == json.loads((loaded.path / "manifest.json").read_text())
            assert isinstance(loaded.options, dict) and isinstance(loaded.outputs, tuple)
            assert isinstance(loaded.recurrence, str) and isinstance(loaded.vector, bool)
            try:
                CudaKernel(loaded)
            except LaunchError:
                pass
    assert tried > 1000 and 0 < accepted < tried / 2


def _ptx_for(m: dict[str, Any]) -> dict[str, str]:
    files: dict[str, str] = {}
    for k in m["kernels"]:
        name = k.get("ptx", "kernel.ptx")
        files[name] = files.get(name, "") + ptx_entry(k["name"], len(k["args"]))
    return files


# --- the files on disk ---------------------------------------------------------------------

@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_artifact(tmp_path / "art", PTX, _manifest())


def _manifest_bytes(folder: Path, data: bytes) -> None:
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").write_bytes(data)


@pytest.mark.parametrize("data, match", [
    (b"", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"format": "scanweaver-artifact/1", "kernels": "\xe9"}', "not UTF-8"),
    (b"[" * 100_000, "nested deeper"),
    (b"{\"a\":" * 5000 + b"1" + b"}" * 5000, "nested deeper"),
    (b"[]", "JSON object"),
    (b"\"text\"", "JSON object"),
    (b"12", "JSON object"),
    (b"{\"format\": NaN}", "NaN is not a JSON number"),
    (b"{\"format\": -Infinity}", "Infinity is not a JSON number"),
    (b"{\"format\": " + b"9" * 5000 + b"}", "not valid JSON"),
    (b"{not json", "not valid JSON"),
])
def test_manifest_bytes(good: Path, data: bytes, match: str) -> None:
    _manifest_bytes(good, data)
    with pytest.raises(ArtifactError, match=match) as info:
        load_artifact(good)
    assert "manifest.json" in str(info.value)


def test_nested_values_are_refused_with_their_field(good: Path) -> None:
    m = json.loads((good / "manifest.json").read_text())
    deep: Any = 1
    for _ in range(60):
        deep = [deep]
    m["versions"] = {"tool": deep}
    _manifest_bytes(good, json.dumps(m).encode())
    with pytest.raises(ArtifactError, match=r"manifest\.versions\.tool\[0\].*nested deeper"):
        load_artifact(good)


def test_an_oversized_manifest_is_not_read(good: Path) -> None:
    with open(good / "manifest.json", "r+b") as f:
        f.truncate(MANIFEST_LIMIT + 1)   # sparse: cheap to make, refused before reading
    with pytest.raises(ArtifactError, match="manifest.json.*more than"):
        load_artifact(good)


def test_an_oversized_ptx_is_not_read(good: Path) -> None:
    with open(good / "kernel.ptx", "r+b") as f:
        f.truncate(PTX_LIMIT + 1)
    with pytest.raises(ArtifactError, match=r"kernels\[0\]\.ptx 'kernel.ptx'.*more than"):
        load_artifact(good)


def test_non_utf8_ptx(good: Path) -> None:
    (good / "kernel.ptx").write_bytes(PTX.encode() + b"\xff")
    with pytest.raises(ArtifactError, match=r"kernels\[0\]\.ptx.*not UTF-8"):
        load_artifact(good)


@pytest.mark.parametrize("name", ["manifest.json", "kernel.ptx"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "link outside", "dangling link"])
def test_something_else_in_place_of_a_file(good: Path, tmp_path: Path, name: str,
                                           kind: str) -> None:
    target = good / name
    outside = tmp_path / "outside"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "link outside":
        target.symlink_to(outside)
    else:
        target.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ArtifactError) as info:
        load_artifact(good)
    message = str(info.value)
    assert name in message or (name == "kernel.ptx" and "ptx" in message), message
    expect = {"fifo": "FIFO", "directory": "directory", "link outside": "symbolic link",
              "dangling link": "symbolic link"}[kind]
    assert expect in message, message


@pytest.mark.parametrize("ptx", ["../outside.ptx", "sub/kernel.ptx", "/etc/passwd",
                                 "kernel.ptx/..", ".hidden.ptx", "kernel.ptx\u0000",
                                 "kernel", "manifest.json", "", "a" * 300 + ".ptx"])
def test_ptx_names_stay_inside_the_directory(good: Path, ptx: str) -> None:
    m = _manifest()
    m["kernels"][0]["ptx"] = ptx
    with pytest.raises(ArtifactError, match=r"kernels\[0\]: ptx must be"):
        validate_manifest(m)
    with pytest.raises(ArtifactError, match="ptx must be"):
        write_artifact(good.parent / "w", PTX, m)


@pytest.mark.parametrize("path", ["missing", "file", "fifo", "nul"])
def test_the_artifact_path_itself(tmp_path: Path, path: str) -> None:
    p = tmp_path / path
    if path == "file":
        p.write_text("{}")
    elif path == "fifo":
        os.mkfifo(p)
    arg: Any = str(p) + "\u0000" if path == "nul" else p
    with pytest.raises(ArtifactError, match="not"):
        load_artifact(arg)


def test_the_manifest_path_may_be_given(good: Path) -> None:
    assert load_artifact(good / "manifest.json").path == good.resolve()


@pytest.mark.parametrize("value, match", [
    (None, "hash"), (12, "hash"), ("abc", "64 hex digits"), ("0" * 64, "hash mismatch"),
    ("A" * 64, "64 hex digits"),
])
def test_hash_field(good: Path, value: Any, match: str) -> None:
    m = json.loads((good / "manifest.json").read_text())
    m["hash"] = value
    _manifest_bytes(good, json.dumps(m).encode())
    with pytest.raises(ArtifactError, match=match):
        load_artifact(good)


def test_a_changed_manifest_fails_the_hash(good: Path) -> None:
    m = json.loads((good / "manifest.json").read_text())
    m["kernels"][0]["block"] = [128, 1, 1]
    _manifest_bytes(good, json.dumps(m).encode())
    with pytest.raises(ArtifactError, match="hash mismatch"):
        load_artifact(good)


def test_writing_replaces_fifos_and_links_instead_of_writing_through(good: Path,
                                                                      tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (good / "kernel.ptx").unlink()
    (good / "kernel.ptx").symlink_to(outside)
    (good / "manifest.json").unlink()
    os.mkfifo(good / "manifest.json")
    write_artifact(good, PTX, _manifest())
    assert outside.read_text() == "keep me"
    assert load_artifact(good).ptx_text["kernel.ptx"] == PTX


def test_write_refuses_ptx_for_files_no_kernel_names(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no kernel names"):
        write_artifact(tmp_path / "a", {"kernel.ptx": PTX, "../evil.ptx": PTX}, _manifest())
    assert not (tmp_path / "evil.ptx").exists()


def test_too_many_kernels_or_arguments() -> None:
    m = _manifest()
    m["kernels"] = m["kernels"] * (contract_mod.MAX_KERNELS + 1)
    with pytest.raises(ArtifactError, match="kernels has"):
        validate_manifest(m)
    m = _manifest()
    m["kernels"][0]["args"] = m["kernels"][0]["args"] * 40
    with pytest.raises(ArtifactError, match="args has"):
        validate_manifest(m)
