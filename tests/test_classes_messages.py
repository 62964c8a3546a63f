"""Classes with point-to-point messages and under the packet rule (issue 43): every NPU's run, field by field."""

from __future__ import annotations

import itertools
import random

import pytest
from test_classes import TEXT, every_npu, same_fields

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.run.collective import model_collective
from themis_mpi.run.training import model_training, run_graph
from themis_mpi.timing import planner
from themis_mpi.timing.classes import Inexact, npu_classes
from themis_mpi.timing.routes import NpuRoutes
from themis_mpi.timing.world import World, expected_npus
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import Graph
from themis_mpi.workloads.llm import LazyTraces, LlmConfig, fit_groups, place_groups
from themis_mpi.workloads.simai import SimaiTraces, parse_simai
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

DIMS = ("SW({n},100,500{a})", "SW({n},50,1000{a})", "FC({n},50,800)", "Ring({n},50,800)")


@pytest.fixture
def simulated(monkeypatch):
    """The NPUs each `World` made runs: its classes, or every NPU."""
    made: list[int] = []
    init = World.__init__

    def counted(self, *args, classes=None, **kwargs):
        made.append(args[0].npus if classes is None else classes.count)
        init(self, *args, classes=classes, **kwargs)

    monkeypatch.setattr(World, "__init__", counted)
    return made


def llm_graph(topo_spec: str, **shape) -> tuple[Graph, object]:
    """A small generated LLM (8 layers) on a topology: its per-rank graphs and the topology they run on."""
    c = LlmConfig(layers=8, hidden=256, heads=8, seq=128, vocab=1000, micro_batch=1, **shape)
    layout = fit_groups(c, parse_topology(topo_spec))
    return Graph("<gpt>", LazyTraces(c, layout)), layout.topology  # type: ignore[arg-type]


def random_llm(seed: int) -> tuple[str, dict]:
    """A random shape of 16 to 64 NPUs, PP 2 to 4 on a dim of its own, and its topology."""
    rng = random.Random(seed)
    tp, dp, pp = rng.choice((2, 4)), rng.choice((2, 4)), rng.choice((2, 4))
    schedule = rng.choice(("1f1b", "gpipe", "interleaved"))
    m = rng.choice((1, 2)) * pp
    dims = [rng.choice(DIMS[:3]).format(n=n, a=rng.choice(("", ",direct", ",ring"))) for n in (tp, dp)]
    dims.append(rng.choice(DIMS).format(n=pp, a=""))
    port = ["NIC(1+2,40)"] if rng.random() < 0.3 else []
    shape = dict(
        tp=tp,
        pp=pp,
        dp=dp,
        global_batch=m * dp,
        schedule=schedule,
        chunks=2 if schedule == "interleaved" else 1,
    )
    return "_".join(dims + port), shape


def gpt(graph: Graph, topo, rule: str, policy: str = "baseline"):
    """One iteration of the graphs on the model under a rule."""
    return run_graph(ModelTransport(topo, RunConfig(network=rule)), graph, policy, TrainingSpec(2))


@pytest.mark.parametrize("rule", ["packet", "fair"])
@pytest.mark.parametrize("seed", range(8))
def test_a_generated_llm_by_classes_equals_every_npu(monkeypatch, simulated, seed, rule):
    """Random small LLMs (16-64 NPUs, PP 2-4, 1F1B, GPipe, interleaved): one rank per stage runs, field by field."""
    topo_spec, shape = random_llm(seed)
    graph, topo = llm_graph(topo_spec, **shape)
    fast = gpt(graph, topo, rule, random.Random(seed).choice(("baseline", "themis")))
    assert simulated[-1] == shape["pp"] < topo.npus  # (one rank per pipeline stage)
    plain = every_npu(monkeypatch, lambda: gpt(graph, topo, rule, fast.policy))
    assert simulated[-1] == topo.npus
    same_fields(fast, plain)


def test_gpt_on_a_64_npu_cut_of_hgx_keeps_its_iteration(monkeypatch, simulated):
    """The issue's GPT-3 shape cut to TP 4 x DP 4 x PP 4 on HGX's dims, default rule: the same iteration both ways."""
    graph, topo = llm_graph(
        "SW(4,419.1,700,hd)_SW(4,46.57,1700,hd)_SW(4,46.57,1700,hd)_NIC(1+2,46.57)",
        tp=4,
        pp=4,
        dp=4,
        global_batch=32,
    )
    fast = gpt(graph, topo, "packet")
    plain = every_npu(monkeypatch, lambda: gpt(graph, topo, "packet"))
    assert simulated == [4, 4, 64]  # (a run learns the message patterns, the next goes through; every NPU)
    assert fast.iteration_us == plain.iteration_us
    same_fields(fast, plain)


def test_messages_across_a_third_npus_links_run_by_classes(monkeypatch, simulated):
    """PP 4 over two dims of 2: stage 1 to 2 crosses a third NPU's links, which the classes refine by too."""
    graph, topo = llm_graph("SW(2,100,500)_SW(2,50,1000)_SW(2,50,1000)", tp=2, pp=4, dp=1, global_batch=4)
    fast = gpt(graph, topo, "packet")
    assert simulated[-1] == 4
    same_fields(fast, every_npu(monkeypatch, lambda: gpt(graph, topo, "packet")))


def test_a_route_at_offsets_that_differ_is_refused():
    """On Ring(3) x SW(2), rank 2's message 1 ahead wraps the ring and crosses NPU 0's switch; rank 0's does not.

    NPUs of one kind whose routes cross NPUs at different offsets cannot be proven alike (`Inexact`).
    """
    topo = parse_topology("Ring(3,100,500)_SW(2,50,1000)")
    routes = NpuRoutes(topo, ())

    def vias(src: int, dst: int) -> set[int]:
        return {link // routes.per_npu for hop in routes.route(src, dst) for link, _ in hop}

    assert vias(0, 1) == {0} and vias(2, 3) == {2, 0, 3}
    config, kinds = RunConfig(network="fair"), {r: r % 2 for r in range(6)}  # (kind 1: ranks 0, 2, 4)
    with pytest.raises(Inexact):
        npu_classes(topo, config, kinds, [], [(1, 1)], vias)
    across = {r: r // 3 for r in range(6)}  # (kind 1: ranks 0, 1, 2, each to the one 3 ahead, on dim 1)
    assert npu_classes(topo, config, across, [], [(1, 3)], vias).count == 2


def test_graphs_from_files_run_every_npu(simulated):
    """Per-rank graphs that do not say their kinds (files: `training.graph_kinds`) run every NPU."""
    graph, topo = llm_graph("SW(2,100,500)_SW(2,50,1000)", tp=2, pp=2, dp=1, global_batch=2)
    files = Graph("<gpt>", [graph.traces[r] for r in range(topo.npus)])
    same_fields(gpt(files, topo, "fair"), gpt(graph, topo, "fair"))
    assert simulated == [topo.npus, 2, 2]  # (the files every NPU, the generated graphs by classes)


@pytest.mark.parametrize(
    "config,spec,by_classes",
    [
        (dict(npu_delay_ns=tuple((r, 5_000.0) for r in range(4))), {}, True),  # (a late dim-0 group: 4 and 4)
        ({}, dict(npu_compute_scale=tuple((r, 1.5) for r in range(4))), True),
        (
            dict(npu_delay_ns=((3, 5_000.0),)),
            {},
            False,
        ),  # (a class of 1 sends to one of 3, 3 to 4: every NPU)
    ],
)
def test_packet_by_classes_where_every_weight_is_one(monkeypatch, simulated, config, spec, by_classes):
    """Training under packet: by classes where classes are all of one size, else every NPU; both every NPU's row."""
    wl, topo = (
        parse_workload(str(TEXT / "MLP_HybridParallel_Data_Model.txt")),
        parse_topology("SW(4,100,500,direct)_SW(2,50,300,direct)"),
    )
    settings, run_config = TrainingSpec(chunks=2, **spec), RunConfig(network="packet", **config)

    def run():
        return model_training(wl, topo, "themis", settings, run_config)

    fast = run()
    assert (simulated[-1] < topo.npus) == by_classes
    same_fields(fast, every_npu(monkeypatch, run))


def test_the_estimate_counts_the_classes_that_will_run(simulated):
    """`planner.estimate` prices the NPUs the classes run where they apply: the classes a run starts with."""
    topo = parse_topology("SW(8,100,500,direct)_SW(16,50,1000,direct)_SW(8,50,1000,direct)")
    late = dict(npu_delay_ns=((5, 1e3),))
    by_rule = {
        rule: planner.plan(planner.Run(topo, RunConfig(network=rule, **late), planner.TRAINING))
        for rule in ("fair", "packet")
    }
    (fair_s, fair_why), (packet_s, packet_why) = (planner.estimate(p, 4480) for p in by_rule.values())
    assert "1024 NPUs as 8 classes x 4,480 chunk steps" in fair_why and "1024 NPUs x 4,480" in packet_why
    assert fair_s < packet_s / 100  # (8 NPUs against 1024, each dearer the more share the links)
    small = parse_topology("SW(8,100,500,direct)_SW(2,50,1000,direct)")
    config = RunConfig(network="fair", **late)
    model_collective(small, Collective("all_reduce", 1 << 16, "float32", 2, (0, 1)), "baseline", config)
    assert simulated == [expected_npus(small, config, {})] == [4]  # (NPU 5, its dim-0 others, the rest's 2)


def test_a_pipelined_simai_file_by_classes_equals_every_npu(monkeypatch, simulated, tmp_path):
    """A SimAI file with PP 4 (`SimaiTraces.kind`: its stage) under packet: one rank per stage, field by field."""
    from test_simai import write

    wl = parse_simai(str(write(tmp_path, 4, 4)))
    layout = place_groups(wl.tp, wl.ep, wl.dp, wl.pp, parse_topology("SW(8,360,500)_SW(2,48.5,1000)"))
    graph = Graph(wl.path, SimaiTraces(wl, layout))  # type: ignore[arg-type]
    fast = gpt(graph, layout.topology, "packet")
    assert simulated[-1] == 4
    same_fields(fast, every_npu(monkeypatch, lambda: gpt(graph, layout.topology, "packet")))


def test_a_lazy_trace_list_ends_at_its_ranks():
    """`list()` and iteration of a generated model's traces stop at its NPUs (they never ended: no IndexError)."""
    graph, topology = llm_graph("SW(2,100,500)_SW(2,50,1000)_SW(2,50,1000)", tp=2, pp=2, dp=2, global_batch=4)
    traces = graph.traces
    built = list(itertools.islice(iter(traces), len(traces) + 1))  # (one past the end: it stops before)
    assert len(built) == len(traces) == topology.npus == 8
    assert [t.path for t in built] == [traces[r].path for r in range(8)]
    with pytest.raises(IndexError):
        traces[8]


def test_the_estimate_says_it_is_a_bound_where_classes_by_state_may_run():
    """Every NPU's links expected under fair (hd around a late NPU): an upper bound, classes by state may run.

    Under packet (no classes by state) and where the equitable classes already run, no such words.
    """
    late = dict(npu_delay_ns=((5, 1e3),))
    hd, direct = parse_topology("SW(8,100,500,hd)_SW(4,50,1000,hd)"), parse_topology("SW(8,100,500,direct)")
    bound = ", at most: classes by state may run fewer NPUs"

    def why(topo, rule: str) -> str:
        run = planner.Run(topo, RunConfig(network=rule, **late), planner.TRAINING)
        return planner.estimate(planner.plan(run), 100)[1]

    assert why(hd, "fair").endswith(f"32 NPUs x 100 chunk steps{bound})")
    assert bound not in why(hd, "packet") and bound not in why(direct, "fair")
