"""Compiled records and the disk cache are files from elsewhere: they may be refused, but they
never run host code, hang, escape their folder or grow without bound."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import explorer as ex
from explorer import compiler

pytest.importorskip("mlir.ir", reason="MLIR's Python bindings are not installed")

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


pytestmark = pytest.mark.usefixtures("private_cache")


def _evil_module(marker: Path) -> str:
    """An LLVM-dialect module whose entry, once JIT-compiled and called, runs a shell command."""
    cmd = f"touch {marker}\0"
    return f'''module {{
  llvm.mlir.global internal constant @cmd("{cmd.replace(chr(0), chr(92) + "00")}")
      {{addr_space = 0 : i32}}
  llvm.func @system(!llvm.ptr) -> i32
  llvm.func @_mlir_ciface_evil() {{
    %0 = llvm.mlir.addressof @cmd : !llvm.ptr
    %1 = llvm.call @system(%0) : (!llvm.ptr) -> i32
    llvm.return
  }}
  llvm.func @_mlir_ciface_scanweaver_blelloch() {{
    llvm.call @_mlir_ciface_evil() : () -> ()
    llvm.return
  }}
}}'''


def _rewrite(path: Path, edit) -> None:
    """Edit a record's payload and recompute its checksum, as an attacker would."""
    raw = path.read_bytes()
    gz = raw[:2] == b"\x1f\x8b"
    if gz:
        raw = gzip.decompress(raw)
    head, _, body = raw.partition(b"\n")
    payload = json.loads(body)
    edit(payload)
    body = json.dumps(payload).encode()
    header = json.loads(head)
    header["sha256"] = hashlib.sha256(body).hexdigest()
    out = json.dumps(header).encode() + b"\n" + body
    path.write_bytes(gzip.compress(out) if gz else out)


def test_the_payload_is_potent(tmp_path):
    """The module used below does run its command when JIT-compiled: the tests that show it is
    not run from a record could fail."""
    from mlir.execution_engine import ExecutionEngine
    from mlir.ir import Context, Module

    marker = tmp_path / "ran"
    with Context():
        engine = ExecutionEngine(Module.parse(_evil_module(marker)))
        engine.invoke("evil")
    assert marker.exists()


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_record_never_runs_its_stored_ir_on_the_host(tmp_path, target):
    marker = tmp_path / "ran"
    evil = _evil_module(marker)
    c = ex.compile(AFFINE, target=target, strategy="blelloch", block_size=32,
                   elements_per_thread=1)
    path = c.dump(tmp_path / "shared.json.gz")

    def plant(payload):
        payload["final_module"] = evil
        for p in payload["passes"]:
            p["ir"] = evil
        for s in payload["stages"]:
            if s["kind"] == "mlir":
                s["text"] = evil
    _rewrite(path, plant)
    compiler._MEMORY.clear()
    loaded = compiler.load_compiled(path)
    assert not loaded.trusted
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1.0, (3, 40)).astype(np.float32)
    b = rng.standard_normal((3, 40)).astype(np.float32)
    h = loaded(device="cpu", a=a, b=b)
    assert not marker.exists()
    np.testing.assert_allclose(h, ex.reference(AFFINE, a=a, b=b), rtol=1e-4, atol=1e-4)
    assert loaded.passes[-1].ir == evil      # shown as text, never run


def test_a_tampered_disk_cache_entry_never_runs(tmp_path):
    marker = tmp_path / "ran"
    c = ex.compile(AFFINE, target="cpu", strategy="sequential")
    compiler.wait_for_cache_writes()
    entry = compiler.cache_dir() / f"{c.key}.json.gz"
    assert entry.exists()
    _rewrite(entry, lambda p: p.update(final_module=_evil_module(marker)))
    compiler._MEMORY.clear()
    again = ex.compile(AFFINE, target="cpu", strategy="sequential")
    assert again.from_cache and not again.trusted
    a = np.full((2, 9), 0.5, np.float32)
    b = np.ones((2, 9), np.float32)
    np.testing.assert_allclose(again(a=a, b=b), ex.reference(AFFINE, a=a, b=b), rtol=1e-5)
    assert not marker.exists()


def test_a_record_key_cannot_name_a_path(tmp_path):
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    path = c.dump(tmp_path / "r.json")
    head, _, body = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    header["key"] = "../../../../tmp/escaped"
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    with pytest.raises(ValueError, match="key"):
        compiler.load_compiled(path)


def _hostile_payloads():
    yield "wrong type", lambda p: p.update(stages="nope")
    yield "stage with extra field", lambda p: p["stages"][0].update(evil=1)
    yield "stage text not a string", lambda p: p["stages"][0].update(text=[1, 2])
    yield "pass ir a number", lambda p: p["passes"][0].update(ir=5)
    yield "options", lambda p: p.update(options={"block_size": 3})
    yield "unknown option", lambda p: p["options"].update(evil="x")
    yield "fast_math", lambda p: p["options"].update(fast_math="__import__('os')")
    yield "strategy", lambda p: p.update(strategy="__import__('os')")
    yield "recurrence", lambda p: p.update(recurrence="h[t] = __import__('os').system('x')")
    yield "missing field", lambda p: p.pop("kernels")
    yield "payload a list", lambda p: (p.clear(), None)


@pytest.mark.parametrize("what, edit", list(_hostile_payloads()), ids=lambda x: str(x)[:24])
def test_malformed_records_are_refused_with_valueerror(tmp_path, what, edit):
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    path = c.dump(tmp_path / "r.json")
    _rewrite(path, edit)
    with pytest.raises(ValueError):
        compiler.load_compiled(path)


def test_odd_files_are_refused_quickly(tmp_path):
    cases = {}
    deep = tmp_path / "deep.json"
    head = json.dumps({"format": compiler._FORMAT, "key": "0" * 32}).encode()
    body = b"[" * 100000 + b"]" * 100000
    deep.write_bytes(head.replace(b"}", b', "sha256": "%s"}' % hashlib.sha256(body)
                                  .hexdigest().encode()) + b"\n" + body)
    cases["deep"] = deep
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe\x00garbage\n\x80\x81")
    cases["bytes"] = tmp_path / "bytes.json"
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (compiler.RECORD_LIMIT + 10)))
    cases["bomb"] = bomb
    cases["folder"] = tmp_path
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases["fifo"] = fifo
    cases["missing"] = tmp_path / "missing.json"
    for name, path in cases.items():
        result: list[BaseException] = []

        def load(path=path, result=result):
            try:
                compiler.load_compiled(path)
            except BaseException as err:   # noqa: BLE001 - reported below
                result.append(err)
        t = threading.Thread(target=load, daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), f"{name}: load_compiled hangs"
        assert result and type(result[0]) is ValueError, f"{name}: {result!r}"


def test_a_fifo_or_link_in_the_cache_is_not_read(tmp_path):
    c = ex.compile(AFFINE, target="cpu", strategy="sequential")
    compiler.wait_for_cache_writes()
    entry = compiler.cache_dir() / f"{c.key}.json.gz"
    secret = tmp_path / "secret"
    secret.write_bytes(entry.read_bytes())
    secret_bytes = secret.read_bytes()
    for plant in ("fifo", "link"):
        entry.unlink()
        if plant == "fifo":
            os.mkfifo(entry)
        else:
            entry.symlink_to(secret)
        compiler._MEMORY.clear()
        done: list[object] = []
        t = threading.Thread(target=lambda done=done: done.append(
            ex.compile(AFFINE, target="cpu", strategy="sequential")), daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), f"compile hangs on a {plant} in the cache"
        assert not done[0].from_cache, plant
        compiler.wait_for_cache_writes()
        assert secret.read_bytes() == secret_bytes, "the link's target was written through"


def test_the_disk_cache_is_bounded_and_evicts_the_oldest(tmp_path, monkeypatch):
    folder = compiler.cache_dir()
    first = ex.compile(AFFINE, target="cpu", strategy="sequential", block_size=32)
    compiler.wait_for_cache_writes()
    one = (folder / f"{first.key}.json.gz").stat().st_size
    assert one < 1_000_000, "a cache entry is compressed"
    monkeypatch.setenv("SCANWEAVER_CACHE_MB", str(2.5 * one / 2**20))
    keys = [first.key]
    for bs in (64, 128, 256):
        keys.append(ex.compile(AFFINE, target="cpu", strategy="sequential", block_size=bs).key)
        compiler.wait_for_cache_writes()
    total = sum(p.stat().st_size for p in folder.glob("*.json.gz"))
    assert total <= compiler.cache_limit_bytes()
    assert (folder / f"{keys[-1]}.json.gz").exists()
    assert not (folder / f"{keys[0]}.json.gz").exists()


def test_clear_cache_deletes_only_its_own_files():
    folder = compiler.cache_dir()
    ex.compile(AFFINE, target="cpu", strategy="sequential")
    compiler.wait_for_cache_writes()
    mine = list(folder.glob("*.json.gz"))
    assert mine
    (folder / "notes.txt").write_text("keep me")
    (folder / "sub").mkdir()
    (folder / "sub" / "data.json").write_text("{}")
    (folder / ("ab" * 16 + ".txt")).write_text("keep me too")
    compiler.clear_cache()
    assert not any(p.exists() for p in mine)
    assert (folder / "notes.txt").read_text() == "keep me"
    assert (folder / "sub" / "data.json").exists()
    assert (folder / ("ab" * 16 + ".txt")).exists()


def test_a_record_from_before_fast_math_says_none(tmp_path):
    """A record written before the option ``fast_math`` existed ran no ``scan-fastmath`` pass:
    it loads as ``fast_math="none"`` (what its kernels did), not as today's default."""
    c = ex.compile(AFFINE, target="cuda", strategy="blelloch")
    assert c.options["fast_math"] == "contract"
    path = c.dump(tmp_path / "r.json")
    _rewrite(path, lambda p: p["options"].pop("fast_math"))
    assert compiler.load_compiled(path).options["fast_math"] == "none"


def _drop_moduli(payload) -> None:
    for k in payload["kernels"]:
        k["args"] = [a for a in k["args"] if a["role"] != "rowmod"]


@pytest.mark.parametrize("edit, options", [
    (lambda p: p["options"].update(param_rows="channel"), "channel with moduli"),
    (_drop_moduli, "auto without moduli"),
    (lambda p: p["kernels"][0]["args"].append(
        {"name": "x", "role": "rowmod", "timed": False, "lane": False, "dtype": "int64"}),
     "a modulus of an input"),
])
def test_a_record_whose_options_disagree_with_its_kernels_is_refused(tmp_path, edit, options):
    """The runtime follows the kernels' arguments, the explorer shows the options: a record
    whose ``param_rows`` says one thing and whose kernels (row moduli per parameter or none)
    do another is refused, re-hashed or not."""
    c = ex.compile(ex.PRESETS["selective scan"], target="cuda", strategy="blelloch")
    assert {a.name for k in c.contract for a in k.args if a.role == "rowmod"} == {"A", "D"}
    path = c.dump(tmp_path / "r.json")
    _rewrite(path, edit)
    with pytest.raises(ValueError, match="row moduli"):
        compiler.load_compiled(path)


def test_a_record_from_before_param_rows_says_what_its_kernels_do(tmp_path):
    """Without the option (written before it): kernels without row moduli read parameters a
    row per channel, and the record says ``channel``; with them it says ``auto``."""
    c = ex.compile(ex.PRESETS["selective scan"], target="cuda", strategy="blelloch")
    path = c.dump(tmp_path / "r.json")
    _rewrite(path, lambda p: p["options"].pop("param_rows"))
    assert compiler.load_compiled(path).options["param_rows"] == "auto"
    _rewrite(path, lambda p: (p["options"].pop("param_rows", None), _drop_moduli(p)))
    assert compiler.load_compiled(path).options["param_rows"] == "channel"


def _lookback_plan(p, threads, block=None, drop=False):
    look = p["plan"]["lookback"]
    look["threads"] = threads
    p["plan"]["grid"]["tile"] = threads * look["elements"]
    if drop:
        del look["threads"]
    for k in p["kernels"]:
        if block is not None and k["name"].endswith("_lookback"):
            k["block"] = [block, 1, 1]


def test_a_record_whose_lookback_threads_disagree_with_its_kernel_is_refused(tmp_path):
    """The runtime launches the look-back kernel's block, the explorer shows the plan's
    ``scan.lookback {threads}``: a record where they differ is refused, re-hashed or not; one
    written before the field (its plan names no threads, its look-back kernel has the plain
    block) loads with the block's threads."""
    c = ex.compile(ex.PRESETS["affine scan"], target="cuda", strategy="blelloch",
                   block_size=128)
    assert c.scan_plan.lookback.threads == 256
    path = c.dump(tmp_path / "r.json")
    assert compiler.load_compiled(path).scan_plan.lookback.threads == 256
    _rewrite(path, lambda p: _lookback_plan(p, 128))
    with pytest.raises(ValueError, match="look-back kernel's block"):
        compiler.load_compiled(path)
    _rewrite(path, lambda p: _lookback_plan(p, 128, block=128, drop=True))
    old = compiler.load_compiled(path)
    assert old.scan_plan.lookback.threads == 128 and old.scan_plan.grid.tile == 128 * 16


def test_a_record_whose_short_kernel_disagrees_with_its_plan_is_refused(tmp_path):
    """The runtime launches the short kernel as its manifest says (block, longest sequence),
    the explorer shows the plan's ``scan.short``: a record where they differ, or where one has
    a short kernel and the other none, is refused, re-hashed or not."""
    c = ex.compile(AFFINE, target="cuda")
    assert c.scan_plan.short is not None
    path = c.dump(tmp_path / "r.json")
    assert compiler.load_compiled(path).scan_plan.short == c.scan_plan.short

    def short_kernel(p):
        return next(k for k in p["kernels"] if k["name"].endswith("_short"))
    edits = [
        lambda p: p["plan"]["short"].update(threads=64),
        lambda p: p["plan"]["short"].update(longest=2048),
        lambda p: short_kernel(p).update(block=[64, 1, 1]),
        lambda p: short_kernel(p).update(launch_unless_longer_than=8192),
        lambda p: p["plan"].update(short=None),
        lambda p: p["kernels"].remove(short_kernel(p)),
    ]
    for edit in edits:
        path = c.dump(tmp_path / "r.json")
        _rewrite(path, edit)
        with pytest.raises(ValueError, match="short"):
            compiler.load_compiled(path)


def test_a_record_may_not_shorten_an_input_to_one_step_in_a_tile(tmp_path):
    """``every`` (an input of ``L // every`` steps) is a fused backward's saved states alone: a
    forward record, or a backward one, that gives it to another input is refused, re-hashed or
    not (the runtime would take a shorter array than the kernel reads)."""
    c = ex.compile(AFFINE, target="cuda")
    path = c.dump(tmp_path / "f.json")

    def shorten(name: str):
        def edit(p):
            for k in p["kernels"]:
                for a in k["args"]:
                    if a["name"] == name and a["role"] == "input":
                        a["every"] = 512
        return edit
    _rewrite(path, shorten("a"))
    with pytest.raises(ValueError, match="forward kernels take an argument of one step"):
        compiler.load_compiled(path)
    b = ex.compile(ex.PRESETS["selective scan"], target="cuda", backward="readouts")
    path = b.dump(tmp_path / "b.json")
    assert compiler.load_compiled(path).contract[0].args == b.contract[0].args
    _rewrite(path, shorten("x"))
    with pytest.raises(ValueError, match="reads \\['x'\\] one step in a tile: only its saved"):
        compiler.load_compiled(path)
