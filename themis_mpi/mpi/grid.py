"""The Cartesian communicator mirroring the topology, with one sub-communicator per dim.

Built in the manner of mpi4py-fft's ``Subcomm``. Rank numbering: MPI numbers Cartesian ranks
row-major (the last Cartesian coordinate varies fastest), and the grid is created with the
topology's dims reversed, so topology dim 0 varies fastest: ``rank = c0 + P0 * (c1 + P1 * ...)``.
The NPUs of one dim-0 group are consecutive ranks, which a block-placing launcher puts on the
same host.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from ..config import DEFAULT_TIMEOUT_S
from ..errors import UsageError
from ..topology import Topology
from .progress import Watchdog

SERVE_EVERY_S = 0.01  # how often a busy rank's thread answers pings (they wait 2 s for it)


class CartGrid:
    """The grid of one run; free it with `close()` or a ``with`` block.

    Args:
        comm: the communicator to arrange; its size must equal the topology's NPU count.
        topology: the network.
        timeout_s: seconds without progress before any wait on this grid gives up.

    Attributes:
        cart: the Cartesian communicator (it carries the control collectives and the pings).
        subcomms: one communicator per dim, along which the stages move data.
        coords: this rank's coordinate per topology dim.
        world_ranks: per dim, the `comm` rank of each sub-communicator rank (for diagnoses).
        watchdog: liveness pings and quiet waits on `cart`.
    """

    def __init__(self, comm: MPI.Intracomm, topology: Topology, timeout_s: float = DEFAULT_TIMEOUT_S):
        if comm.Get_size() != topology.npus:
            raise UsageError(
                f"topology {topology.label()} has {topology.npus} NPUs "
                f"({'x'.join(map(str, topology.shape))}) but {comm.Get_size()} MPI ranks were started"
            )
        n = len(topology.dims)
        self.topology = topology
        self.cart = comm.Create_cart(list(reversed(topology.shape)), periods=[True] * n, reorder=False)
        self.rank = self.cart.Get_rank()
        self.size = self.cart.Get_size()
        self.coords = tuple(reversed(self.cart.Get_coords(self.rank)))
        self.subcomms: list[MPI.Cartcomm] = []
        self.world_ranks: list[list[int]] = []
        world = comm.Get_group()
        for d in range(n):
            remain = [False] * n
            remain[n - 1 - d] = True
            sub = self.cart.Sub(remain)
            self.subcomms.append(sub)
            group = sub.Get_group()
            self.world_ranks.append(
                list(MPI.Group.Translate_ranks(group, list(range(sub.Get_size())), world))
            )
            group.Free()
        world.Free()
        self.watchdog = Watchdog(self.cart, timeout_s)

    def wait(self, request: MPI.Request, what: str, patient: bool = False) -> None:
        """Complete a control collective quietly, under the watchdog (`Watchdog.wait`)."""
        self.watchdog.wait(request, what, patient)

    def bcast(self, array: np.ndarray, what: str, patient: bool = False) -> np.ndarray:
        """Broadcast a numpy array from rank 0 in place (uppercase, no pickling).

        `patient`: rank 0 may take long (it decides) but answers pings meanwhile (`serving`).
        """
        self.wait(self.cart.Ibcast(array, root=0), what, patient)
        return array

    @contextmanager
    def serving(self) -> Iterator[None]:
        """While this rank computes on its own, a thread answers the others' liveness pings.

        The rank makes no MPI call meanwhile (MPI runs with MPI_THREAD_MULTIPLE), so the other
        ranks, waiting patiently, know it is busy rather than dead.
        """
        stop = threading.Event()

        def answer() -> None:
            while not stop.wait(SERVE_EVERY_S):
                self.watchdog.service()

        thread = threading.Thread(target=answer, name="themis-mpi-pings", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        """Free the sub-communicators and the Cartesian communicator."""
        self.watchdog.close()
        for sub in self.subcomms:
            sub.Free()
        self.subcomms = []
        if self.cart:
            self.cart.Free()  # leaves the handle null

    def __enter__(self) -> CartGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
