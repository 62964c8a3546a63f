"""A watchdog for plugin code on the model: a call that outlives its time ends the command.

Under MPI the other ranks watch a rank that stops answering; the one-process model has nobody to
watch it, so a plugin's call (an inter-dim decision, an intra-dim `position`) runs inside
`watch`. One daemon thread per process checks the innermost open watch every 0.1 s, so a
watched call costs two clock reads, not a thread.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .output import remove_partials

STUCK_EXIT = 3  # as the emulator's watchdog
_POLL_S = 0.1

_lock = threading.Lock()
_open: list[tuple[float, str]] = []  # (deadline on time.monotonic, message), innermost last
_thread_started = False


def _expire(message: str) -> None:
    """One line; the command ends at once, a library call gets KeyboardInterrupt and lives on."""
    print(f"themis-mpi: error: {message}", file=sys.stderr, flush=True)
    if getattr(signal.getsignal(signal.SIGINT), "__module__", "") == "themis_mpi.cli":  # the command
        remove_partials()
        os._exit(STUCK_EXIT)
    _thread.interrupt_main()


def _patrol() -> None:
    while True:
        time.sleep(_POLL_S)
        with _lock:
            due = _open[-1] if _open and time.monotonic() > _open[-1][0] else None
            if due is not None:
                _open.remove(due)  # fires once
        if due is not None:
            _expire(due[1])


@contextmanager
def watch(seconds: float, message: str) -> Iterator[None]:
    """Run the block with `seconds` to finish; past that, `message` is the one line printed."""
    global _thread_started
    entry = (time.monotonic() + seconds, message)
    with _lock:
        _open.append(entry)
        if not _thread_started:
            threading.Thread(target=_patrol, name="themis-mpi-watchdog", daemon=True).start()
            _thread_started = True
    try:
        yield
    finally:
        with _lock:
            if entry in _open:
                _open.remove(entry)
