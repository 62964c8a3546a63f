"""Stragglers (``--npu-delay-us``, ``--link-scale``): the per-NPU model, the agreed order and the emulator agree."""

from __future__ import annotations

import json
import random
from collections import deque

import pytest
from harness import DATA, cli_jobs, costly, in_process, on_two_cores

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.run.collective import model_collective, run_collective, symmetric_run
from themis_mpi.run.coordinator import share_schedules
from themis_mpi.run.training import model_training, run_training
from themis_mpi.timing.greenlets import NpuWorld
from themis_mpi.timing.vectors import NpuVectors
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

RING = "Ring(8,100,500)"


def collective(topo, op="all_reduce", count=1 << 20, chunks=8, dims=None):
    """A float32 collective over the given dims (all by default)."""
    return Collective(op, count, "float32", chunks, tuple(range(len(topo.dims))) if dims is None else dims)


def per_npu_end_ns(topo, coll, policy, config) -> list[float]:
    """Each NPU's own last stage end under the per-NPU model."""
    world = NpuWorld(topo, config)
    runs = world.run(lambda npu: run_collective(npu, coll, policy))
    return [max(r.end_ns for r in engine.records) for _, engine in runs]


@pytest.mark.parametrize("rank", [0, 5])
@pytest.mark.parametrize("delay_us", [0.5, 50.0, 2000.0])
def test_a_late_npu_ends_a_ring_all_reduce_that_much_later(rank, delay_us):
    """On one ring every step waits for its neighbour, so one NPU late by d ends the all-reduce d later."""
    topo = parse_topology(RING)
    coll = collective(topo, chunks=4)
    on_time, _ = model_collective(topo, coll, "baseline", RunConfig(network="ideal", intra="fifo"))
    late, _ = model_collective(
        topo,
        coll,
        "baseline",
        RunConfig(network="ideal", intra="fifo", npu_delay_ns=((rank, delay_us * 1e3),)),
    )
    assert late.time_us == pytest.approx(on_time.time_us + delay_us, rel=0, abs=1e-6)


def test_groups_without_the_late_npu_finish_on_time():
    """On 4x2 over dim 0 only, NPU 5's ring (NPUs 4-7) ends d later and the other ring on time."""
    topo = parse_topology("4x2")
    coll = collective(topo, chunks=4, dims=(0,))
    on_time, _ = model_collective(topo, coll, "baseline", RunConfig(network="ideal", intra="fifo"))
    ends = per_npu_end_ns(
        topo, coll, "baseline", RunConfig(network="ideal", intra="fifo", npu_delay_ns=((5, 30_000.0),))
    )
    solo_ns = on_time.time_us * 1e3
    assert ends[:4] == pytest.approx([solo_ns] * 4, rel=0, abs=1e-3)
    assert max(ends[4:]) == pytest.approx(solo_ns + 30_000.0, rel=0, abs=1e-3)
    assert min(ends[4:]) > solo_ns  # every member of the late ring waits for it


@pytest.mark.parametrize(
    "topo_spec,policy,intra,op,network",
    [
        ("4x2", "baseline", "fifo", "all_reduce", "ideal"),
        ("2x2x2", "themis", "scf", "all_reduce", "ideal"),
        ("2x4x2", "themis", "fifo", "all_reduce", "ideal"),
        ("2x2x2", "themisFlex", "rg", "reduce_scatter", "ideal"),
        ("2x2x2", "themis", "lrpf", "all_gather", "ideal"),
        ("2x2x2", "baseline", "fifo", "all_to_all", "ideal"),
        (RING, "baseline", "fifo", "all_reduce", "ideal"),
        ("SW(8,100,700)", "baseline", "fifo", "all_reduce", "ideal"),
        ("2x2x2", "themis", "scf", "all_reduce", "fair"),
        ("SW(4,100,500)_SW(2,50,700)_NIC(0+1,50)", "baseline", "fifo", "all_reduce", "fair"),
        ("SW(8,100,700)", "baseline", "fifo", "all_reduce", "store-forward"),
    ],
)
def test_every_npu_on_time_gives_the_one_npu_models_time(topo_spec, policy, intra, op, network):
    """A delay of 0 runs every NPU (on every NPU's links under sharing): the symmetric model's time, to rounding."""
    topo = parse_topology(topo_spec)
    coll = collective(topo, op=op, chunks=16)
    one, _ = model_collective(topo, coll, policy, RunConfig(intra=intra, network=network))
    late = RunConfig(intra=intra, npu_delay_ns=((0, 0.0),), network=network)
    every, _ = model_collective(topo, coll, policy, late)
    rel = 0.0 if network == "ideal" else 1e-12  # (exact on ideal links; fair sums solo stages ahead)
    assert every.time_us == pytest.approx(one.time_us, rel=rel, abs=0.0)
    assert [d.busy_us for d in every.dims] == pytest.approx([d.busy_us for d in one.dims], rel=rel, abs=0.0)


@pytest.mark.parametrize("chunks", [1, 4])
@pytest.mark.parametrize("size", [1 << 16, 1 << 22])
def test_one_slow_link_on_a_ring_is_as_slow_as_halving_the_dim(chunks, size):
    """Every ring step waits for its slowest link, so NPU 3's links at 0.5x cost what half the dim's bandwidth does."""
    slow, _ = model_collective(
        parse_topology(RING),
        collective(parse_topology(RING), count=size, chunks=chunks),
        "baseline",
        RunConfig(network="ideal", intra="fifo", link_scale=((0, 3, 0.5),)),
    )
    half = parse_topology("Ring(8,50,500)")
    halved, _ = model_collective(
        half,
        collective(half, count=size, chunks=chunks),
        "baseline",
        RunConfig(network="ideal", intra="fifo"),
    )
    assert slow.time_us == pytest.approx(halved.time_us, rel=1e-12)


def test_rings_without_the_slow_link_keep_their_time():
    """On 4x2 over dim 0, NPU 3's ring (NPUs 0-3) runs at the slow link's rate and NPUs 4-7 on time."""
    topo = parse_topology("4x2")
    coll = collective(topo, chunks=4, dims=(0,))
    on_time, _ = model_collective(topo, coll, "baseline", RunConfig(network="ideal", intra="fifo"))
    half = topo.with_overrides(bandwidth_gbps=[topo.dims[0].bandwidth_gbps / 2, None])
    halved, _ = model_collective(half, coll, "baseline", RunConfig(network="ideal", intra="fifo"))
    ends = per_npu_end_ns(
        topo, coll, "baseline", RunConfig(network="ideal", intra="fifo", link_scale=((0, 3, 0.5),))
    )
    assert max(ends[:4]) == pytest.approx(halved.time_us * 1e3, rel=1e-12)
    assert ends[4:] == pytest.approx([on_time.time_us * 1e3] * 4, rel=1e-12)


def every_npu(topo, coll, policy, config):
    """The plain per-NPU path: every NPU's driver and engine (`NpuWorld`), NPU 0's result."""
    return NpuWorld(topo, config).run(lambda npu: run_collective(npu, coll, policy))[0][0]


@pytest.mark.parametrize(
    "topo_spec,policy,intra,op,count,chunks,late,links",
    [
        ("4x2", "baseline", "fifo", "all_reduce", 1 << 16, 4, ((5, 30_000.0),), ()),
        ("2x2x2", "themis", "scf", "all_reduce", 100_003, 7, ((5, 50_000.0), (2, 1_000.0)), ((1, 3, 0.5),)),
        ("2x4x2", "themisFlex", "rg", "all_reduce", 1 << 18, 16, ((0, 5_000.0),), ((0, 6, 0.25),)),
        ("2x2x2", "themis", "lrpf", "all_gather", 100_003, 8, ((7, 20_000.0),), ()),
        ("2x2x2", "baseline", "fifo", "reduce_scatter", 1 << 16, 8, (), ((2, 4, 0.5), (0, 4, 2.0))),
        ("2x2x2", "baseline", "fifo", "all_to_all", 1 << 16, 4, ((3, 10_000.0),), ()),
        ("SW(8,100,700)", "baseline", "fifo", "all_reduce", 7, 3, ((4, 7_000.0),), ((0, 1, 0.3),)),
        (RING, "baseline", "fifo", "all_reduce", 1 << 20, 2, (), ((0, 3, 0.5),)),
    ],
)
def test_the_vectorised_model_equals_running_every_npu(
    topo_spec, policy, intra, op, count, chunks, late, links
):
    """`model` times stragglers for all NPUs at once (`timing.vectors.NpuVectors`); it must equal running every NPU exactly."""
    topo = parse_topology(topo_spec)
    coll = collective(topo, op=op, count=count, chunks=chunks)
    config = RunConfig(network="ideal", intra=intra, npu_delay_ns=late, link_scale=links)
    fast, _ = model_collective(topo, coll, policy, config)
    plain = every_npu(topo, coll, policy, config)
    assert fast.time_us == plain.time_us
    assert [d.busy_us for d in fast.dims] == [d.busy_us for d in plain.dims]
    (schedule,), _ = share_schedules(ModelTransport(topo, config), policy, [coll])
    even, _ = symmetric_run(topo, config, coll, schedule)
    vectors = NpuVectors(topo, config)
    engine = Engine(topo, vectors, config)
    engine.agree(even.start_order())
    engine.now_ns = vectors.issue_ns
    engine.issue(coll, schedule, False)
    engine.run()
    _, last_ns = vectors.span_ns(engine)
    plain_ends = per_npu_end_ns(topo, coll, policy, config)
    assert vectors.npu_end_ns.tolist() == plain_ends
    assert last_ns == max(plain_ends)


@pytest.mark.parametrize(
    "config,message",
    [
        (dict(npu_delay_ns=((1, 1.0), (1, 2.0))), "names a rank twice"),
        (dict(npu_delay_ns=((1, -1.0),)), "between 0 and"),
        (dict(npu_delay_ns=((1, 1.0),), compat="astra-sim-1.0"), "has identical NPUs"),
        (dict(npu_delay_ns=((1, 1.0),), active_per_dim=2), "one active chunk"),
        (dict(link_scale=((0, 1, 0.5), (0, 1, 0.7))), "names a link twice"),
        (dict(link_scale=((0, 1, 0.0),)), "between"),
        (dict(link_scale=((0, 1, 0.5),), network="fair", active_per_dim=2), "one active chunk"),
    ],
)
def test_bad_late_npu_settings_are_refused(config, message):
    """Settings a late NPU cannot run under are refused with one clear message."""
    with pytest.raises(UsageError, match=message):
        RunConfig(**config)


def test_a_late_rank_outside_the_topology_is_refused():
    """A late NPU must exist: rank 8 on an 8-NPU topology is an error, not a silent no-op."""
    topo = parse_topology("4x2")
    transport = ModelTransport(topo, RunConfig(npu_delay_ns=((8, 1.0),)))
    with pytest.raises(UsageError, match="names rank 8"):
        run_collective(transport, collective(topo), "baseline")


def test_a_scaled_link_outside_the_topology_is_refused():
    """``--link-scale 2:0=0.5`` on a 2-dim topology names no link: an error, not a no-op."""
    topo = parse_topology("4x2")
    transport = ModelTransport(topo, RunConfig(link_scale=((2, 0, 0.5),)))
    with pytest.raises(UsageError, match="names dim 2 of rank 0"):
        run_collective(transport, collective(topo), "baseline")


@pytest.mark.parametrize(
    "flag,value", [("--npu-delay-us", "5"), ("--link-scale", "3=0.5"), ("--link-scale", "0:3")]
)
def test_the_cli_refuses_a_malformed_straggler_in_one_line(flag, value):
    """A malformed ``--npu-delay-us`` or ``--link-scale`` exits 2 with one line naming the flag."""
    proc = in_process(["model", "-t", "4x2", flag, value, "-b", "1M"])
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and flag in proc.stderr


STRAGGLING = [
    ["-t", "2x2x2", "--npu-delay-us", "5=50", "-p", "themis", "--intra", "scf", "-c", "64"],
    ["-t", "4x2", "--npu-delay-us", "5=20,2=3.5", "-p", "baseline", "--dims", "0", "-c", "4"],
    ["-t", "2x2x2", "--link-scale", "0:3=0.5,2:6=0.25", "-p", "themis", "--intra", "scf", "-c", "16"],
    ["-t", "SW(8,100,700)", "--link-scale", "0:1=0.3", "--npu-delay-us", "4=7", "-p", "baseline"],
]


@pytest.mark.parametrize("args", STRAGGLING)
def test_the_emulator_with_stragglers_moves_exact_data_in_the_models_time(tmp_path, straggler_runs, args):
    """On 8 ranks a run with a late NPU or a slow link ends, reduces exactly (#wrong 0) in the per-NPU model's time."""
    assert emulator_rows_equal_the_models(tmp_path, args, straggler_runs) == 2


def sweep_args(args: list[str]) -> list[str]:
    """`args` over 256K to 1M, quietly."""
    return [*args, "-b", "256K", "-e", "1M", "-f", "4", "-q"]


@pytest.fixture(scope="module")
def straggler_runs(tmp_path_factory):
    """The emulator's runs of this module, in one mpiexec (`harness.cli_jobs`): keyed by their args.

    Both straggler sweeps' cases (`STRAGGLING`, `SHARED_STRAGGLING`), the training with stragglers,
    jitter and p3 under each rule (key ``("train", network)``) and the wall-clock run (``("wall",)``).
    """
    tmp = tmp_path_factory.mktemp("stragglers")
    cases = [*STRAGGLING, *([*a, "--network", n] for n in SHARED_NETWORKS for a in SHARED_STRAGGLING)]
    files = {tuple(a): tmp / f"{i}.json" for i, a in enumerate(cases)}
    runs = {
        k: (8, ["run", *sweep_args(list(k)), "-n", "1", "-w", "0", "--json", str(f)])
        for k, f in files.items()
    }
    others = {("train", n): training_with_stragglers(n) for n in ("ideal", "fair")}
    others[("wall",)] = WALL_CLOCK_RUN
    for key, args in others.items():
        files[key] = tmp / f"{'-'.join(key)}.json"
        runs[key] = (8, [*args, "--json", str(files[key])])
    done = cli_jobs(runs, tmp)
    return {k: (done[k], f) for k, f in files.items()}


def emulator_rows_equal_the_models(tmp_path, args, runs: dict) -> int:
    """`args` (256K to 1M) on 8 ranks (its run in `runs`) and on the model: every row #wrong 0 in the model's time; the row count."""
    common = sweep_args(args)
    emu, emu_json = runs[tuple(args)]
    assert emu.returncode == 0, emu.stderr[-2000:]
    model = in_process(["model", *common, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr[-2000:]
    emu_rows = json.loads(emu_json.read_text())
    model_rows = json.loads((tmp_path / "model.json").read_text())
    assert len(emu_rows) == len(model_rows)
    for e, m in zip(emu_rows, model_rows):
        assert e["wrong"] == 0
        assert e["time_us"] == m["time_us"]
    return len(emu_rows)


# --- training --------------------------------------------------------------------------------

TEXT = DATA / "astra-sim-1.0-text"


def train(workload, topo_spec, policy="themis", config=None, **spec):
    """One training run on the model (every NPU when the settings make NPUs differ)."""
    spec.setdefault("chunks", 4)
    return model_training(
        parse_workload(str(TEXT / workload)),
        parse_topology(topo_spec),
        policy,
        TrainingSpec(**spec),
        config or RunConfig(network="ideal"),
    )


def train_every_npu(workload, topo_spec, policy="themis", config=None, **spec):
    """The plain per-NPU path of `train`: every NPU's driver and engine (`NpuWorld`), NPU 0's row."""
    spec.setdefault("chunks", 4)
    wl, topo, config = (
        parse_workload(str(TEXT / workload)),
        parse_topology(topo_spec),
        config or RunConfig(network="ideal"),
    )
    return NpuWorld(topo, config).run(lambda npu: run_training(npu, wl, policy, TrainingSpec(**spec)))[0]


@pytest.mark.parametrize(
    "workload,topo_spec,config,spec",
    [
        ("Resnet50_DataParallel.txt", "2x2x2", dict(npu_delay_ns=((3, 5_000.0),)), {}),
        ("Resnet50_DataParallel.txt", "4x2", dict(comm_scheduler="p3", intra="scf"), dict(npu_compute_scale=((5, 1.5),), chunks=8)),
        ("Transformer_HybridParallel.txt", "2x2x2", dict(link_scale=((0, 1, 0.5),)), dict(compute_jitter=0.1)),
        ("DLRM_HybridParallel.txt", "Ring(4,100,500)_FC(4,50,300)", dict(npu_delay_ns=((3, 2_000.0),)), dict(npu_compute_scale=((2, 1.3),))),
        ("sample_per_layer_parallel_HybridCustomized.txt", "Ring(4,100,500)_FC(4,50,300)",
         dict(npu_delay_ns=((3, 2_000.0),), link_scale=((0, 1, 0.5),)), dict(npu_compute_scale=((2, 1.3),), compute_jitter=0.1)),
        ("MLP_HybridParallel_Model_Data.txt", "2x4", dict(comm_scheduler="tictac"), dict(npu_compute_scale=((7, 2.0),), iterations=2)),
    ],
)  # fmt: skip
@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_training_on_every_npu_at_once_equals_running_every_npu(workload, topo_spec, config, spec, policy):
    """`model` trains stragglers with vector times (`timing.vectors.NpuVectors`); every field equals running every NPU's engine."""
    fast = train(workload, topo_spec, policy, RunConfig(network="ideal", **config), **spec).to_dict()
    plain = train_every_npu(
        workload, topo_spec, policy, RunConfig(network="ideal", **config), **spec
    ).to_dict()
    assert fast.pop("transport") == "model" and plain.pop("transport") == "npus"
    for key in ("wall_s", "decision_s"):
        fast.pop(key), plain.pop(key)
    assert fast == plain


@pytest.mark.parametrize("network", ["ideal", "fair", "store-forward"])
def test_a_late_npu_ends_a_one_layer_training_update_included_that_much_later(tmp_path, network):
    """One layer, one ring all-reduce, then an update: NPU 2 late by d ends the run exactly d later."""
    path = tmp_path / "one.txt"
    path.write_text("DATA\n1\nfc -1 1000 NONE 0 0 NONE 0 2000 ALLREDUCE 1048576 30000\n")
    wl, topo = parse_workload(str(path)), parse_topology(RING)
    for iterations in (1, 2):
        spec = TrainingSpec(chunks=2, iterations=iterations)
        on_time = model_training(wl, topo, "baseline", spec, RunConfig(network=network))
        late = model_training(
            wl, topo, "baseline", spec, RunConfig(npu_delay_ns=((2, 7_000.0),), network=network)
        )
        ring_us = on_time.dims[0].busy_us / iterations
        assert on_time.total_us == pytest.approx(iterations * (1.0 + 2.0 + ring_us + 30.0), rel=1e-12)
        assert late.total_us == pytest.approx(on_time.total_us + 7.0, rel=1e-12)


@pytest.mark.parametrize(
    "workload,topo_spec,scheduler,network",
    [
        ("Resnet50_DataParallel.txt", "2x2x2", "", "ideal"),
        ("Resnet50_DataParallel.txt", "4x2", "p3", "ideal"),
        ("Transformer_HybridParallel.txt", "2x2x2", "", "ideal"),
        ("DLRM_HybridParallel.txt", "2x2x2", "tictac", "ideal"),
        ("Resnet50_DataParallel.txt", "2x2x2", "", "fair"),
        ("Transformer_HybridParallel.txt", "Ring(4,100,500)_SW(2,50,700)", "p3", "fair"),
        ("DLRM_HybridParallel.txt", "2x2x2", "", "store-forward"),
    ],
)
def test_every_npu_on_time_trains_in_the_one_npu_models_time(workload, topo_spec, scheduler, network):
    """Training on the per-NPU model (every NPU's links under sharing) with nobody late is the one-NPU model's."""
    one = train(workload, topo_spec, config=RunConfig(comm_scheduler=scheduler, network=network))
    late = RunConfig(comm_scheduler=scheduler, npu_delay_ns=((0, 0.0),), network=network)
    every = train(workload, topo_spec, config=late)
    assert every.iteration_us == pytest.approx(one.iteration_us, rel=1e-12)
    assert [d.busy_us for d in every.dims] == pytest.approx([d.busy_us for d in one.dims], rel=1e-12)


@pytest.mark.parametrize("network", ["ideal", "fair"])
def test_every_npu_slowed_alike_is_the_compute_scale_what_if(network):
    """``--npu-compute-scale`` naming every NPU with F equals ``--compute-scale F`` on the one-NPU model."""
    config = RunConfig(network=network)
    every = tuple((r, 1.5) for r in range(8))
    slowed = train("Resnet50_DataParallel.txt", "2x2x2", config=config, npu_compute_scale=every)
    scaled = train("Resnet50_DataParallel.txt", "2x2x2", config=config, compute_scale=1.5)
    assert slowed.iteration_us == pytest.approx(scaled.iteration_us, rel=1e-12)


@pytest.mark.parametrize("policy", ["baseline", "themis"])
def test_a_slower_straggler_never_ends_training_sooner(policy):
    """With the stage order agreed, times only grow with one NPU's compute factor (1, 1.1, 1.5, 2)."""
    times = [train("Resnet50_DataParallel.txt", "2x2x2", policy).iteration_us]
    for factor in (1.1, 1.5, 2.0):
        one = train("Resnet50_DataParallel.txt", "2x2x2", policy, npu_compute_scale=((3, factor),))
        assert one.iteration_us >= times[-1]
        times.append(one.iteration_us)
    assert times[-1] > times[0]


def test_compute_jitter_is_seeded_and_has_mean_one():
    """The same seed gives the same run and another seed another; the factors average 1."""
    a = train("Resnet50_DataParallel.txt", "2x2x2", compute_jitter=0.2, seed=1)
    b = train("Resnet50_DataParallel.txt", "2x2x2", compute_jitter=0.2, seed=1)
    c = train("Resnet50_DataParallel.txt", "2x2x2", compute_jitter=0.2, seed=2)
    assert a.iteration_us == b.iteration_us != c.iteration_us
    draws = TrainingSpec(compute_jitter=0.2, seed=1).jitter(3)
    factors = [next(draws) for _ in range(100_000)]
    assert sum(factors) / len(factors) == pytest.approx(1.0, abs=0.005)
    assert min(factors) > 0


def test_stragglers_are_refused_on_chakra_graphs_under_ideal():
    """Under ``ideal`` a Chakra graph replay refuses stragglers with one line instead of ignoring them.

    Under a sharing rule they run (tests/test_graph_stragglers.py).
    """
    proc = in_process(
        [
            "train",
            str(DATA / "astra-sim-chakra-et/all_reduce/8npus_1MB/all_reduce"),
            "-t",
            "2x2x2",
            "--npu-compute-scale",
            "1=2",
            "--network",
            "ideal",
        ]
    )
    assert proc.returncode == 2 and "stragglers in graphs run under a sharing rule" in proc.stderr


def training_with_stragglers(network: str) -> list[str]:
    """`train` of Resnet50 on 2x2x2 with a straggler, jitter, a late NPU, a slow link and p3."""
    return [
        "train",
        "--network",
        network,
        str(TEXT / "Resnet50_DataParallel.txt"),
        "-t",
        "2x2x2",
        "-p",
        "themis",
        "-c",
        "8",
        "--comm-scheduler",
        "p3",
        "--npu-compute-scale",
        "3=1.5",
        "--compute-jitter",
        "lognormal:0.1",
        "--seed",
        "1",
        "--npu-delay-us",
        "5=50",
        "--link-scale",
        "1:2=0.5",
    ]


@pytest.mark.parametrize("network", ["ideal", "fair"])
def test_the_emulator_trains_with_stragglers_jitter_and_p3_in_the_models_time(
    tmp_path, straggler_runs, network
):
    """On 8 ranks a straggler, jitter, a late NPU and p3 train with #wrong 0 in the per-NPU model's time."""
    args = training_with_stragglers(network)
    emu, emu_json = straggler_runs[("train", network)]
    assert emu.returncode == 0, emu.stderr[-2000:]
    model = in_process([*args, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr[-2000:]
    (e,), (m,) = (json.loads(f.read_text()) for f in (emu_json, tmp_path / "model.json"))
    assert e["wrong"] == 0
    assert e["iteration_us"] == m["iteration_us"]
    alike = train("Resnet50_DataParallel.txt", "2x2x2", config=RunConfig(network=network), chunks=8)
    assert e["iteration_us"] > alike.iteration_us


WALL_CLOCK_RUN = ["run", "-t", "2x2x2", "-b", "64K", "-c", "4", "-p", "baseline", "--clock", "wall"]
WALL_CLOCK_RUN += ["--time-scale", "10", "--npu-delay-us", "5=2000", "-n", "1", "-w", "0", "-q"]


def test_a_late_npu_really_waits_under_the_wall_clock(straggler_runs):
    """Under ``--clock wall`` the late rank holds its steps until their deadlines: the run takes at least its delay."""
    proc, out = straggler_runs[("wall",)]
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["wrong"] == 0
    assert row["time_us"] >= 2000.0


class _AnyOrder(deque):
    """A ready queue that hands out a random NPU: another legal order of running them."""

    def __init__(self, seed: int):
        super().__init__()
        self.rng = random.Random(seed)

    def popleft(self):
        i = self.rng.randrange(len(self))
        self.rotate(-i)
        value = super().popleft()
        self.rotate(i)
        return value


ORDER_SETTINGS = dict(npu_compute_scale=((3, 1.5),), compute_jitter=0.2, seed=4, chunks=8)
ORDER_CONFIG = RunConfig(network="ideal", npu_delay_ns=((6, 20_000.0),), link_scale=((1, 2, 0.5),))


def ordered_run(seed: int | None):
    """The training with stragglers, its NPUs run in the world's own order (None) or in a random one (`_AnyOrder`)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        if seed is not None:
            init = NpuWorld.__init__

            def any_order(self, *args, **kwargs):
                init(self, *args, **kwargs)
                self.ready = _AnyOrder(seed)

            monkeypatch.setattr(NpuWorld, "__init__", any_order)
        return train_every_npu("Resnet50_DataParallel.txt", "2x2x2", config=ORDER_CONFIG, **ORDER_SETTINGS)


ORDER_SEEDS = [1, 2, 3]


@pytest.fixture(scope="module")
@costly
def orders(request) -> dict:
    """The world's own order (key None, once for every seed) and the selected seeds' runs, two at a time (`harness.on_two_cores`)."""
    test = "test_training_with_stragglers_does_not_depend_on_the_order_npus_run_in[{}]"
    names = {item.name for item in request.session.items if item.module is request.module}
    seeds = [None, *(seed for seed in ORDER_SEEDS if test.format(seed) in names)]
    return dict(zip(seeds, on_two_cores(ordered_run, seeds)))


@pytest.mark.parametrize("seed", ORDER_SEEDS)
def test_training_with_stragglers_does_not_depend_on_the_order_npus_run_in(orders, seed):
    """Times follow from the data alone: running the NPUs in a random order gives the same iteration."""
    shuffled, in_order = orders[seed], orders[None]
    assert shuffled.iteration_us == in_order.iteration_us
    assert [d.busy_us for d in shuffled.dims] == [d.busy_us for d in in_order.dims]


def test_stragglers_are_refused_on_nccl_dims():
    """The NCCL-like model times a collective as one flat algorithm: a late NPU there is refused in one line."""
    topo = parse_topology("SW(8,400,600,nccl)")
    transport = ModelTransport(topo, RunConfig(npu_delay_ns=((1, 5_000.0),)))
    with pytest.raises(UsageError, match="not on nccl dims"):
        run_collective(transport, Collective("all_reduce", 1 << 16, "float32", 1, (0,)), "baseline")


# --- under a sharing rule: every NPU's links -------------------------------------------------

SHARED_TOPOLOGIES = [
    "Ring(8,100,500,ring)",
    "SW(8,100,500,ring)",
    "FC(4,100,500,direct)",
    "Ring(4,100,500)_SW(2,50,700)",
]


@pytest.mark.parametrize("network", ["fair", "store-forward"])
@pytest.mark.parametrize("topo_spec", SHARED_TOPOLOGIES)
def test_a_late_npu_under_sharing_ends_the_all_reduce_that_much_later(topo_spec, network):
    """On every NPU's links, NPU 3 late by 50 us ends an all-reduce exactly 50 us later (its peers wait for it)."""
    topo = parse_topology(topo_spec)
    coll = collective(topo, count=1 << 20, chunks=4)
    on_time, _ = model_collective(topo, coll, "baseline", RunConfig(network=network))
    late, _ = model_collective(
        topo, coll, "baseline", RunConfig(network=network, npu_delay_ns=((3, 50_000.0),))
    )
    assert late.time_us == pytest.approx(on_time.time_us + 50.0, rel=1e-12)


@pytest.mark.parametrize("topo_spec", SHARED_TOPOLOGIES)
def test_one_slow_npu_link_under_fair_is_as_slow_as_halving_its_dim(topo_spec):
    """Under fair, NPU 3's dim-0 links at half rate give the all-reduce's time on dim 0 at half bandwidth."""
    topo = parse_topology(topo_spec)
    coll = collective(topo, count=1 << 20, chunks=4)
    slow, _ = model_collective(topo, coll, "baseline", RunConfig(network="fair", link_scale=((0, 3, 0.5),)))
    half = parse_topology(topo_spec.replace("100,", "50,", 1))
    halved, _ = model_collective(half, coll, "baseline", RunConfig(network="fair"))
    assert slow.time_us == pytest.approx(halved.time_us, rel=1e-9)
    assert max(link.busy_pct for link in slow.links) <= 100 * (1 + 1e-9)


SHARED_NETWORKS = ["fair", "store-forward"]
SHARED_STRAGGLING = [
    [
        "-t",
        "2x2x2",
        "--npu-delay-us",
        "5=30",
        "--link-scale",
        "1:2=0.5",
        "-p",
        "baseline,themis",
        "-c",
        "4",
    ],
    [
        "-t",
        "SW(4,100,500)_SW(2,50,700)_NIC(0+1,50)",
        "--link-scale",
        "0:1=0.3",
        "-p",
        "themis",
        "-c",
        "8",
    ],
]


@pytest.mark.parametrize("network", SHARED_NETWORKS)
@pytest.mark.parametrize("args", SHARED_STRAGGLING)
def test_the_emulator_with_stragglers_under_sharing_moves_exact_data_in_the_models_time(
    tmp_path, straggler_runs, args, network
):
    """On 8 ranks, a late NPU or a slow link on every NPU's shared links: #wrong 0 in the model's time."""
    assert emulator_rows_equal_the_models(tmp_path, [*args, "--network", network], straggler_runs) >= 2
