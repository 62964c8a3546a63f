"""Rules of the training loop (ASTRA-sim 1.0's Workload.cc), checked in closed form on small workloads."""

import pytest
from harness import DATA

from themis_mpi.config import RunConfig
from themis_mpi.cost import AG, RS, CostModel
from themis_mpi.engine import Engine
from themis_mpi.model import ModelTransport
from themis_mpi.run.coordinator import share_orders
from themis_mpi.run.training import model_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingLoop, TrainingSpec, collective_of, distinct_collectives

REFERENCE = DATA / "astra-sim-1.0-text"
MIB = 1 << 20


def run_loop(tmp_path, text, topology):
    """Run one iteration of a workload given as text on the model (1 chunk); returns the loop and the engine."""
    spec, config = TrainingSpec(chunks=1, iterations=1), RunConfig(network="ideal")  # (ideal's closed forms)
    path = tmp_path / "w.txt"
    path.write_text(text)
    wl = parse_workload(str(path))
    topo = wl.fit_topology(parse_topology(topology))
    transport = ModelTransport(topo, config)
    collectives = distinct_collectives(wl, topo, spec)
    schedules = dict(zip(collectives, share_orders(transport, "baseline", collectives)))
    engine = Engine(topo, transport, config)
    loop = TrainingLoop(wl, topo, spec, schedules)
    engine.process(loop.process(engine))
    engine.run()
    return loop, engine


def stage_ns(topology, op, size_bytes, dim=0):
    """One stage's time on the model (float32 elements)."""
    return CostModel(parse_topology(topology), 4).stage_end_ns(dim, op, size_bytes // 4, 0.0)


def test_transformer_backward_overlaps_the_input_gradient_collective_with_weight_gradient_compute(tmp_path):
    """Transformer: ig compute, ig collective in the background, wg compute, wg collective, then wait for ig."""
    topo = "SW(2,100,0)_SW(2,100,0)"
    ig_ns = stage_ns(topo, RS, 8 * MIB) + stage_ns(topo, AG, 8 * MIB)  # all-reduce on dim 0 (model)
    wg_compute = 2 * ig_ns
    text = f"HYBRID_TRANSFORMER model_parallel_NPU_group: 2\n1\nl0 -1 100 NONE 0 50 ALLREDUCE {8 * MIB} {wg_compute} ALLREDUCE {MIB} 0\n"
    loop, engine = run_loop(tmp_path, text, topo)
    ig, wg = engine.collectives
    assert ig.collective.dims == (0,) and wg.collective.dims == (1,)
    assert ig.issued_ns == 150  # right after the input-gradient compute, for layer 0 too
    assert ig.end_ns == pytest.approx(150 + ig_ns)  # ran while the weight gradient was computed
    assert wg.issued_ns == 150 + wg_compute and ig.end_ns < wg.issued_ns
    assert loop.compute_ns == 150 + wg_compute


def test_hybrid_layers_but_the_first_issue_input_gradient_collectives(tmp_path):
    """HYBRID_DATA_MODEL: layer 0 computes its input gradient but issues no collective for it (ASTRA-sim's index > 0)."""
    layer = f"-1 10 NONE 0 20 ALLREDUCE {MIB} 30 ALLREDUCE {MIB} 0"
    text = f"HYBRID_DATA_MODEL\n2\nl0 {layer}\nl1 {layer}\n"
    loop, engine = run_loop(tmp_path, text, "SW(2,100,0)_SW(2,100,0)")
    phases = sorted((run.issued_ns, run.collective.dims) for run in engine.collectives)
    assert len(phases) == 3  # ig of l1, wg of l1, wg of l0
    assert loop.compute_ns == 2 * (10 + 20 + 30)


def test_data_parallel_backward_computes_weight_then_input_gradient_and_layer_0_has_none(tmp_path):
    """DATA: wg compute, wg collective in the background, ig compute; layer 0 has no ig compute."""
    text = f"DATA\n2\nl0 -1 10 NONE 0 20 NONE 0 30 ALLREDUCE {MIB} 0\nl1 -1 10 NONE 0 20 NONE 0 30 ALLREDUCE {MIB} 0\n"
    loop, engine = run_loop(tmp_path, text, "SW(4,100,0)")
    assert [run.issued_ns for run in engine.collectives] == [20 + 30, 20 + 30 + 20 + 30]
    assert loop.compute_ns == 10 + 10 + 30 + 20 + 30


def test_update_time_follows_every_collective_of_a_layer(tmp_path):
    """A forward collective counts as finished the layer's update time after its last chunk."""
    topo = "SW(4,100,0)"
    fwd_ns = stage_ns(topo, RS, MIB) + stage_ns(topo, AG, MIB)
    text = f"MODEL\n2\nl0 -1 10 ALLREDUCE {MIB} 0 NONE 0 0 NONE 0 500\nl1 -1 10 NONE 0 0 NONE 0 0 NONE 0 0\n"
    loop, engine = run_loop(tmp_path, text, topo)
    (fwd,) = engine.collectives
    assert fwd.end_ns == pytest.approx(10 + fwd_ns)
    assert engine.now_ns == pytest.approx(10 + fwd_ns + 500 + 10)  # l1 starts after the update


def test_an_all_gather_in_a_workload_file_gives_the_per_npu_input(tmp_path):
    """ALLGATHER bytes are each NPU's input: the collective's output is that times the group."""
    path = tmp_path / "ag.txt"
    path.write_text(f"MODEL\n1\nl0 -1 1 ALLGATHER {MIB} 0 NONE 0 0 NONE 0 0\n")
    wl = parse_workload(str(path))
    topo = parse_topology("SW(4,100,0)_SW(2,100,0)")
    coll = collective_of(wl, wl.layers[0], "fwd", topo, TrainingSpec())
    assert coll.op == "all_gather" and coll.size_bytes == 8 * MIB


def test_a_transformer_group_smaller_than_dim_0_splits_it():
    """Group 4 on 16x8x8: dim 0 becomes 4x4, each part with the dim's kind, bandwidth and latency."""
    wl = parse_workload(str(REFERENCE / "Transformer_HybridParallel.txt"))
    topo = parse_topology("3D-SW_SW_SW_hetero")
    fitted = wl.fit_topology(topo)
    assert fitted.shape == (4, 4, 8, 8) and fitted.npus == topo.npus
    assert fitted.dims[0] == fitted.dims[1] and fitted.dims[0].bandwidth_gbps == 200
    assert fitted.dims[2:] == topo.dims[1:]
    assert wl.dims(wl.layers[1], "fwd", fitted) == (0,) and wl.dims(wl.layers[1], "wg", fitted) == (1, 2, 3)


def test_the_astra_sim_transformer_runs_on_the_paper_topology_and_hides_input_gradient_collectives():
    """HYBRID_TRANSFORMER, group 4, on 3D-SW_SW_SW_hetero: exposed communication is less than its ig+fwd time."""
    wl = parse_workload(str(REFERENCE / "Transformer_HybridParallel.txt"))
    result = model_training(wl, parse_topology("3D-SW_SW_SW_hetero"), "themis", TrainingSpec(iterations=1))
    assert result.collectives > 0 and result.exposed_comm_us >= 0
    assert result.iteration_us == pytest.approx(result.compute_us + result.exposed_comm_us)
    model_busy_us = result.dims[0].busy_us  # the model-parallel collectives (fwd, ig) run on dim 0
    assert result.exposed_comm_us < model_busy_us


def test_dlrm_issues_the_embedding_all_to_all_in_both_passes(tmp_path):
    """DLRM: the forward all-to-all overlaps the bottom MLP; the backward one follows the first top layer's ig."""
    wl = parse_workload(str(REFERENCE / "DLRM_HybridParallel.txt"))
    result = model_training(
        wl, parse_topology("Ring(2,100,20)_SW(2,50,700)"), "baseline", TrainingSpec(chunks=4, iterations=2)
    )
    wg = sum(1 for layer in wl.layers if layer.wg.op)
    assert result.collectives == 2 * (
        2 + wg
    )  # per iteration: forward and backward all-to-all, every wg all-reduce


def test_activation_recompute_runs_the_forward_from_the_checkpoint_up_to_the_initiating_layer():
    """Checkpoints 2 and 11, initiators 10 and 19: the backward recomputes layers 2..9 and 11..18."""
    wl = parse_workload(str(REFERENCE / "Transformer_HybridParallel_Fwd_In_Bckwd.txt"))
    result = model_training(
        wl,
        parse_topology("Ring(2,100,20)_FC(2,100,700)_SW(2,50,700)"),
        "baseline",
        TrainingSpec(iterations=1),
    )
    recomputed = [*range(2, 10), *range(11, 19)]
    want_ns = sum(layer.fwd.compute_ns + layer.ig.compute_ns + layer.wg.compute_ns for layer in wl.layers)
    want_ns += sum(wl.layers[i].fwd.compute_ns for i in recomputed)
    assert result.compute_us * 1e3 == pytest.approx(want_ns)


def test_astra_sim_compat_spends_one_cycle_per_loop_step(tmp_path):
    """With compat astra-sim-1.0 every step of the loop takes one ns (ASTRA-sim's register_event(..., 1))."""
    text = "DATA\n2\nl0 -1 10 NONE 0 20 NONE 0 30 NONE 0 0\nl1 -1 10 NONE 0 20 NONE 0 30 NONE 0 0\n"
    plain, _ = run_loop(tmp_path, text, "SW(2,100,0)")
    path = tmp_path / "w.txt"
    compat = model_training(
        parse_workload(str(path)),
        parse_topology("SW(2,100,0)"),
        "baseline",
        TrainingSpec(iterations=1),
        RunConfig(compat="astra-sim-1.0"),
    )
    # forward: 2 steps; backward: l1 wg, l1 ig, l0 wg -> 3 steps
    assert compat.total_us * 1e3 == pytest.approx(plain.compute_ns + 5)
