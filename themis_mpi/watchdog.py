"""A watchdog for plugin code: a call that outlives its time ends the command (and an MPI job).

A plugin scheduler or intra-dim policy runs on every rank at once, and the one-process model has
nobody else to watch it, so its calls run inside `watch`. One daemon thread per process checks the
innermost open watch every 0.1 s, so a watched call costs two clock reads, not a thread. Under MPI
the rank that sees the call expire ends the whole job with `end_stalled_job` (exit 3), as a rank
whose peers stopped answering does.
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
from typing import Any

from .output import remove_partials

STUCK_EXIT = 3  # as the emulator's watchdog
_POLL_S = 0.1

_lock = threading.Lock()
_open: list[tuple[float, str]] = []  # (deadline on time.monotonic, message), innermost last
_thread_started = False


FORWARD_S = 0.3  # lets the launcher forward a last line before an abort tears the job down
STAGGER_S, MAX_STAGGERED_RANKS = 0.5, 20  # a stalled rank r reports after r * STAGGER_S (at most 10 s)


def mpi_world() -> Any:
    """COMM_WORLD when MPI is running with more than one rank, else None."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() < 2:
        return None
    return mpi.COMM_WORLD


def end_stalled_job(world: Any, message: str, alone: bool = False) -> None:
    """Print one line for the job and abort it with exit 3 (`STUCK_EXIT`).

    Ranks that see the same silence at once speak in rank order: the first one's abort ends the
    others before they print, so the job says it once. A rank `alone` to see it speaks at once.
    """
    remove_partials()
    time.sleep(0 if alone else min(world.Get_rank(), MAX_STAGGERED_RANKS) * STAGGER_S)
    print(f"themis-mpi: error: {message}; aborting the job", file=sys.stderr, flush=True)
    time.sleep(FORWARD_S)
    world.Abort(STUCK_EXIT)
    os._exit(STUCK_EXIT)  # (an abort called from the watchdog's thread may return first)


def _expire(message: str) -> None:
    """One line; the command (or MPI job) ends at once, a library call gets KeyboardInterrupt."""
    world = mpi_world()
    if world is not None:
        end_stalled_job(world, message)
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
