"""The model against ASTRA-sim 2.x's congestion-aware backend on several dims, and the rule it needed.

The rows (tests/data/astra-sim-reference-2/runs-multidim.csv, 432 runs at 64 MiB) come from an
unmerged multi-dim branch of 2.x's network backend; the README there says how they were made and
why an all-reduce's all-gather stages run anticlockwise (`timing.routes.astra2_anticlockwise`).
"""

import math

import pytest
from harness import DATA, compare_row_2, compare_rows_at_once, run_specs

from themis_mpi.api import sweep
from themis_mpi.astra import RUNS_2_MULTIDIM, reference_rows_2, topology_of_2
from themis_mpi.collectives import AR_EVERY_DIM, ChunkStages, Collective, chunk_plan
from themis_mpi.config import RunConfig
from themis_mpi.cost import AG, AR, ASTRA_SIM_2, RS, link_bytes_per_ns
from themis_mpi.engine import Engine
from themis_mpi.model import ModelTransport
from themis_mpi.policies.base import baseline_order, fixed_schedule
from themis_mpi.timing import symmetric, world
from themis_mpi.timing.routes import astra2_anticlockwise, uneven_dims
from themis_mpi.timing.rules import STORE_FORWARD
from themis_mpi.timing.world import World
from themis_mpi.topology import parse_topology

REF = DATA / "astra-sim-reference-2"
NETWORKS = str(REF / "network")
ROWS = reference_rows_2(str(REF / RUNS_2_MULTIDIM))


def every_npu_row(row: dict) -> bool:
    """Whether the row runs every NPU (halving-doubling on a Ring of 4): 64 engines, the costly rows."""
    return bool(uneven_dims(topology_of_2(row, NETWORKS)))


# One NPU's view, and the every-NPU rows with 1 or 4 splits (408 rows): 2 s of the 10-20 s of all 432.
QUICK = [r for r in ROWS if not every_npu_row(r) or int(r["splits"]) <= 4]


def rows_off(rows: list[dict]) -> list[str]:
    """Every row whose finish or collective end differs from the branch's, one line each, by run id."""
    compare_rows_at_once(rows, NETWORKS)  # (two at a time: the every-NPU rows are costly)
    off = []
    for row in rows:
        got = compare_row_2(row, NETWORKS)
        if got["err_ns"]:
            off.append(
                f"{row['run_id']} {row['topology']} {row['collective_optimization']} "
                f"{row['scheduling_policy']} {row['implementation']} active {row['active_chunks_per_dim']} "
                f"splits {row['splits']}: model {got['finish_ns']} ns, ASTRA-sim {got['ref_finish_ns']} ns "
                f"({100 * got['time_err']:+.3f} %)"
            )
    return off


def test_the_multidim_table_is_the_branchs_64_mib_grid():
    """432 distinct runs: 3 networks x LIFO/FIFO x 2 optimizations x 3 algorithms x 1/2/4 active x 4 splits."""
    assert {(r["backend"], r["binary_variant"], r["collectives"], r["size_bytes"]) for r in ROWS} == {
        ("congestion_aware", "multidim_branch", "ALL_REDUCE", str(64 << 20))
    }
    keys = ("topology", "scheduling_policy", "collective_optimization", "implementation")
    keys += ("active_chunks_per_dim", "splits")
    grid = {tuple(r[k] for k in keys) for r in ROWS}
    assert len(grid) == len(ROWS) == 3 * 2 * 2 * 3 * 3 * 4
    assert 0 < len(QUICK) < len(ROWS)


@pytest.mark.reference
def test_the_quick_multidim_rows_are_exact_to_the_ns():
    """Every row but the every-NPU ones with 16 or 64 splits: finish and end equal the branch's."""
    off = rows_off(QUICK)
    assert not off, f"{len(off)} of {len(QUICK)} rows off:\n" + "\n".join(off)


@pytest.mark.reference
@pytest.mark.slow
def test_every_multidim_row_is_exact_to_the_ns():
    """All 432 rows (10-12 s of CPU, most of it the every-NPU rows): finish and end equal the branch's."""
    off = rows_off(ROWS)
    assert not off, f"{len(off)} of {len(ROWS)} rows off:\n" + "\n".join(off)


def test_only_an_all_reduces_all_gather_stages_run_anticlockwise():
    """localBWAware: RS and the last dim's AR clockwise, AG anticlockwise; a lone AG and 2.x's baseline clockwise."""
    topo = parse_topology("Ring(4,400,500)_FC(4,300,700)_SW(4,50,1700)")

    def directions(op: str, fuse_last: int) -> list[tuple[int, str, bool]]:
        coll = Collective(op, 4096, "float32", 1, (0, 1, 2))
        plan = chunk_plan(topo, coll, 4096, baseline_order(op, 3), fuse_last)
        return [(s.dim, s.op, astra2_anticlockwise(s)) for s in ChunkStages.of(plan, 0, 0, 4)]

    assert directions("all_reduce", True) == [
        (0, RS, False),
        (1, RS, False),
        (2, AR, False),
        (1, AG, True),
        (0, AG, True),
    ]
    assert directions("all_reduce", AR_EVERY_DIM) == [(0, AR, False), (1, AR, False), (2, AR, False)]
    assert directions("all_gather", False) == [(2, AG, False), (1, AG, False), (0, AG, False)]


@pytest.mark.parametrize(("size_bytes", "latency_ns"), [(64 << 20, 500), (64 << 20, 0), (1 << 20, 5000)])
def test_a_direct_step_on_a_ring_of_4_ends_min_latency_serialization_earlier_anticlockwise(
    size_bytes, latency_ns
):
    """Ring(4), direct, one chunk: the AG stage (anticlockwise) ends min(L, s) before the RS stage.

    A direct step sends m bytes to the NPUs 1, 2 and 3 ahead; the one 2 ahead is a tie, routed
    clockwise in 2 hops. Each link takes a message for s = trunc(m / B) and delivers it a =
    trunc(L + m / B) = L + s later. Clockwise (RS) the 2-hop message leaves second, at s, and
    arrives at s + 2a. Anticlockwise (AG: 3, 2, 1 ahead) it leaves first and reaches the next NPU
    at a, whose own clockwise link is busy until 2s: it arrives at max(2s, a) + a. The stages
    move the same bytes, so they differ by s + a - max(2s, a) = min(L, s).
    """
    topo = parse_topology(f"Ring(4,400,{latency_ns},direct)_SW(2,50,700,direct)")
    config = RunConfig(endpoint_delay_ns=10, compat=ASTRA_SIM_2, network=STORE_FORWARD)
    coll = Collective("all_reduce", size_bytes // 4, "float32", 1, (0, 1))
    engine = Engine(topo, ModelTransport(topo, config), config)
    engine.issue(coll, fixed_schedule(coll, [baseline_order("all_reduce", 2)], True, "fifo"))
    engine.run()
    took = {r.stage.op: r.end_ns - r.start_ns for r in engine.collectives[0].runs if r.stage.dim == 0}
    s = math.floor(size_bytes / 4 / link_bytes_per_ns(topo.dims[0]))
    assert took[RS] - took[AG] == min(latency_ns, s)


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_every_npus_links_apply_the_rule_as_one_npus_view(algorithm):
    """R_FC_SW_4x4x4, 4 chunks, 2 active: `timing.world.World` (every NPU's links) gives NPU 0 the one-NPU view's stage times.

    The rule changes these rows (a ring AG stage leaves on the other links than the RS stage of
    its dim beside it), so both paths must apply it alike for emulator == model to hold there.
    """
    row = next(
        r
        for r in ROWS
        if r["topology"] == "R_FC_SW_4x4x4"
        and r["collective_optimization"] == "localBWAware"
        and r["implementation"] == algorithm
        and r["active_chunks_per_dim"] == "2"
        and r["splits"] == "4"
    )
    topo = topology_of_2(row, NETWORKS)
    config = RunConfig(active_per_dim=2, endpoint_delay_ns=10, compat=ASTRA_SIM_2, network=STORE_FORWARD)
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 4, (0, 1, 2))
    schedule = fixed_schedule(coll, [baseline_order("all_reduce", 3)] * 4, True, "fifo")

    def play(transport):
        engine = Engine(topo, transport, config)
        engine.issue(coll, schedule)
        engine.run()
        return engine

    def times(engine):
        return sorted(
            (r.stage.chunk, r.stage.index, r.start_ns, r.end_ns) for r in engine.collectives[0].runs
        )

    one = play(ModelTransport(topo, config))
    every = World(topo, config).run(play)
    assert times(every[0]) == times(one)
    assert max(e.collectives[0].end_ns for e in every) == one.collectives[0].end_ns == int(row["finish_ns"])


RULE_TOPOLOGIES = ["Ring(4,100,500,ring)_SW(2,400,700,ring)", "Ring(4,400,500,direct)_SW(2,50,700,ring)"]


def rule_cases() -> list[dict]:
    """The baseline (localBWAware) and Themis, 4 chunks, 2 active, under 2.x's compat and link rule."""
    base = {
        "op": "all_reduce",
        "count": 1 << 18,
        "dtype": "float32",
        "chunks": 4,
        "active": 2,
        "endpoint_delay_ns": 10.0,
        "compat": ASTRA_SIM_2,
        "network": STORE_FORWARD,
    }
    return [{**base, "policy": "baseline", "intra": "fifo"}, {**base, "policy": "themis", "intra": "scf"}]


@pytest.fixture(scope="module")
def rule_jobs(tmp_path_factory):
    """Both topologies' emulator runs in one mpiexec of 8 ranks (`harness.run_specs`)."""
    specs = {t: (8, t, rule_cases()) for t in RULE_TOPOLOGIES}
    return run_specs(specs, tmp_path_factory.mktemp("mpi"))


@pytest.mark.parametrize("topology", RULE_TOPOLOGIES)
def test_emulator_equals_model_where_the_rule_applies_on_8_ranks(rule_jobs, monkeypatch, topology):
    """A Ring of 4 beside a Switch, 4 chunks, 2 active, localBWAware and Themis: the same times on 8 ranks.

    Both cases are ones the rule changes (checked first on the model with it switched off).
    """
    cases = rule_cases()

    def model_us() -> list[float]:
        return [
            sweep(topology, 1 << 20, c["policy"], 4, dtype="float32", active_per_dim=2, endpoint_delay_ns=10.0,
                  compat=ASTRA_SIM_2, network=STORE_FORWARD)[0].time_us
            for c in cases
        ]  # fmt: skip

    with_rule = model_us()
    with monkeypatch.context() as m:
        for module in (symmetric, world):  # (where the one-NPU view and every NPU's links ask it)
            m.setattr(module, "astra2_anticlockwise", lambda stage: False)
        assert all(a != b for a, b in zip(model_us(), with_rule))
    rows = rule_jobs[topology]
    assert [r["model"]["time_us"] for r in rows] == with_rule
    for r in rows:
        assert r["emu"]["wrong"] == 0, r["case"]
        assert r["emu"]["time_us"] == r["model"]["time_us"], r["case"]
