"""The LLM study's rows against every NPU under its rule (issue 43).

scripts/study_llm.py prices each cell under ``ideal`` by the linked ranks (`run.linked`: rank 0
and its pipeline peers, each collective timed by one NPU's symmetric view), which assumes that a
stage's TP, DP and EP peers start their collectives together. Every NPU in event order
(`timing.greenlets.NpuWorld`) runs each rank's graph, each collective step waiting for the sends
of its peers and each message for its peer's issue: the same rows wherever that assumption holds.
The planner picks the linked ranks for these runs; `forced_every_npu` makes it pick every NPU.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from harness import costly, on_two_cores, script
from test_classes import same_fields
from test_classes_messages import llm_graph, random_llm

from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.run import training
from themis_mpi.run.training import run_graph
from themis_mpi.timing import planner
from themis_mpi.timing.greenlets import NpuWorld
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.llm import fit_groups
from themis_mpi.workloads.training import TrainingSpec

# Two of the study's cells (two models, two topologies, both placement orders), cut from 1024 to
# 16 NPUs: the same model at TP 2 x PP 4 x DP 2 (EP 2 within DP for the MoE), 4 micro-batches, on
# the topology's dims cut to those groups (HGX's with its shared NIC). Each group still spans a dim
# of peers that must start its collectives together, each middle stage receives from one side and
# sends to the other, and 1F1B reaches its steady state (m = p): what the linked ranks assume is
# there to fail. Every NPU of a 1024-NPU cell is about 17 CPU minutes a run, 22 runs a cell
# (docs/llm/study.md); the cut at
# TP 4 (32 NPUs) costs 65 CPU s for both cells, at TP 2 23 s, the same comparisons.
CELLS = {
    "gpt3-175b": (
        "gpt3-175b",
        "SW(2,419.1,700,hd)_SW(2,46.57,1700,hd)_SW(4,46.57,1700,hd)_NIC(1+2,46.57)",
        "tp-dp-pp",
        dict(tp=2, pp=4, dp=2),
    ),
    "mixtral-8x7b": (
        "mixtral-8x7b",
        "Ring(2,250,20,ring)_SW(4,200,700,hd)_SW(2,100,700,hd)",
        "tp-pp-dp",
        dict(tp=2, pp=4, dp=2, ep=2),
    ),
}
MICRO_BATCHES = 4


def forced_every_npu(patch: pytest.MonkeyPatch) -> list[int]:
    """Where the planner picks the linked ranks, every NPU in event order instead; the NPUs of each world run."""
    ran: list[int] = []
    plan = planner.plan

    def every_npu(run: planner.Run) -> planner.Plan:
        chosen = plan(run)
        return replace(chosen, simulator=planner.GREENLETS) if chosen.simulator == planner.LINKED else chosen

    class Counted(NpuWorld):
        def __init__(self, topology, config, **kwargs):
            ran.append(topology.npus)
            super().__init__(topology, config, **kwargs)

    patch.setattr(training, "plan", every_npu)
    patch.setattr(planner, "NpuWorld", Counted)
    return ran


def cell_rows(name: str) -> tuple[dict, dict, list[int]]:
    """A cut cell's study rows by the study's path and by every NPU, and the NPUs each every-NPU run ran."""
    study = script("study_llm")
    model, topology, order, shape = CELLS[name]
    c = replace(study.config_of(model, order), **shape, global_batch=MICRO_BATCHES * shape["dp"])
    layout = fit_groups(c, parse_topology(topology))
    linked = study.priced_rows(c, layout, 4)
    with pytest.MonkeyPatch.context() as patch:
        ran = forced_every_npu(patch)
        every = study.priced_rows(c, layout, 4)
    return linked, every, ran


@pytest.fixture(scope="module")
@costly
def cells() -> dict[str, tuple]:
    """Both cut cells' rows both ways, two at a time (`harness.on_two_cores`)."""
    return dict(zip(CELLS, on_two_cores(cell_rows, list(CELLS))))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CELLS))
def test_a_cut_study_cell_gives_every_npus_rows(cells, name):
    """Each policy's study row (iteration, compute, exposed, TP, PP, DP, EP, bubble) equal both ways, to the ns."""
    linked, every, ran = cells[name]
    study = script("study_llm")
    assert list(linked) == list(every) == [p for p, _ in study.POLICIES]
    assert ran and set(ran) == {16}  # (every run by every NPU of the cut)
    for policy in linked:
        assert every[policy] == linked[policy], policy
    assert linked["baseline"]["iteration_us"] > linked["baseline"]["compute_us"] > 0


@pytest.mark.parametrize("seed", range(6))
def test_a_small_generated_llm_under_ideal_by_every_npu_equals_the_linked_ranks(monkeypatch, seed):
    """Random small LLMs (16-64 NPUs, PP 2-4, 1F1B, GPipe, interleaved) under ideal: one row both ways."""
    topo_spec, shape = random_llm(seed)
    graph, topo = llm_graph(topo_spec, **shape)
    policy = random.Random(seed).choice(("baseline", "themis"))

    def run():
        return run_graph(ModelTransport(topo, RunConfig(network="ideal")), graph, policy, TrainingSpec(2))

    linked = run()
    ran = forced_every_npu(monkeypatch)
    every = run()
    assert ran == [topo.npus]
    same_fields(linked, every, "transport")
