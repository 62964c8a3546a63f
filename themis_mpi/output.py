"""Output files that are complete or absent: every file this package writes goes through here.

A file is written under a temporary name in its target's directory, flushed to disk and renamed
over the target only once complete, so a crash, a kill or a full disk never leaves a half-written
file at the path and never replaces a good file with a broken one. A symlink is written through
(its target is replaced, the link stays); devices, directories and other non-regular files are
refused, as are paths an input is read from. `check_output_path` says all that before any work
starts, so no run is lost to a bad path at its end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import UsageError

STDOUT = "-"
SPECIAL_ROOTS = ("/proc/", "/sys/", "/dev/")
PARTIAL = ".{stem}.partial-{pid}{ext}"
_PARTIALS: set[str] = set()  # temporary files being written now (`atomic_path`)


def remove_partials() -> None:
    """Remove the temporary files being written now: a job that ends abruptly leaves none behind."""
    for tmp in list(_PARTIALS):
        try:
            os.remove(tmp)
        except OSError:
            pass
        _PARTIALS.discard(tmp)


def _temp_name(target: str) -> str:
    directory, name = os.path.split(target)
    stem, ext = os.path.splitext(name)
    return os.path.join(directory, PARTIAL.format(stem=stem, pid=os.getpid(), ext=ext))


def check_output_path(path: str, inputs: Sequence[str] = ()) -> None:
    """Refuse, with one line, a path this run could not write completely or should not replace."""
    if path == STDOUT:
        return
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if target.startswith(SPECIAL_ROOTS) or target == "/dev":
        raise UsageError(f"cannot write {path}: {target} is on a special filesystem")
    if os.path.lexists(target) and not os.path.isfile(target):
        raise UsageError(f"cannot write {path}: it exists and is not a regular file")
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {path}: no directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: directory {directory} is not writable")
    if len(os.path.basename(_temp_name(target)).encode("utf-8", "surrogateescape")) > 255:
        raise UsageError(f"cannot write {path}: the file name is too long")
    for source in inputs:
        if os.path.exists(source) and os.path.realpath(source) == target:
            raise UsageError(f"cannot write {path}: it is an input of this command")


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path to write to (same directory and extension); renamed over `path` on success.

    On any failure the temporary file is removed and `path` keeps its previous content; a failure
    of the file system (a full disk, a read-only file system, EIO, a target that became a
    directory) is one `UsageError` line naming `path`.
    """
    check_output_path(path)
    target = os.path.realpath(path)
    tmp = _temp_name(target)
    _PARTIALS.add(tmp)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError):  # a full disk, a read-only file system, a target turned directory
            raise UsageError(
                f"cannot write {path}: {exc.strerror or exc}; the previous file, if any, is intact"
            ) from None
        raise
    finally:
        _PARTIALS.discard(tmp)


def write_text(path: str, text: str) -> None:
    """Write a text file (a report, a table, a generated page) atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def write_study(folder: str, stem: str, text: str, doc: Any) -> None:
    """A study's page and its data in `folder`: `stem` with ``.md`` and with ``.json``, each atomically."""
    os.makedirs(folder, exist_ok=True)
    write_text(os.path.join(folder, f"{stem}.md"), text)
    write_json(os.path.join(folder, f"{stem}.json"), doc)


def write_json(path: str, doc: Any) -> None:
    """Write a JSON document atomically, or to standard output for ``-``."""
    import json  # only rank 0 writes: the other ranks never load it

    if path == STDOUT:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)


def write_csv(path: str, rows: Sequence[dict]) -> None:
    """Write flat rows as CSV (columns: the union of their keys, in first-seen order), atomically."""
    import csv

    columns = list(dict.fromkeys(key for row in rows for key in row))
    if path == STDOUT:
        writer = csv.DictWriter(sys.stdout, columns)
        writer.writeheader()
        writer.writerows(rows)
        return
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


class RowFiles:
    """The `--json` and `--csv` files of a sweep, rewritten (atomically) after every finished row.

    A killed sweep therefore leaves every row it finished in complete files.
    """

    def __init__(self, json_path: str | None, csv_path: str | None, flatten: Any = None):
        self.json_path, self.csv_path, self.flatten = json_path, csv_path, flatten
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        """Record one more row and rewrite both files."""
        self.rows.append(row)
        if self.json_path and self.json_path != STDOUT:
            write_json(self.json_path, self.rows)
        if self.csv_path and self.csv_path != STDOUT:
            write_csv(self.csv_path, [self.flatten(r) if self.flatten else r for r in self.rows])

    def close(self) -> None:
        """Standard output gets its copy at the end (it cannot be rewritten)."""
        if self.json_path == STDOUT:
            write_json(STDOUT, self.rows)
        if self.csv_path == STDOUT:
            write_csv(STDOUT, [self.flatten(r) if self.flatten else r for r in self.rows])


CELL, FINGERPRINT = "sweep_cell", "sweep_fingerprint"  # what every row of a sweep's files records


def read_json(path: str) -> Any:
    """A JSON file's document (the reader of every JSON input).

    Raises:
        OSError: it cannot be read.
        ValueError: it is no JSON, or nested past Python's recursion limit ("nested too deep").
    """
    import json

    try:
        with open(path) as f:
            return json.load(f)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _refuse(path: str, why: str) -> UsageError:
    return UsageError(f"cannot resume from {path}: {why}; remove it or run without --resume")


def _read_json_rows(path: str) -> list[dict]:
    try:
        rows = read_json(path)
    except (OSError, ValueError) as exc:
        raise _refuse(path, f"it is not a JSON list of rows ({str(exc)[:100]})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise _refuse(path, "it is not a JSON list of rows")
    return rows


def _read_csv_rows(path: str) -> list[dict]:
    import csv

    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise _refuse(path, f"it is not a CSV table ({exc})") from None


def _read_jsonl_rows(path: str) -> tuple[list[dict], bool]:
    """The rows of a JSON Lines file, and whether a half-written last line was dropped."""
    import json

    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise _refuse(path, str(exc)) from None
    rows, cut = [], lines.pop() != ""  # text after the last newline: a line cut mid-write
    for n, line in enumerate(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict):
            if n == len(lines) - 1:  # the last line, cut where a newline happened to be
                cut = True
                break
            raise _refuse(path, f"line {n + 1} is not a JSON row")
        rows.append(row)
    return rows, cut


def _cell(row: dict) -> int | None:
    """A row's cell, or None when it has none: an integer (CSV's as its digits)."""
    cell = row.get(CELL)
    if isinstance(cell, str) and cell.isascii() and cell.isdigit() and len(cell) < 19:
        return int(cell)
    return cell if isinstance(cell, int) and not isinstance(cell, bool) else None


class SweepFiles:
    """The ``--json``, ``--csv`` and ``--jsonl`` files of a sweep: its rows by cell, in grid order.

    Every row records its cell (`CELL`) and the sweep's fingerprint (`FINGERPRINT`). JSON and CSV
    are rewritten atomically after every row; JSON Lines get each row appended, and a row the file
    system cannot take (a full disk) is cut off again: every line of the file stays a whole row.
    With `resume`, the rows already in every given file are read back and checked: a row that
    fails `check` (its values: what a fresh row must pass), names no cell of the sweep's `cells`,
    or shares its cell with another row is dropped (a half-written last JSON line too), the file
    is rewritten without them and `dropped` says how many; `done` names the cells kept in every
    file. A file of another sweep is refused.
    """

    def __init__(
        self,
        fingerprint: str,
        json_path: str | None = None,
        csv_path: str | None = None,
        jsonl_path: str | None = None,
        flatten: Any = None,
        resume: bool = False,
        cells: int | None = None,
        check: Callable[[dict], str | None] | None = None,
    ):
        self.fingerprint, self.flatten = fingerprint, flatten
        self.cells, self.check = cells, check
        self.paths = {"json": json_path, "csv": csv_path, "jsonl": jsonl_path}
        self.rows: dict[int, dict] = {}  # cell -> its row (as written to JSON: nested)
        self.kept: dict[str, dict[int, dict]] = {}  # rows read back, per format (CSV's as text)
        self.dropped: dict[str, tuple[int, dict[str, int]]] = {}  # path -> (rows read, reason -> rows)
        self._jsonl: int | None = None  # the JSON Lines file's descriptor, appended to
        self._jsonl_cells: list[int] = []
        self.done: set[int] = set()
        if resume:
            self._resume()

    def _files(self) -> list[tuple[str, str]]:
        return [(kind, p) for kind, p in self.paths.items() if p and p != STDOUT]

    def _resume(self) -> None:
        """Read back every given file and check its rows; the cells kept in all of them are done."""
        found: dict[str, dict[int, dict]] = {}
        rewrite = set()
        for kind, path in self._files():
            if not os.path.exists(path):
                found[kind] = {}
                continue
            torn = False
            if kind == "jsonl":
                rows, torn = _read_jsonl_rows(path)
            else:
                rows = _read_json_rows(path) if kind == "json" else _read_csv_rows(path)
            if any(str(row.get(FINGERPRINT)) != self.fingerprint for row in rows):
                raise _refuse(path, "it holds rows of another sweep (its grid or options differ)")
            found[kind], why = self._checked(kind, rows)
            if torn:
                why["a half-written last line"] = 1
            if why:
                self.dropped[path] = (len(rows) + torn, why)
                rewrite.add(kind)
        if not found:
            return
        self.done = set.intersection(*(set(by_cell) for by_cell in found.values()))
        for kind, by_cell in found.items():
            self.kept[kind] = {c: r for c, r in by_cell.items() if c in self.done}
            if len(by_cell) != len(self.done):
                rewrite.add(kind)
        for kind in rewrite:  # the files hold at most one checked row per cell from now on
            self._rewrite(kind)
        if "jsonl" in found:
            self._jsonl_cells = sorted(self.kept["jsonl"])

    def _reason(self, kind: str, row: dict, cell: int | None) -> str | None:
        """Why a row read back cannot be kept (its cell, then `check` on its flat form), or None."""
        if cell is None or (self.cells is not None and not 0 <= cell < self.cells):
            return f"outside the sweep's {self.cells} cells" if self.cells is not None else "no cell"
        if self.check is None:
            return None
        try:
            flat = self.flatten(row) if kind != "csv" and self.flatten else row
        except (TypeError, AttributeError, KeyError, ValueError):  # (a forged nesting)
            return "a malformed row"
        return self.check(flat)

    def _checked(self, kind: str, rows: list[dict]) -> tuple[dict[int, dict], dict[str, int]]:
        """The rows of one file that pass, by cell, and how many failed for each reason."""
        why: dict[str, int] = {}
        by_cell: dict[int, dict] = {}
        repeated: set[int] = set()
        for row in rows:
            cell = _cell(row)
            reason = self._reason(kind, row, cell)
            if reason is not None or cell is None:
                reason = reason or "no cell"
                why[reason] = why.get(reason, 0) + 1
            elif cell in by_cell or cell in repeated:  # which copy is the true one is not known
                why["a repeated cell"] = why.get("a repeated cell", 0) + 1 + (cell in by_cell)
                by_cell.pop(cell, None)
                repeated.add(cell)
            else:
                by_cell[cell] = row
        return by_cell, why

    def _row(self, cell: int, row: dict) -> dict:
        return {**row, CELL: cell, FINGERPRINT: self.fingerprint}

    def _ordered(self, kind: str) -> list[dict]:
        """A format's rows, kept and new, in cell order (CSV's flattened)."""
        new = {c: (self.flatten(r) if kind == "csv" and self.flatten else r) for c, r in self.rows.items()}
        merged = {**self.kept.get(kind, {}), **new}
        return [merged[c] for c in sorted(merged)]

    def _rewrite(self, kind: str) -> None:
        """One file rewritten (atomically) with the rows kept and new, in cell order."""
        path = self.paths[kind]
        assert path is not None
        if kind == "json":
            write_json(path, self._ordered("json"))
        elif kind == "csv":
            write_csv(path, self._ordered("csv"))
        else:
            self._rewrite_jsonl()

    def _rewrite_jsonl(self) -> None:
        import json

        path = self.paths["jsonl"]
        assert path is not None
        self._close_jsonl()
        with atomic_path(path) as tmp, open(tmp, "w") as f:
            for row in self._ordered("jsonl"):
                f.write(json.dumps(row) + "\n")
        self._jsonl_cells = sorted(set(self.kept.get("jsonl", {})) | set(self.rows))

    def _close_jsonl(self) -> None:
        if self._jsonl is not None:
            os.close(self._jsonl)
            self._jsonl = None

    def _append_jsonl(self, path: str, line: str) -> None:
        """Append one whole line; a file system that cannot take all of it gets none of it, and one line."""
        if self._jsonl is None:
            try:
                self._jsonl = os.open(path, os.O_WRONLY | os.O_APPEND)
            except OSError as exc:
                raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        size = os.fstat(self._jsonl).st_size
        data = memoryview(line.encode())
        try:
            while data:
                data = data[os.write(self._jsonl, data) :]
        except OSError as exc:  # a full disk, EIO: cut the part of the row that got in
            try:
                os.ftruncate(self._jsonl, size)
            finally:
                self._close_jsonl()
            raise UsageError(
                f"cannot write {path}: {exc.strerror or exc}; its {len(self._jsonl_cells)} rows so far are "
                "whole (the torn last one was cut off); --resume runs the rest"
            ) from None

    def add(self, cell: int, row: dict) -> None:
        """Record the row of one more cell: JSON and CSV rewritten, a JSON line appended."""
        import json

        self.rows[cell] = self._row(cell, row)
        if self.paths["json"] and self.paths["json"] != STDOUT:
            write_json(self.paths["json"], self._ordered("json"))
        if self.paths["csv"] and self.paths["csv"] != STDOUT:
            write_csv(self.paths["csv"], self._ordered("csv"))
        path = self.paths["jsonl"]
        if path and path != STDOUT:
            if self._jsonl is None and not self._jsonl_cells:  # a new file: complete from its first row
                self._rewrite_jsonl()
            else:
                self._append_jsonl(path, json.dumps(self.rows[cell]) + "\n")
                self._jsonl_cells.append(cell)
        elif path == STDOUT:
            print(json.dumps(self.rows[cell]), flush=True)

    def close(self) -> None:
        """Files left in cell order (a resumed JSON Lines file too); standard output gets its copy."""
        self._close_jsonl()
        if self._jsonl_cells != sorted(self._jsonl_cells):
            self._rewrite_jsonl()
        for kind, _ in self._files():
            if kind != "jsonl" and self.kept.get(kind) and not self.rows:
                self._rewrite(kind)
        if self.paths["json"] == STDOUT:
            write_json(STDOUT, self._ordered("json"))
        if self.paths["csv"] == STDOUT:
            write_csv(STDOUT, self._ordered("csv"))
