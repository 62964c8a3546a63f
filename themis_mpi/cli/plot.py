"""`themis-mpi plot ROWS`: a sweep's rows (`--csv`, `--json` or `--jsonl` of run, model or train) as a PNG."""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import os
from collections.abc import Sequence

from ..errors import UsageError, shown
from ..plots import (  # (matplotlib loads when a picture is drawn)
    LOG_COLUMNS,
    SWEEP_COLUMNS,
    SweepPlot,
    default_axes,
    is_categorical,
    is_number,
    line_fields,
    scales,
    sweep_column,
    sweep_plot,
    values_of,
)
from ..units import parse_size
from .options import check_outputs

MAX_ROWS = 100_000


def _json_lines(f, path: str) -> list:
    """The rows of a JSON Lines file (--jsonl), one object a line; a bad line is named."""
    rows = []
    for n, line in enumerate(f, start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                raise UsageError(
                    f"{path}:{n}: not a JSON row (a --jsonl file holds one object a line)"
                ) from None
        if len(rows) > MAX_ROWS:
            break
    return rows


def read_rows(path: str) -> list[dict]:
    """The rows of a --json (a list of objects), --jsonl or --csv file, told apart by their content.

    One line when the file is none of them, and no row is ever quoted whole.
    """
    try:
        with open(path, newline="") as f:
            start = f.read(4096).lstrip()[:1]
            f.seek(0)
            if start == "[":
                rows = json.load(f)
            elif start == "{":
                rows = _json_lines(f, path)
            else:
                rows = list(itertools.islice(csv.DictReader(f), MAX_ROWS + 1))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error, RecursionError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"cannot read rows from {path}: {shown(why)}") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise UsageError(
            f"{path}: no rows (a JSON list of objects, JSON Lines or a CSV with a header, as --json, "
            "--jsonl and --csv write)"
        )
    if len(rows) > MAX_ROWS:
        raise UsageError(f"{path}: more than {MAX_ROWS} rows; plot takes at most {MAX_ROWS}")
    return rows


def check_axis(path: str, rows: list[dict], column: str) -> None:
    """Every row's value of a numeric axis is a finite number, and one physics allows.

    A size or chunk count is positive and a time (``*_us``) not negative, whatever the scale: a
    row that says otherwise is not a run's row. A row is named when one is not.
    """
    for i, row in enumerate(rows, start=1):
        value = row[column]
        if not is_number(value):
            raise UsageError(f"{path}: row {i}: {column} {shown(str(value))} is not a finite number")
        if column in LOG_COLUMNS and float(value) <= 0:
            raise UsageError(f"{path}: row {i}: {column} {shown(str(value))} is not a positive number")
        if column.endswith("_us") and float(value) < 0:
            raise UsageError(f"{path}: row {i}: {column} {shown(str(value))} is negative (a time)")


def where(rows: list[dict], conditions: Sequence[str], path: str) -> list[dict]:
    """The rows that meet every ``KEY=VALUE`` of --where; a key given twice takes either value.

    Numbers compare as numbers ("16" equals 16.0); the size column also takes sizes such as 1M.
    """
    wanted: dict[str, list[str]] = {}
    for condition in conditions:
        key, sep, value = condition.partition("=")
        if not sep or not key:
            raise UsageError(f"--where takes KEY=VALUE, e.g. topology=2x2x2, got {shown(condition)}")
        wanted.setdefault(sweep_column(key.strip())[0], []).append(value.strip())
    for column, values in wanted.items():
        if column not in rows[0]:
            raise UsageError(
                f"--where: {path} has no column {shown(column)}; it has {shown(', '.join(rows[0]))}"
            )
        kept = [r for r in rows if any(_same(r.get(column), v, column) for v in values)]
        if not kept:
            have = ", ".join(values_of(rows, column)[:20])
            raise UsageError(
                f"--where {column}={'|'.join(values)}: no row of {path} has it; {column} has {shown(have)}"
            )
        rows = kept
    return rows


def _same(cell: object, value: str, column: str) -> bool:
    """Whether a cell equals a --where value: as numbers when both are, else as text."""
    if column == "size_bytes" and not is_number(value):
        with contextlib.suppress(UsageError, ValueError):
            value = str(parse_size(value))
    if is_number(cell) and is_number(value):
        return float(cell) == float(value)  # type: ignore[arg-type]
    return str(cell) == value


def cmd_plot(args: argparse.Namespace) -> int:
    """`themis-mpi plot`: y against x, one line per run of the grid, coloured by --hue."""
    out = args.out or os.path.splitext(args.rows)[0] + ".png"
    check_outputs(out, inputs=(args.rows,))
    rows = where(read_rows(args.rows), args.where or (), args.rows)
    given = {
        name: sweep_column(getattr(args, name))[0] if getattr(args, name) else None
        for name in ("x", "y", "hue")
    }
    col, row = (sweep_column(c)[0] if c else None for c in (args.col, args.row))
    try:
        x, y, hue = default_axes(rows, **given, facets=(col, row))
    except UsageError as exc:
        raise UsageError(f"{args.rows}: {exc}") from None
    for name, column in (("--x", x), ("--y", y), ("--hue", hue), ("--col", col), ("--row", row)):
        if column is None:
            continue
        for i, cells in enumerate(rows, start=1):
            if column not in cells:
                raise UsageError(
                    f"{args.rows}: row {i} has no column {shown(column)} (for {name}); "
                    f"it has {shown(', '.join(cells))}"
                )
    check_axis(args.rows, rows, y)
    if not is_categorical(rows, x):
        check_axis(args.rows, rows, x)
    logx, logy, notes = scales(rows, x, y, args.logx, args.logy)
    spec = SweepPlot(x, y, hue, col, row, logx, logy, args.title)
    chosen = [
        f"{name} {column or 'none'}"
        for name, column in (("x", x), ("y", y), ("hue", hue))
        if given[name] is None
    ]
    if chosen:
        print(f"# chose from {args.rows}: {', '.join(chosen)}; line styles by {_styles(rows, spec)}")
    for note in notes:
        print(f"# note: {note}")
    sweep_plot(rows, spec, out)
    facets = "".join(f", {kind} by {c}" for kind, c in (("columns", col), ("rows", row)) if c)
    short = {column: name for name, (column, _) in SWEEP_COLUMNS.items()}
    what = f"{short.get(y, y)} against {short.get(x, x)} by {short.get(hue, hue) if hue else 'nothing'}"
    print(f"# wrote {out}: {what}{facets}")
    return 0


def _styles(rows: list[dict], spec: SweepPlot) -> str:
    """What tells the lines of one colour apart (`line_fields` after the hue), or "nothing"."""
    fields = line_fields(rows, spec.hue, given=(spec.x, spec.col, spec.row))
    rest = fields[1:] if spec.hue else fields
    return ", ".join(rest) or "nothing"
