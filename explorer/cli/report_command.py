"""``scanweaver report``: the table and figure of a bench JSON file, and ``--snapshot``: one
self-contained HTML file of a compile (no GPU needed).

The snapshot shows a recurrence compiled here (``--recurrence``) or a record that
``Compiled.dump`` wrote (``--record``, read without MLIR), with the JSON's timings.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any

from explorer.cli.compile_command import compile_options
from explorer.cli.errors import CliError
from explorer.cli.paths import (
    RESULTS_LIMIT,
    _read_recurrence,
    _read_text,
    _write_text,
    check_output,
)


def _title(env: dict[str, Any]) -> str:
    return (f"{env.get('gpu') or 'unknown GPU'}, driver {env.get('driver', '?')}, "
            f"CUDA runtime {env.get('cuda_runtime', '?')}")


def load_results(path: str) -> tuple[list[Any], dict[str, Any]]:
    """Records and environment of a file written by ``scanweaver bench --json``."""
    from explorer.bench.results import Record

    text = _read_text(path, "JSON", RESULTS_LIMIT)
    try:
        data = json.loads(text)
    except RecursionError:
        raise CliError(f"JSON {path}: nested too deeply") from None
    except ValueError as err:
        raise CliError(f"JSON {path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise CliError(f"JSON {path}: not a file of scanweaver bench --json (no 'results' "
                       "list)")
    env = data.get("environment", {})
    if not isinstance(env, dict):
        raise CliError(f"JSON {path}: 'environment' must be an object")
    hints = typing.get_type_hints(Record)
    records = []
    for i, raw in enumerate(data["results"]):
        try:
            if not isinstance(raw, dict):
                raise TypeError("not an object")
            record = Record.from_dict(raw)
        except (TypeError, ValueError) as err:
            raise CliError(f"JSON {path}: results[{i}] is malformed ({err})") from None
        for name, hint in hints.items():
            value = getattr(record, name)
            if not _typed_like(value, hint):
                raise CliError(f"JSON {path}: results[{i}].{name} must be "
                               f"{_type_name(hint)}, got {value!r:.40}")
        records.append(record)
    return records, env


def _typed_like(value: Any, hint: Any) -> bool:
    """``value`` fits the annotation ``hint`` (int, float, str, dict, unions with None)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_typed_like(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(hint) or hint
    return not isinstance(origin, type) or isinstance(value, origin)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    return {int: "an integer", float: "a number", str: "a string", dict: "an object",
            type(None): "null"}.get(origin, str(hint))


def _snapshot_source(args: argparse.Namespace) -> Any:
    """The compile ``--snapshot`` shows: ``--recurrence`` compiled here, or ``--record`` read."""
    if args.record is not None:
        from explorer.compiler import load_compiled

        try:
            return load_compiled(args.record)
        except ValueError as err:
            raise CliError(f"--record {err}") from None
    from explorer.codegen.options import validate

    opts = compile_options(args)
    validate(args.strategy, "cuda", **opts)   # OptionError before anything is read
    text = _read_recurrence(args.recurrence)

    import explorer

    return explorer.compile(text, target="cuda", strategy=args.strategy, **opts)


def cmd_report(args: argparse.Namespace) -> int:
    from explorer.bench.results import format_table, save_html

    for path, flag in ((args.html_path, "--html"), (args.table_path, "--table"),
                       (args.snapshot_path, "--snapshot")):
        if path is not None:
            check_output(path, flag)
    has_source = args.recurrence is not None or args.record is not None
    if args.snapshot_path is not None and not has_source:
        raise CliError("--snapshot needs the compile to show: --recurrence TEXT or --record "
                       "FILE")
    if has_source and args.snapshot_path is None:
        raise CliError("--recurrence and --record are for --snapshot HTML: say where to write "
                       "it")
    if args.json_in is None and args.snapshot_path is None:
        raise CliError("give a JSON file written by scanweaver bench --json, or --snapshot HTML "
                       "with --recurrence or --record")
    records: list[Any] = []
    if args.json_in is not None:
        records, env = load_results(args.json_in)
        try:
            table = format_table(records, _title(env))
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as err:
            raise CliError(f"JSON {args.json_in}: a result has a field of the wrong type "
                           f"({type(err).__name__}: {err})") from None
        print(table)
        if args.table_path:
            _write_text(args.table_path, table + "\n")
        if args.html_path:
            try:
                save_html(args.html_path, records, _title(env))
            except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as err:
                raise CliError(f"JSON {args.json_in}: a result has a field of the wrong type "
                               f"({type(err).__name__}: {err})") from None
            print(f"wrote {args.html_path}")
    elif args.html_path or args.table_path:
        raise CliError("--html and --table write the results of a JSON file: give one")
    if args.snapshot_path is not None:
        from explorer.widget.bundle import snapshot

        compiled = _snapshot_source(args)
        out = snapshot(compiled, args.snapshot_path, records or None)
        timings = f", {len(records)} timings" if records else ""
        print(f"wrote {out} ({len(compiled.stages)} stages, {len(compiled.passes)} passes"
              f"{timings})")
    return 0
