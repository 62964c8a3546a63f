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
from collections.abc import Iterator, Sequence
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
