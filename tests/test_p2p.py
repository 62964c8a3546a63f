"""Every NPU's links under --network fair|store-forward (`timing.world.World`): point-to-point traffic.

One NPU's view (`timing.symmetric`) times symmetric collectives; messages and per-rank graphs run on
every NPU's links. Here: both give the same times where NPUs are alike, the closed forms of a
message beside a collective, and emulator == model with messages under both rules.
"""

import random
import re

import pytest
from harness import DATA, cli_jobs, costly, in_process, on_two_cores

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine
from themis_mpi.errors import Stalled, UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.policies.base import fixed_schedule
from themis_mpi.run.collective import model_collective
from themis_mpi.run.coordinator import share_orders
from themis_mpi.run.training import graph_on, run_graph
from themis_mpi.timing.world import World
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import coords, graph_collectives, load_graph
from themis_mpi.workloads.et import COMM_RECV_NODE, COMM_SEND_NODE, Attr, EtTrace, Node, write_et
from themis_mpi.workloads.llm import LlmConfig, write_llm
from themis_mpi.workloads.training import TrainingSpec

SYMMETRIC = [
    "Ring(8,100,20,ring)",
    "SW(8,100,500,hd)",
    "SW(8,100,500,direct)",
    "FC(8,350,500,hd)",
    "Ring(4,100,20,ring)_SW(2,50,700,hd)",
    "Ring(2,100,20,ring)_SW(4,50,500,hd)_SW(2,50,500,ring)_NIC(1+2,46.57)",
    "FC(4,100,50,direct)_SW(2,50,500,ina)",
]


def stage_times(engine: Engine) -> dict:
    """Every stage's (start, end) by its key."""
    return {(r.stage.coll, r.stage.chunk, r.stage.index): (r.start_ns, r.end_ns) for r in engine.records}


def same_times(every: list[dict], one: dict, rule: str) -> bool:
    """Every NPU's stage times are one NPU's: to the ns, or to float rounding under the packet rule.

    (One NPU's view sums a stage alone on its links at once and places it when a transfer comes;
    every NPU's links go step by step: the floats round differently.)
    """
    if rule != "packet":
        return all(times == one for times in every)
    return all(
        times.keys() == one.keys()
        and all(times[k] == pytest.approx(one[k], rel=1e-12, abs=1e-9) for k in one)
        for times in every
    )


@pytest.mark.parametrize("topology", SYMMETRIC)
@pytest.mark.parametrize("rule", ["packet", "fair", "store-forward"])
@pytest.mark.parametrize("active", [1, 2, 4])
def test_every_npu_equals_one_npu_where_npus_are_alike(topology, rule, active):
    """Two all-reduces over every dim, 7 chunks: every NPU's stage starts and ends equal the one-NPU network's, to the ns."""
    topo = parse_topology(topology)
    cfg = RunConfig(network=rule, active_per_dim=active)
    dims = tuple(range(len(topo.dims)))
    colls = [
        Collective("all_reduce", (1 << 20) // 4, "float32", 7, dims),
        Collective("all_gather", 1 << 16, "float32", 3, dims[::-1]),
    ]
    schedules = [
        fixed_schedule(colls[0], [list(dims)] * 7, True, "fifo"),
        fixed_schedule(colls[1], [list(dims[::-1])] * 3, False, "fifo"),
    ]

    def play(transport):
        engine = Engine(topo, transport, cfg)
        for coll, schedule in zip(colls, schedules):
            engine.issue(coll, schedule)
        engine.run()
        return engine

    one = stage_times(play(ModelTransport(topo, cfg)))
    every = [stage_times(engine) for engine in World(topo, cfg).run(play)]
    assert len(one) > 7 and same_times(every, one, rule)


def hgx_times(rule: str) -> tuple[dict, list[dict]]:
    """HGX-H100-SW_SW_SW (1024 NPUs, dims 1 and 2 behind one NIC), 4 chunks in four dim orders, 2 active: one NPU's and every NPU's stage times."""
    topo = parse_topology("HGX-H100-SW_SW_SW")
    cfg = RunConfig(network=rule, active_per_dim=2)
    coll = Collective("all_reduce", (1 << 20) // 4, "float32", 4, (0, 1, 2))
    schedule = fixed_schedule(coll, [[0, 1, 2], [0, 2, 1], [1, 2, 0], [2, 1, 0]], True, "fifo")

    def play(transport):
        engine = Engine(topo, transport, cfg)
        engine.issue(coll, schedule)
        engine.run()
        return stage_times(engine)

    return play(ModelTransport(topo, cfg)), World(topo, cfg).run(play)


HGX_RULES = ["fair", "packet", "store-forward"]  # (the longest first: both workers end together)


@pytest.fixture(scope="module")
@costly
def hgx(request) -> dict:
    """The selected rules' `hgx_times`, two at a time (`harness.on_two_cores`): rule -> (one, every)."""
    test = "test_every_npu_equals_one_npu_on_the_hgx_preset_with_its_shared_nic[{}]"
    names = {item.name for item in request.session.items if item.module is request.module}
    rules = [rule for rule in HGX_RULES if test.format(rule) in names]
    return dict(zip(rules, on_two_cores(hgx_times, rules)))


@pytest.mark.parametrize("rule", ["packet", "fair", "store-forward"])
def test_every_npu_equals_one_npu_on_the_hgx_preset_with_its_shared_nic(hgx, rule):
    """HGX-H100-SW_SW_SW (1024 NPUs, dims 1 and 2 behind one NIC), 4 chunks in four dim orders, 2 active: to the ns."""
    one, every = hgx[rule]
    assert len(every) == 1024 and same_times(every, one, rule)


# --- a message beside a collective, in closed form -------------------------------------------------

B_PER_NS = 100 * 2**30 / 1e9  # SW(2,100,0): each up- and down-link carries B


def beside(op: str, message_bytes: int, count: int) -> tuple[float, float, float]:
    """SW(2,100,0,ring), latency and endpoint delay 0, fair: (collective alone, collective beside the message, message).

    Both NPUs run `op` over dim 0 in one chunk; NPU 0 also sends `message_bytes` to NPU 1 at
    time 0, over its up-link and NPU 1's down-link, which its collective steps use too.
    """
    topo = parse_topology("SW(2,100,0,ring)")
    cfg = RunConfig(network="fair", endpoint_delay_ns=0.0)
    coll = Collective(op, count, "float64", 1, (0,))
    schedule = fixed_schedule(coll, [[0]], op == "all_reduce", "fifo")

    def play(transport, message: bool):
        engine = Engine(topo, transport, cfg)
        run = engine.issue(coll, schedule)
        msg = None
        if message:
            peer = 1 - transport.rank
            msg = engine.message(peer, ((0, 2),), message_bytes, 7, transport.rank == 0)
        engine.run()
        return run.end_ns, msg.end_ns if msg else None

    alone = World(topo, cfg).run(lambda t: play(t, False))
    both = World(topo, cfg).run(lambda t: play(t, True))
    assert alone[0] == alone[1] and both[0] == both[1]  # (both NPUs end together)
    assert both[0][1] == both[1][1]  # the message ends on both sides at once
    return alone[0][0], both[0][0], both[0][1]


@pytest.mark.parametrize(
    "topology, dst, links, hops",
    [
        ("SW(4,100,500)", 2, 2, 1),  # up, then down: one hop on the dim, two links
        ("FC(4,300,500)", 3, 1, 1),  # the direct link of B/(P-1)
        ("Ring(8,100,500)", 3, 3, 3),  # clockwise through NPUs 1 and 2
        ("Ring(8,100,500)", 6, 2, 2),  # counter-clockwise, the shorter way
    ],
)
@pytest.mark.parametrize("rule", ["packet", "fair", "store-forward"])
def test_a_message_alone_takes_its_route_once_under_fair_and_per_link_under_store_forward(
    topology, dst, links, hops, rule
):
    """NPU 0 to `dst`, 1 MiB: fair S/rate + delay (cut-through), store-forward one S/rate per link crossed + delay.

    The packet rule: fair's, plus one packet (4 KiB) at the link's rate per link after the first.
    """
    topo = parse_topology(topology)
    dim = topo.dims[0]
    cfg = RunConfig(network=rule, endpoint_delay_ns=10.0)
    nbytes = 1 << 20
    rate = dim.bandwidth_bytes_per_ns / {"Ring": 2, "Switch": 1, "FullyConnected": dim.npus - 1}[dim.kind]

    def play(transport):
        engine = Engine(topo, transport, cfg)
        run = None
        if transport.rank in (0, dst):
            peer = dst if transport.rank == 0 else 0
            run = engine.message(peer, ((0, hops),), nbytes, 1, transport.rank == 0)
        engine.run()
        return None if run is None else run.end_ns

    ends = World(topo, cfg).run(play)
    delay_ns = hops * dim.latency_ns + 10.0
    transfers = links if rule == "store-forward" else 1
    forward_ns = (links - 1) * 4096 / rate if rule == "packet" else 0.0
    assert ends[0] == ends[dst] == pytest.approx(transfers * nbytes / rate + forward_ns + delay_ns, rel=1e-12)


def test_a_message_across_a_link_a_collective_stage_uses_takes_its_shared_time_under_fair():
    """All-gather step of S = 1 MiB on NPU 0's up-link beside a message of M = S/4: it ends at 2M/B, the stage at (S+M)/B."""
    s_bytes = 1 << 20
    m_bytes = s_bytes // 4
    alone, with_message, message = beside("all_gather", m_bytes, 2 * s_bytes // 8)
    assert alone == pytest.approx(s_bytes / B_PER_NS, rel=1e-12)  # (one step of S bytes at B)
    assert message == pytest.approx(2 * m_bytes / B_PER_NS, rel=1e-12)  # half the link until it ends
    assert with_message == pytest.approx((s_bytes + m_bytes) / B_PER_NS, rel=1e-12)


def test_an_activation_message_beside_a_dp_all_reduce_on_the_same_link_holds_its_closed_form():
    """All-reduce of 2S on SW(2) (an RS then an AG step of S) beside a message of M <= S: 2M/B, and the all-reduce M/B later."""
    s_bytes = 1 << 20
    m_bytes = 3 * s_bytes // 4
    alone, with_message, message = beside("all_reduce", m_bytes, 2 * s_bytes // 8)
    assert alone == pytest.approx(2 * s_bytes / B_PER_NS, rel=1e-12)
    assert message == pytest.approx(2 * m_bytes / B_PER_NS, rel=1e-12)
    assert with_message == pytest.approx(alone + m_bytes / B_PER_NS, rel=1e-12)


# --- generated pipelines: every NPU on the model, and the emulator ----------------------------------

SMALL = dict(layers=8, hidden=64, heads=4, seq=32, vocab=100, micro_batch=2, global_batch=16)


def pipeline(tmp_path, **layout) -> str:
    """A small generated GPT (TP2 x PP2 x DP2 by default) as per-rank ET files on 2x2x2; their prefix."""
    prefix = str(tmp_path / "g")
    write_llm(LlmConfig(**SMALL, **(layout or dict(tp=2, pp=2, dp=2))), parse_topology("2x2x2"), prefix)
    return prefix


def table(stdout: str) -> list[tuple[str, ...]]:
    """The rows of `train`: policy, iteration_us, compute_us, exposed_us, #wrong and the dims' busy shares."""
    return [
        tuple(f[:1] + f[2:5] + f[6:-1])
        for f in (line.split() for line in stdout.splitlines() if re.match(r"\s+(baseline|themis)\s", line))
    ]


P2P_CASES = [
    ("fair", 2, dict(tp=2, pp=2, dp=2)),
    ("store-forward", 4, dict(tp=2, pp=2, dp=2)),
    ("fair", 4, dict(pp=4, dp=2, schedule="interleaved", chunks=2)),
    ("packet", 2, dict(tp=2, pp=2, dp=2)),
    ("packet", 4, dict(pp=4, dp=2, schedule="interleaved", chunks=2)),
]


def p2p_args(prefix: str, rule: str, active: int) -> list[str]:
    """`train` of a generated pipeline on 2x2x2 under `rule`, `active` chunks per dim."""
    return [
        "train",
        prefix,
        "-t",
        "2x2x2",
        "-c",
        "4",
        "--network",
        rule,
        "--active-chunks-per-dim",
        str(active),
    ]


@pytest.fixture(scope="module")
def p2p_emulated(tmp_path_factory):
    """Each `P2P_CASES` case's `train` args, and its run on 8 ranks: one mpiexec for all of them."""
    tmp = tmp_path_factory.mktemp("p2p")
    args = {}
    for i, (rule, active, layout) in enumerate(P2P_CASES):
        (tmp / str(i)).mkdir()
        args[i] = p2p_args(pipeline(tmp / str(i), **layout), rule, active)
    done = cli_jobs({i: (8, a) for i, a in args.items()}, tmp)
    return {i: (args[i], done[i]) for i in args}


@pytest.mark.parametrize(
    "case", range(len(P2P_CASES)), ids=[f"{r}-{a}-layout{i}" for i, (r, a, _) in enumerate(P2P_CASES)]
)
def test_emulator_equals_model_with_point_to_point_traffic_on_8_ranks(p2p_emulated, case):
    """A generated pipeline under packet / fair / store-forward, active chunks > 1, on 8 ranks: the model's rows, #wrong 0."""
    args, emu = p2p_emulated[case]
    model = in_process(args)
    assert emu.returncode == 0 and model.returncode == 0, emu.stderr + model.stderr
    got, want = table(emu.stdout), table(model.stdout)
    assert len(got) == 2 and [r[:4] + r[5:] for r in got] == [r[:4] + r[5:] for r in want]
    assert all(r[4] == "0" for r in got) and all(r[4] == "N/A" for r in want)


@pytest.mark.parametrize("rule", ["packet", "fair", "store-forward"])
def test_a_pipeline_under_sharing_takes_at_least_its_ideal_time_and_no_link_is_overfull(tmp_path, rule):
    """GPT TP2 x PP2 x DP2 (pp messages beside TP and DP collectives): >= its ideal time; every NPU's links <= 100 % busy."""
    graph = load_graph(pipeline(tmp_path))
    topo = parse_topology("2x2x2")
    spec = TrainingSpec(4, "float32", 1)
    ideal = run_graph(
        ModelTransport(topo, RunConfig(active_per_dim=2, network="ideal")), graph, "baseline", spec
    )
    cfg = RunConfig(network=rule, active_per_dim=2)
    shared = run_graph(ModelTransport(topo, cfg), graph, "baseline", spec)
    assert shared.iteration_us >= ideal.iteration_us * (1 - 1e-12)
    assert shared.links and max(link.busy_pct for link in shared.links) <= 100 * (1 + 1e-9)
    collectives = graph_collectives(graph, topo, spec, range(topo.npus))
    schedules = dict(zip(collectives, share_orders(ModelTransport(topo, cfg), "baseline", collectives)))
    world = World(topo, cfg)
    ends = world.run(lambda npu: graph_on(npu, graph, "baseline", spec, schedules).iteration_us)
    assert max(ends) == shared.iteration_us  # (the last rank's end; the model's row is rank 0's)
    span_ns = shared.iteration_us * 1e3
    rule, links = world.rule, world.routes.links
    busy = [b / (cap * span_ns) for b, cap in zip(rule.carried, rule.capacity)]
    assert max(busy) <= 1 + 1e-9
    pp = [i for i, link in enumerate(links) if ".dim2." in link.name]  # (PP crosses dim 2 only)
    assert sum(rule.carried[i] for i in pp) > 0
    assert world.loop.idle(world.rule) and not (world._sent or world._waiting)  # (nothing left in flight)


def test_a_neighbour_shift_runs_under_fair_over_one_direction_of_the_ring(tmp_path):
    """Ring(4,100,500): 1 MiB to the next NPU after 10 us ends at 10 us + 500 ns + S/(B/2), one way round, on every rank."""
    from test_chakra import ring_shift  # (writes per-rank ET files of a neighbour shift)

    nbytes = 1 << 20
    prefix = ring_shift(tmp_path, 4, nbytes, lambda r: (r + 1) % 4)
    topo = parse_topology("Ring(4,100,500)")
    row = run_graph(
        ModelTransport(topo, RunConfig(network="fair")),
        load_graph(prefix),
        "baseline",
        TrainingSpec(1, "float32", 1),
    )
    assert row.iteration_us * 1e3 == pytest.approx(10e3 + 500 + nbytes / (50 * 2**30 / 1e9), rel=1e-12)
    cw = {link.name: link.bytes for link in row.links}
    assert cw["dim0.cw"] == nbytes and cw["dim0.ccw"] == 0  # (rank 0's links: its send went clockwise)


def test_a_graph_where_every_rank_waits_is_refused_on_every_npus_links(tmp_path):
    """Two ranks that each receive before they send, under fair: one UsageError that names the deadlock."""
    for r in (0, 1):
        msg = [Attr("comm_size", "int64", 64), Attr("comm_tag", "int64", 1)]
        nodes = [
            Node(1, "recv", COMM_RECV_NODE, [], attrs=[Attr("comm_src", "int64", 1 - r), *msg]),
            Node(2, "send", COMM_SEND_NODE, [1], attrs=[Attr("comm_dst", "int64", 1 - r), *msg]),
        ]
        write_et(str(tmp_path / f"dl.{r}.et"), EtTrace("dl", "0.0.4", [], nodes))
    topo = parse_topology("SW(2,100,500)")
    with pytest.raises(UsageError, match="the graph deadlocks on every NPU's links: every NPU waits"):
        run_graph(ModelTransport(topo, RunConfig(network="fair")), load_graph(str(tmp_path / "dl")), "baseline",
                  TrainingSpec(1, "float32", 1))  # fmt: skip


@pytest.mark.parametrize("rule", ["fair", "store-forward"])
@pytest.mark.parametrize("active", [1, 2])
def test_per_rank_traces_without_messages_take_the_one_npu_models_time(rule, active):
    """ASTRA-sim's per-rank all-reduce traces (8 files, 1 MiB) on every NPU's links: the one-NPU model's time for that all-reduce."""
    prefix = DATA / "astra-sim-chakra-et" / "all_reduce" / "8npus_1MB" / "all_reduce"
    topo = parse_topology("SW(8,100,500,hd)")
    cfg = RunConfig(network=rule, active_per_dim=active)
    row = run_graph(
        ModelTransport(topo, cfg), load_graph(str(prefix)), "baseline", TrainingSpec(4, "float32", 1)
    )
    coll = Collective("all_reduce", (1 << 20) // 4, "float32", 4, (0,))
    assert row.iteration_us == model_collective(topo, coll, "baseline", cfg)[0].time_us


KINDS = [
    "Ring({n},100,{lat},ring)",
    "SW({n},50,{lat},hd)",
    "FC({n},150,{lat},direct)",
    "SW({n},80,{lat},ring)",
]


@pytest.mark.parametrize("seed", range(12))
def test_random_messages_beside_random_collectives_keep_every_link_within_its_rate(seed):
    """Random 2-dim topologies (a shared port on odd seeds), a collective and messages: no link of any NPU > 100 %, nothing left.

    (One chunk: its stages follow each other on every NPU, so no group can start them in
    different orders; `test_npus_that_start_a_dims_stages_in_different_orders_are_named`.)
    """
    rng = random.Random(seed)
    dims = [rng.choice(KINDS).format(n=rng.choice([2, 4]), lat=rng.choice([0, 500])) for _ in range(2)]
    spec = "_".join(dims) + ("_NIC(0+1,60)" if seed % 2 else "")
    topo = parse_topology(spec)
    rule = ("fair", "store-forward")[seed % 2]
    cfg = RunConfig(network=rule, active_per_dim=rng.choice([1, 2, 4]))
    coll = Collective(
        rng.choice(["all_reduce", "all_gather", "reduce_scatter"]), 1 << 16, "float32", 1, (0, 1)
    )
    schedule = fixed_schedule(coll, [rng.sample([0, 1], 2)], False, "fifo")
    pairs = [
        (rng.randrange(topo.npus), rng.randrange(topo.npus), rng.choice([1 << 10, 1 << 18])) for _ in range(6)
    ]
    pairs = [(a, b, n) for a, b, n in pairs if a != b]

    def play(transport):
        engine = Engine(topo, transport, cfg)
        engine.issue(coll, schedule)
        for tag, (a, b, nbytes) in enumerate(pairs):
            if transport.rank in (a, b):
                peer = b if transport.rank == a else a
                path = tuple(
                    (d, 1) for d, dim in enumerate(topo.dims) if coords(topo, a)[d] != coords(topo, b)[d]
                )
                engine.message(peer, path, nbytes, tag, transport.rank == a)
        engine.run()
        return engine.now_ns

    world = World(topo, cfg)
    span_ns = max(world.run(play))
    rule = world.rule
    assert max(b / (cap * span_ns) for b, cap in zip(rule.carried, rule.capacity)) <= 1 + 1e-9
    assert world.loop.idle(world.rule) and not (world._sent or world._waiting or world._posted)


def test_npus_that_start_a_dims_stages_in_different_orders_are_named():
    """Messages that load some NPUs of a group more: they queue a dim's stages in another order, and the deadlock says so."""
    topo = parse_topology("SW(4,50,0,hd)_SW(4,80,0,ring)")
    cfg = RunConfig(network="fair")
    coll = Collective("all_reduce", 1 << 16, "float32", 4, (0, 1))
    schedule = fixed_schedule(coll, [[0, 1], [1, 0], [0, 1], [1, 0]], False, "fifo")
    pairs = [
        (3, 8, 1 << 10),
        (0, 8, 1 << 18),
        (6, 5, 1 << 18),
        (9, 11, 1 << 10),
        (10, 12, 1 << 10),
        (5, 7, 1 << 18),
    ]

    def play(transport):
        engine = Engine(topo, transport, cfg)
        engine.issue(coll, schedule)
        for tag, (a, b, nbytes) in enumerate(pairs):
            if transport.rank in (a, b):
                path = tuple((d, 1) for d in range(2) if coords(topo, a)[d] != coords(topo, b)[d])
                engine.message(b if transport.rank == a else a, path, nbytes, tag, transport.rank == a)
        engine.run()

    with pytest.raises(Stalled, match="started its stages in different orders"):
        World(topo, cfg).run(play)
