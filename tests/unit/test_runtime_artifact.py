"""The artifact format (manifest + PTX) and the CUDA runtime's checks that need no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from explorer.errors import RecurrenceError
from explorer.runtime.artifact import (
    FORMAT,
    ArtifactError,
    content_hash,
    load_artifact,
    validate_manifest,
    write_artifact,
)
from explorer.runtime.cuda import array_kind, check_array_dtype


def ptx_entry(name: str, params: int) -> str:
    """A PTX module with one empty entry ``name`` of ``params`` 64-bit parameters."""
    listed = ", ".join(f".param .u64 p{i}" for i in range(params))
    return (f"//\n.version 7.8\n.target sm_90\n.address_size 64\n.visible .entry {name}(\n"
            f"    {listed}\n)\n{{\n    ret;\n}}\n")


#: the module of the manifest below (seven arguments)
PTX = ptx_entry("scan_kernel", 7)


def _manifest(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "format": FORMAT, "recurrence": "h[t] = a[t] * h[t-1] + b[t]", "strategy": "blelloch",
        "options": {"block_size": 256}, "chip": "sm_90", "dtype": "float32",
        "kernels": [{
            "name": "scan_kernel", "ptx": "kernel.ptx", "block": [256, 1, 1],
            "sequences_per_block": 1, "shared_bytes": 0,
            "args": [
                {"name": "a", "role": "input", "timed": True, "lane": False, "dtype": "float32"},
                {"name": "b", "role": "input", "timed": True, "lane": False, "dtype": "float32"},
                {"name": "h0", "role": "h0", "timed": False, "lane": False, "dtype": "float32"},
                {"name": "h", "role": "output", "timed": True, "lane": False,
                 "dtype": "float32"},
                {"name": "C", "role": "size", "dtype": "int64"},
                {"name": "N", "role": "size", "dtype": "int64"},
                {"name": "L", "role": "size", "dtype": "int64"},
            ]}],
        "outputs": ["h"], "vector": False, "versions": {"explorer": "test"},
    }
    m.update(over)
    return m


def test_round_trip_keeps_manifest_and_ptx(tmp_path: Path) -> None:
    out = write_artifact(tmp_path / "art", PTX, _manifest())
    art = load_artifact(out)
    assert art.ptx_text["kernel.ptx"] == PTX
    assert art.strategy == "blelloch" and art.outputs == ("h",) and not art.vector
    assert len(art.hash) == 64
    k = art.kernels[0]
    assert k.name == "scan_kernel" and k.block == (256, 1, 1) and k.threads == 256
    assert [a.role for a in k.args] == ["input", "input", "h0", "output", "size", "size", "size"]
    # the file on disk is the manifest plus the hash; loading it again gives the same
    on_disk = json.loads((out / "manifest.json").read_text())
    assert {k: v for k, v in on_disk.items() if k != "hash"} == _manifest()
    assert load_artifact(out / "manifest.json").manifest == art.manifest


def test_hash_detects_a_changed_ptx(tmp_path: Path) -> None:
    out = write_artifact(tmp_path / "art", PTX, _manifest())
    (out / "kernel.ptx").write_text(PTX.replace("ret;", "ret; // edited"))
    with pytest.raises(ArtifactError, match="hash"):
        load_artifact(out)


def test_the_hash_is_mandatory(tmp_path: Path) -> None:
    out = write_artifact(tmp_path / "art", PTX, _manifest())
    m = json.loads((out / "manifest.json").read_text())
    del m["hash"]
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="missing field 'hash'"):
        load_artifact(out)


def test_hash_depends_on_manifest_content() -> None:
    h1 = content_hash(_manifest(), {"kernel.ptx": PTX})
    h2 = content_hash(_manifest(strategy="sequential"), {"kernel.ptx": PTX})
    assert h1 != h2 and h1 == content_hash(_manifest(), {"kernel.ptx": PTX})


def test_grid_follows_the_contract() -> None:
    k = validate_manifest(_manifest())[0]
    assert k.grid(4096, 1) == (4096, 1, 1)
    m = _manifest()
    m["kernels"][0]["sequences_per_block"] = 256
    k = validate_manifest(m)[0]
    assert k.grid(1000, 16) == (63, 1, 1)  # ceil(16000 / 256)
    assert k.grid(0, 1) == (1, 1, 1)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(format="other/2"), "format"),
    (lambda m: m.update(dtype="float64"), "dtype"),
    (lambda m: m.update(kernels=[]), "kernels"),
    (lambda m: m["kernels"][0].pop("name"), "name"),
    (lambda m: m["kernels"][0].update(block=[2048, 1, 1]), "1024 threads"),
    (lambda m: m["kernels"][0].update(block=[0]), "block"),
    (lambda m: m["kernels"][0].update(sequences_per_block=0), "sequences_per_block"),
    (lambda m: m["kernels"][0].update(shared_bytes=-1), "shared_bytes"),
    (lambda m: m["kernels"][0].update(ptx="../outside.ptx"), "no path"),
    (lambda m: m["kernels"][0]["args"][0].update(role="weird"), "role"),
    (lambda m: m["kernels"][0]["args"][0].update(dtype="float64"), "float32"),
    (lambda m: m["kernels"][0]["args"][4].update(name="Q"), "C, N, L"),
    (lambda m: m["kernels"][0]["args"].append(dict(m["kernels"][0]["args"][0])), "duplicate"),
    (lambda m: m.update(outputs=["h", "y"]), "written by no kernel"),
])
def test_invalid_manifests_name_the_field(edit: Any, match: str) -> None:
    m = _manifest()
    edit(m)
    with pytest.raises(ArtifactError, match=match):
        validate_manifest(m)


def test_an_input_may_share_a_size_name() -> None:
    # the selective scan reads an input called C; the size argument C is a different thing
    m = _manifest()
    m["kernels"][0]["args"].insert(0, {"name": "C", "role": "input", "timed": True,
                                       "lane": True})
    assert validate_manifest(m)[0].args[0].name == "C"


def test_missing_files_and_entries(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not an artifact"):
        load_artifact(tmp_path)
    out = write_artifact(tmp_path / "art", PTX, _manifest())
    (out / "kernel.ptx").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(out)
    out2 = write_artifact(tmp_path / "art2", PTX.replace("scan_kernel", "other"), _manifest())
    with pytest.raises(ArtifactError, match="no .entry"):
        load_artifact(out2)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="JSON"):
        load_artifact(tmp_path / "bad")


def test_several_ptx_files(tmp_path: Path) -> None:
    m = _manifest()
    second = json.loads(json.dumps(m["kernels"][0]))
    second.update(name="second", ptx="second.ptx")
    m["kernels"].append(second)
    with pytest.raises(ArtifactError, match="mapping"):
        write_artifact(tmp_path / "x", PTX, m)
    out = write_artifact(tmp_path / "x", {"kernel.ptx": PTX,
                                          "second.ptx": PTX.replace("scan_kernel", "second")}, m)
    art = load_artifact(out)
    assert [k.name for k in art.kernels] == ["scan_kernel", "second"]


# --- checks done before any device work ---------------------------------------------------

def test_array_kind() -> None:
    assert array_kind(np.zeros(3)) == "numpy"
    assert array_kind([1.0, 2.0]) == "numpy"


@pytest.mark.parametrize("value", [np.zeros(3, np.float32), 1.5, 2, np.float32(3)])
def test_dtype_accepted(value: Any) -> None:
    check_array_dtype("a", value, cast=False)


@pytest.mark.parametrize("value, text", [
    (np.zeros(3, np.float64), "float64"), (np.zeros(3, np.int64), "int64"),
    (np.zeros(3, np.complex64), "complex64"), (True, "bool"), ("x", "array"),
])
def test_dtype_refused_with_the_name(value: Any, text: str) -> None:
    with pytest.raises(RecurrenceError, match=f"dt.*{text}"):
        check_array_dtype("dt", value, cast=False)


def test_cast_allows_other_real_dtypes() -> None:
    check_array_dtype("a", np.zeros(3, np.float64), cast=True)
    with pytest.raises(RecurrenceError):
        check_array_dtype("a", np.zeros(3, np.complex64), cast=True)


# --- importable without the compiler ------------------------------------------------------

def test_runtime_imports_without_mlir_and_sympy() -> None:
    code = (
        "import sys\n"
        "sys.modules['mlir'] = None\n"
        "sys.modules['sympy'] = None\n"
        "import explorer.runtime.artifact, explorer.runtime.cuda\n"
        "import explorer.bench, explorer.bench.affine, explorer.bench.results\n"
        "import explorer.cli\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('mlir', 'sympy', 'cupy')"
        " and sys.modules[m] is not None]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# --- a kernel's call checks, done on the host before CuPy is touched -----------------------

@pytest.fixture
def kernel(tmp_path: Path) -> Any:
    from explorer.runtime.cuda import CudaKernel

    return CudaKernel.from_artifact(write_artifact(tmp_path / "k", PTX, _manifest()))


def test_kernel_describes_its_arguments(kernel: Any) -> None:
    assert kernel.input_names == ("a", "b")
    assert kernel.h0_names == ("h0",)
    assert kernel.output_names == ("h",) and not kernel.vector
    assert "blelloch" in repr(kernel)


def test_kernel_check_accepts_broadcastable_arrays(kernel: Any) -> None:
    specs = kernel.check(a=np.ones((2, 3, 8), np.float32), b=np.ones((3, 8), np.float32),
                         h0=np.ones((2, 1), np.float32))
    assert [s.name for s in specs] == ["a", "b", "h0"]


@pytest.mark.parametrize("arrays, match", [
    ({"a": np.ones((2, 8), np.float64), "b": np.ones((2, 8), np.float32)}, r"a has dtype"),
    ({"a": np.ones((2, 8), np.float32), "b": np.ones((2, 9), np.float32)}, r"time axes"),
    ({"a": np.ones((2, 8), np.float32), "b": np.ones((3, 8), np.float32)}, r"broadcast"),
    ({"a": np.ones((2, 8), np.float32)}, r"missing array: b"),
    ({"a": np.ones((2, 8), np.float32), "b": np.ones((2, 8), np.float32),
      "x": np.ones(2, np.float32)}, r"unexpected array: x"),
    ({"a": np.ones((2, 8), np.float32), "b": np.ones((2, 8), np.float32),
      "h0": np.ones((5,), np.float32)}, r"broadcast"),
])
def test_kernel_refuses_bad_calls_before_any_device_work(kernel: Any, arrays: dict[str, Any],
                                                         match: str) -> None:
    with pytest.raises(RecurrenceError, match=match):
        kernel(**arrays)


def test_kernel_check_takes_L_and_compares_it(kernel: Any) -> None:
    ones = np.ones((2, 8), np.float32)
    assert [s.name for s in kernel.check(L=8, a=ones, b=ones)] == ["a", "b"]
    with pytest.raises(RecurrenceError, match="L=9"):
        kernel(L=9, a=ones, b=ones)


def _chunked() -> dict[str, Any]:
    m = _manifest()
    scan = m["kernels"][0]
    scan["args"].append({"name": "chunk_aggregates", "role": "workspace", "per_chunk": 2,
                         "time_chunk": 4096})
    reduce = json.loads(json.dumps(scan))
    reduce.update(name="scan_reduce", time_chunk=4096, launch_when_longer_than=4096)
    scan.update(time_chunk=4096)
    m["kernels"] = [reduce, scan]
    return m


def test_chunked_kernels_geometry_and_workspaces() -> None:
    reduce, scan = validate_manifest(_chunked())
    assert not reduce.launched(4096) and reduce.launched(4097) and scan.launched(1)
    assert scan.grid(16, 1, 1 << 20) == (16 * 256, 1, 1)
    assert scan.grid(16, 1, 1) == (16, 1, 1)
    ws = scan.args_with_role("workspace")[0]
    assert ws.workspace_size(16, 2, 5000) == 16 * 2 * 2 * 2
    assert ws.as_dict()["per_chunk"] == 2


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["kernels"][1]["args"][-1].pop("per_chunk"), "per_chunk"),
    (lambda m: m["kernels"][1]["args"][-1].update(time_chunk=0), "time_chunk"),
    (lambda m: m["kernels"][1].update(time_chunk=-5), "time_chunk"),
    (lambda m: m["kernels"][0].update(launch_when_longer_than="x"), "launch_when_longer_than"),
])
def test_chunked_manifest_errors(edit: Any, match: str) -> None:
    m = _chunked()
    edit(m)
    with pytest.raises(ArtifactError, match=match):
        validate_manifest(m)


def _per_call() -> dict[str, Any]:
    """The chunked manifest with the chunk length chosen per call (the Blelloch kernels')."""
    m = _chunked()
    for k in m["kernels"]:
        k["args"][-1]["time_chunk"] = "time_chunk"
        k["args"].append({"name": "time_chunk", "role": "size", "dtype": "int64",
                          "chunk_rule": {"tile": 1024, "min_tiles": 2, "fill": 1.0}})
        k["time_chunk"] = "time_chunk"
    m["kernels"][0]["launch_when_longer_than"] = "time_chunk"
    return m


def test_time_chunk_chosen_per_call() -> None:
    from explorer.runtime.artifact import ChunkRule, Machine, choose_time_chunk, size_values

    reduce, scan = validate_manifest(_per_call())
    assert reduce.chunked_per_call and scan.chunked_per_call
    arg = scan.args[-1]
    assert arg.chunk_rule == ChunkRule(tile=1024, min_tiles=2, fill=1.0, unchunked_from=1.0)
    assert arg.as_dict()["chunk_rule"] == {"tile": 1024, "min_tiles": 2, "fill": 1.0,
                                           "unchunked_from": 1.0}
    gpu = Machine(sms=132, blocks_per_sm=16)            # 2112 block slots
    # many sequences: the whole sequence per block, the reduce kernel skipped
    sizes = size_values(scan.args, 4096, 1, 65536, gpu)
    assert sizes["time_chunk"] == 65536
    assert not reduce.launched(65536, sizes) and scan.grid(4096, 1, 65536, sizes)[0] == 4096
    assert scan.args_with_role("workspace")[0].workspace_size(4096, 1, 65536, sizes) == 4096 * 2
    # few: the fewest chunks that reach 2112 blocks (ceil(2112 / 16) = 132 per sequence)
    sizes = size_values(scan.args, 16, 1, 1 << 20, gpu)
    assert sizes["time_chunk"] == 8 * 1024                # 1024 tiles / 132 -> 8 tiles
    assert reduce.launched(1 << 20, sizes) and scan.grid(16, 1, 1 << 20, sizes)[0] == 16 * 128
    # ragged L rounds the unchunked length up to whole tiles; min_tiles bounds the chunk
    assert choose_time_chunk(arg.chunk_rule, 4096, 1, 1000, gpu) == 1024
    assert choose_time_chunk(arg.chunk_rule, 1, 1, 1 << 26, gpu) == 32 * 1024
    assert choose_time_chunk(arg.chunk_rule, 1, 1, 3000, gpu) == 2 * 1024
    assert size_values(scan.args, 1, 1, 5, gpu, time_chunk=7)["time_chunk"] == 7
    with pytest.raises(ArtifactError, match="per call"):
        scan.grid(16, 1, 1 << 20)
    # unchunked from 0.4 slots (845 sequences), chunks aiming at 2 x 2112 blocks
    rule = ChunkRule(tile=1024, min_tiles=2, fill=2.0, unchunked_from=0.4)
    assert choose_time_chunk(rule, 1024, 1, 16384, gpu) == 16384
    assert choose_time_chunk(rule, 845, 1, 16384, gpu) == 16384
    assert choose_time_chunk(rule, 844, 1, 16384, gpu) == 3 * 1024    # 6 chunks -> 3 tiles
    assert choose_time_chunk(rule, 16, 1, 1 << 20, gpu) == 4 * 1024    # 264 chunks


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["kernels"][1]["args"].pop(), "no size argument"),
    (lambda m: m["kernels"][1]["args"][-1].pop("chunk_rule"), "chunk_rule"),
    (lambda m: m["kernels"][1]["args"][-1]["chunk_rule"].update(fill=0), "fill"),
    (lambda m: m["kernels"][1]["args"][-1]["chunk_rule"].update(unchunked_from="x"),
     "unchunked_from"),
    (lambda m: m["kernels"][1]["args"][-1]["chunk_rule"].update(tile=0), "tile"),
    (lambda m: m["kernels"][1].update(time_chunk="T"), "time_chunk"),
])
def test_per_call_manifest_errors(edit: Any, match: str) -> None:
    m = _per_call()
    edit(m)
    with pytest.raises(ArtifactError, match=match):
        validate_manifest(m)


@pytest.mark.parametrize("change", ["drop", "u32"])
def test_entry_parameters_must_match_the_manifest(tmp_path: Path, change: str) -> None:
    """Every argument is launched as 8 bytes: a PTX entry with a parameter fewer than the
    manifest lists (the launch would shift the rest) or a 32-bit one is refused at load."""
    ptx = (PTX.replace(", .param .u64 p6", "") if change == "drop"
           else PTX.replace(".param .u64 p6", ".param .u32 p6"))
    assert ptx != PTX
    out = write_artifact(tmp_path / "art", ptx, _manifest())
    with pytest.raises(ArtifactError, match="kernels\\[0\\].args lists 7 of 64 bits"):
        load_artifact(out)
