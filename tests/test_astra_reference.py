"""The model against ASTRA-sim 1.0: every reference row in compat mode, and each mechanism in closed form.

The reference rows come from ASTRA-sim 1.0's own binary (tests/data/astra-sim-reference); the
other tests pin each rule of `cost`, `engine` and `collectives` that makes them agree.
"""

import math

import pytest
from harness import DATA, check_rows, compare_row

from themis_mpi.astra import BUSY_BOUND_PCT, TIME_BOUNDS, reference_rows
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.cost import AG, AR, ASTRA_SIM_1_0, RS, CostModel, reduction_ns
from themis_mpi.results import astra_busy_pct
from themis_mpi.run.collective import model_collective
from themis_mpi.topology import parse_topology

ROWS = reference_rows(str(DATA / "astra-sim-reference" / "allreduce-small.csv"))
GB = 2**30 / 1e9  # bytes per ns of 1 GB/s
ASTRA = RunConfig(endpoint_delay_ns=10, compat=ASTRA_SIM_1_0)


def row_id(row):
    return "{topology}-{policy}-{intra}-{chunks}-{alg_map}-{size_bytes}".format(**row)


def row_outside(row: dict) -> str | None:
    """Why the model's row is outside its bounds: finish time, or ASTRA-style busy % (None: within)."""
    got = compare_row(row)
    bound = TIME_BOUNDS[(row["policy"], row["intra"])]
    if abs(got["time_err"]) <= bound and got["busy_err_pct"] <= BUSY_BOUND_PCT:
        return None
    return (
        f"time {got['time_us']:.3f} us, ASTRA-sim {got['ref_time_us']:.3f} us "
        f"({100 * got['time_err']:+.3f} %, bound {100 * bound:g} %); busy % {got['busy_pct']}, "
        f"ASTRA-sim {got['ref_busy_pct']} ({got['busy_err_pct']:.2f} points, bound {BUSY_BOUND_PCT:g})"
    )


def test_the_reference_has_384_rows():
    """The development set is complete: 8 topologies x 3 policy classes x 4 chunk counts x 2 maps x 2 sizes."""
    assert len(ROWS) == 384
    assert len({(r["policy"], r["intra"]) for r in ROWS}) == 3


@pytest.mark.reference
@pytest.mark.parametrize("topology", sorted({r["topology"] for r in ROWS}))
def test_every_reference_row_is_within_its_bounds(topology):
    """Finish time within 0.5 % (baseline, Themis+SCF) or 3 % (Themis+FIFO); ASTRA-style busy % within 1 point."""
    check_rows([r for r in ROWS if r["topology"] == topology], row_id, row_outside)


def test_a_row_outside_its_bounds_is_reported_with_its_id_and_values():
    """A reference time planted 1 % too low fails the table check with the row's id and both times."""
    row = dict(next(r for r in ROWS if r["policy"] == "baseline"))
    row["time_us"] = f"{float(row['time_us']) * 0.99:.3f}"
    with pytest.raises(AssertionError) as failure:
        check_rows([row], row_id, row_outside)
    lines = str(failure.value).splitlines()
    assert lines[0] == "1 of 1 rows fail:" and lines[1].startswith(f"{row_id(row)}: time ")
    assert f"ASTRA-sim {float(row['time_us']):.3f} us (+1.0" in lines[1] and len(lines) == 2


def fc_ring_sw(algorithms):
    return parse_topology("3D-FC_Ring_SW").with_overrides(algorithms=algorithms)


@pytest.mark.parametrize("compat", ["", ASTRA_SIM_1_0])
def test_ring_on_a_fully_connected_dim_moves_each_message_at_b_over_p_minus_1(compat):
    """3D-FC_Ring_SW with ring everywhere: each FC step takes latency + block / (B/(P-1)) under ASTRA-sim 1.0.

    Outside the compat the ring runs both ways round (`cost.ring_both_ways`): half of the block
    over each of the two neighbour links of B/(P-1) at once, so the step's transfer is halved.
    """
    topo = fc_ring_sw(["ring"] * 3)
    elems = (64 << 20) // 4
    block = (64 << 20) // 8
    link = 175 * GB / 7  # 8 NPUs: 7 links of B/7
    if compat:
        cost = CostModel(topo, 4, 10, compat)
        step = math.floor(700 + block / link) + 10
        assert cost.stage_end_ns(0, RS, elems, 0.0) == 10 + 7 * (step + reduction_ns(block))
        assert cost.stage_end_ns(0, AG, elems, 0.0) == 10 + 7 * step
    else:
        cost = CostModel(topo, 4, 10)
        assert cost.step_times_ns(0, RS, elems) == pytest.approx(
            (700 + block / 2 / link + 10,) * 7, rel=1e-12
        )
    # the Ring dim keeps its full bandwidth per message
    assert CostModel(topo, 4).step_times_ns(1, AG, elems)[0] == pytest.approx(
        700 + elems * 4 / 16 / (100 * GB)
    )


def test_direct_on_a_fully_connected_dim_drives_every_link_and_reaches_b():
    """Direct sends to the P-1 peers at once, one link each: the step moves (P-1) blocks at B."""
    topo = fc_ring_sw(["direct", "ring", "halving_doubling"])
    block = (64 << 20) // 8
    assert CostModel(topo, 4).step_times_ns(0, RS, (64 << 20) // 4) == pytest.approx(
        (700 + 7 * block / (175 * GB),)
    )


def test_themis_load_tracker_keeps_the_full_bandwidth_of_a_fully_connected_dim():
    """Themis's chunk orders are the same whatever the per-link model (the tracker uses B)."""
    topo = fc_ring_sw(["ring"] * 3)
    coll = Collective("all_reduce", (256 << 20) // 4, "float32", 16, (0, 1, 2))
    _, a = model_collective(topo, coll, "themis", RunConfig(intra="scf"))
    _, b = model_collective(
        topo, coll, "themis", RunConfig(intra="scf", endpoint_delay_ns=10, compat=ASTRA_SIM_1_0)
    )
    assert (a.collectives[0].orders == b.collectives[0].orders).all()


@pytest.mark.parametrize("compat", ["", ASTRA_SIM_1_0])
def test_chunk_zero_starts_first_under_scf(compat):
    """Chunks are issued one by one: chunk 0 takes its idle first dim before chunk 1 is queued."""
    topo = parse_topology("SW(4,200,700)_SW(4,100,700)_SW(4,50,1700)")
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 16, (0, 1, 2))
    _, engine = model_collective(topo, coll, "themis", RunConfig(intra="scf", compat=compat))
    first = sorted((r.start_ns, r.start_seq, r.stage.chunk) for r in engine.records)[0]
    assert first[2] == 0


def test_the_baseline_runs_its_last_dim_as_one_all_reduce_stage():
    """Baseline: RS on dims 0..n-2, one AR stage on the last dim, AG back; Themis keeps RS + AG."""
    topo = parse_topology("SW(4,200,700)_SW(4,100,700)_SW(4,50,1700)")
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 4, (0, 1, 2))
    _, engine = model_collective(topo, coll, "baseline", ASTRA)
    for stages in engine.collectives[0].stages:
        assert [(s.dim, s.op) for s in stages] == [(0, RS), (1, RS), (2, AR), (1, AG), (0, AG)]
    cost = CostModel(topo, 4, 10, ASTRA_SIM_1_0)
    full = (64 << 20) // 4 // 4 // 16
    # one stage start (one endpoint delay) for both halves
    assert cost.stage_end_ns(2, AR, full, 0.0) == (
        cost.stage_end_ns(2, RS, full, 0.0) + cost.stage_end_ns(2, AG, full, 0.0) - 10
    )
    _, themis = model_collective(topo, coll, "themis", RunConfig(intra="scf"))
    assert all(len(s) == 6 for s in themis.collectives[0].stages)


def test_each_received_reduce_scatter_message_is_reduced_locally():
    """Ring RS: every received message costs 3 floor(B/500000) ns; HD RS: all but the last, on the next size."""
    full_bytes = 32 << 20
    bw = 100 * GB
    m = full_bytes // 4
    ring = CostModel(parse_topology("SW(4,100,700,ring)"), 4, 10, ASTRA_SIM_1_0)
    assert ring.stage_end_ns(0, RS, full_bytes // 4, 0.0) == 10 + 3 * (
        math.floor(1400 + m / bw) + 10 + 3 * (m // 500000)
    )
    assert ring.stage_end_ns(0, AG, full_bytes // 4, 0.0) == 10 + 3 * (math.floor(1400 + m / bw) + 10)
    hd = CostModel(parse_topology("SW(4,100,700,hd)"), 4, 10, ASTRA_SIM_1_0)
    want = 10 + (math.floor(1400 + full_bytes / 2 / bw) + 10 + reduction_ns(full_bytes // 4))
    want += math.floor(1400 + full_bytes / 4 / bw) + 10
    assert hd.stage_end_ns(0, RS, full_bytes // 4, 0.0) == want
    assert reduction_ns(499999) == 0 and reduction_ns(1000000) == 6


def test_simultaneous_completions_follow_astra_sims_event_order():
    """Stages ending at the same instant are taken in registration order of their last events, then start order."""
    topo = parse_topology("SW(2,200,0)_SW(2,100,0)_SW(2,50,0)")
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 16, (0, 1, 2))
    _, engine = model_collective(
        topo, coll, "themis", RunConfig(intra="fifo", endpoint_delay_ns=10, compat=ASTRA_SIM_1_0)
    )
    cost = CostModel(topo, 4, 10, ASTRA_SIM_1_0)
    by_end: dict[float, list] = {}
    for r in engine.records:  # records are appended in processing order
        by_end.setdefault(r.end_ns, []).append(r)
    ties = [rs for rs in by_end.values() if len(rs) > 1]
    assert ties, "this configuration has simultaneous completions"
    for rs in ties:
        keys = [
            (cost.finish_order_key(r.stage.dim, r.stage.op, r.stage.full_elems, r.end_ns), r.start_seq)
            for r in rs
        ]
        assert keys == sorted(keys)


def test_astra_busy_pct_counts_queued_time_over_complete_windows():
    """A dim is busy from queueing to end; only complete 10 us windows count."""

    class Run:
        def __init__(self, dim, queued, start, end):
            self.stage = type("S", (), {"dim": dim})
            self.queued_ns, self.start_ns, self.end_ns = queued, start, end

    runs = [Run(0, 0, 0, 5000), Run(0, 0, 5000, 15000), Run(1, 0, 12000, 16000)]
    assert astra_busy_pct(runs, 2, 25000) == [75.0, 80.0]  # windows [0, 10 us) and [10, 20 us)
    assert astra_busy_pct(runs, 2, 25000, since="start") == [75.0, 20.0]
