"""`themis-mpi ARGS` with one fault raised on one rank when its first collective starts.

Usage: ``mpiexec -n K python tests/jobs/inject_fault.py KIND RANK ARGS...`` with KIND one of
``usage`` (a UsageError), ``bug`` (an unexpected exception) or ``stall`` (a `Stalled`).
"""

import sys

from mpi4py import MPI

from themis_mpi import cli, driver
from themis_mpi.errors import UsageError
from themis_mpi.mpi.progress import Stalled

KIND, RANK = sys.argv[1], int(sys.argv[2])
FAULTS = {
    "usage": UsageError("injected user mistake"),
    "bug": ZeroDivisionError("injected bug"),
    "stall": Stalled("injected stall"),
}
original = driver.run_collective


def faulty(*args, **kwargs):
    """Raise the fault on RANK, run normally elsewhere (the others wait for RANK)."""
    if MPI.COMM_WORLD.Get_rank() == RANK:
        raise FAULTS[KIND]
    return original(*args, **kwargs)


driver.run_collective = faulty
sys.exit(cli.main(sys.argv[3:]))
