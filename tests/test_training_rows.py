"""Training rows that explain themselves (issue 45): compute per stage, the slowest NPU, the bubble split.

Closed forms, not figures copied from output: a stage's compute is its layers' FLOPs over the
NPU's rate (`LlmConfig.layer_forward_ns`, the output layer's on the last stage); the ideal bubble
of 1F1B is ``(p-1)/m`` of a stage's compute; the parts of a priced iteration add up to it; a slow
NPU's extra compute is the wait, not exposed communication.
"""

from __future__ import annotations

import pytest

from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.results import flat_row
from themis_mpi.run.priced import layer_activation_bytes, price
from themis_mpi.run.training import model_training, run_graph
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import Graph
from themis_mpi.workloads.llm import PRESETS, LazyTraces, LlmConfig, fit_groups
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

SMALL = dict(layers=8, hidden=512, heads=8, seq=512, vocab=1000, micro_batch=1, global_batch=16)
SPEC = TrainingSpec(chunks=4, iterations=1)


def stage_compute_us(c: LlmConfig) -> list[float]:
    """Each stage's compute per iteration: m micro-batches of L/p layers, forward + backward (3 forwards)."""
    layers = [3 * c.micro_batches * c.layers // c.pp * c.layer_forward_ns] * c.pp
    layers[-1] += 3 * c.micro_batches * c.head_forward_ns
    return [ns / 1e3 for ns in layers]


def gpt_tp2_pp4() -> tuple[LlmConfig, object]:
    c = LlmConfig(**SMALL, tp=2, pp=4)
    return c, fit_groups(c, parse_topology("2x4"))


def test_a_priced_gpt_lists_compute_per_stage_and_splits_the_bubble():
    """TP2 x PP4, 1F1B: compute per stage in closed form; ideal bubble (p-1)/m x compute; the parts add up."""
    c, layout = gpt_tp2_pp4()
    row = price(c, layout, "baseline", RunConfig(), SPEC)
    assert row["stage_compute_us"] == pytest.approx(stage_compute_us(c), rel=1e-12)
    assert row["compute_us"] == pytest.approx(row["stage_compute_us"][0], rel=1e-12)
    assert row["ideal_bubble_us"] == pytest.approx(
        (c.pp - 1) / c.micro_batches * row["compute_us"], rel=1e-12
    )
    assert row["bubble_us"] == pytest.approx(row["ideal_bubble_us"] + row["imbalance_us"], rel=1e-12)
    parts = row["compute_us"] + row["ideal_bubble_us"] + row["imbalance_us"] + row["exposed_us"]
    assert parts == pytest.approx(row["iteration_us"], rel=1e-12)
    assert row["imbalance_us"] > 0  # the last stage's output layer
    # 1F1B: stage s holds min(p - s, m) micro-batches' activations of its L/p layers
    per_layer = layer_activation_bytes(c)
    assert per_layer == 512 * 1 * 512 * (10 + 24 / 2 + 5 * 8 * 512 / (512 * 2))
    assert row["stage_activation_bytes"] == [min(c.pp - s, c.micro_batches) * 2 * per_layer for s in range(4)]


@pytest.mark.parametrize("vocab", [1, 50000])
def test_the_imbalance_is_the_slowest_stages_extra_compute(vocab):
    """1F1B, free network, the last stage heavier by d per micro-batch: bubble = (p-1) t + m d.

    So the imbalance is the last stage's compute minus the first's (m d), up to the messages'
    time on the free network (1 PB/s: 0.5 ns per 512 KiB message, 40 ns over the whole chain).
    """
    c = LlmConfig(**{**SMALL, "vocab": vocab}, tp=2, pp=4)
    row = price(c, fit_groups(c, parse_topology("2x4")), "baseline", RunConfig(), SPEC)
    stages = stage_compute_us(c)
    assert row["imbalance_us"] == pytest.approx(stages[-1] - stages[0], abs=0.04)


def test_the_train_row_of_a_generated_gpt_lists_stages_and_waits_for_the_slowest():
    """The graph's row: compute per stage, the slowest (last) stage's compute, iteration = compute + wait + exposed."""
    c, layout = gpt_tp2_pp4()
    graph = Graph("<gpt>", LazyTraces(c, layout))  # type: ignore[arg-type]
    row = run_graph(ModelTransport(layout.topology, RunConfig()), graph, "baseline", SPEC)
    assert row.stage_compute_us == pytest.approx(stage_compute_us(c), rel=1e-12)
    assert row.max_compute_us == pytest.approx(max(stage_compute_us(c)), rel=1e-12)
    assert row.wait_us == pytest.approx(row.max_compute_us - row.compute_us, rel=1e-12)
    assert row.iteration_us == pytest.approx(row.compute_us + row.wait_us + row.exposed_comm_us, rel=1e-12)
    assert row.to_dict()["stage_compute_us"] == row.stage_compute_us
    flat = flat_row(row.to_dict())  # CSV: a column per stage
    assert [flat[f"stage{s}_compute_us"] for s in range(c.pp)] == row.stage_compute_us


@pytest.mark.parametrize("order", ["tp-dp-pp", "tp-pp-dp"])
def test_the_llm_studys_layout_adds_up(order):
    """The docs/llm run (GPT-3 175B's shape, TP8 x PP8 x DP16 on HGX-H100-SW_SW_SW, ideal), fewer layers and micro-batches."""
    shape = {**PRESETS["gpt3-175b"], "layers": 16, "global_batch": 16 * 16}
    c = LlmConfig(**shape, tp=8, pp=8, dp=16, order=order)
    layout = fit_groups(c, parse_topology("HGX-H100-SW_SW_SW"))
    row = price(c, layout, "baseline", RunConfig(network="ideal"), SPEC)
    assert row["stage_compute_us"] == pytest.approx(stage_compute_us(c), rel=1e-12)
    assert row["ideal_bubble_us"] == pytest.approx(7 / 16 * row["compute_us"], rel=1e-12)
    parts = row["compute_us"] + row["ideal_bubble_us"] + row["imbalance_us"] + row["exposed_us"]
    assert parts == pytest.approx(row["iteration_us"], rel=1e-12)
    assert row["exposed_us"] >= 0 and row["PP"] >= 0


MICRO = (
    "DATA\n2\nconv1 -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 1048576 5\n"
    "fc -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 4194304 5\n"
)


@pytest.mark.parametrize("rule", ["ideal", "fair", "packet"])
def test_a_slow_npus_extra_compute_is_the_wait_not_exposed_communication(tmp_path, rule):
    """NPU 3 at 1.5x: rank 0's compute unchanged, the slowest 1.5x it, the 0.5x the wait."""
    path = tmp_path / "micro.txt"
    path.write_text(MICRO)
    wl, topo, config = parse_workload(str(path)), parse_topology("2x2x2"), RunConfig(network=rule)
    even = model_training(wl, topo, "baseline", TrainingSpec(chunks=4), config)
    slow = model_training(wl, topo, "baseline", TrainingSpec(chunks=4, npu_compute_scale=((3, 1.5),)), config)
    compute_us = 5 * 5000 / 1e3  # two layers' forward, weight and input gradient (layer 0's input: none)
    assert even.compute_us == slow.compute_us == pytest.approx(compute_us, rel=1e-12)
    assert (
        even.max_compute_us == even.compute_us and even.wait_us == 0 and even.stage_compute_us == [compute_us]
    )
    assert slow.max_compute_us == pytest.approx(1.5 * compute_us, rel=1e-12)
    assert slow.wait_us == pytest.approx(0.5 * compute_us, rel=1e-12)
    assert slow.iteration_us == pytest.approx(
        slow.compute_us + slow.wait_us + slow.exposed_comm_us, rel=1e-12
    )
    assert slow.exposed_comm_us == pytest.approx(slow.iteration_us - 1.5 * compute_us, rel=1e-12)


@pytest.mark.parametrize("rule", ["ideal", "fair", "packet"])
def test_a_dims_busy_share_counts_pipeline_messages_under_every_rule(rule):
    """PP4 x DP2, collectives left out: stage 0 sends m activations and receives m gradients on dim 1.

    Its busy share is the busier direction's bytes over one link's rate and the iteration, the same
    definition under every rule (docs/time-model.md#dim-busy-share).
    """
    c = LlmConfig(**SMALL, pp=4, dp=2)
    layout = fit_groups(c, parse_topology("SW(2,100,500)_SW(4,50,1000)"))
    graph = Graph("<pp>", LazyTraces(c, layout, frozenset(("TP", "DP", "EP"))))  # type: ignore[arg-type]
    row = run_graph(ModelTransport(layout.topology, RunConfig(network=rule)), graph, "baseline", SPEC)
    link_bytes_per_us = 50 * 2**30 / 1e6
    busy_bytes = row.dims[1].utilization * row.iteration_us * link_bytes_per_us
    assert busy_bytes == pytest.approx(c.micro_batches * c.activation_bytes, rel=1e-9)
    assert row.dims[0].utilization == 0
