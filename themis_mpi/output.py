"""Output files that are complete or absent: every file this package writes goes through here.

A file is written under a temporary name in its own directory and renamed over the target only
once complete, so a crash, a kill or a full disk never leaves a half-written file at the path,
and never replaces a good file with a broken one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import UsageError


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path to write to (same directory and extension); renamed to `path` on success."""
    directory, name = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(name)
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {path}: no directory {directory}")
    tmp = os.path.join(directory, f".{stem}.partial-{os.getpid()}{ext}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path: str, doc: Any) -> None:
    """Write a JSON document atomically (results call their own `to_dict()` first)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
