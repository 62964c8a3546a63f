"""Output files that are complete or absent: every file this package writes goes through here.

A file is written under a temporary name in its target's directory, flushed to disk and renamed
over the target only once complete, so a crash, a kill or a full disk never leaves a half-written
file at the path and never replaces a good file with a broken one. A symlink is written through
(its target is replaced, the link stays); devices, directories and other non-regular files are
refused, as are paths an input is read from. `check_output_path` says all that before any work
starts, so no run is lost to a bad path at its end.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import UsageError

STDOUT = "-"
SPECIAL_ROOTS = ("/proc/", "/sys/", "/dev/")
PARTIAL = ".{stem}.partial-{pid}{ext}"


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
    """A temporary path to write to (same directory and extension); renamed over `path` on success."""
    check_output_path(path)
    target = os.path.realpath(path)
    tmp = _temp_name(target)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path: str, doc: Any) -> None:
    """Write a JSON document atomically, or to standard output for ``-``."""
    if path == STDOUT:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
