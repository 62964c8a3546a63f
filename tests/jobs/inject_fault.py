"""`themis-mpi ARGS` with one fault on one rank.

Usage: ``mpiexec -n K python tests/jobs/inject_fault.py KIND RANK ARGS...`` with KIND one of
``usage`` (a UsageError), ``bug`` (an unexpected exception) or ``stall`` (a `Stalled`), raised
when the rank's first collective starts, or ``freeze-start`` / ``freeze-write`` (the rank stops
itself, SIGSTOP, before the start-up barrier / when it starts writing the trace).
"""

import os
import signal
import sys

from mpi4py import MPI

from themis_mpi import cli
from themis_mpi.cli import sweep
from themis_mpi.errors import Stalled, UsageError
from themis_mpi.mpi.transport import MpiBackend
from themis_mpi.trace import TraceRecorder

KIND, RANK = sys.argv[1], int(sys.argv[2])
FAULTS = {
    "usage": UsageError("injected user mistake"),
    "bug": ZeroDivisionError("injected bug"),
    "stall": Stalled("injected stall"),
}
run_collective, write, backend_init = sweep.run_collective, TraceRecorder.write, MpiBackend.__init__


def faulty_run(*args, **kwargs):
    """Raise the fault on RANK, run normally elsewhere (the others wait for RANK)."""
    if KIND in FAULTS and MPI.COMM_WORLD.Get_rank() == RANK:
        raise FAULTS[KIND]
    return run_collective(*args, **kwargs)


def frozen_write(self, *args, **kwargs):
    """Freeze RANK as it starts writing the trace."""
    if KIND == "freeze-write" and MPI.COMM_WORLD.Get_rank() == RANK:
        os.kill(os.getpid(), signal.SIGSTOP)
    return write(self, *args, **kwargs)


def frozen_start(self, *args, **kwargs):
    """Freeze RANK after MPI_Init, before its start-up barrier."""
    if KIND == "freeze-start" and MPI.COMM_WORLD.Get_rank() == RANK:
        os.kill(os.getpid(), signal.SIGSTOP)
    backend_init(self, *args, **kwargs)


sweep.run_collective = faulty_run  # what `run` calls
MpiBackend.__init__ = frozen_start
TraceRecorder.write = frozen_write
sys.exit(cli.main(sys.argv[3:]))
