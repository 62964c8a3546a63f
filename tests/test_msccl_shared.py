"""A dim's custom stages share the network with the run's other stages (issue 44, Build 2).

Under a sharing rule with several active stages per dim, or on a dim whose port another dim
shares, a dim's custom stage runs as a flow of its rounds over one NPU's links among the other
stages (`run.custom.DimStages.flow`). The built-in ring exported is the same algorithm as the
built-in ring, so it must take the same time to the ns, on the model and on the emulator; and
the policies' estimates see the file (`policies.base.PolicyContext.stage_ns`, `custom_scale`).
Files whose NPUs' rounds differ run each NPU's levels on every NPU's links (`DimStages.npu_steps`).
"""

import re

import pytest
from harness import cli_jobs, in_process
from test_msccl_dim import exported_stages
from test_msccl_run import rows_of, run_args

from themis_mpi.api import sweep
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.policies import policy_context
from themis_mpi.policies.inter import Themis
from themis_mpi.run.custom import DimStages, dim_stages
from themis_mpi.timing.planner import ONE_NPU, WORLD, Run, plan
from themis_mpi.topology import parse_topology

SWITCH = "SW(4,100,500)_SW(2,50,1000)"
SHARED_PORT = "SW(4,100,500)_SW(2,50,1000)_NIC(0+1,40)"  # dims 0 and 1 leave through one NIC


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, str]:
    """The built-in ring's and halving-doubling's reduce-scatter and all-gather on 4 NPUs, exported."""
    out = tmp_path_factory.mktemp("shared")
    return {name: exported_stages(out, name) for name in ("ring", "halving_doubling", "direct")}


@pytest.fixture(scope="module")
def ring(exported) -> str:
    """The exported ring: dim 0's spec."""
    return exported["ring"]


def row(topology: str, op: str, network: str, active: int, policy: str, first: str):
    """The model's row of a 64 MiB collective in 8 chunks, `first` on dim 0, direct on dim 1."""
    kw = dict(op=op, network=network, active_per_dim=active, algorithm=[first, "direct"])
    return sweep(topology, "64M", policy, 8, **kw)[0]


@pytest.mark.parametrize("network", ["fair", "packet"])
@pytest.mark.parametrize(
    "topology,active",
    [(SWITCH, 2), (SWITCH, 4), (SHARED_PORT, 1), (SHARED_PORT, 2)],
    ids=["active-2", "active-4", "shared-port", "shared-port-active-2"],
)
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_exported_ring_shares_the_network_as_the_builtin_ring(exported, network, topology, active, op):
    """The same algorithm among other stages: the built-in's time to the ns, both schedules.

    The ring; and halving-doubling, whose partners differ NPU by NPU, but not their bytes, and
    on a Switch every message crosses its sender's up-link and its receiver's down-link.
    """
    for algorithm, policies in (("ring", ("baseline", "themis")), ("halving_doubling", ("baseline",))):
        for policy in policies:
            mine, builtin = (
                row(topology, op, network, active, policy, a) for a in (exported[algorithm], algorithm)
            )
            assert mine.time_us == pytest.approx(builtin.time_us, rel=1e-12), (algorithm, policy)
    # the stages did meet: with one stage at a time on a dim of its own the time differs
    if active > 1:
        alone = row(SWITCH, op, network, 1, "baseline", exported["ring"])
        assert row(topology, op, network, active, "baseline", exported["ring"]).time_us != alone.time_us


def test_emulator_equals_model_with_active_chunks_and_a_shared_port(ring, tmp_path):
    """Under mpiexec -n 8, 2 active chunks per dim on a shared NIC: #wrong 0, the model's time, the built-in's."""
    runs = {}
    for network in ("fair", "packet"):
        args = run_args(
            SHARED_PORT, "all_reduce", "1M", f"{ring},direct", network, tmp_path / f"{network}.json", 4
        )
        runs[network] = (8, [*args, "--active-chunks-per-dim", "2"])
    done = cli_jobs(runs, tmp_path)  # one batch of the resident job
    for network in ("fair", "packet"):
        out = tmp_path / f"{network}.json"
        proc = done[network]
        assert proc.returncode == 0, proc.stderr
        (row,) = rows_of(out)
        assert row["wrong"] == 0
        model, builtin = (
            sweep(
                SHARED_PORT, "1M", "baseline", 4, network=network, active_per_dim=2, algorithm=[a, "direct"]
            )[0]
            for a in (ring, "ring")
        )
        assert row["time_us"] == pytest.approx(model.time_us, rel=1e-12)
        assert model.time_us == pytest.approx(builtin.time_us, rel=1e-12)


RING = "Ring(4,100,500)_SW(2,50,1000)"
FC = "FC(4,100,500)_SW(2,50,1000)"
FC_PORT = "FC(4,100,500)_SW(2,50,1000)_NIC(0+1,40)"
RING_PORT = "Ring(4,100,500)_SW(2,50,1000)_NIC(0+1,40)"


def simulator(topology: str, first: str, network: str, active: int) -> str:
    """What times a 1 MiB all-reduce with `first` on dim 0 (`timing.planner.plan`), its stages held."""
    topo = parse_topology(f"{topology.replace(')_', f',{first})_', 1)}")
    config = RunConfig(network=network, active_per_dim=active)
    collective = Collective.of_bytes("all_reduce", 2**20, "float64", 4, (0, 1))
    with dim_stages(topo, config, collective, prove=True):
        return plan(Run(topo, config)).simulator


@pytest.mark.parametrize("network", ["fair", "packet", "store-forward"])
@pytest.mark.parametrize(
    "algorithm,topology",
    [("ring", SWITCH), ("ring", SHARED_PORT), ("ring", RING), ("halving_doubling", SWITCH)]
    + [("halving_doubling", SHARED_PORT)],  # (its partners differ NPU by NPU on a Ring: no one NPU's view)
)
def test_every_npus_levels_are_one_npus_view_where_the_file_is_symmetric(
    exported, monkeypatch, network, topology, algorithm
):
    """Every NPU's links running each NPU's levels give one NPU's view to the ns where that view is exact.

    The exported ring (and halving-doubling, symmetric on a Switch) run both ways: as one
    NPU's rounds (`DimStages.flow`), and forced onto every NPU's links as if its NPUs' rounds
    differed (`DimStages.npu_steps`, `routes.NpuRoutes.custom_stage`), 2 active chunks a dim.
    """
    spec = exported[algorithm]
    one = row(topology, "all_reduce", network, 2, "baseline", spec)
    assert simulator(topology, spec, network, 2) == ONE_NPU
    monkeypatch.setattr(DimStages, "asymmetric", lambda self: 1)
    assert simulator(topology, spec, network, 2) == WORLD
    every = row(topology, "all_reduce", network, 2, "baseline", spec)
    assert every.time_us == pytest.approx(one.time_us, rel=1e-12)


@pytest.mark.parametrize("network", ["fair", "packet", "store-forward"])
@pytest.mark.parametrize("topology,active", [(FC, 2), (FC_PORT, 1), (FC_PORT, 2)])
@pytest.mark.parametrize("algorithm", ["halving_doubling", "direct"])
def test_exported_files_on_a_fully_connected_dim_take_the_builtins_time(
    exported, network, topology, active, algorithm
):
    """Each message has its own link; halving-doubling on every NPU's links, direct by one NPU's view.

    Halving-doubling's XOR partners lie at different distances NPU by NPU, so its NPUs' levels
    (`msccl.custom.stage_levels`) differ; the direct file's levels send every message at once,
    the same on every NPU. The built-in algorithms send each step to the same
    peers' links, so the times and every link's bytes are the same to the ns, with 2 active
    chunks a dim and with a NIC shared by both dims.
    """
    spec = exported[algorithm]
    assert simulator(topology, spec, network, active) == (ONE_NPU if algorithm == "direct" else WORLD)
    mine = row(topology, "all_reduce", network, active, "baseline", spec)
    builtin = row(topology, "all_reduce", network, active, "baseline", algorithm)
    assert mine.time_us == pytest.approx(builtin.time_us, rel=1e-12)
    assert [x.name for x in mine.links] == [x.name for x in builtin.links]
    for a, b in zip(mine.links, builtin.links):
        assert a.bytes == pytest.approx(b.bytes, rel=1e-12), a.name


@pytest.mark.parametrize(
    "algorithm,network", [("halving_doubling", "fair"), ("halving_doubling", "packet"), ("direct", "fair")]
)
def test_exported_files_on_a_ring_dim_run_within_its_links(exported, algorithm, network):
    """On a Ring their messages go the shorter way round hop by hop (ties clockwise): no link over 100 %.

    The built-in halving-doubling and direct on a Ring spread each step half each way over the
    sender's own links (one NPU's view), so the files differ from them: a message 2 away loads
    two clockwise links, and they take longer. With stages sharing the links the time differs
    from one stage at a time.
    """
    spec = exported[algorithm]
    assert simulator(RING, spec, network, 2) == (ONE_NPU if algorithm == "direct" else WORLD)
    shared = row(RING, "all_reduce", network, 2, "baseline", spec)
    alone = row(RING, "all_reduce", network, 1, "baseline", spec)
    assert shared.links and all(link.busy_pct <= 100 + 1e-9 for link in shared.links)
    assert shared.time_us > row(RING, "all_reduce", network, 2, "baseline", algorithm).time_us
    assert shared.time_us != alone.time_us


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> str:
    """`themis-mpi synthesize` on Ring(4): its reduce-scatter (by reversal) and all-gather, dim 0's spec."""
    out = tmp_path_factory.mktemp("synthesized")
    paths = []
    for op in ("reduce_scatter", "all_gather"):
        paths.append(out / f"syn_{op}.xml")
        proc = in_process(["synthesize", op, "-t", "Ring(4,100,500)", "-b", "1M", "--out", str(paths[-1])])
        assert proc.returncode == 0, proc.stderr
    return "msccl:" + "+".join(map(str, paths))


@pytest.mark.parametrize("network", ["fair", "packet"])
@pytest.mark.parametrize("topology,active", [(RING, 2), (RING_PORT, 1)])
@pytest.mark.parametrize("op", ["all_gather", "all_reduce"])
def test_synthesized_files_share_a_ring_dim_within_its_links(synthesized, network, topology, active, op):
    """Their NPUs' rounds differ: every NPU's links run them among the other stages, no link over 100 %.

    Their levels carry what their programs carry alone (one active chunk, no shared port): each
    of dim 0's links the same bytes.
    """
    assert simulator(topology, synthesized, network, active) == WORLD
    kw = dict(op=op, network=network, algorithm=[synthesized, "direct"])
    shared = sweep(topology, "1M", "baseline", 4, active_per_dim=active, **kw)[0]
    alone = sweep(RING, "1M", "baseline", 4, active_per_dim=1, **kw)[0]
    assert shared.links and all(link.busy_pct <= 100 + 1e-9 for link in shared.links)
    carried = {link.name: link.bytes for link in alone.links if link.name.startswith("dim0.")}
    assert carried and {x.name: x.bytes for x in shared.links if x.name in carried} == pytest.approx(carried)


def test_files_whose_steps_are_not_their_programs_are_refused_where_stages_share(exported, synthesized):
    """A dim's files whose steps alone do not take their programs' time: one line where stages share links.

    A level's messages leave as one step where the programs send each on its own: under `fair`
    the same time (the exported direct on a Switch then gives the built-in direct's row), under
    `packet` one step's packets, so the direct file on a Switch or a Ring there takes another
    time than its programs and is refused. A level where an NPU sends nothing is a step of no
    transfers, which store-forward does not take. Each runs alone (one active chunk, no shared
    port).
    """
    mine = row(SHARED_PORT, "all_reduce", "fair", 2, "baseline", exported["direct"])
    assert mine.time_us == pytest.approx(
        row(SHARED_PORT, "all_reduce", "fair", 2, "baseline", "direct").time_us
    )
    with pytest.raises(UsageError, match="its levels alone take") as refused:
        row(SHARED_PORT, "all_reduce", "packet", 1, "baseline", exported["direct"])
    levels_us, programs_us = (float(x) for x in re.findall(r"([0-9.]+) us", str(refused.value)))
    assert levels_us != pytest.approx(programs_us, rel=1e-9)
    assert len(str(refused.value).splitlines()) == 1
    assert row(SWITCH, "all_reduce", "packet", 1, "baseline", exported["direct"]).time_us > 0
    base = ["model", "-t", RING, "-b", "64M", "-c", "8", "--algorithm", f"{exported['direct']},direct"]
    proc = in_process([*base, "--network", "packet", "--active-chunks-per-dim", "2"])
    assert proc.returncode == 2 and "its levels alone take" in proc.stderr
    levels_us, programs_us = (float(x) for x in re.findall(r"([0-9.]+) us", proc.stderr))
    assert levels_us != pytest.approx(programs_us, rel=1e-9)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert in_process([*base, "--network", "packet"]).returncode == 0
    base = ["model", "-t", RING, "-b", "1M", "-c", "4", "--algorithm", f"{synthesized},direct"]
    proc = in_process(
        [*base, "-o", "all_gather", "--network", "store-forward", "--active-chunks-per-dim", "2"]
    )
    assert proc.returncode == 2 and "store-forward does not take a step without transfers" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_emulator_replays_every_npus_levels(exported, synthesized, tmp_path):
    """Under mpiexec -n 8 (one job), 2 active chunks a dim: #wrong 0 and the model's time.

    On a Ring dim the exported halving-doubling and the synthesized files, under fair and
    packet; on a FullyConnected dim the exported halving-doubling.
    """
    files = (
        ("hd", RING, exported["halving_doubling"]),
        ("syn", RING, synthesized),
        ("hd-fc", FC, exported["halving_doubling"]),
    )
    cases = {
        (name, network): (topology, spec) for name, topology, spec in files for network in ("fair", "packet")
    }
    runs = {}
    for (name, network), (topology, spec) in cases.items():
        args = run_args(
            topology, "all_reduce", "1M", f"{spec},direct", network, tmp_path / f"{name}-{network}.json", 4
        )
        runs[name, network] = (8, [*args, "--active-chunks-per-dim", "2"])
    for (name, network), proc in cli_jobs(runs, tmp_path).items():
        assert proc.returncode == 0, proc.stderr
        (got,) = rows_of(tmp_path / f"{name}-{network}.json")
        topology, spec = cases[name, network]
        kw = dict(network=network, active_per_dim=2, algorithm=[spec, "direct"])
        model = sweep(topology, "1M", "baseline", 4, **kw)[0]
        assert simulator(topology, spec, network, 2) == WORLD
        assert got["wrong"] == 0
        assert got["time_us"] == pytest.approx(model.time_us, rel=1e-12), (name, network)


def themis_orders(topology: str, collective: Collective, config: RunConfig):
    """Themis's chunk orders on the topology, its dims' custom stages held as in a run."""
    topo = parse_topology(topology)
    with dim_stages(topo, config, collective, prove=True):
        return Themis().schedule(policy_context(topo, config), collective).orders.tolist()


@pytest.mark.parametrize("size_mib", [8, 64])
def test_themis_sees_the_files_load(ring, size_mib):
    """The one-way ring on a Ring dim holds its clockwise link (half the dim's rate) twice as long.

    Themis's tracker counts a stage's bytes at the dim's bandwidth, so with the file it must
    choose as the built-in ring does on a Ring dim of half the bandwidth (closed form: the load
    doubles), where the built-in ring on the full dim chooses otherwise.
    """
    collective = Collective.of_bytes("all_reduce", size_mib * 2**20, "float64", 8, (0, 1))
    config = RunConfig(network="fair")
    path = ring.removeprefix("msccl:")
    mine = themis_orders(f"Ring(4,100,500,msccl:{path})_SW(2,60,1000)", collective, config)
    half = themis_orders("Ring(4,50,500)_SW(2,60,1000)", collective, config)
    full = themis_orders("Ring(4,100,500)_SW(2,60,1000)", collective, config)
    assert mine == half
    assert mine != full


def test_themis_lat_takes_the_files_stage_time(ring):
    """The time-based estimates (themis-lat, the predictive lower bound) take the file's stage time."""
    topo = parse_topology(f"Ring(4,100,500,{ring})_SW(2,60,1000)")
    collective = Collective.of_bytes("all_reduce", 2**20, "float64", 4, (0, 1))
    config = RunConfig(network="fair")
    context = policy_context(topo, config)
    builtin = context.cost(4).stage_end_ns(0, "RS", 2**16, 0.0)
    assert context.stage_ns(0, "RS", 2**16) == builtin  # (no custom stages held: the built-in's)
    with dim_stages(topo, config, collective, prove=True):
        from themis_mpi.algorithms import custom_stage

        assert context.stage_ns(0, "RS", 2**16) == custom_stage(topo.dims[0]).time_ns("RS", 2**16, 4)
        assert context.stage_ns(0, "RS", 2**16) > 1.5 * builtin
