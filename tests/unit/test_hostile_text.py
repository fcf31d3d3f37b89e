"""Hostile recurrence text: every name is usable or refused at parse time, constants and
exponents are bounded, long sums compile, and numbers are accepted where arrays are."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

import explorer as ex
from explorer.codegen.contract import kernel_args
from explorer.codegen.options import validate
from explorer.frontend.names import RESERVED_NAMES, SIZE_NAMES, TIME_CHUNK, h0_name
from explorer.frontend.recurrence import MAX_NODES, Binary, Num, Ref, fold, to_text, walk
from explorer.groundtruth import interpret
from explorer.runtime.shapes import ArgSpec, marshal


def _error(text: str) -> ex.RecurrenceError:
    with pytest.raises(ex.RecurrenceError) as info:
        ex.decompose(ex.Recurrence.parse(text))
    return info.value


def _caret(err: ex.RecurrenceError) -> tuple[int, int]:
    """(column, length) of the carets drawn under the source line."""
    last = str(err).splitlines()[-1]
    col = last.index("^") - 4
    return col, len(last.strip())


# ---------------------------------------------------------------------------------------------
# 1. names: usable, or refused at parse time with the caret at the name and the reason
# ---------------------------------------------------------------------------------------------
_OWN = sorted(set(RESERVED_NAMES) - {"t", "n"})


@pytest.mark.parametrize("name", _OWN)
@pytest.mark.parametrize("where", ["parameter", "input", "state", "readout"])
def test_names_the_explorer_uses_are_refused_with_their_reason(name, where):
    text = {
        "parameter": f"h[t] = {name} * h[t-1] + x[t]",
        "input": f"h[t] = a[t] * h[t-1] + {name}[t]",
        "state": f"{name}[t] = a[t] * {name}[t-1] + x[t]",
        "readout": f"h[t] = a[t] * h[t-1] + x[t]\n{name}[t] = 2 * h[t]",
    }[where]
    err = _error(text)
    assert f"'{name}' is reserved" in str(err) and RESERVED_NAMES[name] in str(err)
    line = text.splitlines()[err.line - 1]
    assert line[err.col:err.col + err.length] == name, str(err)
    assert _caret(err) == (err.col, len(name))


@pytest.mark.parametrize("text, line, col, role", [
    ("h[t] = a[t] * h[t-1] + h0", 1, 23, "a parameter"),
    ("h[t] = a[t] * h[t-1] + h0[t]", 1, 23, "an input"),
    ("h[t] = a[t] * h[t-1] + x[t]\nh0[t] = 2 * h[t]", 2, 0, "a readout"),
    ("h[t] = h0[t-1] + x[t]\nh0[t] = h[t-1]", 2, 0, "a state"),
    ("g[t] = 0.5 * g[t-1] + x[t]\nh[t] = h[t-1] + g0 * g[t-1]", 2, 16, "a parameter"),
])
def test_initial_state_keywords_collide_with_nothing(text, line, col, role):
    """``h0=`` gives h[-1]: a parameter, input, readout or state called h0 next to a state h
    was silently used as the initial state (or read garbage); now it is refused."""
    err = _error(text)
    assert f"is {role}, but" in str(err) and "keyword of the initial state" in str(err)
    assert (err.line, err.col) == (line, col), str(err)


def test_every_argument_the_compiler_names_is_reserved_or_bound_by_role():
    """The kernels' own arguments (sizes, workspaces) cannot be written by a user unless the
    runtimes bind them by role (C and N); initial states are <state>0, which the parser checks."""
    rec = ex.Recurrence.parse("h[t] = a[t] * h[t-1] + b[t]\ng[t] = h[t-1] + c * g[t-2]")
    args = kernel_args(ex.decompose(rec), validate("blelloch", "cuda"))
    own = [a["name"] for a in args if a["role"] in ("size", "workspace")]
    assert TIME_CHUNK in own and len(own) >= 6
    for name in own:
        assert name in RESERVED_NAMES or name in SIZE_NAMES, name
    h0 = [a["name"] for a in args if a["role"] == "h0"]
    assert h0 == [h0_name(s) for s in rec.states] == ["h0", "g0"]


def test_names_like_the_sizes_and_the_call_arguments_are_usable():
    """C and N (Mamba's C; sizes are bound by role), and rec / self (the first argument of
    the calls that take arrays as keywords, now positional only) run like any other name."""
    rng = np.random.default_rng(0)
    text = "h[t, n] = rec[t] * h[t-1, n] + C[t, n] * N[t] + self\ny[t] = sum(C[t, n] * h[t, n])"
    arrays = dict(rec=rng.uniform(0.5, 1, (2, 12)), C=rng.normal(size=(2, 3, 12)),
                  N=rng.normal(size=(2, 12)), self=rng.normal(size=(2,)))
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    c = ex.compile(text, target="cpu", strategy="sequential", outputs="all")
    got, want = c(**arrays), ex.reference(text, **arrays)
    for k in ("h", "y"):
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-5)
    again = interpret(text, **arrays)
    np.testing.assert_allclose(again["y"], want["y"], rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# 2. constants and exponents: bounded, refused at once with the caret, never a hang
# ---------------------------------------------------------------------------------------------
_HOSTILE_NUMBERS = [
    # text, words, caret text (None: the whole statement)
    ("h[t] = h[t-1] + 3 ** 1000000000 * b[t]", "exponent 1000000000 is too large",
     "1000000000"),
    ("h[t] = h[t-1] + 2 ** 2 ** 2 ** 100 * b[t]", "exponent 100 is too large", "100"),
    ("h[t] = h[t-1] + 1e999 * b[t]", "not finite", "1e999"),
    ("h[t] = h[t-1] + " + "1" + "0" * 400 + " * b[t]", "too large", "1" + "0" * 400),
    ("h[t] = h[t-1] + 1e-50 * b[t]", "too small", "1e-50"),
    ("h[t] = h[t-1] + ((((3 ** 64) ** 64) ** 64) ** 64) * b[t]", "power of a power",
     "(3 ** 64) ** 64"),
    ("h[t] = h[t-1] + ((((x[t] ** 64) ** 64) ** 64) ** 64) * b[t]", "power of a power",
     "(x[t] ** 64) ** 64"),
    ("h[t] = h[t-1] + ((2 * x[t]) ** 8 * y[t]) ** 16", "multiply to 128",
     "((2 * x[t]) ** 8 * y[t]) ** 16"),
    ("h[t] = h[t-1] + abs(x[t] ** 8) ** 16", "multiply to 128", "abs(x[t] ** 8) ** 16"),
    ("h[t] = h[t-1] + " + " * ".join(["3 ** 64"] * 300) + " * b[t]", "1.18e+61",
     "3 ** 64 * 3 ** 64"),
    ("h[t] = h[t-1] + 3.4e38 * 10 * b[t]", "3.4e+39", "3.4e38 * 10"),
    ("h[t] = h[t-1] + exp(100) * b[t]", "2.69e+43", "exp(100)"),
    ("h[t] = h[t-1] + exp(1e30) * b[t]", "infinite", "exp(1e30)"),
    ("h[t] = h[t-1] + log(0) * b[t]", "infinite", "log(0)"),
    ("h[t] = h[t-1] + sqrt(-1) * b[t]", "not a real number", "sqrt(-1)"),
    ("h[t] = h[t-1] + (-8) ** 0.5 * b[t]", "not a real number", "(-8) ** 0.5"),
    ("h[t] = h[t-1] + 0 ** -1 * b[t]", "divides by zero", "0 ** -1"),
    ("h[t] = h[t-1] + b[t] / 0", "division by zero", "b[t] / 0"),
    ("h[t] = h[t-1] + b[t] / (1 - 1)", "division by zero", "b[t] / (1 - 1)"),
    ("h[t] = h[t-1] + x[t] ** 65", "exponent 65 is too large", "65"),
    ("h[t] = h[t-1] + x[t] ** -64.5", "exponent -64.5 is too large", "-64.5"),
    # what sympy's folding across terms makes of the constants: checked after decomposition
    ("h[t] = h[t-1] + 3e38 * b[t] * 10", "folds its constants into 3e+39", None),
    ("h[t] = h[t-1] + log(0 * b[t])", "not a finite real number", None),
    ("h[t] = h[t-1] + sqrt(0 * b[t] - 1)", "not a finite real number", None),
]


def test_hostile_numbers_are_refused_at_once_with_the_caret():
    """Each case in a fresh interpreter with a deadline: a case that made sympy compute
    3**1000000000 digit by digit would otherwise hang the test run."""
    script = (
        "import json, sys, time\n"
        "import explorer as ex\n"
        "ex.decompose(ex.Recurrence.parse('h[t] = h[t-1] + x[t]'))  # imports sympy\n"
        "for text in json.loads(sys.stdin.read()):\n"
        "    t0 = time.perf_counter()\n"
        "    try:\n"
        "        ex.decompose(ex.Recurrence.parse(text))\n"
        "        out = {'ok': True}\n"
        "    except ex.RecurrenceError as e:\n"
        "        out = {'ok': False, 'message': str(e), 'col': e.col, 'length': e.length}\n"
        "    out['seconds'] = time.perf_counter() - t0\n"
        "    print(json.dumps(out), flush=True)\n")
    texts = [t for t, _, _ in _HOSTILE_NUMBERS]
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(texts),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(texts)
    for (text, words, caret), got in zip(_HOSTILE_NUMBERS, results, strict=True):
        assert not got["ok"], text
        assert got["seconds"] < 2.0, (text, got)
        assert words in got["message"], (text, got["message"])
        assert "Error" not in got["message"]   # no Python exception leaks into the message
        if caret is not None:
            assert text[got["col"]:got["col"] + got["length"]] == caret, (text, got)
        else:
            assert got["col"] == 0 and got["length"] == len(text)


@pytest.mark.parametrize("text", [
    "h[t] = h[t-1] + x[t] ** 64",
    "h[t] = h[t-1] + x[t] ** -64",
    "h[t] = h[t-1] + (x[t] ** 8) ** 8",
    "h[t] = h[t-1] + 2 ** 64 * x[t]",
    "h[t] = h[t-1] + 3.4e38 * x[t]",
    "h[t] = h[t-1] + 1.5e-45 * x[t]",
    "h[t] = h[t-1] + x[t] ** 0.5 + exp(88) * x[t]",
    "h[t] = h[t-1] + (1 / 3) ** 64 * x[t]",
])
def test_numbers_within_the_bounds_are_accepted(text):
    form = ex.decompose(ex.Recurrence.parse(text))
    x = np.random.default_rng(1).uniform(0.5, 1.0, 6)
    assert np.all(np.isfinite(ex.reference(form, x=x)))


def test_the_bounds_are_float32_and_64():
    from explorer.frontend.recurrence import MAX_CONSTANT, MAX_EXPONENT, MIN_CONSTANT

    assert MAX_CONSTANT == float(np.finfo(np.float32).max)
    assert MIN_CONSTANT == float(np.finfo(np.float32).smallest_subnormal)
    assert MAX_EXPONENT == 64
    assert "3.403e+38" in str(_error("h[t] = h[t-1] + 3.5e38 * x[t]"))


# ---------------------------------------------------------------------------------------------
# 3. long but legal recurrences: no recursion anywhere, compile and match the reference
# ---------------------------------------------------------------------------------------------
def _terms_500() -> str:
    """500 distinct terms over two inputs (sympy cannot merge them): x**i * y**j."""
    return " + ".join(f"x[t] ** {i} * y[t] ** {j}" for i in range(23) for j in range(23)
                      if 23 * i + j < 500)


@pytest.mark.parametrize("strategy, tail", [
    ("blelloch", " + ".join(["b[t]"] * 500)),
    ("sequential", _terms_500()),
])
def test_a_500_term_sum_compiles_and_matches_the_reference(strategy, tail):
    text = "h[t] = a[t] * h[t-1] + " + tail
    rng = np.random.default_rng(2)
    arrays = {n: rng.uniform(0.5, 1.0, (3, 40)).astype(np.float32) for n in ("a", "b", "x", "y")}
    rec = ex.Recurrence.parse(text)
    arrays = {n: v for n, v in arrays.items() if n in rec.inputs}
    c = ex.compile(rec, target="cpu", strategy=strategy, cache=False)
    got, want = c(**arrays), ex.reference(rec, **arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(interpret(rec, **arrays), want, rtol=1e-10)


def test_names_are_bounded_at_the_first_name_past_the_limit():
    """500 distinct inputs compiled for the CPU in minutes (and could not be an artifact, 256
    kernel arguments at most): refused at the 129th name; 126 inputs compile in seconds."""
    from explorer.frontend.recurrence import MAX_NAMES

    text = "h[t] = a[t] * h[t-1] + " + " + ".join(f"b{i}[t]" for i in range(1, 501))
    err = _error(text)
    assert f"names 502 arrays (inputs, parameters, states and readouts); the limit is {MAX_NAMES}" \
        in str(err)
    assert text[err.col:err.col + err.length] == f"b{MAX_NAMES - 1}[t]"
    text = "h[t] = a[t] * h[t-1] + " + " + ".join(f"b{i}[t]" for i in range(1, MAX_NAMES - 1))
    rng = np.random.default_rng(8)
    arrays = {n: rng.uniform(0.5, 1.0, (2, 30)).astype(np.float32)
              for n in ex.Recurrence.parse(text).inputs}
    c = ex.compile(text, target="cpu", strategy="blelloch", cache=False)
    np.testing.assert_allclose(c(**arrays), ex.reference(text, **arrays), rtol=1e-5)


def test_the_longest_chains_parse_render_compare_and_evaluate():
    """Every walk over a recurrence is iterative: a 2,400-term chain is far deeper than
    Python's recursion limit, and parsing, rendering, equality, hashing, repr, the affine
    form, the reference and the interpreter all get through it."""
    rng = np.random.default_rng(3)
    a, x, y = (rng.uniform(0.5, 1.0, (2, 9)) for _ in range(3))
    for tail in (" + ".join(["x[t]"] * 2400), " - ".join(["x[t] * y[t]"] * 1200),
                 " * ".join(["x[t]"] * 2400), "-" * 800 + "x[t]"):
        text = "h[t] = a[t] * h[t-1] + " + tail
        rec = ex.Recurrence.parse(text)
        assert rec == ex.Recurrence.parse(text)
        assert hash(rec.statements) == hash(ex.Recurrence.parse(text).statements)
        assert ex.Recurrence.parse(rec.as_text()).as_text() == rec.as_text()
        assert repr(rec.statements[0].expr).startswith("Binary(")
        rec.summary()
        rec.dependence_dot()
        arrays = {n: v for n, v in dict(a=a, x=x, y=y).items() if n in rec.inputs}
        np.testing.assert_allclose(ex.reference(rec, **arrays), interpret(rec, **arrays),
                                   rtol=1e-9)


def test_walks_do_not_recurse():
    deep = Ref("x", 0, False, None)  # type: ignore[arg-type]
    for _ in range(5_000):
        deep = Binary("+", deep, Num(1.0, None), None)  # type: ignore[arg-type]
    assert sum(1 for _ in walk(deep)) == 10_001
    assert fold(deep, lambda e, kids: 1 + sum(kids)) == 10_001
    assert to_text(deep).count("+") == 5_000
    assert deep == deep and hash(deep) == hash(deep)


@pytest.mark.parametrize("text", [
    "h[t] = h[t-1] + " + " + ".join(["x[t]"] * (MAX_NODES // 2 + 10)),
    "h[t] = h[t-1] + " + "-" * 5000 + "x[t]",
    "h[t] = h[t-1] + " + "(" * 300 + "x[t]" + ")" * 300,
])
def test_beyond_the_limits_a_clear_error_not_a_recursion_error(text):
    t0 = time.perf_counter()
    err = _error(text)
    assert time.perf_counter() - t0 < 5
    assert "Recursion" not in str(err)
    assert any(w in str(err) for w in ("terms", "nested too deeply", "too many nested"))


def _nested(prefix: str, suffix: str, levels: int) -> str:
    return "h[t] = 0.5 * h[t-1] + " + prefix * levels + "x[t]" + suffix * levels


@pytest.mark.parametrize("prefix, suffix", [("exp(-", ")"), ("sigmoid(softplus(", "))"),
                                            ("1 / (2 + ", ")"), ("max(x[t], min(", ", 0.5))")])
def test_nesting_is_bounded_where_sympy_still_has_stack_to_spare(prefix, suffix):
    """Nesting deeper than MAX_DEPTH is refused at the term; the deepest nesting allowed
    goes through sympy, the reference, the interpreter and codegen with the recursion limit
    lowered to 600 (sympy recursed past 1000 at 190 levels of exp(-...))."""
    from explorer.frontend.recurrence import MAX_DEPTH

    levels = next(n for n in range(1, MAX_DEPTH + 2) if not _parses(_nested(prefix, suffix, n)))
    err = _error(_nested(prefix, suffix, levels))
    assert f"more than {MAX_DEPTH} levels deep" in str(err)
    text = _nested(prefix, suffix, levels - 1)
    x = np.random.default_rng(6).uniform(0.0, 0.1, (2, 8))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(600)
    try:
        rec = ex.Recurrence.parse(text)
        want = ex.reference(rec, x=x)
        np.testing.assert_allclose(interpret(rec, x=x), want, rtol=1e-9)
        c = ex.compile(rec, target="cpu", strategy="sequential", cache=False)
    finally:
        sys.setrecursionlimit(old)
    np.testing.assert_allclose(c(x=x.astype(np.float32)), want, rtol=1e-4, atol=1e-6)


def _parses(text: str) -> bool:
    try:
        ex.Recurrence.parse(text)
    except ex.RecurrenceError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# 5. numbers where a parameter or an initial state is accepted
# ---------------------------------------------------------------------------------------------
EMA = "h[t] = gamma * h[t-1] + (1 - gamma) * x[t]"


@pytest.mark.parametrize("gamma", [0.9, 1, np.float32(0.9), np.float64(0.9), np.array(0.9),
                                   np.int64(1)])
def test_a_number_is_a_parameter_and_an_initial_state(gamma):
    x = np.random.default_rng(4).normal(size=(3, 20)).astype(np.float32)
    full = np.full(3, float(gamma))
    want = ex.reference(EMA, x=x, gamma=full, h0=np.full(3, 0.5))
    np.testing.assert_allclose(ex.reference(EMA, x=x, gamma=gamma, h0=0.5), want, rtol=1e-12)
    c = ex.compile(EMA, target="cpu", strategy="sequential")
    np.testing.assert_allclose(c(x=x, gamma=gamma, h0=0.5), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value, words", [
    (True, "is a bool"), (np.bool_(False), "is a bool"), ("0.9", "is text"),
    (0.9j, "is complex"), (np.complex64(1), "is complex"), (None, "is None"),
    ([0.9], "must be an array or a real number, got list"),
    (10**400, "too large for a float"),
])
def test_what_is_not_a_real_number_is_refused(value, words):
    x = np.ones((2, 5), np.float32)
    c = ex.compile(EMA, target="cpu", strategy="sequential")
    for call in (lambda: ex.reference(EMA, x=x, gamma=value), lambda: c(x=x, gamma=value),
                 lambda: c(x=x, gamma=0.5, h0=value)):
        with pytest.raises(ex.RecurrenceError, match=words):
            call()


@pytest.mark.parametrize("value", [1e300, np.float64(-1e39), np.array([1.0, 1e300])])
def test_values_beyond_float32_are_refused_by_the_kernels_not_made_inf(value):
    x = np.ones((2, 5), np.float32)
    c = ex.compile(EMA, target="cpu", strategy="sequential")
    with pytest.raises(ex.RecurrenceError, match="beyond float32's range"):
        c(x=x, gamma=value)
    with pytest.raises(ex.RecurrenceError, match="beyond float32's range"):
        marshal([ArgSpec("x", True, False), ArgSpec("gamma", False, False)],
                {"x": x, "gamma": value})
    # the float64 reference holds them (and overflows float64 itself soon after: no warning)
    with np.errstate(over="ignore"):
        assert ex.reference(EMA, x=x, gamma=value).dtype == np.float64


def test_inf_itself_is_data_not_an_overflow():
    x = np.array([[1.0, np.inf, 2.0]])
    out = marshal([ArgSpec("x", True, False)], {"x": x})
    assert np.isinf(out.arrays["x"][0, 1])


def test_the_cuda_launcher_checks_numbers_with_the_same_rule(tmp_path):
    """No GPU here: the launcher's checks run on the host before any device work."""
    from explorer.runtime.cuda import CudaKernel

    compiled = ex.compile(EMA, target="cuda", strategy="sequential")
    kernel = CudaKernel.from_artifact(compiled.save(tmp_path / "ema"))
    x = np.ones((2, 5), np.float32)
    specs = kernel.check(x=x, gamma=0.9, h0=np.float64(0.5))
    assert [s.name for s in specs] == ["x", "gamma", "h0"]
    for number in (1, np.float32(0.9), np.array(0.9), np.array(0.9, np.float32), np.int64(1)):
        kernel.check(x=x, gamma=number, h0=number)   # any precision: a number is a number
    with pytest.raises(ex.RecurrenceError, match="float64"):
        kernel.check(x=x, gamma=np.full(2, 0.9))      # an array keeps the dtype rule
    for value, words in ((True, "is a bool"), ("0.9", "is text"), (None, "is None"),
                         (1e300, "beyond float32's range"), (0.9j, "is complex")):
        with pytest.raises(ex.RecurrenceError, match=words):
            kernel.check(x=x, gamma=value)
    # the shape rules the launcher marshals with accept the number as a (C,) parameter
    m = marshal(specs, {"x": x, "gamma": 0.9, "h0": 0.5})
    assert m.arrays["gamma"].shape == (2,) and m.arrays["gamma"].dtype == np.float32
    assert float(m.arrays["gamma"][1]) == pytest.approx(0.9, rel=1e-7)


# ---------------------------------------------------------------------------------------------
# 4. the state dimension: compiled in seconds, or refused before any work
# ---------------------------------------------------------------------------------------------
def _coupled(k1: int, k2: int) -> str:
    h = " + ".join(f"a{i} * h[t-{i}]" for i in range(1, k1 + 1))
    g = " + ".join(f"c{i} * g[t-{i}]" for i in range(1, k2 + 1))
    return f"h[t] = {h} + g[t-1] + x[t]\ng[t] = {g} + h[t-1]"


def test_a_state_beyond_the_language_limit_is_refused_at_parse_time():
    text = _coupled(8, 8) + "\nk[t] = 0.5 * k[t-1] + h[t-1]"
    err = _error(text)
    assert "dimension S = 17 (h 8 + g 8 + k 1" in str(err) and "limit of 16" in str(err)
    assert (err.line, text.splitlines()[2][err.col:err.col + err.length]) == (3, "k[t-1]")


def test_blelloch_refuses_a_state_above_its_limit_before_any_work():
    text = _coupled(5, 4)
    ex.Recurrence.parse(text)        # the language takes it
    t0 = time.perf_counter()
    with pytest.raises(ex.RecurrenceError) as info:
        ex.compile(text, target="cpu", strategy="blelloch", cache=False)
    assert time.perf_counter() - t0 < 2
    err = info.value
    assert "dimension S = 9 (h 5 + g 4" in str(err) and "limit of 8" in str(err)
    assert "strategy='sequential'" in str(err)
    assert text.splitlines()[1][err.col:err.col + err.length] == "g[t-4]"


def test_two_coupled_states_of_lag_8_compile_in_seconds_with_the_sequential_kernel():
    """The 16-dimensional state that took 448 s and 1.2 GB with the Blelloch tree."""
    text = _coupled(8, 8)
    rng = np.random.default_rng(5)
    params = {f"a{i}": np.float32(0.5 / i) for i in range(1, 9)}
    params |= {f"c{i}": np.float32(-0.3 / i) for i in range(1, 9)}
    x = rng.normal(size=(3, 50)).astype(np.float32)
    t0 = time.perf_counter()
    c = ex.compile(text, target="cpu", strategy="sequential", cache=False)
    assert time.perf_counter() - t0 < 60
    assert c.form.size == 16 and c.form.kind == "dense"
    got, want = c(x=x, **params), ex.reference(text, x=x, **params)
    for k in ("h", "g"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
