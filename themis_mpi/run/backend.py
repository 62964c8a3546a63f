"""Where runs happen: the model (this process) or MPI (one rank per NPU), and MPI's start-up guard."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import numpy as np

from ..config import DEFAULT_TIMEOUT_S, RunConfig
from ..engine import Transport
from ..errors import UsageError
from ..launch import env_rank, env_size
from ..model import ModelBackend
from ..topology import Topology


class Backend(Protocol):
    """Where runs happen: the model (this process) or MPI (one rank per NPU on a grid)."""

    @property
    def name(self) -> str:
        """Model or mpi."""
        ...

    @property
    def rank(self) -> int:
        """This process's rank (0 in the model)."""
        ...

    def transport(self, config: RunConfig) -> Transport:
        """A transport with these settings."""
        ...

    def gather(self, events: np.ndarray) -> np.ndarray | None:
        """Every rank's trace events on rank 0 (None on the others)."""
        ...

    def service(self) -> None:
        """Answer liveness pings while this rank is busy on its own (writing outputs)."""

    def close(self, barrier: bool = True) -> None:
        """Wait for every rank (unless `barrier` is False), then free what the backend holds."""


# The start-up guard, a POSIX shell script (argv: timeout in s, the rank's pid, rank 0's line or
# ""; stdin: a pipe the rank holds open until MPI is up). End of input (MPI started, or the rank
# is gone) stops the sleeper; a sleeper that runs out ends the rank. The guard leaves last.
_GUARD_SH = """
exec 3>&2 2>/dev/null 4<&0
sleep "$1" & s=$!
(cat <&4 >/dev/null; kill "$s") &
if wait "$s"; then
    if [ -n "$3" ]; then printf '%s\\n' "$3" >&3; else sleep 1; fi
    kill -9 "$2"
fi
wait
"""


@contextmanager
def _start_up_deadline(timeout_s: float) -> Iterator[None]:
    """End this rank with one line if MPI_Init does not return within the timeout.

    MPI_Init waits for every rank; one that died or stopped before reaching it would keep the
    others there for ever (spinning, with the GIL held), out of reach of the watchdog, which
    needs MPI itself. A guard process ends this one unless MPI starts in time: a small shell
    script, spawned (no copy of this process: a forked copy, sharing every page copy-on-write
    while MPI_Init wrote them, cost each rank of a 128-rank job on 2 cores about 20-40 ms of CPU).
    """
    shell = "/bin/sh"
    if not hasattr(os, "posix_spawn") or not os.path.exists(shell):  # not POSIX (Windows): no guard
        yield
        return
    line = ""
    if env_rank() == 0:
        line = (
            f"themis-mpi: error: MPI did not start within {timeout_s:g} s (--timeout-s): a rank died or "
            "stopped before MPI_Init, or start-up is slower than that on this machine; aborting"
        )
    argv = [shell, "-c", _GUARD_SH, "themis-mpi-guard", str(math.ceil(timeout_s)), str(os.getpid()), line]
    read_fd, write_fd = os.pipe()  # (not inherited: Python's descriptors close on exec)
    try:
        stdio = [(os.POSIX_SPAWN_DUP2, read_fd, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
        guard = os.posix_spawn(shell, argv, os.environ, file_actions=stdio)
    finally:
        os.close(read_fd)
    try:
        yield
    finally:
        os.close(write_fd)  # the guard sees its input end and leaves
        os.waitpid(guard, 0)


@contextmanager
def open_backend(
    topology: Topology, use_mpi: bool, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[Backend]:
    """The MPI backend on COMM_WORLD (under mpiexec) or the model; closed on exit.

    mpi4py is imported only here, and only for the MPI backend.
    """
    backend: Backend
    if use_mpi:
        ranks = env_size()
        if ranks is not None and ranks != topology.npus:  # refused on every rank before MPI starts
            raise UsageError(
                f"topology {topology.label()} has {topology.npus} NPUs "
                f"({'x'.join(map(str, topology.shape))}) but {ranks} MPI ranks were started"
            )
        with _start_up_deadline(timeout_s):
            from mpi4py import MPI  # MPI_Init waits for every rank of the job

        from ..mpi.transport import MpiBackend  # imports mpi4py: only after MPI has started

        backend = MpiBackend(MPI.COMM_WORLD, topology, timeout_s)
    else:
        backend = ModelBackend(topology)
    try:
        yield backend
    except BaseException:
        backend.close(barrier=False)  # the other ranks may be anywhere: the caller ends the job
        raise
    backend.close()
