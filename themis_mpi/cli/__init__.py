"""The `themis-mpi` command (`main`); see `app` for how it runs commands and ends on errors.

This file imports nothing heavy: `main` first makes Ctrl-C end the process quietly (one line
from rank 0, exit 130), then imports the parser and the command. A Ctrl-C while numpy, mpi4py or
MPI_Init load would otherwise print a traceback per rank, or worse.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from ..output import remove_partials

__all__ = ["COMMANDS", "build_parser", "main"]

INTERRUPTED = b"themis-mpi: interrupted\n"


def _interrupted(signum: int, frame: Any) -> None:
    """SIGINT: no half-written file stays; rank 0 says so in one line; every rank leaves at once."""
    remove_partials()
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
        os.write(2, INTERRUPTED)
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    """Entry point: Ctrl-C handled before the heavy imports, then `app.main`.

    The handler is this process's while the command runs, and the caller's again after it (a
    program or a test may call `main` in its own process, from its main thread).
    """
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _interrupted) if main_thread else None
    try:
        from .app import main as run  # the parser, numpy and the rest: after the handler

        return run(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def __getattr__(name: str) -> Any:
    """`build_parser` and `COMMANDS` from `parser` and `app`, imported on first use (PEP 562)."""
    if name == "build_parser":
        from .parser import build_parser

        return build_parser
    if name == "COMMANDS":
        from .app import COMMANDS

        return COMMANDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
