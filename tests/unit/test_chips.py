"""Every chip the options accept compiles and keeps its PTX; the ptxas report is optional.

The local ptxas may not assemble for every chip (ptxas 13 knows neither ``sm_70``/``sm_72``
nor ``sm_101``), or may be missing: the compile still succeeds, and the report then says why it
is absent. CPU only (no GPU is needed to make PTX).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("mlir", reason="compiling needs the MLIR Python bindings")

import explorer as ex  # noqa: E402
from explorer.codegen import ptxas  # noqa: E402
from explorer.codegen.options import CHIP_PTX  # noqa: E402

AFFINE = "h[t] = a[t] * h[t-1] + b[t]"


@pytest.mark.parametrize("chip", list(CHIP_PTX))
def test_every_chip_compiles_and_keeps_its_ptx(chip: str) -> None:
    c = ex.compile(AFFINE, target="cuda", chip=chip, cache=False)
    assert c.ptx is not None and c.stages["ptx"].text == c.ptx
    assert f".target {chip}" in c.ptx and ".entry scanweaver_blelloch" in c.ptx
    info = c.ptx_info
    assert info is not None
    if "unavailable" in info:   # the local ptxas cannot assemble for this chip, or is missing
        assert chip in info["unavailable"] or "not found" in info["unavailable"]
        assert "\n" not in info["unavailable"]
    else:
        assert info["kernel"].startswith("scanweaver_") and info["registers"] > 0


def _fake_ptxas(folder: Path, script: str) -> str:
    exe = folder / "ptxas"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_a_ptxas_that_refuses_the_chip_leaves_the_compile_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _fake_ptxas(tmp_path, "echo \"ptxas fatal   : Value 'sm_90' is not defined for "
                                "option 'gpu-name'\" >&2\nexit 255\n")
    monkeypatch.setattr(ptxas, "find_tool", lambda name: exe if name == "ptxas" else None)
    c = ex.compile(AFFINE, target="cuda", chip="sm_90", cache=False)
    assert ".entry scanweaver_blelloch" in (c.ptx or "")
    assert c.ptx_info == {"unavailable": "the local ptxas cannot assemble this PTX for sm_90: "
                                         "Value 'sm_90' is not defined for option 'gpu-name'"}
    assert c.sass() is None
    assert ptxas.ptxas_report(c.ptx or "", "sm_90") is None


def test_without_ptxas_the_report_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ptxas, "find_tool", lambda name: None)
    c = ex.compile(AFFINE, target="cuda", cache=False)
    assert c.ptx is not None
    assert c.ptx_info is not None and "ptxas was not found" in c.ptx_info["unavailable"]
    assert c.sass() is None


def test_a_ptxas_that_cannot_run_is_no_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "ptxas"
    broken.write_text("not a program")
    os.chmod(broken, 0o755)     # exec fails: no #! line, not ELF
    monkeypatch.setattr(ptxas, "find_tool", lambda name: str(broken))
    info = ptxas.ptxas_info(".version 7.8\n.target sm_90\n", "sm_90")
    assert "unavailable" in info


def test_the_widget_says_why_the_report_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ipywidgets")
    from explorer.widget import Explorer

    monkeypatch.setattr(ptxas, "find_tool", lambda name: None)
    w = Explorer(ex.compile(AFFINE, target="cuda", chip="sm_70", cache=False))
    w.show_tab("PTX")
    assert w.error is None
    header = w.ptx_view.header.value
    assert "No ptxas report" in header and "ptxas was not found" in header
    assert ".entry" in w.ptx_view.code.value


@pytest.mark.parametrize("chip", [c for c in CHIP_PTX if CHIP_PTX[c] < 63])
def test_chips_without_nanosleep_take_the_chunked_grid(chip: str) -> None:
    """The look-back walk backs off with nanosleep (PTX ISA 6.3): "auto" takes the chunked grid
    on older chips, and asking for the look-back grid there is refused before any compile."""
    from explorer.errors import OptionError

    c = ex.compile(AFFINE, target="cuda", chip=chip, cache=False)
    assert c.scan_plan.grid.scheme == "chunked"
    with pytest.raises(OptionError, match="nanosleep"):
        ex.compile(AFFINE, target="cuda", chip=chip, grid="lookback", cache=False)
    assert ex.compile(AFFINE, target="cuda", chip="sm_80", cache=False
                      ).scan_plan.grid.scheme == "lookback"
