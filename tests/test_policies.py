"""Rules of the policies: the reference numbers of docs/design.md#reference-numbers, ASTRA-sim 1.0's rules, the registry and ours."""

import pytest

from themis_mpi.collectives import AG, PRICED_ITEMSIZE, RS, Collective, Stage, priced_words
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.policies import (
    InterPolicy,
    PolicyError,
    QueueView,
    ThemisTracker,
    chunk_orders,
    inter_class,
    inter_names,
    intra_names,
    make_inter,
    make_intra,
    policy_context,
)
from themis_mpi.run.collective import model_collective
from themis_mpi.run.sweep import policy_configs
from themis_mpi.topology import parse_topology

HETERO = parse_topology("3D-SW_SW_SW_hetero")
MIB64 = 64 * 2**20


def test_themis_loads_and_fallbacks_match_reference():
    """64 MiB, 64 chunks on 3D-SW_SW_SW_hetero: loads ~36.3/37.0/36.5 MiB, 2 baseline chunks."""
    tracker = ThemisTracker(HETERO, (0, 1, 2))
    for _ in range(64):
        tracker.next_order("all_reduce", MIB64 // 64)
    assert tracker.loads == pytest.approx([36.3, 37.0, 36.5], abs=0.05)
    assert tracker.fallbacks == 2


def test_themis_first_chunk_orders_match_reference():
    """The first three chunk orders are (0,1,2), (2,1,0), (1,0,2)."""
    orders = chunk_orders("themis", HETERO, "all_reduce", MIB64, 64, (0, 1, 2))
    assert [tuple(o) for o in orders[:3]] == [(0, 1, 2), (2, 1, 0), (1, 0, 2)]


def test_baseline_loads_match_reference():
    """Baseline order every chunk: loads 60 / 7 / 1.75 MiB at 200 GB/s."""
    tracker = ThemisTracker(HETERO, (0, 1, 2))
    tracker._sorted = [0, 1, 2]
    m = MIB64 // 64
    loads = [0.0, 0.0, 0.0]
    for _ in range(64):
        size = m
        for d in range(3):
            p = HETERO.dims[d].npus
            loads[d] += size / 2**20 * (p - 1) / p / (HETERO.dims[d].bandwidth_gbps / 200)
            size //= p
    assert loads == pytest.approx([60, 7, 1.75])
    assert all(
        tuple(o) == (0, 1, 2) for o in chunk_orders("baseline", HETERO, "all_reduce", MIB64, 64, (0, 1, 2))
    )


@pytest.mark.parametrize(
    "op,order",
    [
        ("all_reduce", (0, 1, 2)),
        ("reduce_scatter", (0, 1, 2)),
        ("all_gather", (2, 1, 0)),
        ("all_to_all", (0, 1, 2)),
    ],
)
def test_baseline_order_per_op(op, order):
    """Baseline: ascending dims, a standalone all-gather descending."""
    assert tuple(chunk_orders("baseline", HETERO, op, MIB64, 4, (0, 1, 2))[0]) == order


def test_all_to_all_is_never_reordered():
    """Themis leaves all-to-all in the baseline order."""
    orders = chunk_orders("themis", HETERO, "all_to_all", MIB64, 16, (0, 1, 2))
    assert all(tuple(o) == (0, 1, 2) for o in orders)


@pytest.mark.parametrize("name", ["3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"])
def test_themis_orders_are_permutations(name):
    """Every chunk order is a permutation of the dims."""
    topo = parse_topology(name)
    orders = chunk_orders("themis", topo, "all_reduce", 2**30, 64, tuple(range(len(topo.dims))))
    assert all(sorted(o) == list(range(len(topo.dims))) for o in orders.tolist())


def test_themis_balances_loads_better_than_baseline():
    """Themis's max/min load ratio is far below the baseline's 60/1.75."""
    tracker = ThemisTracker(HETERO, (0, 1, 2))
    for _ in range(64):
        tracker.next_order("all_reduce", MIB64 // 64)
    assert max(tracker.loads) / min(tracker.loads) < 1.05


# --- the platform: registry, ASTRA-sim 1.0's full set, ours ----------------------------------

CTX = policy_context(HETERO)
AR64 = Collective("all_reduce", MIB64 // 8, "float64", 64, (0, 1, 2))


def test_registry_lists_astra_sims_set_and_ours():
    """At least 6 inter-dim and 4 intra-dim policies, ASTRA-sim 1.0's names among them."""
    assert {"baseline", "themis", "themisFlex", "roundRobin", "themis-lat", "predictive"} <= set(
        inter_names()
    )
    assert {"fifo", "scf", "rg", "lrpf"} <= set(intra_names())
    assert all(inter_class(n).description for n in inter_names())


def test_unknown_names_are_one_usage_error_line():
    """An unknown inter- or intra-dim name is a UsageError that lists the choices, wherever it is met."""
    with pytest.raises(UsageError, match="unknown policy 'greedy'.*baseline"):
        make_inter("greedy")
    with pytest.raises(UsageError, match="unknown intra-dim policy 'lifo'.*fifo"):
        policy_configs("baseline", ["lifo"], RunConfig())
    with pytest.raises(UsageError, match="unknown intra-dim policy 'lifo'.*fifo"):
        model_collective(parse_topology("2x2x2"), AR64, "baseline", RunConfig(intra="lifo"))


def test_baseline_and_round_robin_fuse_the_last_dim_and_themis_does_not():
    """ASTRA-sim's localBWAware all-reduce (baseline, roundRobin) ends in one AR stage; Themis splits it."""
    assert inter_class("baseline").fuses_last_dim and inter_class("roundRobin").fuses_last_dim
    assert not inter_class("themis").fuses_last_dim and not inter_class("themisFlex").fuses_last_dim


def test_round_robin_rotates_per_chunk_and_keeps_its_counter_across_collectives():
    """Chunk k starts on dim (k mod n); the next collective goes on where the last one stopped."""
    policy = make_inter("roundRobin")
    first = policy.schedule(CTX, Collective("all_reduce", 1000, "float64", 4, (0, 1, 2)))
    second = policy.schedule(CTX, Collective("all_reduce", 1000, "float64", 2, (0, 1, 2)))
    assert [list(o) for o in first.orders] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert [list(o) for o in second.orders] == [[1, 2, 0], [2, 0, 1]]


def test_round_robin_rotates_the_descending_order_of_an_all_gather():
    """A standalone all-gather rotates ASTRA-sim's reversed dim list."""
    orders = (
        make_inter("roundRobin").schedule(CTX, Collective("all_gather", 1000, "float64", 2, (0, 1, 2))).orders
    )
    assert [list(o) for o in orders] == [[2, 1, 0], [1, 0, 2]]


def test_themis_flex_keeps_nominal_chunks_until_the_gap_exceeds_one_then_fills_it():
    """64 MiB on 3D-SW_SW_SW_hetero: 4 nominal baseline chunks, then chunk 4 fills dim 2 up to dim 0's load.

    themisFlex sizes its chunks in priced words (`collectives.PRICED_ITEMSIZE`), whatever the dtype.
    """
    policy = make_inter("themisFlex")
    s = policy.schedule(CTX, AR64)
    nominal = priced_words(AR64) // 64
    assert [s.chunk_elems(k) for k in range(4)] == [nominal] * 4
    assert all(list(o) == [0, 1, 2] for o in s.orders[:4])
    assert list(s.orders[4]) == [2, 1, 0] and s.chunk_elems(4) > nominal
    assert s.bounds[0] == 0 and s.bounds[-1] == priced_words(AR64) and s.n_chunks < 64


def test_themis_flex_chunk_closes_the_gap_in_closed_form():
    """Chunk 4's bytes = (load0 - load2) * (B2/B0) / ((P2-1)/P2) MiB after 4 baseline chunks."""
    m = 2**20
    load0 = 4 * m / 2**20 * 15 / 16
    load2 = 4 * (m / 16 / 8) / 2**20 * 7 / 8 / 0.25
    want_bytes = (load0 - load2) * 0.25 / (7 / 8) * 2**20
    s = make_inter("themisFlex").schedule(CTX, AR64)
    assert s.chunk_elems(4) == int(want_bytes) // PRICED_ITEMSIZE


def test_variable_chunks_run_on_the_engine_with_the_bounds_given():
    """The model runs themisFlex's chunks at their own sizes: every byte is sent once per dim stage."""
    row, engine = model_collective(HETERO, AR64, "themisFlex", RunConfig(intra="scf"))
    run = engine.collectives[0]
    assert row.chunks == len(run.bounds) - 1 < 64
    firsts = [r.stage for r in engine.records if r.stage.index == 0]
    assert sum(s.full_elems * s.itemsize for s in firsts) == AR64.size_bytes


def _stage(coll, chunk, index, n, op, key=8):
    return Stage(coll, chunk, index, n, 0, op, key, key, 1)


def test_rg_never_cuts_between_a_waiting_rs_ag_pair():
    """RG: behind [RS, AG] the new stage goes after the pair, never between them."""
    rg = make_intra("rg")
    waiting = [_stage(0, 0, 1, 4, RS), _stage(0, 1, 2, 4, AG), _stage(0, 2, 2, 4, AG)]
    assert rg.position(QueueView(waiting, 0), _stage(0, 3, 0, 4, RS)) == 0
    pair = [_stage(0, 0, 1, 4, AG), _stage(0, 1, 0, 4, RS), _stage(0, 2, 1, 4, RS)]
    assert rg.position(QueueView(pair, 1), _stage(0, 3, 0, 4, RS)) == 2


def test_rg_keeps_the_stage_behind_a_running_one():
    """RG: while the dim runs a stage, the first waiting stage keeps its place."""
    waiting = [_stage(0, 0, 1, 4, RS), _stage(0, 1, 1, 4, RS)]
    assert make_intra("rg").position(QueueView(waiting, 1), _stage(0, 2, 0, 4, RS)) == 1
    assert make_intra("rg").position(QueueView(waiting, 0), _stage(0, 2, 0, 4, RS)) == 0


def test_lrpf_serves_fewer_remaining_phases_first_and_ties_new_first():
    """LRPF: ahead of the first waiting stage with as many or more phases left."""
    waiting = [_stage(0, 0, 5, 6, AG), _stage(0, 1, 3, 6, AG), _stage(0, 2, 1, 6, RS)]
    lrpf = make_intra("lrpf")
    assert lrpf.position(QueueView(waiting, 0), _stage(0, 3, 3, 6, RS)) == 1
    assert lrpf.position(QueueView(waiting, 0), _stage(0, 3, 0, 6, RS)) == 3
    assert lrpf.position(QueueView(waiting, 0), _stage(0, 3, 5, 6, RS)) == 0


def test_scf_sends_the_second_to_last_stage_to_the_tail():
    """SCF: smaller keys first, except a chunk's second-to-last stage."""
    waiting = [_stage(0, 0, 1, 4, RS, 4), _stage(0, 1, 0, 4, RS, 16)]
    scf = make_intra("scf")
    assert scf.position(QueueView(waiting, 0), _stage(0, 2, 1, 4, RS, 8)) == 1
    assert scf.position(QueueView(waiting, 0), _stage(0, 2, 2, 4, AG, 1)) == 2


def test_themis_lat_keeps_small_chunks_off_the_high_latency_dim():
    """64 MiB in 64 chunks with the paper's latencies: Themis starts 9 chunks on the 1700 ns dim, themis-lat none."""
    themis = make_inter("themis").schedule(CTX, AR64).orders
    lat = make_inter("themis-lat").schedule(CTX, AR64).orders
    assert sum(int(o[0]) == 2 for o in themis) == 9
    assert sum(int(o[0]) == 2 for o in lat) == 0


def test_themis_lat_beats_themis_where_latency_matters():
    """On the model, 64 MiB / 64 chunks with latency: themis-lat is faster than Themis."""
    t_themis = model_collective(HETERO, AR64, "themis", RunConfig(intra="scf"))[0].time_us
    t_lat = model_collective(HETERO, AR64, "themis-lat", RunConfig(intra="scf"))[0].time_us
    assert t_lat < t_themis


@pytest.mark.parametrize("size", [2**20, 2**26, 2**30])
@pytest.mark.parametrize("chunks", [2, 64])
def test_predictive_is_never_slower_than_baseline_or_themis(size, chunks):
    """Predictive's model time <= baseline (FIFO) and Themis (SCF) at the same chunk count."""
    coll = Collective("all_reduce", size // 8, "float64", chunks, (0, 1, 2))
    base = model_collective(HETERO, coll, "baseline", RunConfig(intra="fifo"))[0]
    them = model_collective(HETERO, coll, "themis", RunConfig(intra="scf"))[0]
    pred = model_collective(HETERO, coll, "predictive", RunConfig(intra="scf"))[0]
    assert pred.time_us <= min(base.time_us, them.time_us)
    assert pred.decision_s > 0 and pred.schedule.count("/") == 2


def test_every_result_reports_the_per_dim_bound_of_its_schedule():
    """dim_bound_us = max_d(bytes_d / B_d) of the schedule that ran, between the ideal and the time."""
    row = model_collective(HETERO, AR64, "baseline", RunConfig(intra="fifo"))[0]
    want = max(d.bytes / HETERO.dims[d.dim].bandwidth_bytes_per_ns for d in row.dims) / 1e3
    assert row.dim_bound_us == pytest.approx(want) and row.ideal_us <= row.dim_bound_us <= row.time_us


def test_best_found_is_at_least_as_good_as_predictive():
    """The local search starts from predictive's choice and only keeps improvements."""
    from themis_mpi.policies.predictive import best_found, fastest
    from themis_mpi.run.coordinator import model_oracle

    config = RunConfig(intra="scf")
    ctx = policy_context(HETERO, config)
    ctx.evaluate_collective = model_oracle(HETERO, config)
    coll = Collective("all_reduce", 2**24 // 8, "float64", 8, (0, 1, 2))
    _, pred_us, _ = fastest(ctx, coll)
    _, found_us, evaluations = best_found(ctx, coll, max_evals=40)
    assert found_us <= pred_us and evaluations > 40


def test_best_found_is_bounded_by_evaluations_and_seeded():
    """The search makes exactly max_evals evaluations after its start and gives the same result twice."""
    from themis_mpi.policies.predictive import best_found, fastest
    from themis_mpi.run.coordinator import model_oracle

    config = RunConfig(intra="scf")
    ctx = policy_context(HETERO, config)
    ctx.evaluate_collective = model_oracle(HETERO, config)
    coll = Collective("all_reduce", 2**24 // 8, "float64", 8, (0, 1, 2))
    start, start_us, _ = fastest(ctx, coll)
    runs = [best_found(ctx, coll, max_evals=12, seed=3, start=(start, start_us)) for _ in range(2)]
    assert [r[2] for r in runs] == [12, 12]
    assert runs[0][1] == runs[1][1] and (runs[0][0].orders == runs[1][0].orders).all()


class _NotAPermutation(InterPolicy):
    name = "broken"

    def order(self, chunk):
        return [0, 0, 1]


class _Raises(InterPolicy):
    name = "raiser"

    def order(self, chunk):
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    "policy,fragment",
    [
        (_NotAPermutation(), "policy 'broken'.*not a permutation|policy 'broken'.*permutation"),
        (_Raises(), "policy 'raiser'.*RuntimeError: boom"),
    ],
)
def test_a_policy_that_fails_is_one_line_naming_it(policy, fragment):
    """A policy that raises or returns no permutation becomes one PolicyError line naming it."""
    with pytest.raises(PolicyError, match=fragment) as info:
        model_collective(HETERO, AR64, policy, RunConfig())
    assert "\n" not in str(info.value)
