"""The explorer widget on a real GPU: a compiled record made on the MLIR machine is loaded
(``load_compiled``, no MLIR needed), shown, run and checked on the GPU, and swept with the live
plot filling in: the kernel, the copy roofline and the baselines.

Needs CuPy with a GPU, ipywidgets and plotly, and the records of ``build_artifacts.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
try:
    _gpus = cp.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    _gpus = 0
if _gpus == 0:
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)
pytest.importorskip("ipywidgets", reason="ipywidgets is not installed")
pytest.importorskip("plotly", reason="plotly is not installed")
pytest.importorskip("sympy", reason="sympy is not installed (the reference needs it)")

RECORDS = Path(__file__).resolve().parent / "artifacts" / "compiled"
if not RECORDS.is_dir():
    pytest.skip("no compiled records: run `python tests/gpu/build_artifacts.py`",
                allow_module_level=True)


def _explorer(name: str):
    from explorer.compiler import load_compiled
    from explorer.widget import Explorer

    return Explorer(load_compiled(RECORDS / f"{name}.json.gz"))


@pytest.mark.parametrize("name", ["affine-scan-blelloch", "selective-scan-blelloch",
                                  "second-order-sequential"])
def test_run_and_check_on_the_gpu(name):
    widget = _explorer(name)
    assert widget.compiled.device == "cuda"
    assert "GPU" in widget.run.device.value
    rows = widget.run.run_and_check()
    assert rows and widget.run.passed(rows), rows
    assert "PASS" in widget.run.check.value


def test_sweep_fills_the_plot_with_the_kernel_and_the_roofline():
    widget = _explorer("affine-scan-blelloch")
    widget.run.channels.value = 1024
    widget.run.sweep(sizes=[1024, 4096, 16384], wait=True)
    traces = {t.name: t for t in widget.run.figure.data}
    kernel = [t for name, t in traces.items() if name.startswith("compiled blelloch")]
    assert kernel and len(kernel[0].x) == 3, list(traces)
    assert all(y > 0 for y in kernel[0].y)
    # the hover text says which kernel ran each length: the short kernel up to 4096 steps
    ran = list(kernel[0].text)
    assert ran[:2] == ["ran blelloch_short"] * 2 and ran[2].startswith("ran blelloch"), ran
    assert "short" not in ran[2], ran
    roofline = [t for name, t in traces.items() if "copy" in name]
    assert roofline and len(roofline[0].x) == 3
    assert any(name.startswith("cuda-sequential") for name in traces), list(traces)
    print({name: [round(y) for y in t.y] for name, t in traces.items()}, "GB/s")


def test_sweep_of_the_selective_scan_times_it_on_the_gpu():
    widget = _explorer("selective-scan-blelloch")
    widget.run.channels.value = 64
    widget.run.state_size.value = 16
    widget.run.sweep(sizes=[1024, 4096], wait=True)
    names = [t.name for t in widget.run.figure.data]
    assert any(n.startswith("compiled blelloch") for n in names), names
    assert any("copy" in n for n in names), names
