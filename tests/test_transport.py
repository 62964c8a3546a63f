"""Rules for the MPI data path: messages with the send time folded in, and the ones without.

Blocks up to ``FOLD_MAX_BYTES`` travel in one message with their send time; larger ones as a
header and the data (under a sharing rule, whose timer times the stages, the data alone). Every case runs under `mpiexec` (pytest itself never starts MPI).
"""

import json

import pytest
from harness import mpirun, run_specs

FOLD_MAX_BYTES = 64 << 10  # themis_mpi.mpi.transport.FOLD_MAX_BYTES (importing it would start MPI)
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}


def fold_cases(ops, dtypes, **extra) -> list[dict]:
    """Sizes whose first blocks sit exactly at the fold limit, just above it, and 4x above."""
    cases = []
    for op in ops:
        for dtype in dtypes:
            limit = FOLD_MAX_BYTES // ITEMSIZE[dtype]
            for count, chunks in [(2 * limit, 1), (2 * limit + 2, 1), (8 * limit + 8, 3)]:
                cases.append(
                    {
                        "op": op,
                        "count": count,
                        "chunks": chunks,
                        "dtype": dtype,
                        "policy": "themis",
                        "intra": "scf",
                        "redop": "max" if dtype == "int64" else "sum",
                        **extra,
                    }
                )
    return cases


FOLD_TOPOLOGIES = ["2x2x2", "SW(2,100,700)_FC(4,100,700,ring)", "Ring(2,100,20)_SW(4,100,700,ina)"]
WALL_TOPOLOGY = "SW(2,100,700)_FC(4,100,700,ring)"


def both_sides_cases() -> list[dict]:
    """Every op in two dtypes on both sides of the fold limit."""
    return fold_cases(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"], ["float32", "int64"])


def wall_cases() -> list[dict]:
    """Under the wall clock (100x slower than the model's time), an all-reduce and an all-to-all."""
    return fold_cases(["all_reduce", "all_to_all"], ["float64"], clock="wall", time_scale=100.0)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The module's agreement cases, in one mpiexec of 8 ranks (`harness.run_specs`)."""
    specs = {("fold", t): (8, t, both_sides_cases()) for t in FOLD_TOPOLOGIES}
    specs["wall"] = (8, WALL_TOPOLOGY, wall_cases())
    return run_specs(specs, tmp_path_factory.mktemp("mpi"))


@pytest.mark.parametrize("topo", FOLD_TOPOLOGIES)
def test_blocks_on_both_sides_of_the_fold_limit_are_exact_in_the_models_time(jobs, topo):
    """Every op moves exact data in exactly the model's time whether its blocks fold the send time in or not."""
    rows = jobs[("fold", topo)]
    assert len(rows) == len(both_sides_cases())
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
        assert [d["busy_us"] for d in r["emu"]["dims"]] == [d["busy_us"] for d in r["model"]["dims"]]


def test_the_wall_clock_keeps_exact_data_and_the_models_virtual_time_on_both_paths(jobs):
    """Under the wall clock each step waits for its deadline; data stays exact and virtual time equals the model's."""
    rows = jobs["wall"]
    assert len(rows) == len(wall_cases())
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["virtual_us"] == r["model"]["time_us"], r["case"]


COUNT_MESSAGES = """
import json, sys
from mpi4py import MPI
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.run.collective import run_collective
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiTransport
from themis_mpi.timing.planner import emulator_timer
from themis_mpi.topology import parse_topology


class Counting:
    '''A sub-communicator that counts the sends posted on it.'''

    def __init__(self, comm):
        self.comm, self.sends = comm, 0

    def Isend(self, *args):
        self.sends += 1
        return self.comm.Isend(*args)

    def Irecv(self, *args):
        return self.comm.Irecv(*args)

    def Send_init(self, *args):  # (a symmetric run's program: one persistent send per message)
        self.sends += 1
        return self.comm.Send_init(*args)

    def Recv_init(self, *args):
        return self.comm.Recv_init(*args)


topo = parse_topology("2x2x2")
for count, chunks, network in zip(*[iter(sys.argv[1:])] * 3):  # one line per case: COUNT CHUNKS NETWORK
    with CartGrid(MPI.COMM_WORLD, topo) as grid:
        counting = [Counting(c) for c in grid.subcomms]
        real, grid.subcomms = grid.subcomms, counting
        config = RunConfig(network=network).on(topo)
        transport = MpiTransport(grid, config, emulator_timer(topo, config))  # (ideal: no timer)
        collective = Collective("all_reduce", int(count), "float64", int(chunks), (0, 1, 2))
        result, engine = run_collective(transport, collective, "baseline")
        transport.drain()
        grid.subcomms = real
        sends = sum(c.sends for c in counting)
        if grid.rank == 0:
            print(json.dumps({"sends": sends, "stages": len(engine.records), "wrong": result.wrong}))
"""
FOLDS = [(FOLD_MAX_BYTES, "ideal", 1), (FOLD_MAX_BYTES + 8, "ideal", 2), (FOLD_MAX_BYTES + 8, "packet", 1)]
FOLD_CHUNKS = 4


@pytest.fixture(scope="module")
def counted() -> list[dict]:
    """`COUNT_MESSAGES` of every `FOLDS` case in one 8-rank job: per case, its sends, stages and #wrong."""
    # the first step's block of every chunk is block_bytes
    cases = [a for b, network, _ in FOLDS for a in (2 * b // 8 * FOLD_CHUNKS, FOLD_CHUNKS, network)]
    proc = mpirun(8, ["-c", COUNT_MESSAGES, *map(str, cases)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(FOLDS) :]]


@pytest.mark.parametrize("block_bytes,network,per_step", FOLDS)
def test_a_step_sends_one_message_per_peer_up_to_the_fold_limit_and_two_above(
    counted, block_bytes, network, per_step
):
    """On 2x2x2 (one peer per step, six steps per chunk) blocks up to the limit go as one message, larger ones as two.

    Under a sharing rule its timer times the stages: no send time travels, a larger block goes alone.
    """
    chunks = FOLD_CHUNKS
    out = counted[FOLDS.index((block_bytes, network, per_step))]
    assert out["wrong"] == 0
    # RS dim 0, RS dim 1, AR dim 2 (two steps), AG dim 1, AG dim 0; only the outer dim-0 blocks are that large
    assert out["sends"] == chunks * (4 + 2 * per_step)
