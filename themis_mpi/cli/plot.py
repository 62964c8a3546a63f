"""`themis-mpi plot ROWS`: a sweep's rows (`--csv`, `--json` or `--jsonl` of run, model or train) as a PNG."""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os

from ..errors import UsageError, shown
from ..plots import log_axis, sweep_column, sweep_plot  # (matplotlib loads when a picture is drawn)
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


def check_axis(path: str, rows: list[dict], name: str) -> None:
    """Every row's value of an axis is a finite number, and positive on a log axis (sizes, times)."""
    column = sweep_column(name)[0]
    for i, row in enumerate(rows, start=1):
        try:
            value = float(row[column])
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or (log_axis(column) and value <= 0):
            need = "a positive number (its axis is logarithmic)" if log_axis(column) else "a finite number"
            raise UsageError(f"{path}: row {i}: {column} {shown(str(row[column]))} is not {need}")


def cmd_plot(args: argparse.Namespace) -> int:
    """`themis-mpi plot`: y against x, one line per value of --hue."""
    out = args.out or os.path.splitext(args.rows)[0] + ".png"
    check_outputs(out, inputs=(args.rows,))
    rows = read_rows(args.rows)
    for name in (args.x, args.y, args.hue):
        column = sweep_column(name)[0]
        for i, row in enumerate(rows, start=1):
            if column not in row:
                raise UsageError(
                    f"{args.rows}: row {i} has no column {shown(column)} (for {shown(name)}); "
                    f"it has {shown(', '.join(row))}"
                )
    for name in (args.x, args.y):
        check_axis(args.rows, rows, name)
    print(
        f"# wrote {sweep_plot(rows, args.x, args.y, args.hue, out)}: {args.y} against {args.x} by {args.hue}"
    )
    return 0
