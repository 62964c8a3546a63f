"""`themis-mpi plot ROWS`: a sweep's rows (`--csv` or `--json` of run, model or train) as a PNG."""

from __future__ import annotations

import argparse
import csv
import json
import os

from ..errors import UsageError
from ..plots import sweep_column, sweep_plot  # (matplotlib loads when a picture is drawn)
from .options import check_outputs

MAX_ROWS = 100_000


def read_rows(path: str) -> list[dict]:
    """The rows of a --json (a list of objects) or --csv file; one line when it is not one."""
    try:
        with open(path, newline="") as f:
            if path.endswith(".json"):
                rows = json.load(f)
            else:
                rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error, RecursionError) as exc:
        raise UsageError(
            f"cannot read rows from {path}: {str(exc).splitlines()[0] if str(exc) else exc}"
        ) from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise UsageError(
            f"{path}: no rows (a JSON list of objects or a CSV with a header, as --json/--csv write)"
        )
    if len(rows) > MAX_ROWS:
        raise UsageError(f"{path}: {len(rows)} rows; plot takes at most {MAX_ROWS}")
    return rows


def cmd_plot(args: argparse.Namespace) -> int:
    """`themis-mpi plot`: y against x, one line per value of --hue."""
    out = args.out or os.path.splitext(args.rows)[0] + ".png"
    check_outputs(out, inputs=(args.rows,))
    rows = read_rows(args.rows)
    for name in (args.x, args.y, args.hue):
        column = sweep_column(name)[0]
        if column not in rows[0]:
            raise UsageError(
                f"{args.rows} has no column {column!r} (for {name!r}); it has {', '.join(rows[0])}"
            )
    for name in (args.x, args.y):
        column = sweep_column(name)[0]
        for r in rows:
            try:
                float(r[column])
            except (TypeError, ValueError):
                raise UsageError(f"{args.rows}: {column} {r[column]!r} is not a number") from None
    print(
        f"# wrote {sweep_plot(rows, args.x, args.y, args.hue, out)}: {args.y} against {args.x} by {args.hue}"
    )
    return 0
