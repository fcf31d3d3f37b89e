"""What each recurrence of the test corpus gives: its affine form, and the CPU results of both
strategies against the float64 reference (4 channels, L = 1000); then what bad input reports.

    python bench/corpus_report.py          # a Markdown table
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

import numpy as np  # noqa: E402
import sympy  # noqa: E402

import explorer as ex  # noqa: E402
from tests.corpus import CASES  # noqa: E402

BAD = [
    ("quadratic", "h[t] = h[t-1]*h[t-1] + x[t]"),
    ("tanh of the state", "h[t] = tanh(h[t-1]) + x[t]"),
    ("the future", "h[t] = a[t]*h[t+1]"),
    ("undefined state", "h[t] = a[t]*g[t-1] + b[t]"),
    ("attribute access", "h[t] = np.exp(x[t]) * h[t-1]"),
]


def relative_error(got, want) -> float:
    if isinstance(want, dict):
        return max(relative_error(got[k], want[k]) for k in want)
    return float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))


def main() -> None:
    print("| name | recurrence | kind | A_t ; b_t | max rel. error (sequential, blelloch) |")
    print("| --- | --- | --- | --- | --- |")
    for case in CASES:
        rec = ex.Recurrence.parse(case.text)
        form = ex.decompose(rec)
        arrays = case.inputs((4,), 1000, N=4)
        want = ex.reference(rec, **arrays)
        errors = [relative_error(ex.compile(rec, target="cpu", strategy=s)(**arrays), want)
                  for s in ("sequential", "blelloch")]
        coefficients = f"{sympy.sstr(form.A.tolist())} ; {sympy.sstr(form.b.T.tolist()[0])}"
        print(f"| {case.name} | `{case.text.replace(chr(10), '; ')}` | {form.kind}, "
              f"S={form.size} | {coefficients} | {errors[0]:.1e}, {errors[1]:.1e} |")
    print()
    print("| bad input | text | what it says |")
    print("| --- | --- | --- |")
    for name, text in BAD:
        try:
            ex.Recurrence.parse(text)
            said = "accepted (unexpected)"
        except ex.RecurrenceError as err:
            said = str(err).splitlines()[0]
        print(f"| {name} | `{text}` | {said} |")


if __name__ == "__main__":
    main()
