"""`themis-mpi ARGS` with one fault on one rank.

Usage: ``mpiexec -n K python tests/jobs/inject_fault.py KIND RANK ARGS...`` with KIND one of
``usage`` (a UsageError), ``bug`` (an unexpected exception) or ``stall`` (a `Stalled`), raised
when the rank's first collective starts, or ``freeze-start`` / ``freeze-write`` (the rank stops
itself, SIGSTOP, before the start-up barrier / when it starts writing the trace), or
``freeze-grid`` (the rank stops after the start-up barrier, as the grid's blocking constructors
start: the others block in them), or ``freeze-model`` (the rank stops as the model run of every NPU's links that times a straggler
run starts, before any wait; the other ranks' model runs then last `MODEL_S` of CPU, as at 200
ranks on 2 cores; a RANK out of range freezes none). ``THEMIS_MPI_TEST_MODEL_S`` sets `MODEL_S`.
"""

import os
import signal
import sys
import time

from mpi4py import MPI

from themis_mpi import cli
from themis_mpi.cli import sweep
from themis_mpi.errors import Stalled, UsageError
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiBackend
from themis_mpi.timing.world import World
from themis_mpi.trace import TraceRecorder

KIND, RANK = sys.argv[1], int(sys.argv[2])
FAULTS = {
    "usage": UsageError("injected user mistake"),
    "bug": ZeroDivisionError("injected bug"),
    "stall": Stalled("injected stall"),
}
run_collective, write, backend_init = sweep.run_collective, TraceRecorder.write, MpiBackend.__init__
world_run, grid_init = World.run, CartGrid.__init__
MODEL_S = float(os.environ.get("THEMIS_MPI_TEST_MODEL_S", "120"))


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


def frozen_grid(self, *args, **kwargs):
    """Freeze RANK as the grid is built, after the start-up barrier."""
    if KIND == "freeze-grid" and MPI.COMM_WORLD.Get_rank() == RANK:
        os.kill(os.getpid(), signal.SIGSTOP)
    grid_init(self, *args, **kwargs)


def frozen_model(self, *args, **kwargs):
    """Freeze RANK as its model run starts; the others compute for MODEL_S first (busy, holding the GIL)."""
    if KIND == "freeze-model":
        if MPI.COMM_WORLD.Get_rank() == RANK:
            os.kill(os.getpid(), signal.SIGSTOP)
        end = time.monotonic() + MODEL_S
        while time.monotonic() < end:
            sum(range(10_000))
    return world_run(self, *args, **kwargs)


sweep.run_collective = faulty_run  # what `run` calls
World.run = frozen_model
CartGrid.__init__ = frozen_grid
MpiBackend.__init__ = frozen_start
TraceRecorder.write = frozen_write
sys.exit(cli.main(sys.argv[3:]))
