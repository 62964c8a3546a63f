"""Rules of links that concurrent traffic shares (`themis_mpi.timing`): closed forms and physics."""

import json

import pytest
from harness import cli_jobs, in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.cost import CostModels
from themis_mpi.engine import Engine
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.policies import fixed_schedule
from themis_mpi.results import link_results
from themis_mpi.run.collective import model_collective
from themis_mpi.timing.events import EventLoop
from themis_mpi.timing.fair import Fair, max_min_rates
from themis_mpi.timing.links import physical_links
from themis_mpi.topology import Dim, Port, Topology, parse_topology

GIB = 1 << 30
SHARING = ("packet", "fair", "store-forward")


def ring_all_reduce_us(topology: str, size_bytes: int) -> float:
    """One ring all-reduce alone: 2 (P-1)/P S / B, latency 0 (the closed form)."""
    dim = parse_topology(topology).dims[0]
    return 2 * (dim.npus - 1) / dim.npus * size_bytes / dim.bandwidth_bytes_per_ns / 1e3


@pytest.mark.parametrize("active", [1, 2, 4, 8])
def test_concurrent_chunks_share_the_link_so_the_collective_keeps_its_time(active):
    """SW(8,100,0,ring), 1 GiB in 16 chunks: fair takes the one-link time whatever runs at once."""
    topo = parse_topology("SW(8,100,0,ring)")
    coll = Collective("all_reduce", GIB // 4, "float32", 16, (0,))
    fair = model_collective(topo, coll, "baseline", RunConfig(network="fair", active_per_dim=active))[0]
    assert fair.time_us == pytest.approx(17500.0, rel=1e-12)
    assert fair.time_us == pytest.approx(ring_all_reduce_us("SW(8,100,0,ring)", GIB), rel=1e-12)
    assert max(link.busy_pct for link in fair.links) <= 100 * (1 + 1e-9)
    assert fair.dims[0].utilization <= 1 + 1e-9
    forward = model_collective(
        topo, coll, "baseline", RunConfig(network="store-forward", active_per_dim=active)
    )
    assert forward[0].time_us >= 17500.0 * (1 - 1e-12)
    assert max(link.busy_pct for link in forward[0].links) <= 100 * (1 + 1e-9)


def test_without_sharing_four_chunks_overdraw_the_link_four_times():
    """Under ideal (ASTRA-sim 1.0's rule) 4 active chunks take a quarter of the time: 400 % of the link."""
    topo = parse_topology("SW(8,100,0,ring)")
    coll = Collective("all_reduce", GIB // 4, "float32", 16, (0,))
    ideal, engine = model_collective(topo, coll, "baseline", RunConfig(active_per_dim=4, network="ideal"))
    assert ideal.time_us == pytest.approx(4375.0, rel=1e-12) and ideal.links == [] and ideal.beyond_physics
    links = link_results(engine.records, topo, CostModels(topo), ideal.time_us)
    assert max(link.busy_pct for link in links) == pytest.approx(400.0)


def stage_ends(topology: Topology, network: str, collectives, active: int = 1) -> list[float]:
    """Issue collectives (one chunk each, ascending dim order) at t=0 on the model; their stage ends in ns."""
    config = RunConfig(network=network, active_per_dim=active)
    transport = ModelTransport(topology, config)
    engine = Engine(topology, transport, config)
    for coll in collectives:
        engine.issue(coll, fixed_schedule(coll, [sorted(coll.dims)] * coll.n_chunks))
    engine.run()
    return sorted(r.end_ns for r in engine.records)


@pytest.mark.parametrize("kind", ["SW", "Ring", "FC"])
def test_two_equal_stages_on_one_link_end_at_2t_fair_and_t_ideal(kind):
    """Two reduce-scatter stages of T each, on one link at once (latency 0): 2T under fair, T under ideal."""
    topo = parse_topology(f"{kind}(2,100,0)")
    coll = Collective("reduce_scatter", (1 << 20) // 4, "float32", 2, (0,))
    t_ns = (1 << 20) / 2 / 2 / topo.dims[0].bandwidth_bytes_per_ns  # half a chunk's bytes, at B
    assert stage_ends(topo, "ideal", [coll], active=2) == pytest.approx([t_ns, t_ns], rel=1e-12)
    assert stage_ends(topo, "fair", [coll], active=2) == pytest.approx([2 * t_ns, 2 * t_ns], rel=1e-12)


def test_a_shared_nic_halves_each_of_its_dims_while_both_are_busy():
    """Dims 0 and 1 behind one NIC of B: a stage on each at once ends at 2T (fair), at T without the NIC."""
    dims = (Dim("Switch", 2, 100.0, 0.0), Dim("Switch", 2, 100.0, 0.0))
    with_nic, without = Topology(dims, "", (Port((0, 1), 100.0),)), Topology(dims)
    colls = [Collective("reduce_scatter", (1 << 20) // 4, "float32", 1, (d,)) for d in (0, 1)]
    t_ns = (1 << 20) / 2 / dims[0].bandwidth_bytes_per_ns
    assert stage_ends(without, "fair", colls) == pytest.approx([t_ns, t_ns], rel=1e-12)
    assert stage_ends(with_nic, "fair", colls) == pytest.approx([2 * t_ns, 2 * t_ns], rel=1e-12)
    assert stage_ends(with_nic, "ideal", colls) == pytest.approx([t_ns, t_ns], rel=1e-12)


def test_a_nic_wider_than_its_dims_takes_nothing_away():
    """A port as fast as both dims together never slows them."""
    dims = (Dim("Switch", 2, 100.0, 0.0), Dim("Switch", 2, 100.0, 0.0))
    topo = Topology(dims, "", (Port((0, 1), 200.0),))
    colls = [Collective("reduce_scatter", (1 << 20) // 4, "float32", 1, (d,)) for d in (0, 1)]
    t_ns = (1 << 20) / 2 / dims[0].bandwidth_bytes_per_ns
    assert stage_ends(topo, "fair", colls) == pytest.approx([t_ns, t_ns], rel=1e-12)


def test_store_forward_serves_a_switch_up_then_down():
    """Store-and-forward at the switch: one stage alone takes its bytes up, then down (2T); ring links T."""
    coll = Collective("reduce_scatter", (1 << 20) // 4, "float32", 1, (0,))
    sw, ring = parse_topology("SW(2,100,0)"), parse_topology("Ring(2,100,0)")
    t_ns = (1 << 20) / 2 / sw.dims[0].bandwidth_bytes_per_ns
    assert stage_ends(sw, "store-forward", [coll]) == pytest.approx([2 * t_ns], rel=1e-12)
    assert stage_ends(ring, "store-forward", [coll]) == pytest.approx([t_ns], rel=1e-12)


def test_max_min_fills_the_narrow_link_first():
    """Flows a (link 0), b (links 0 and 1), c (link 1) on links of 1 and 3: a = b = 0.5, c = 2.5."""
    assert max_min_rates([((0, 1.0),), ((0, 1.0), (1, 1.0)), ((1, 1.0),)], [1.0, 3.0]) == pytest.approx(
        [0.5, 0.5, 2.5]
    )


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("Ring(4,100,0)", ["dim0.cw", "dim0.ccw"]),
        ("FC(4,90,0)", ["dim0.peer+1", "dim0.peer+2", "dim0.peer+3"]),
        (
            "SW(4,100,0)_SW(2,50,0)_NIC(0+1,100)",
            ["dim0.up", "dim0.down", "dim1.up", "dim1.down", "port0.out", "port0.in"],
        ),
    ],
)
def test_every_dim_has_its_physical_links(spec, names):
    """Ring: two links of B/2; FullyConnected: P-1 links of B/(P-1); Switch: up and down of B; ports."""
    topo = parse_topology(spec)
    links = physical_links(topo)
    assert [link.name for link in links] == names
    for link in links:
        if link.dim >= 0:
            dim = topo.dims[link.dim]
            total = sum(x.bytes_per_ns for x in links if x.dim == link.dim and not x.name.endswith(".down"))
            assert total == pytest.approx(dim.bandwidth_bytes_per_ns)


def test_the_ideal_bound_counts_a_shared_nic_once():
    """ideal_us of dims behind one NIC uses the NIC's rate, not the sum of the dims'."""
    plain = parse_topology("SW(2,100,0)_SW(2,100,0)")
    shared = parse_topology("SW(2,100,0)_SW(2,100,0)_NIC(0+1,100)")
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 4, (0, 1))
    a = model_collective(plain, coll, "themis", RunConfig(intra="scf", network="fair"))[0]
    b = model_collective(shared, coll, "themis", RunConfig(intra="scf", network="fair"))[0]
    assert b.ideal_us == pytest.approx(2 * a.ideal_us)
    assert b.time_us >= b.ideal_us * (1 - 1e-9)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(network="fair", compat="astra-sim-1.0"), "takes --network ideal only"),
        (dict(network="bus"), "unknown --network 'bus'"),
    ],
)
def test_settings_that_do_not_go_together_are_one_line(config, message):
    """--compat astra-sim-1.0 shares no link, and an unknown rule is named."""
    with pytest.raises(UsageError, match=message):
        RunConfig(**config)


DIMS = st.builds(
    Dim,
    st.sampled_from(["Ring", "FullyConnected", "Switch"]),
    st.sampled_from([2, 3, 4, 8]),
    st.sampled_from([25.0, 50.0, 100.0, 200.0]),
    st.sampled_from([0.0, 20.0, 700.0]),
)


@st.composite
def topologies(draw):
    """1 to 3 dims, and sometimes a port that two of them share."""
    dims = tuple(draw(st.lists(DIMS, min_size=1, max_size=3)))
    ports = ()
    if len(dims) >= 2 and draw(st.booleans()):
        pair = tuple(
            sorted(draw(st.lists(st.sampled_from(range(len(dims))), min_size=2, max_size=2, unique=True)))
        )
        ports = (Port(pair, draw(st.sampled_from([25.0, 60.0, 400.0]))),)
    return Topology(dims, "", ports)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=topologies(),
    policy=st.sampled_from(["baseline", "themis", "roundRobin", "themis-lat"]),
    chunks=st.sampled_from([1, 2, 5, 16]),
    active=st.sampled_from([1, 2, 4]),
    op=st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]),
    network=st.sampled_from(SHARING),
)
def test_physics_holds_on_every_result(topo, policy, chunks, active, op, network):
    """No link is busier than 100 %, and no collective beats the bound of its bottleneck (ideal_us)."""
    coll = Collective(op, (4 << 20) // 4, "float32", chunks, tuple(range(len(topo.dims))))
    intra = "fifo" if policy in ("baseline", "roundRobin") else "scf"
    r = model_collective(topo, coll, policy, RunConfig(intra=intra, active_per_dim=active, network=network))[
        0
    ]
    assert max(link.busy_pct for link in r.links) <= 100 * (1 + 1e-9)
    assert all(d.utilization <= 1 + 1e-9 for d in r.dims)
    assert r.time_us >= r.ideal_us * (1 - 1e-9)
    cost = CostModels(topo)
    sent = sum(
        cost(run.stage.itemsize).stage_bytes(run.stage.dim, run.stage.op, run.stage.full_elems)
        for run in model_collective(
            topo, coll, policy, RunConfig(intra=intra, active_per_dim=active, network=network)
        )[1].records
    )
    links_out = sum(
        link.bytes for link in r.links if link.name.endswith((".cw", ".ccw", ".up")) or "peer+" in link.name
    )
    assert links_out == pytest.approx(sent, rel=1e-9)


def emulated_runs(cases: dict, tmp, trace: bool = False) -> dict:
    """`run` on 8 ranks of each case's `model` args (key -> args), all in one mpiexec (`harness.cli_jobs`).

    One iteration without warm-up unless a case's args give their own ``-n`` and ``-w``. Returns
    key -> (the run, its JSON file, its trace file, written with `trace`).
    """
    files = {key: (tmp / f"{i}.json", tmp / f"{i}.h5") for i, key in enumerate(cases)}
    runs = {
        key: (8, ["run", "-n", "1", "-w", "0", *args, "--json", str(files[key][0])]
                 + (["--trace", str(files[key][1])] if trace else []))
        for key, args in cases.items()
    }  # fmt: skip
    done = cli_jobs(runs, tmp)
    return {key: (done[key], *files[key]) for key in cases}


def emulator_equals_model(tmp_path, args: list[str], network: str, emulated: tuple) -> None:
    """The emulator's `run` (of `emulated_runs`) and `model` with the same args: equal times, every element right, the rule recorded."""
    emu, emu_json, _ = emulated
    assert emu.returncode == 0, emu.stderr
    model = in_process(["model", *args, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr
    e, m = json.loads(emu_json.read_text()), json.loads((tmp_path / "model.json").read_text())
    assert [r["time_us"] for r in e] == [r["time_us"] for r in m]
    assert [r["wrong"] for r in e] == [0] * len(e)
    assert all(r["network"] == network for r in e)


def sharing_args(network: str, active: int) -> list[str]:
    """2x2x2, every policy, 1 MiB in 16 chunks, `active` chunks per dim, under `network`."""
    return ["-t", "2x2x2", "-b", "1M", "-c", "16", "-p", "all", "--active-chunks-per-dim", str(active),
            "--network", network, "-q"]  # fmt: skip


@pytest.fixture(scope="module")
def sharing_runs(tmp_path_factory):
    """The emulator's runs of every sharing rule and active count, with their traces: one mpiexec."""
    cases = {(n, a): sharing_args(n, a) for n in SHARING for a in (1, 3)}
    return emulated_runs(cases, tmp_path_factory.mktemp("sharing"), trace=True)


@pytest.mark.parametrize("network", SHARING)
@pytest.mark.parametrize("active", [1, 3])
def test_the_emulator_equals_the_model_under_sharing(tmp_path, sharing_runs, network, active):
    """8 ranks, every policy: the emulator's times are the model's to the ns, and the data is right."""
    emulated = sharing_runs[(network, active)]
    emulator_equals_model(tmp_path, sharing_args(network, active), network, emulated)
    trace = str(emulated[2])
    replay = in_process(["replay", trace])  # the model replays the emulator's trace under the recorded rule
    assert replay.returncode == 0 and "reproduces all" in replay.stdout, replay.stdout + replay.stderr


@pytest.mark.parametrize("network", SHARING)
@pytest.mark.parametrize("spec", ["SW(8,100,0,ring)", "HGX-H100-SW_SW_SW"])
def test_a_trace_under_sharing_keeps_every_link_and_replays_exactly(tmp_path, network, spec):
    """`--trace` under a sharing rule holds the run's links; analyze shows them; replay keeps or changes the rule."""
    from themis_mpi.trace import Trace

    out, trace = tmp_path / "rows.json", str(tmp_path / "t.h5")
    run = in_process(["model", "-t", spec, "-b", "64M", "-c", "16", "-p", "baseline,themis", "--active-chunks-per-dim",
                 "2", "--network", network, "--json", str(out), "--trace", trace, "-q"])  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows, t = json.loads(out.read_text()), Trace(trace)
    assert t.network == network
    for c, row in enumerate(rows):
        mine = t.links[t.links["collective"] == c]
        assert [x.decode() for x in mine["link"]] == [x["name"] for x in row["links"]]
        assert list(mine["bytes"]) == [x["bytes"] for x in row["links"]]
        assert list(mine["busy_pct"]) == [x["busy_pct"] for x in row["links"]]
        assert (mine["busy_pct"] <= 100 * (1 + 1e-9)).all()
    analyzed = in_process(["analyze", trace, "--json", str(tmp_path / "a.json")])
    assert analyzed.returncode == 0 and "links of one NPU under --network " + network in analyzed.stdout
    for row, a in zip(rows, json.loads((tmp_path / "a.json").read_text())):
        assert [d["utilization"] for d in a["dims"]] == pytest.approx([d["utilization"] for d in row["dims"]])
        assert [x["name"] for x in a["links"]] == [x["name"] for x in row["links"]]
    same = in_process(["replay", trace])
    assert same.returncode == 0 and "reproduces all" in same.stdout, same.stdout + same.stderr
    other = in_process(["replay", trace, "--network", "ideal", "--json", str(tmp_path / "r.json")])
    assert other.returncode == 0 and "(changed)" in other.stdout, other.stdout + other.stderr
    for r in json.loads((tmp_path / "r.json").read_text())["collectives"]:
        assert r["row"]["network"] == "ideal" and r["replay_us"] <= r["recorded_us"] * (1 + 1e-12)


@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_the_hgx_nic_never_carries_more_than_its_rate_under_sharing(policy):
    """HGX H100 (dims 1 and 2 behind one NIC), zero latency: fair keeps the NIC <= 100 %; ideal overdraws it."""
    topo = parse_topology("HGX-H100-SW_SW_SW").with_overrides(latency_ns=[0.0, 0.0, 0.0])
    coll = Collective("all_reduce", (64 << 20) // 8, "float64", 64, (0, 1, 2))
    intra = "fifo" if policy == "baseline" else "scf"
    fair = model_collective(topo, coll, policy, RunConfig(intra=intra, network="fair"))[0]
    nic = [link for link in fair.links if link.name.startswith("port0.")]
    assert len(nic) == 2 and max(link.busy_pct for link in nic) <= 100 * (1 + 1e-9)
    nic_bytes = next(link.bytes for link in nic if link.name == "port0.out")
    assert nic_bytes / topo.ports[0].bandwidth_bytes_per_ns / 1e3 <= fair.time_us * (1 + 1e-9)
    if policy == "themis":  # Themis balances dims 1 and 2 as if each had its own 46.57 GB/s
        ideal, engine = model_collective(topo, coll, policy, RunConfig(intra=intra, network="ideal"))
        links = link_results(engine.records, topo, CostModels(topo), ideal.time_us)
        assert max(link.busy_pct for link in links if link.name.startswith("port0.")) > 100


def solo_matches_step_wise(topo: Topology, policy: str, chunks: int, active: int, network: str) -> None:
    """A 4 MiB all-reduce: the rule's solo shortcuts change no stage's start or end beyond float rounding."""
    coll = Collective("all_reduce", (4 << 20) // 4, "float32", chunks, tuple(range(len(topo.dims))))
    config = RunConfig(
        intra="fifo" if policy == "baseline" else "scf", active_per_dim=active, network=network
    )
    fast_result, fast = model_collective(topo, coll, policy, config)
    Fair.solo = False
    try:
        slow_result, slow = model_collective(topo, coll, policy, config)
    finally:
        Fair.solo = True

    def times(records):  # (by stage: two that end at one instant may be recorded in either order)
        return {(r.stage.coll, r.stage.chunk, r.stage.index): (r.start_ns, r.end_ns) for r in records}

    fast_times, slow_times = times(fast.records), times(slow.records)
    assert fast_times.keys() == slow_times.keys()
    for key, (start_ns, end_ns) in slow_times.items():
        assert fast_times[key] == pytest.approx((start_ns, end_ns), rel=1e-9, abs=1e-6), key
    assert fast_result.time_us == pytest.approx(slow_result.time_us, rel=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=topologies(),
    policy=st.sampled_from(["baseline", "themis"]),
    chunks=st.sampled_from([1, 4, 16]),
    active=st.sampled_from([1, 2, 3]),
)
def test_a_solo_stage_ends_where_the_step_wise_path_ends_it(topo, policy, chunks, active):
    """The fair rule's solo shortcuts (alone, interleaved, meeting) change no stage's start or end beyond float rounding."""
    solo_matches_step_wise(topo, policy, chunks, active, "fair")


def test_a_stage_placed_in_the_middle_of_a_meeting_keeps_its_own_end():
    """Two solo stages met behind a NIC without slowing each other; a third comes: the first goes on at its rate.

    (It ended where the other's transfer did, 584 ns early, before the fix: `Fair._unsolo`.)
    """
    topo = parse_topology("Ring(2,25,0)_Ring(3,25,700)_NIC(0+1,60)")
    solo_matches_step_wise(topo, "themis", 16, 3, "fair")


@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_stages_behind_the_hgx_nic_end_as_step_by_step_in_about_one_network_event_each(policy, monkeypatch):
    """On HGX (dims 1 and 2 behind one NIC) solo stages interleave and meet there: step-wise ends, < 1.5 events a stage."""
    topo = parse_topology("HGX-H100-SW_SW_SW")
    coll = Collective("all_reduce", (64 << 20) // 4, "float32", 64, (0, 1, 2))
    config = RunConfig(intra="fifo" if policy == "baseline" else "scf", network="fair")
    events = [0]
    fire = EventLoop.fire

    def counted(self, t_ns, rule):
        events[0] += 1
        fire(self, t_ns, rule)

    monkeypatch.setattr(EventLoop, "fire", counted)
    fast_result, fast = model_collective(topo, coll, policy, config)
    fast_events, events[0] = events[0], 0
    monkeypatch.setattr(Fair, "solo", False)
    slow_result, slow = model_collective(topo, coll, policy, config)
    assert fast_events < 1.5 * len(fast.records) < events[0]
    assert fast_result.time_us == pytest.approx(slow_result.time_us, rel=1e-9)
    slow_ends = {(r.stage.chunk, r.stage.index): r.end_ns for r in slow.records}
    assert {(r.stage.chunk, r.stage.index): r.end_ns for r in fast.records} == pytest.approx(
        slow_ends, rel=1e-9
    )


@pytest.mark.parametrize(
    ("args", "nic", "note"),
    [
        (["-t", "HGX-H100-SW_SW_SW", "--network", "ideal"], True, True),
        (["-t", "HGX-H100-SW_SW_SW"], True, False),
        (["-t", "SW(8,100,0,ring)", "--active-chunks-per-dim", "4", "--network", "ideal"], False, True),
        (["-t", "SW(8,100,0,ring)", "--network", "ideal"], False, False),
    ],
)
def test_the_header_names_a_shared_nic_and_what_ideal_leaves_out(args, nic, note):
    """A shared NIC gets its own header line; ideal says once that it lets links overdraw, where they can."""
    proc = in_process(["model", *args, "-b", "1M", "-c", "4", "-p", "baseline"])
    assert proc.returncode == 0, proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("#   ")]
    assert any(line.startswith("#   NIC(1+2,46.57): dims 1 and 2") for line in header) == nic
    assert any("network ideal: stages that run at once share nothing" in line for line in header) == note
