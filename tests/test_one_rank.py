"""The emulator's MPI layer on one rank, in this process (MPI as a singleton, no mpiexec).

The runs on 2 to 8 ranks need mpiexec (tests/test_emulator.py and others); these keep the grid,
the watchdog and the transport under the quick subset.
"""

import numpy as np
import pytest

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.run.collective import model_collective, run_collective
from themis_mpi.topology import parse_topology


@pytest.fixture
def singleton():
    """mpi4py's MPI and the emulator's transport module, imported (MPI_Init) only by the tests here."""
    from mpi4py import MPI

    from themis_mpi.mpi import transport

    return MPI, transport


def test_a_grid_of_another_size_than_the_topology_is_refused(singleton):
    """A communicator of 1 rank for a topology of 8 NPUs: one line naming both counts."""
    MPI, transport = singleton
    with pytest.raises(UsageError, match=r"has 8 NPUs \(2x2x2\) but 1 MPI ranks were started"):
        transport.MpiBackend(MPI.COMM_SELF, parse_topology("2x2x2"), 5.0)


@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_one_rank_reduces_exactly_in_the_models_time(singleton, policy):
    """An all-reduce on a 1-NPU topology: the data is exact (wrong 0) and the time is the model's."""
    MPI, transport = singleton
    topo = parse_topology("Ring(1,100,20)")
    coll = Collective("all_reduce", 1000, "float32", 4, (0,))
    backend = transport.MpiBackend(MPI.COMM_SELF, topo, 10.0)
    try:
        result, _ = run_collective(backend.transport(RunConfig()), coll, policy)
    finally:
        backend.close()
    model, _ = model_collective(topo, coll, policy)
    assert result.wrong == 0 and result.time_us == model.time_us


def test_a_point_to_point_payload_depends_on_both_ends_and_the_tag(singleton):
    """Messages that differ in source, destination or tag carry different bytes, so a misrouted one is wrong."""
    payload = singleton[1].p2p_payload
    base = payload(1, 2, 3, 64)
    assert base.dtype == np.uint8 and len(base) == 64 and (base == payload(1, 2, 3, 64)).all()
    for other in (payload(2, 2, 3, 64), payload(1, 3, 3, 64), payload(1, 2, 4, 64)):
        assert (other != base).all()
