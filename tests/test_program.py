"""The program a symmetric collective's data moves by on the emulator (`mpi.program`), without MPI."""

import pytest

from themis_mpi.collectives import Collective, owned_region, rs_dims
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.mpi.program import Program
from themis_mpi.run.collective import recorded_run
from themis_mpi.run.coordinator import share_schedules
from themis_mpi.timing.planner import Run, plan
from themis_mpi.topology import parse_topology


@pytest.mark.parametrize(
    "topo,op",
    [
        ("2x2x2", "all_reduce"),
        ("Ring(4,100,20)_SW(2,50,700)", "all_reduce"),
        ("4x2", "reduce_scatter"),
        ("4x2", "all_gather"),
    ],
)
def test_waves_take_every_stage_once_after_its_chunk_before_and_one_per_dim(topo, op):
    """Every stage of the model's run joins one wave, after its chunk's previous stage, at most one per dim."""
    topology = parse_topology(topo)
    config = RunConfig(network="packet").on(topology)
    collective = Collective(op, 1 << 14, "float32", 16, tuple(range(len(topology.dims))))
    assert plan(Run(topology, config)).programmed
    (schedule,), _ = share_schedules(ModelTransport(topology, config), "themis", [collective], None)
    _, run, order, finish = recorded_run(topology, config, collective, schedule)
    assert sorted(finish) == list(range(len(order)))
    bounds = run.bounds.tolist()
    regions = [[(bounds[k], bounds[k + 1])] for k in range(len(bounds) - 1)]
    for k, stack in enumerate(regions if op == "all_gather" else []):  # (as `MpiTransport.open` narrows them)
        for d in rs_dims(topology, collective, run.orders[k]):
            stack.append(owned_region(topology.dims[d].npus, 0, *stack[-1]))
    program = Program(
        topology, [0] * len(topology.dims), [None] * len(topology.dims), collective, regions, order
    )
    placed = [i for wave, _ in program.waves for i in wave]
    assert sorted(placed) == list(range(len(order)))
    wave_of = {i: w for w, (wave, _) in enumerate(program.waves) for i in wave}
    for wave, _ in program.waves:
        assert len({order[i].stage.dim for i in wave}) == len(wave)
    for i, r in enumerate(order):
        s = r.stage
        before = [j for j, q in enumerate(order) if q.stage.chunk == s.chunk and q.stage.index == s.index - 1]
        assert all(wave_of[j] < wave_of[i] for j in before)


def test_plugins_stragglers_and_ideal_take_the_general_path():
    """Only NPUs alike under a sharing rule with built-in policies run as a program."""
    topology = parse_topology("2x2x2")
    assert not plan(Run(topology, RunConfig(network="ideal"))).programmed
    assert not plan(Run(topology, RunConfig(network="packet", npu_delay_ns=((1, 500.0),)))).programmed
    assert not plan(Run(topology, RunConfig(network="packet"), kind="training")).programmed
