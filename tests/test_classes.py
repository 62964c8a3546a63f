"""NPUs in classes (`timing.classes`): one NPU per class gives every NPU's run, field by field."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from harness import DATA, costly, on_two_cores

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.run.collective import model_collective, run_collective
from themis_mpi.run.training import model_training, run_training
from themis_mpi.timing import planner
from themis_mpi.timing.classes import admitted, npu_classes, pattern_key
from themis_mpi.timing.greenlets import NpuWorld
from themis_mpi.timing.routes import step_planner
from themis_mpi.timing.rules import rule_names
from themis_mpi.timing.world import World, by_classes
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

TEXT = DATA / "astra-sim-1.0-text"
KINDS = {"Ring": ("ring", "direct"), "FC": ("direct", "ring"), "SW": ("direct", "hd", "ring")}


def every_npu(monkeypatch, run):
    """`run()` with classes turned off: every NPU's links, as before classes."""
    with monkeypatch.context() as m:
        m.setattr(planner, "by_classes", lambda *args, **kwargs: None)
        return run()


def same_fields(a, b, *besides: str) -> None:
    """Two results equal in every field but their wall and decision seconds (and `besides`)."""
    one, two = a.to_dict(), b.to_dict()
    for key in ("wall_s", "decision_s", *besides):
        one.pop(key, None), two.pop(key, None)
    assert one == two


def random_case(seed: int):
    """A small topology of mixed dims and algorithms (a shared port at times), a late NPU and a slow link."""
    rng = random.Random(seed)
    dims = []
    for _ in range(rng.choice((2, 3))):
        kind = rng.choice(tuple(KINDS))
        algorithm = rng.choice(KINDS[kind])
        npus = rng.choice((2, 4)) if algorithm == "hd" else rng.choice((2, 3, 4))
        dims.append(f"{kind}({npus},{rng.choice((50, 100, 200))},{rng.choice((300, 500))},{algorithm})")
    port = [f"NIC(1+2,{rng.choice((25, 100))})"] if len(dims) == 3 and rng.random() < 0.5 else []
    topo = parse_topology("_".join(dims + port))
    config = RunConfig(
        network="fair",
        npu_delay_ns=((rng.randrange(topo.npus), float(rng.choice((2_000, 20_000)))),),
        link_scale=((rng.randrange(len(topo.dims)), rng.randrange(topo.npus), rng.choice((0.5, 0.25))),),
    )
    op = rng.choice(("all_reduce", "reduce_scatter", "all_gather", "all_to_all"))
    coll = Collective(
        op, 1 << rng.choice((14, 18)), "float32", rng.choice((1, 4, 8)), tuple(range(len(topo.dims)))
    )
    return topo, config, coll, rng.choice(("baseline", "themis"))


@pytest.mark.parametrize("rule", rule_names())
@pytest.mark.parametrize("seed", range(24))
def test_one_npu_per_class_gives_every_npus_collective(monkeypatch, seed, rule):
    """Random topologies, stragglers and collectives: the class-reduced run equals every NPU's, field by field.

    Under a rule classes do not admit they refuse (every NPU runs, as before); under ``packet``
    they run where every weight is 1, else every NPU runs.
    """
    topo, config, coll, policy = random_case(seed)
    config = RunConfig(network=rule, npu_delay_ns=config.npu_delay_ns, link_scale=config.link_scale)
    if not admitted(rule):
        assert by_classes(topo, config, {}, lambda npu: None) is None
        return
    fast, _ = model_collective(topo, coll, policy, config)
    plain, _ = every_npu(monkeypatch, lambda: model_collective(topo, coll, policy, config))
    same_fields(fast, plain)


@pytest.mark.parametrize(
    "workload,topo_spec,config,spec",
    [
        ("MLP_HybridParallel_Data_Model.txt", "SW(4,100,500,direct)_FC(4,50,300,direct)", dict(npu_delay_ns=((3, 5_000.0),)), {}),
        ("MLP_HybridParallel_Model_Data.txt", "SW(4,100,500,direct)_SW(4,50,300,direct)", {}, dict(npu_compute_scale=((5, 1.5),))),
        ("DLRM_HybridParallel.txt", "Ring(4,100,500)_FC(4,50,300)", dict(link_scale=((1, 6, 0.5),)), dict(npu_compute_scale=((2, 1.3),))),
        pytest.param("Resnet50_DataParallel.txt", "SW(4,100,500,direct)_SW(2,50,300,direct)_SW(4,25,900,direct)_NIC(1+2,20)",
                     {}, dict(npu_compute_scale=((5, 1.5),)), marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_one_npu_per_class_trains_as_every_npu(monkeypatch, workload, topo_spec, config, spec):
    """Training with a slow NPU, a late NPU or a slow link under fair: classes give every NPU's row."""
    wl, topo = parse_workload(str(TEXT / workload)), parse_topology(topo_spec)
    settings, run_config = TrainingSpec(chunks=2, **spec), RunConfig(network="fair", **config)

    def run():
        return model_training(wl, topo, "themis", settings, run_config)

    same_fields(run(), every_npu(monkeypatch, run))


def test_most_random_cases_run_fewer_npus(monkeypatch):
    """The random cases above mostly run by classes (the rest fall back to every NPU, as a one-way ring must)."""
    simulated = []
    init = World.__init__

    def counted(self, *args, classes=None, **kwargs):
        simulated[-1] = args[0].npus if classes is None else classes.count
        init(self, *args, classes=classes, **kwargs)

    monkeypatch.setattr(World, "__init__", counted)
    fewer = 0
    for seed in range(24):
        topo, config, coll, policy = random_case(seed)
        simulated.append(0)
        model_collective(topo, coll, policy, config)
        fewer += 0 < simulated[-1] < topo.npus
    assert fewer >= 12  # (13 of 24 when written)


def test_a_late_npu_on_direct_switches_makes_four_classes():
    """NPU 5 late on SW(8) x SW(4), direct: itself, its two dim groups' others, and the rest."""
    topo = parse_topology("SW(8,100,500,direct)_SW(4,50,300,direct)")
    config = RunConfig(network="fair", npu_delay_ns=((5, 1_000.0),))
    planner_ = step_planner(topo, config.costs(topo)(4))
    patterns = [pattern_key(d, planner_.stage_peers(d, "reduce_scatter", 1 << 12)) for d in range(2)]
    classes = npu_classes(topo, config, {}, patterns)
    assert classes.count == 4 and sorted(classes.sizes.tolist()) == [1, 3, 7, 21]
    assert classes.reps[0] == 0 and classes.rep(5) == 5 and classes.rep(13) == classes.rep(29)
    assert classes.rep(4) == classes.rep(0) and classes.rep(13) != classes.rep(12)


def test_halving_doubling_sets_every_position_apart():
    """One late NPU on halving-doubling dims: every NPU is its own class (every NPU runs)."""
    topo = parse_topology("SW(4,100,500,hd)_SW(4,50,300,hd)")
    config = RunConfig(network="fair", npu_delay_ns=((5, 1_000.0),))
    planner_ = step_planner(topo, config.costs(topo)(4))
    patterns = [
        pattern_key(d, planner_.stage_peers(d, op, 1 << 12))
        for d in range(2)
        for op in ("reduce_scatter", "all_gather")
    ]
    assert npu_classes(topo, config, {}, patterns).count == topo.npus


def test_a_sum_over_npus_counts_every_npu_of_a_class():
    """A meeting's sum weighs each representative by its class: the NPUs' count, not the classes'."""
    topo = parse_topology("SW(8,100,500,direct)_SW(4,50,300,direct)")
    config = RunConfig(network="fair", npu_delay_ns=((5, 1_000.0),))
    classes = npu_classes(topo, config, {}, [])
    world = World(topo, config, replayable=False, classes=classes)
    sums = world.run(lambda npu: float(npu.reduce(np.array([1.0, npu.rank]), "sum")[0]))
    assert [sums[r] for r in classes.reps] == [float(topo.npus)] * classes.count
    assert sum(s is not None for s in sums) == classes.count == 2


# --- the cases on their cuts (issue 43): the fast path equals every NPU's --------------------

CUT = "SW(4,100,500{a})_SW(8,50,1000{a})_SW(16,25,2000{a})"  # (the 8,192-NPU SW(16)_SW(32)_SW(16)'s 512 cut)


def straggling(network: str) -> RunConfig:
    """NPU 5 late by 50 us and NPU 300's dim-1 links at 0.5x, as the benchmark's 8,192-NPU case."""
    return RunConfig(network=network, npu_delay_ns=((5, 50_000.0),), link_scale=((1, 300, 0.5),))


def cut_pairs(algorithm: str) -> list[tuple]:
    """The all-reduce with a late NPU and a slow link on the 512-NPU cut: (fast path, every NPU, fields aside).

    Under ``ideal`` (every NPU vectorised) against every NPU's engine (`greenlets.NpuWorld`);
    with `algorithm` also under ``fair`` by classes against every NPU's links (halving-doubling
    sets every position apart: classes fall back, nothing to compare).
    """
    topo = parse_topology(CUT.format(a=algorithm))
    coll = Collective("all_reduce", 1 << 24, "float32", 16, (0, 1, 2))
    config = straggling("ideal")
    fast, _ = model_collective(topo, coll, "themis", config)
    plain = NpuWorld(topo, config).run(lambda npu: run_collective(npu, coll, "themis"))[0][0]
    pairs = [(fast, plain, ("clock",))]  # (the model's, and the greenlets' virtual one)
    if algorithm:
        config = straggling("fair")
        fast, _ = model_collective(topo, coll, "themis", config)
        with pytest.MonkeyPatch.context() as monkeypatch:
            plain, _ = every_npu(monkeypatch, lambda: model_collective(topo, coll, "themis", config))
        pairs.append((fast, plain, ()))
    return pairs


def gnmt_pairs() -> list[tuple]:
    """GNMT, NPU 5 at 1.5x compute, 16 chunks, on HGX's 64-NPU cut: ideal's fast path and every NPU's engine."""
    topo = parse_topology("SW(8,419.1,700,hd)_SW(4,46.57,1700,hd)_SW(2,46.57,1700,hd)_NIC(1+2,46.57)")
    wl = parse_workload(str(Path(__file__).parents[1] / "traces" / "gnmt.txt"))
    spec, config = TrainingSpec(chunks=16, npu_compute_scale=((5, 1.5),)), RunConfig(network="ideal")
    fast = model_training(wl, topo, "baseline", spec, config)
    plain = NpuWorld(topo, config).run(lambda npu: run_training(npu, wl, "baseline", spec))[0]
    return [(fast, plain, ("transport",))]


CUT_TESTS = {  # test name -> its runs (the longest first: both workers end together)
    "test_the_512_npu_cut_by_its_fast_path_equals_every_npu[,direct]": (cut_pairs, ",direct"),
    "test_the_512_npu_cut_by_its_fast_path_equals_every_npu[]": (cut_pairs, ""),
    "test_gnmt_on_a_64_npu_cut_of_hgx_with_a_slow_npu_equals_every_npu": (gnmt_pairs,),
}


def run_pairs(job: tuple) -> list[tuple]:
    """One `CUT_TESTS` entry's pairs (module-level, for `harness.on_two_cores`)."""
    return job[0](*job[1:])


@pytest.fixture(scope="module")
@costly
def cuts(request) -> dict[str, list[tuple]]:
    """The selected tests' runs of `CUT_TESTS`, two at a time (`harness.on_two_cores`): test name -> pairs."""
    names = {item.name for item in request.session.items if item.module is request.module}
    chosen = [name for name in CUT_TESTS if name in names]
    return dict(zip(chosen, on_two_cores(run_pairs, [CUT_TESTS[name] for name in chosen])))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["", ",direct"])
def test_the_512_npu_cut_by_its_fast_path_equals_every_npu(request, cuts, algorithm):
    """The all-reduce with a late NPU and a slow link on the 512-NPU cut, field by field (`cut_pairs`).

    Under ``ideal`` (every NPU vectorised) against every NPU's engine
    (`greenlets.NpuWorld`); under ``fair`` by classes against every NPU's links.
    """
    pairs = cuts[request.node.name]
    assert len(pairs) == (2 if algorithm else 1)
    for fast, plain, besides in pairs:
        same_fields(fast, plain, *besides)


@pytest.mark.slow
def test_gnmt_on_a_64_npu_cut_of_hgx_with_a_slow_npu_equals_every_npu(request, cuts):
    """GNMT, NPU 5 at 1.5x compute, 16 chunks, on HGX's 64-NPU cut: ideal's fast path equals every NPU's engine."""
    ((fast, plain, besides),) = cuts[request.node.name]
    same_fields(fast, plain, *besides)
