"""Memory of generated pipelines on every NPU's links (issue 43): one graph and one plan per kind.

A generated LLM's ranks of one pipeline stage run one graph whose peers sit at the same rank
offsets (`workloads.llm.LazyTraces.kind`), so every NPU's links build and plan one graph per
kind (a slow NPU's is a kind of its own) and every NPU runs its kind's plan shifted to it
(`chakra.Plan.shifted`); the row equals the one where every rank builds and plans its own.
"""

from __future__ import annotations

import re

import harness
import pytest
from test_classes import every_npu
from test_classes_messages import llm_graph
from test_progress import GPT

from themis_mpi.cli.options import expect_lines
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.run import priced, training
from themis_mpi.timing import planner
from themis_mpi.topology import parse_topology
from themis_mpi.workloads import chakra, llm
from themis_mpi.workloads.training import TrainingSpec

TOPO = "SW(4,100,500)_SW(2,50,700)_Ring(4,25,1000)"  # TP 4 x DP 2 x PP 4: 32 NPUs
SHAPE = dict(tp=4, dp=2, pp=4, global_batch=8, schedule="1f1b")
SLOW = 5


def run_counted(monkeypatch, own_plans: bool) -> tuple[dict, list[int], list[chakra.GraphReplay], object]:
    """The LLM with NPU 5 at 1.5x under packet on every NPU's links: its row, the ranks built, the replays.

    `own_plans`: every rank builds and plans its own graph (as before kinds shared them).
    """
    built: list[int] = []
    replays: list[chakra.GraphReplay] = []
    rank_graph, replay_init = llm.rank_graph, chakra.GraphReplay.__init__

    def counted_graph(c, layout, rank, drop=frozenset()):
        built.append(rank)
        return rank_graph(c, layout, rank, drop)

    def kept_replay(self, *args, **kwargs):
        replay_init(self, *args, **kwargs)
        replays.append(self)

    with monkeypatch.context() as m:
        m.setattr(llm, "_BUILT", {})  # (no graph built by another test)
        m.setattr(llm, "rank_graph", counted_graph)
        m.setattr(chakra.GraphReplay, "__init__", kept_replay)
        if own_plans:
            m.setattr(training, "kind_firsts", lambda kinds, npus: {})
        graph, topo = llm_graph(TOPO, peak_tflops=5.0, **SHAPE)
        spec = TrainingSpec(2, npu_compute_scale=((SLOW, 1.5),))
        transport = ModelTransport(topo, RunConfig(network="packet"))
        row = every_npu(monkeypatch, lambda: training.run_graph(transport, graph, "baseline", spec)).to_dict()
    for key in ("wall_s", "decision_s"):
        row.pop(key)
    return row, built, replays, graph


def test_every_npus_links_hold_one_graph_and_one_plan_per_kind_and_the_same_row(monkeypatch):
    """32 NPUs, PP 4, a slow NPU: graphs built and plans held number the kinds (4 stages + the slow NPU)."""
    row, built, replays, graph = run_counted(monkeypatch, own_plans=False)
    kinds = {graph.traces.kind(r) for r in range(32)}
    assert len(kinds) == 4
    assert len(replays) == 32  # (every NPU ran: a lone slow NPU under packet)
    assert sorted(set(built)) == sorted({0, 8, 16, 24, SLOW})  # (each stage's first rank, and the slow one)
    assert len(graph.traces._made) == len(kinds) + 1
    plans = {id(replay.plan.ops) for replay in replays}
    assert len(plans) == len(kinds) + 1
    assert sum(replay.plan.shift != 0 for replay in replays) == 32 - len(plans)

    own_row, own_built, own_replays, own_graph = run_counted(monkeypatch, own_plans=True)
    assert sorted(set(own_built)) == list(range(32)) and len(own_graph.traces._made) == 32
    assert len({id(replay.plan.ops) for replay in own_replays}) == 32
    assert row == own_row


@pytest.mark.parametrize("rank", [0, 5, 13, 31])
def test_a_shifted_plan_is_the_ranks_own_plan_but_for_its_ops_identity(rank):
    """A kind's first rank's plan moved to another rank of the kind: the same peers and routes as its own."""
    graph, topo = llm_graph(TOPO, peak_tflops=5.0, **SHAPE)
    spec = TrainingSpec(2)
    first = training.kind_firsts(training.graph_kinds(graph, True, spec) or {}, topo.npus)[rank]
    shared = chakra.plan_graph(graph.trace(first), topo, first, spec).shifted(rank)
    own = chakra.plan_graph(graph.trace(rank), topo, rank, spec)
    assert shared.rank == rank and shared.compute_ns == own.compute_ns
    moved = [
        (op.kind, op.peer + shared.shift, chakra.message_path(topo, rank, op.peer + shared.shift), op.tag)
        for op in shared.ops
        if op.kind in (chakra.SEND, chakra.RECV)
    ]
    assert moved == [
        (op.kind, op.peer, op.path, op.tag) for op in own.ops if op.kind in (chakra.SEND, chakra.RECV)
    ]
    assert moved  # (a pipeline: messages)


# --- the planner's memory estimate ---------------------------------------------------------------


def expected_gb(topo_spec: str, nodes: int) -> float:
    """The GB figure of the line a generated pipeline with a slow NPU under packet prints first."""
    topo = parse_topology(topo_spec)
    timing = planner.plan(
        planner.Run(
            topo, RunConfig(network="packet"), planner.GRAPH, messages=True, per_rank=True, slow_compute=True
        )
    )
    assert timing.simulator == planner.WORLD
    (line,) = expect_lines(
        timing, [100_000], TrainingSpec(2, npu_compute_scale=((SLOW, 1.5),)), nodes, 5 * nodes
    )
    figure = re.fullmatch(r"# expect ~[\d.]+ \w+, ~([\d.]+) GB: .*", line)
    assert figure, line
    return float(figure[1])


def test_the_expect_line_gives_the_peak_memory_and_it_grows_with_npus_and_nodes(monkeypatch):
    """Every NPU runs its graph: more NPUs, or more nodes per NPU, more memory in the line."""
    monkeypatch.setenv("THEMIS_MPI_EXPECT_S", "0")
    small, big = expected_gb("4x4x4", 10_000), expected_gb("16x8x8", 10_000)
    assert small < big and expected_gb("16x8x8", 1_000) < big
    per_npu = (big - small) * 1e9 / (1024 - 64)
    assert per_npu == pytest.approx(
        planner.NPU_BYTES + 10_000 * planner.NODE_NPU_BYTES, rel=0.02
    )  # (printed: 2 digits)


def test_a_run_expected_beyond_the_machines_memory_is_refused_before_it_starts(monkeypatch):
    """On a machine the test pretends has 100 MB, a straggler run of a generated LLM: one line, exit 2."""
    started: list = []
    run_graph = priced.run_graph

    def counted(*args, **kwargs):
        started.append(args)
        return run_graph(*args, **kwargs)

    monkeypatch.setattr(priced, "run_graph", counted)
    gpt = [*GPT, "--npu-compute-scale", "5=1.5"]  # (a small pipeline on 8 NPUs)
    assert harness.in_process(gpt + ["-q", "-p", "baseline"]).returncode == 0 and started  # (it fits here)
    started.clear()
    monkeypatch.setattr(planner, "machine_bytes", lambda: 100 * 10**6)
    out = harness.in_process(gpt + ["-q", "-p", "baseline"])
    assert out.returncode == 2 and not started and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert (
        "this machine has 0.1 GB" in line
        and "a smaller shape, fewer chunks, no straggler, or --network ideal" in line
    )
