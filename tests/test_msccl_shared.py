"""A dim's custom stages share the network with the run's other stages (issue 44, Build 2).

Under a sharing rule with several active stages per dim, or on a dim whose port another dim
shares, a dim's custom stage runs as a flow of its rounds over one NPU's links among the other
stages (`run.custom.DimStages.flow`). The built-in ring exported is the same algorithm as the
built-in ring, so it must take the same time to the ns, on the model and on the emulator; and
the policies' estimates see the file (`policies.base.PolicyContext.stage_ns`, `custom_scale`).
"""

import re

import pytest
from harness import cli, local
from test_msccl_dim import exported_stages
from test_msccl_run import rows_of, run_args

from themis_mpi.api import sweep
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.policies import policy_context
from themis_mpi.policies.inter import Themis
from themis_mpi.run.custom import dim_stages
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
    for network in ("fair", "packet"):
        out = tmp_path / f"{network}.json"
        args = run_args(SHARED_PORT, "all_reduce", "1M", f"{ring},direct", network, out, chunks=4)
        proc = cli(8, [*args, "--active-chunks-per-dim", "2"])
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


def test_a_file_one_npu_cannot_stand_for_is_refused_where_stages_share(exported, tmp_path):
    """Files one NPU's rounds cannot time: one line where stages share links, and they run alone.

    A synthesized Ring(4) file, whose NPUs send differently round by round; and the exported
    direct, whose data moves one message a round where its threadblocks send at once: its
    rounds alone take two more latencies of the Switch (2 x 2 hops x 500 ns) than its programs.
    """
    with pytest.raises(UsageError, match="its rounds alone take") as refused:
        row(SHARED_PORT, "all_reduce", "fair", 1, "baseline", exported["direct"])
    rounds_us, programs_us = (float(x) for x in re.findall(r"([0-9.]+) us", str(refused.value)))
    assert rounds_us - programs_us == pytest.approx(2 * 2 * 0.5)
    assert len(str(refused.value).splitlines()) == 1
    assert row(SWITCH, "all_reduce", "fair", 1, "baseline", exported["direct"]).time_us > 0
    paths = []
    for op in ("reduce_scatter", "all_gather"):
        paths.append(tmp_path / f"syn_{op}.xml")
        proc = local(["synthesize", op, "-t", "Ring(4,100,500)", "-b", "1M", "--out", str(paths[-1])])
        assert proc.returncode == 0, proc.stderr
    spec = "msccl:" + "+".join(map(str, paths))
    base = [
        "model",
        "-t",
        "Ring(4,100,500)_SW(2,50,1000)",
        "-b",
        "1M",
        "-c",
        "4",
        "--algorithm",
        f"{spec},direct",
    ]
    proc = local([*base, "--network", "fair", "--active-chunks-per-dim", "2"])
    assert proc.returncode == 2 and "not rotation-symmetric" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert local([*base, "--network", "fair"]).returncode == 0


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
