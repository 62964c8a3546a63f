"""Every NPU's links under ASTRA-sim 2.x's congestion-aware backend (`timing.world`): rules and agreement.

The 36 development rows it exists for (halving-doubling on Ring8, 2 or 4 active chunks) are in
tests/test_astra2.py with every other row; here are its link rules in closed form, the one-NPU
network it must equal where collectives are symmetric, and what it refuses.
"""

import math
from dataclasses import replace

import pytest
from harness import DATA, ROOT, in_process, run_specs

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.cost import ASTRA_SIM_2
from themis_mpi.engine import Engine
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.policies.base import fixed_schedule
from themis_mpi.run.collective import collective_on, model_collective
from themis_mpi.run.coordinator import share_schedules
from themis_mpi.timing.planner import WORLD, Run, plan
from themis_mpi.timing.routes import NpuRoutes, uneven_dims
from themis_mpi.timing.world import World
from themis_mpi.topology import from_link_bandwidths, parse_topology

NETWORKS = DATA / "astra-sim-reference-2" / "network"
B_PER_NS = 50 * 2**30 / 1e9  # one Ring8 link, one way: 50 GB/s of 2^30 B
LATENCY_NS = 500


def ring8(algorithm: str = "halving_doubling"):
    """Ring8 of the 2.x development set (50 GB/s per link and direction, 500 ns)."""
    topo = from_link_bandwidths(parse_topology(str(NETWORKS / "net_Ring8.yml")))
    return topo.with_overrides(algorithms=[algorithm])


def config(active: int = 1) -> RunConfig:
    """--compat astra-sim-2 --network store-forward, 10 ns endpoint delay."""
    return RunConfig(endpoint_delay_ns=10, compat=ASTRA_SIM_2, network="store-forward", active_per_dim=active)


def test_xor_partners_go_both_ways_round_a_ring():
    """On Ring8 the message 0 -> 2 goes clockwise through NPU 1, 2 -> 0 counter-clockwise; a tie (0 -> 4) clockwise."""
    routes = NpuRoutes(ring8())

    def names(rank, peer):
        return [routes.links[link].name for ((link, _),) in routes.astra2_route(rank, 0, peer)]

    assert names(0, 2) == ["npu0.dim0.cw", "npu1.dim0.cw"]
    assert names(2, 0) == ["npu2.dim0.ccw", "npu1.dim0.ccw"]
    assert names(0, 4) == [f"npu{r}.dim0.cw" for r in range(4)]


def test_a_message_per_link_and_two_queued_on_one_link_in_closed_form():
    """One hop takes T = trunc(L + S/B), two hops 2T; a message queued behind one leaves trunc(S/B) later."""
    nbytes = 1 << 20
    hop_ns = math.floor(LATENCY_NS + nbytes / B_PER_NS)
    serial_ns = math.floor(nbytes / B_PER_NS)
    world = World(ring8(), config())
    world.astra2_message(1, 0, 2, nbytes, (2, 1, "first"))  # link 1->2, alone at 0
    world.astra2_message(1, 0, 2, nbytes, (2, 1, "queued"))  # behind it on link 1->2
    world.astra2_message(0, 0, 2, nbytes, (2, 0, "two hops"))  # 0->1, then 1->2 behind both
    world.astra2_message(2, 0, 0, nbytes, (0, 2, "other way"))  # 2->1->0: none of those links, alone: 2T
    world.drain()
    got = world.arrival_ns
    assert got[(2, 1, "first")] == hop_ns
    assert got[(2, 1, "queued")] == serial_ns + hop_ns
    assert got[(2, 0, "two hops")] == 2 * serial_ns + hop_ns  # at NPU 1 at T, link 1->2 free at 2 trunc(S/B)
    assert got[(0, 2, "other way")] == 2 * hop_ns


def test_only_halving_doubling_on_a_ring_of_more_than_2_is_uneven():
    """uneven_dims names Ring dims with halving-doubling and P > 2; every NPU runs under 2.x store-forward only."""
    assert uneven_dims(ring8()) == (0,)
    assert uneven_dims(parse_topology("Ring(2,100,500,hd)_SW(4,50,500)")) == ()
    assert uneven_dims(parse_topology("SW(4,50,500)_Ring(4,100,500,hd)")) == (1,)
    for algorithm in ("ring", "direct"):
        assert uneven_dims(ring8(algorithm)) == ()
    assert uneven_dims(parse_topology("SW(8,50,500,hd)_FC(4,50,500,hd)")) == ()
    assert plan(Run(ring8(), config())).simulator == WORLD
    assert (
        plan(Run(ring8(), RunConfig(endpoint_delay_ns=10, compat=ASTRA_SIM_2, network="ideal"))).simulator
        != WORLD
    )
    assert plan(Run(ring8(), RunConfig(network="store-forward"))).simulator != WORLD


def stage_ends(engine: Engine) -> dict:
    """Every stage's (start, end) by (chunk, stage index)."""
    return {(r.stage.chunk, r.stage.index): (r.start_ns, r.end_ns) for r in engine.records}


@pytest.mark.parametrize(
    "topology",
    [
        "Ring8/ring",
        "Ring8/direct",
        "SW(8,50,500,hd)",
        "SW(8,50,500,ring)",
        "FC(8,350,500,hd)",
    ],
)
@pytest.mark.parametrize("active", [1, 2, 4])
def test_every_npu_equals_one_npu_on_symmetric_collectives(topology, active):
    """Where loads are even, every NPU's stage starts and ends equal the one-NPU network's, to the ns."""
    topo = ring8(topology.split("/")[1]) if topology.startswith("Ring8") else parse_topology(topology)
    cfg = config(active)
    coll = Collective("all_reduce", (1 << 20) // 4, "float32", 7, (0,))
    schedule = fixed_schedule(coll, [[0]] * 7, True, "fifo")

    def play(transport):
        engine = Engine(topo, transport, cfg)
        engine.issue(coll, schedule)
        engine.run()
        return engine

    one = stage_ends(play(ModelTransport(topo, cfg)))
    every = [stage_ends(e) for e in World(topo, cfg).run(play)]
    assert all(ends == one for ends in every)


def test_uneven_loads_end_npus_at_different_times_and_the_model_reports_the_last():
    """Ring8 halving-doubling, 2 active chunks: NPUs end apart, and `model` gives the last NPU's end."""
    topo, cfg = ring8(), config(2)
    coll = Collective("all_reduce", (1 << 20) // 4, "float32", 4, (0,))
    schedule = fixed_schedule(coll, [[0]] * 4, True, "fifo")

    def play(transport):
        engine = Engine(topo, transport, cfg)
        run = engine.issue(coll, schedule)
        engine.run()
        return run.end_ns

    ends = World(topo, cfg).run(play)
    assert min(ends) < max(ends)
    result, _ = model_collective(topo, coll, "baseline", cfg, schedule)
    assert result.time_us == max(ends) / 1e3


def test_runs_that_are_not_a_single_collective_are_refused_on_an_uneven_dim():
    """An engine on the one-NPU model (training, graphs) refuses Ring halving-doubling under 2.x store-forward."""
    topo, cfg = ring8(), config()
    engine = Engine(topo, ModelTransport(topo, cfg), cfg)
    coll = Collective("all_reduce", 1 << 16, "float32", 1, (0,))
    with pytest.raises(UsageError, match="runs every NPU"):
        engine.issue(coll, fixed_schedule(coll, [[0]], True, "fifo"))
        engine.run()


def test_training_on_an_uneven_dim_is_one_line_and_exit_2():
    """themis-mpi train on Ring8 halving-doubling under 2.x store-forward exits 2 with one line."""
    proc = in_process(
        [
            "train",
            str(ROOT / "traces" / "resnet152.txt"),
            "-t",
            "Ring(8,100,500,hd)",
            "--compat",
            "astra-sim-2",
        ]
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "runs every NPU" in proc.stderr


MULTI = "Ring(4,100,500,hd)_SW(2,50,500,ring)"


def test_npus_may_start_a_dims_stages_in_different_orders_and_share_their_numbers():
    """Ring4 halving-doubling x SW2, themis/scf, 2 active: an NPU starts a dim's stages in another order; numbers agree."""
    topo, cfg = parse_topology(MULTI), replace(config(2), intra="scf")
    coll = Collective("all_reduce", (1 << 20) // 4, "float32", 8, (0, 1))
    (schedule,), _ = share_schedules(ModelTransport(topo, cfg), "themis", [coll])
    world = World(topo, cfg)
    world.run(lambda npu: collective_on(npu, coll, schedule, False, None, True))
    assert any(order != world.order[0] for order in world.order)
    numbers = [world.replay(rank).numbers for rank in range(topo.npus)]
    assert all(n == numbers[0] for n in numbers)


UNEVEN = ["Ring(8,100,500,hd)", MULTI]
UNEVEN_BASE = {
    "dtype": "float32",
    "endpoint_delay_ns": 10.0,
    "compat": ASTRA_SIM_2,
    "network": "store-forward",
}
UNEVEN_CASES = [
    {
        **UNEVEN_BASE,
        "op": "all_reduce",
        "count": 100003,
        "chunks": 7,
        "policy": "baseline",
        "intra": "fifo",
        "active": 2,
    },
    {
        **UNEVEN_BASE,
        "op": "all_reduce",
        "count": 1 << 18,
        "chunks": 16,
        "policy": "themis",
        "intra": "scf",
        "active": 4,
    },
    {
        **UNEVEN_BASE,
        "op": "reduce_scatter",
        "count": 1 << 16,
        "chunks": 4,
        "policy": "baseline",
        "intra": "fifo",
        "active": 2,
    },
]


@pytest.fixture(scope="module")
def uneven_rows(tmp_path_factory) -> dict:
    """The agreement of `UNEVEN_CASES` on both topologies in one mpiexec (`harness.run_specs`): rows by topology."""
    return run_specs({t: (8, t, UNEVEN_CASES) for t in UNEVEN}, tmp_path_factory.mktemp("uneven"))


@pytest.mark.parametrize("topology", UNEVEN)
def test_emulator_equals_model_on_uneven_links_on_8_ranks(uneven_rows, topology):
    """Ring halving-doubling under 2.x store-forward: emulator == model exactly, active 2 and 4, #wrong 0."""
    rows = uneven_rows[topology]
    assert len(rows) == len(UNEVEN_CASES)
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
