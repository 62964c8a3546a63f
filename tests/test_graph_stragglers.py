"""Stragglers in Chakra graphs (issue 43): a slow, late or badly linked NPU in a pipeline.

Under a sharing rule a graph with stragglers runs on every NPU's links, by classes where they
are proven (a slow NPU's kind is its own: `run.training.graph_kinds`): the class-reduced run
equals the every-NPU run field by field; closed forms (every NPU slowed alike is the
``--compute-scale`` run; a slow last pipeline stage delays the iteration by at least its extra
compute); per-rank files run every NPU; the emulator on 8 ranks replays the model's run; under
``ideal`` the one line that says which rules take it.
"""

from __future__ import annotations

import random

import pytest
from harness import DATA, cli, in_process
from test_classes import every_npu, same_fields
from test_classes_messages import llm_graph, random_llm, simulated  # noqa: F401 (a fixture)
from test_llm import rows

from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.run.training import run_graph
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import load_graph, plan_graph
from themis_mpi.workloads.llm import LlmConfig, write_llm
from themis_mpi.workloads.training import TrainingSpec

ET_DIR = DATA / "astra-sim-chakra-et" / "all_reduce"


def run(graph, topo, rule: str, policy: str = "baseline", config=None, **spec):
    """One iteration of the graphs on the model under a rule, with stragglers in `config` and `spec`."""
    settings = RunConfig(network=rule, **(config or {}))
    return run_graph(ModelTransport(topo, settings), graph, policy, TrainingSpec(2, **spec))


def stragglers(seed: int, npus: int, dims: int) -> tuple[dict, dict]:
    """A slow NPU at 1.2x to 2x, and at random a late NPU and one NPU's links in a dim at 0.5x."""
    rng = random.Random(seed)
    spec = dict(npu_compute_scale=((rng.randrange(npus), rng.choice((1.2, 1.5, 2.0))),))
    config: dict = {}
    if rng.random() < 0.5:
        config["npu_delay_ns"] = ((rng.randrange(npus), float(rng.choice((2_000, 20_000)))),)
    if rng.random() < 0.5:
        config["link_scale"] = ((rng.randrange(dims), rng.randrange(npus), 0.5),)
    return config, spec


@pytest.mark.parametrize("rule", ["packet", "fair"])
@pytest.mark.parametrize("seed", range(5))
def test_a_straggler_in_a_generated_llm_by_classes_equals_every_npu(monkeypatch, simulated, seed, rule):  # noqa: F811
    """Random small LLMs (16-64 NPUs, PP 2-4) with a slow NPU (a late one, a slow link): classes give every NPU's row."""
    topo_spec, shape = random_llm(100 + seed)
    graph, topo = llm_graph(topo_spec, peak_tflops=5.0, **shape)
    config, spec = stragglers(seed, topo.npus, len(topo.dims))
    policy = random.Random(seed).choice(("baseline", "themis"))
    fast = run(graph, topo, rule, policy, config, **spec)
    plain = every_npu(monkeypatch, lambda: run(graph, topo, rule, policy, config, **spec))
    assert simulated[-1] == topo.npus
    same_fields(fast, plain)
    healthy = run(graph, topo, rule, policy)
    assert fast.iteration_us >= healthy.iteration_us  # (a straggler never speeds the iteration)


def test_a_slow_npu_is_a_class_of_its_own_under_fair(monkeypatch, simulated):  # noqa: F811
    """TP4 x PP4 x DP2 on direct dims, NPU 29 at 1.5x under fair: a class of its own, its stage's others apart by it.

    Fewer NPUs than every NPU run, more than a class per pipeline stage, and every NPU's row.
    """
    graph, topo = llm_graph("SW(4,100,500,direct)_SW(2,50,1000,direct)_SW(4,50,800,direct)", tp=4, pp=4, dp=2,
                            global_batch=8, peak_tflops=5.0)  # fmt: skip
    fast = run(graph, topo, "fair", npu_compute_scale=((29, 1.5),))
    assert 4 < simulated[-1] < topo.npus
    same_fields(
        fast, every_npu(monkeypatch, lambda: run(graph, topo, "fair", npu_compute_scale=((29, 1.5),)))
    )


@pytest.mark.parametrize("rule", ["packet", "fair"])
def test_every_npu_slowed_alike_is_the_compute_scale_run(rule):
    """Every NPU at 1.5x (``--npu-compute-scale`` on each) is exactly ``--compute-scale 1.5``: the same graphs, times."""
    graph, topo = llm_graph("SW(4,100,500)_SW(2,50,1000)_SW(4,50,800)", tp=4, pp=4, dp=2, global_batch=8,
                            peak_tflops=5.0)  # fmt: skip
    each = run(graph, topo, rule, npu_compute_scale=tuple((r, 1.5) for r in range(topo.npus)))
    scaled = run(graph, topo, rule, compute_scale=1.5)
    assert each.iteration_us == scaled.iteration_us > run(graph, topo, rule).iteration_us
    same_fields(each, scaled)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("factor", [1.2, 2.0])
def test_a_slow_last_stage_delays_the_iteration_by_its_extra_compute(simulated, schedule, factor):  # noqa: F811
    """PP 2 x DP 2, compute-bound: the last stage's NPU at F delays the iteration by at least (F - 1) x its compute.

    The bound: with messages far shorter than a micro-batch's compute and equal stages, the last
    stage never idles between the arrival of its first forward and its last backward (under
    GPipe stage 0's forwards arrive one stage time apart, as fast as stage 1 takes them, and its
    backwards follow its own forwards; under 1F1B the forward it needs next was sent before the
    backward it just ran came back). So healthy, that span is its compute C. Slowed, its
    compute nodes run one at a time (one GPU) and take F x C, and the first arrival does not
    move (upstream forwards are not slowed) nor does what follows its last backward take less
    (stage 0's last backward, the DP all-reduce): the iteration grows by at least (F - 1) x C.
    Under packet the slow NPU's class of 1 beside classes of 2 runs every NPU (`Inexact`).
    """
    graph, topo = llm_graph(
        "SW(2,400,500)_SW(2,400,500)", pp=2, dp=2, global_batch=8, schedule=schedule, peak_tflops=1.0
    )
    last = next(r for r in range(topo.npus) if graph.traces.kind(r) == 1)  # (a rank of pipeline stage 1)
    compute_ns = plan_graph(graph.trace(last), topo, last, TrainingSpec(2)).compute_ns
    healthy = run(graph, topo, "packet")
    slow = run(graph, topo, "packet", npu_compute_scale=((last, factor),))
    assert simulated[-1] == topo.npus  # (classes of 1 and 3 under packet: every NPU)
    assert slow.iteration_us * 1e3 >= healthy.iteration_us * 1e3 + (factor - 1) * compute_ns * (1 - 1e-9)
    assert slow.max_compute_us == pytest.approx(factor * compute_ns / 1e3)


@pytest.mark.parametrize("rule", ["packet", "fair", "store-forward"])
def test_per_rank_et_files_with_a_straggler_run_every_npu(simulated, rule):  # noqa: F811
    """ASTRA-sim's per-rank all-reduce files (8 NPUs) with a late NPU and a slow link: every NPU, and never faster."""
    graph = load_graph(str(ET_DIR / "8npus_1MB" / "all_reduce"))
    topo = parse_topology("SW(4,100,500)_SW(2,50,1000)")
    healthy = run(graph, topo, rule)
    late = run(graph, topo, rule, config=dict(npu_delay_ns=((5, 20_000.0),), link_scale=((1, 2, 0.5),)))
    assert simulated == [topo.npus, topo.npus]  # (files do not say their kinds: every NPU)
    assert late.iteration_us >= healthy.iteration_us + 20.0  # (the all-reduce needs NPU 5, 20 us late)


def test_a_straggler_in_a_graph_under_ideal_is_one_line_exit_2(tmp_path):
    """``--network ideal`` with a slow NPU in a graph: exit 2, the one line that says which rules take it.

    A compat (ideal's rules) says it too, with its own flag to drop.
    """
    prefix = str(tmp_path / "gpt")
    write_llm(LlmConfig(layers=2, hidden=64, heads=4, seq=32, vocab=100, micro_batch=1, global_batch=2, pp=2),
              parse_topology("SW(2,100,500)"), prefix)  # fmt: skip
    args = [
        "train",
        prefix,
        "-t",
        "SW(2,100,500)",
        "-c",
        "2",
        *"--npu-compute-scale 1=1.5 --network ideal".split(),
    ]
    proc = in_process(args)
    said = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(said) == 1, proc.stderr
    assert said[0].endswith(
        "stragglers in graphs run under a sharing rule (packet, fair, store-forward): drop --network ideal"
    )
    files = load_graph(str(ET_DIR / "8npus_1MB" / "all_reduce"))
    with pytest.raises(UsageError, match=r"store-forward\): drop --compat astra-sim-1.0$"):
        run_graph(ModelTransport(parse_topology("SW(4,100,500)_SW(2,50,1000)"), RunConfig(compat="astra-sim-1.0")),
                  files, "baseline", TrainingSpec(2, npu_compute_scale=((3, 2.0),)))  # fmt: skip


@pytest.mark.parametrize(
    "stragglers",
    ["--npu-compute-scale 5=1.5", "--npu-delay-us 5=20 --link-scale 1:2=0.5 --network store-forward"],
)
def test_a_straggler_in_a_generated_llm_on_8_ranks_replays_the_models_run(tmp_path, stragglers):
    """TP2 x PP2 x DP2 with NPU 5 at 1.5x (packet), or late with a slow link (store-forward), mpiexec -n 8: the model's."""
    prefix = str(tmp_path / "gpt")
    write_llm(LlmConfig(layers=8, hidden=64, heads=4, seq=32, vocab=100, micro_batch=2, global_batch=16, tp=2, pp=2,
                        dp=2, peak_tflops=1.0), parse_topology("2x2x2"), prefix)  # fmt: skip
    args = ["train", prefix, "-t", "2x2x2", "-c", "4", *stragglers.split()]
    emu, model = cli(8, args), in_process(args)
    assert emu.returncode == 0 and model.returncode == 0, emu.stderr + model.stderr
    got, want = rows(emu.stdout), rows(model.stdout)
    assert [r[:4] for r in got] == [r[:4] for r in want] and len(got) == 2
    assert all(r[4] == "0" for r in got)
    network = args[args.index("--network") :] if "--network" in args else []
    healthy = rows(in_process([*args[:6], *network]).stdout)
    assert all(float(s[1]) > float(h[1]) for s, h in zip(want, healthy))  # (the straggler is felt)


def test_a_shared_pytorch_graph_with_a_slow_npu_ends_with_it(simulated):  # noqa: F811
    """PyTorch's trace, one graph for every NPU (2x2x2, packet): a slow NPU's compute ends the iteration.

    Alike every NPU at 1.5x is the ``--compute-scale 1.5`` run (one NPU's view); a lone NPU at
    1.5x computes 1.5x its compute and the iteration waits for it. Its dim groups' NPUs fill their
    queues in different orders (graphs agree on no order; their stages match by key), so with one
    active chunk a dim they hold each other's slot: the one line that says so, and with four the
    run (NPU 0's row, the iteration the slow NPU's end).
    """
    graph, topo = load_graph(str(DATA / "chakra-pytorch" / "chakra.0.et.gz")), parse_topology("2x2x2")
    healthy, scaled = run(graph, topo, "packet"), run(graph, topo, "packet", compute_scale=1.5)
    alike = run(graph, topo, "packet", npu_compute_scale=tuple((r, 1.5) for r in range(8)))
    assert simulated == [1] and alike.iteration_us == scaled.iteration_us  # (every NPU alike: one class of 8)
    with pytest.raises(
        UsageError, match="the graph deadlocks on every NPU's links: .* started its stages in"
    ):
        run(graph, topo, "packet", npu_compute_scale=((3, 1.5),))
    slow = run(graph, topo, "packet", config=dict(active_per_dim=4), npu_compute_scale=((3, 1.5),))
    assert slow.max_compute_us == pytest.approx(1.5 * healthy.compute_us)
    assert slow.iteration_us >= 1.5 * healthy.compute_us > healthy.iteration_us


def test_jitter_in_a_graph_runs_every_npu_seeded(simulated):  # noqa: F811
    """``--compute-jitter`` gives each NPU its own pace (every NPU runs); one seed, one row; another seed, another."""
    graph, topo = llm_graph("SW(2,100,500)_SW(2,50,1000)", tp=2, pp=2, dp=1, global_batch=4, peak_tflops=5.0)
    one, again = (run(graph, topo, "fair", compute_jitter=0.3, seed=1) for _ in range(2))
    other = run(graph, topo, "fair", compute_jitter=0.3, seed=2)
    assert simulated == [topo.npus] * 3
    same_fields(one, again)
    assert one.iteration_us != other.iteration_us != run(graph, topo, "fair").iteration_us
