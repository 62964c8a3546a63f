"""The model against ASTRA-sim 2.x: every development row under ``--compat astra-sim-2``, and its rules.

The rows come from ASTRA-sim 2.x's own binary with both analytical backends
(tests/data/astra-sim-reference-2, its README lists the rules found in the source); the other
tests pin each rule of `cost`, `network.Astra2Network`, `npunet` and `engine` that makes them agree.
"""

import math

import pytest
from harness import DATA, check_rows, compare_row_2, compare_rows_at_once, in_process, run_specs

from themis_mpi.astra import reference_rows_2, topology_of_2
from themis_mpi.collectives import AR_EVERY_DIM, Collective, chunk_plan
from themis_mpi.config import RunConfig
from themis_mpi.cost import AR, ASTRA_SIM_2, CostModel
from themis_mpi.engine import Engine
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.policies.base import fixed_schedule
from themis_mpi.topology import from_link_bandwidths, parse_topology

REF = DATA / "astra-sim-reference-2"
NETWORKS = str(REF / "network")
ROWS = reference_rows_2(str(REF / "runs.csv"))
GB = 2**30 / 1e9  # bytes per ns of 1 GB/s


def test_the_development_set_has_2752_rows():
    """The 2.x development set is complete: 2,592 single all-reduces and 160 in the other sections."""
    assert len(ROWS) == 2752
    assert sum(r["section"] == "1_allreduce_grid" for r in ROWS) == 2592


SECTIONS = sorted({r["section"] for r in ROWS})


def row_differs(row: dict, networks: str = NETWORKS) -> str | None:
    """Why the model's finish or a collective's end differs from the row's, to the ns (None: equal)."""
    got = compare_row_2(row, networks)
    if got["finish_ns"] == got["ref_finish_ns"] and got["ends_ns"] == got["ref_ends_ns"]:
        return None
    setup = " ".join(
        f"{k}={got[k]}" for k in ("topology", "backend", "variant", "implementation", "active", "splits")
    )
    return (
        f"finish {got['finish_ns']} ns, ASTRA-sim {got['ref_finish_ns']} ns; "
        f"ends {got['ends_ns']}, ASTRA-sim {got['ref_ends_ns']} ({setup})"
    )


@pytest.mark.reference
@pytest.mark.parametrize("section", SECTIONS)
def test_every_reference_row_is_exact_to_the_ns(section):
    """Finish time and every collective's end (node0_end_ns, node1_end_ns) equal ASTRA-sim 2.x's, row by row."""
    rows = [r for r in ROWS if r["section"] == section]
    check_rows(rows, lambda r: r["run_id"], row_differs, lambda rows: compare_rows_at_once(rows, NETWORKS))


def test_a_wrong_row_is_reported_with_its_id_and_values():
    """A planted error in two rows fails the table check with both ids and their values, and only them."""
    rows = [dict(r) for r in ROWS if r["section"] == "2_allreduce_then_dependent_allreduce"][:3]
    rows[0]["finish_ns"] = str(int(rows[0]["finish_ns"]) + 1)
    rows[2]["node1_end_ns"] = "7"
    with pytest.raises(AssertionError) as failure:
        check_rows(rows, lambda r: r["run_id"], row_differs)
    lines = str(failure.value).splitlines()
    assert lines[0] == "2 of 3 rows fail:"
    assert lines[1].startswith(
        f"{rows[0]['run_id']}: finish {int(rows[0]['finish_ns']) - 1} ns, ASTRA-sim {rows[0]['finish_ns']} ns"
    )
    assert lines[2].startswith(f"{rows[2]['run_id']}: finish ") and ", 7]" in lines[2] and len(lines) == 3


def test_the_readmes_ring_example_in_closed_form():
    """Ring8, 64 MiB, ring, 1 chunk: 14 trunc(500 + 8 MiB / 50 GB/s) + 15 endpoint delays = 2,194,650 ns."""
    topo = from_link_bandwidths(parse_topology(f"{NETWORKS}/net_Ring8.yml")).with_overrides(
        algorithms=["ring"]
    )
    cost = CostModel(topo, 4, 10, ASTRA_SIM_2)
    end = cost.stage_end_ns(0, AR, (64 << 20) // 4, 0.0)
    assert end == 14 * math.floor(500 + (8 << 20) / (50 * GB)) + 150 == 2194650


def test_yaml_bandwidth_is_per_link_and_direction():
    """FC8's 50 GB/s per link is 350 GB/s per NPU, a Ring's 50 each way 100, a Switch's 50 stays 50."""
    bw = [
        from_link_bandwidths(parse_topology(f"{NETWORKS}/net_{n}.yml")).dims[0].bandwidth_gbps
        for n in ("FC8", "Ring8", "SW8")
    ]
    assert bw == [350.0, 100.0, 50.0]


def test_an_uncontended_switch_message_pays_both_links_when_congestion_aware():
    """SW8, ring, 1 chunk: a step is 2 trunc(lat + size/B) aware, trunc(2 lat + size/B) unaware."""
    row = next(r for r in ROWS if r["topology"] == "SW8" and r["implementation"] == "ring")
    topo = topology_of_2(row, NETWORKS)
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 1, (0,))
    block = (8 << 20) / (50 * GB)
    want = {
        "store-forward": 10 + 14 * (2 * math.floor(500 + block) + 10),
        "ideal": 10 + 14 * (math.floor(1000 + block) + 10),
    }
    for network, end in want.items():
        config = RunConfig(endpoint_delay_ns=10, compat=ASTRA_SIM_2, network=network)
        engine = Engine(topo, ModelTransport(topo, config), config)
        engine.issue(coll, fixed_schedule(coll, [[0]], True, "fifo"))
        engine.run()
        assert engine.collectives[0].end_ns == end, network


def test_the_2x_baseline_is_a_full_all_reduce_on_every_dim():
    """astra2-baseline: one AR stage of the whole chunk per dim, ascending; localBWAware shrinks the chunk."""
    topo = parse_topology("SW(4,200,500)_SW(4,100,700)_SW(4,50,1700)")
    coll = Collective("all_reduce", 4096, "float32", 1, (0, 1, 2))
    assert chunk_plan(topo, coll, 4096, [0, 1, 2], AR_EVERY_DIM) == [
        (0, AR, 4096),
        (1, AR, 4096),
        (2, AR, 4096),
    ]
    assert chunk_plan(topo, coll, 4096, [0, 1, 2], True)[2] == (2, AR, 256)


@pytest.mark.parametrize("concurrent", [False, True])
def test_one_collective_in_flight_per_npu_unless_lifted(concurrent):
    """Two collectives issued at 0: the second starts when the first ends, or at 0 with --compat-concurrent."""
    topo = parse_topology("SW(8,50,500,ring)")
    config = RunConfig(endpoint_delay_ns=10, compat=ASTRA_SIM_2, compat_concurrent=concurrent)
    engine = Engine(topo, ModelTransport(topo, config), config)
    coll = Collective("all_reduce", 1 << 18, "float32", 4, (0,))
    for _ in range(2):
        engine.issue(coll, fixed_schedule(coll, [[0]] * 4, True, "fifo"))
    engine.run()
    first, second = engine.collectives
    assert second.issued_ns == (0.0 if concurrent else first.end_ns)


def test_the_compat_refuses_what_it_does_not_have():
    """--network fair under astra-sim-2, and the 2.x switches without it, are refused."""
    with pytest.raises(UsageError):
        RunConfig(compat=ASTRA_SIM_2, network="fair")
    with pytest.raises(UsageError):
        RunConfig(compat_concurrent=True)
    with pytest.raises(UsageError):
        RunConfig(compat="astra-sim-1.0", compat_fifo=True)


def test_bad_compat_flag_is_one_line_and_exit_2():
    """--compat-concurrent without --compat astra-sim-2 exits 2 with one line."""
    proc = in_process(["model", "-t", "SW(8,50,500)", "-b", "1M", "--compat-concurrent"])
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_cli_reads_2x_yaml_as_it_is():
    """themis-mpi model -t net_Ring8.yml --compat astra-sim-2 --network ideal gives the README's 2194.65 us."""
    proc = in_process(
        ["model", "-t", f"{NETWORKS}/net_Ring8.yml", "-b", "64M", "-c", "1", "--algorithm", "ring"]
        + ["-p", "baseline", "--compat", "astra-sim-2", "--network", "ideal"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "2194.65" in proc.stdout


COMPAT_NETWORKS = ["store-forward", "ideal"]
COMPAT_TOPOLOGIES = ("SW(8,50,500,ring)", "Ring(8,100,500,direct)")


def compat_cases(network: str) -> list[dict]:
    """The agreement cases of `network` under astra-sim-2 (`harness.run_specs`)."""
    base = {"dtype": "float32", "endpoint_delay_ns": 10.0, "compat": ASTRA_SIM_2, "network": network}
    return [
        {
            **base,
            "op": "all_reduce",
            "count": 100003,
            "chunks": 7,
            "policy": "baseline",
            "intra": "fifo",
            "active": 2,
        },
        {
            **base,
            "op": "all_reduce",
            "count": 1 << 18,
            "chunks": 16,
            "policy": "astra2-baseline",
            "intra": "fifo",
        },
        {
            **base,
            "op": "all_to_all",
            "count": 1 << 18,
            "chunks": 4,
            "policy": "baseline",
            "intra": "fifo",
            "active": 4,
        },
        {
            **base,
            "op": "all_reduce",
            "count": 1 << 18,
            "chunks": 16,
            "policy": "themis",
            "intra": "scf",
            "active": 2,
        },
    ]


@pytest.fixture(scope="module")
def compat_rows(tmp_path_factory) -> dict:
    """Every network's cases on both topologies in one mpiexec (`harness.run_specs`): rows by (network, topology)."""
    specs = {(n, t): (8, t, compat_cases(n)) for n in COMPAT_NETWORKS for t in COMPAT_TOPOLOGIES}
    return run_specs(specs, tmp_path_factory.mktemp("compat"))


@pytest.mark.parametrize("network", COMPAT_NETWORKS)
def test_emulator_equals_model_under_the_compat_on_8_ranks(compat_rows, network):
    """Both transports give the same times and exact data under astra-sim-2, both backends, 8 ranks."""
    cases = compat_cases(network)
    for topo in COMPAT_TOPOLOGIES:
        rows = compat_rows[(network, topo)]
        assert len(rows) == len(cases)
        for r in rows:
            assert r["emu"]["wrong"] == 0, r["case"]
            assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
