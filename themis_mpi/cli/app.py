"""How `themis-mpi` runs a command: options in, domain objects out, library calls, tables printed.

Subcommands (one module each, imported only when it runs, so an MPI rank of `run` loads only
what `run` needs): run and model (`sweep`), train, workload, convert, replay, analyze, export,
synthesize, calibrate, plot, topologies, policies, info. The parser is `parser`; options
become domain objects in `options`.

Errors end every rank: a user mistake found before MPI starts prints one line (rank 0) and every
rank exits 2; a mistake found on some ranks only, once MPI runs, aborts the job with 2; a rank
that waits in vain (`Stalled`) aborts it with 3; any other exception prints its traceback once
and aborts with 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from typing import Any

from ..errors import Stalled, UsageError
from ..launch import env_rank
from ..output import remove_partials
from ..watchdog import FORWARD_S, STUCK_EXIT, end_stalled_job, mpi_world
from .parser import build_parser

# command -> (module of this package, its function)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("sweep", "cmd_run"),
    "model": ("sweep", "cmd_model"),
    "train": ("train", "cmd_train"),
    "convert": ("convert", "cmd_convert"),
    "replay": ("replay", "cmd_replay"),
    "analyze": ("analyze", "cmd_analyze"),
    "export": ("export", "cmd_export"),
    "synthesize": ("synthesize", "cmd_synthesize"),
    "calibrate": ("calibrate", "cmd_calibrate"),
    "plot": ("plot", "cmd_plot"),
    "workload": ("workload", "cmd_workload"),
    "topologies": ("topologies", "cmd_topologies"),
    "policies": ("policies", "cmd_policies"),
    "info": ("info", "cmd_info"),
}

RANK0_GRACE_S = 1.0  # a rank other than 0 waits this long for rank 0 to report the same error


def _command(args: argparse.Namespace) -> int:
    """Run the parsed command: its module is imported now, and only its module."""
    module, function = COMMANDS[args.command]
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)(args)


def _abort(world: Any, message: str, code: int) -> int:
    """Print `message` once for the job and abort every rank with `code`.

    Rank 0 prints and aborts at once. Another rank first gives rank 0 a moment: when rank 0 met
    the same error it aborts the job (and this rank) with one line; when only this rank did, it
    prints its own line and aborts.
    """
    remove_partials()
    if world.Get_rank() != 0:
        time.sleep(RANK0_GRACE_S)
    print(message, file=sys.stderr, end="" if message.endswith("\n") else "\n", flush=True)
    time.sleep(FORWARD_S)
    world.Abort(code)
    return code


# Commands that run in one process. Started as several MPI ranks, rank 0 runs them and the other
# ranks leave at once, so nothing is printed or written twice.
ONE_PROCESS = (
    "model",
    "workload",
    "convert",
    "analyze",
    "export",
    "synthesize",
    "calibrate",
    "plot",
    "topologies",
    "policies",
    "info",
)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line and exit 2 for a user mistake; a bug or a lost rank aborts every rank."""
    args = build_parser().parse_args(argv)
    if args.command in ONE_PROCESS and env_rank() != 0:
        return 0
    try:
        return _command(args)
    except UsageError as exc:
        world = mpi_world()
        if world is None:  # found before MPI started: every rank found it
            if env_rank() == 0:
                print(f"themis-mpi: error: {exc}", file=sys.stderr, flush=True)
            return 2
        return _abort(world, f"themis-mpi: error: {exc}", 2)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line, and the job ends
        world = mpi_world()
        if env_rank() == 0:
            print("themis-mpi: interrupted", file=sys.stderr, flush=True)
        if world is not None:
            world.Abort(130)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as a Unix filter does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        world = mpi_world()
        if isinstance(exc, Stalled) and world is not None:
            end_stalled_job(world, str(exc))
            return STUCK_EXIT
        if world is None:
            raise
        return _abort(world, traceback.format_exc(), 1)
