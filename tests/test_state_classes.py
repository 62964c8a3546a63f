"""Classes by state (`timing.classes`, issue 43): NPUs proven alike in the run, each class run once.

Every case compares with every NPU's run, field by field; the classes are forced (`by_state` in
place of `by_classes`) so that the checks run even where the equitable classes would apply.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_classes import TEXT, every_npu, random_case, same_fields

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.run.collective import model_collective
from themis_mpi.run.training import model_training
from themis_mpi.timing import planner
from themis_mpi.timing.classes import Split, StatePlan, check_end, refined, start_colours, state_classes
from themis_mpi.timing.world import World, by_state
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec


def forced(monkeypatch, simulated: list[int]) -> None:
    """Runs by classes by state in place of `by_classes` (every NPU where they give up), counting NPUs run."""
    init = World.__init__

    def counted(self, *args, classes=None, **kwargs):
        simulated.append(args[0].npus if classes is None else classes.count)
        init(self, *args, classes=classes, **kwargs)

    def by_state_only(topology, config, kinds, body, rounds=16, keep=None):
        return by_state(topology, config, kinds, body, keep=keep)

    monkeypatch.setattr(World, "__init__", counted)
    monkeypatch.setattr(planner, "by_classes", by_state_only)


@pytest.mark.parametrize("seed", range(40))
def test_state_classes_give_every_npus_collective(monkeypatch, seed):
    """Random topologies (hd, ring, direct), a late NPU and a slow link, Themis and baseline: every NPU's fields."""
    topo, config, coll, policy = random_case(seed)
    simulated: list[int] = []
    with monkeypatch.context() as m:
        forced(m, simulated)
        fast, _ = model_collective(topo, coll, policy, config)
    plain, _ = every_npu(monkeypatch, lambda: model_collective(topo, coll, policy, config))
    same_fields(fast, plain)
    assert simulated and simulated[-1] <= topo.npus


@pytest.mark.parametrize(
    "workload,topo_spec,config,spec",
    [
        ("MLP_HybridParallel_Data_Model.txt", "SW(8,100,500,hd)_SW(2,50,300,hd)", {}, dict(npu_compute_scale=((5, 1.5),))),
        ("MLP_HybridParallel_Model_Data.txt", "SW(4,100,500,hd)_FC(4,50,300,direct)", dict(npu_delay_ns=((3, 5_000.0),)), {}),
        ("DLRM_HybridParallel.txt", "Ring(4,100,500)_SW(4,50,300,hd)", dict(link_scale=((1, 6, 0.5),)), dict(npu_compute_scale=((2, 1.3),))),
        pytest.param("Resnet50_DataParallel.txt", "SW(4,100,500,hd)_SW(2,50,300,ring)_SW(4,25,900,hd)",
                     {}, dict(npu_compute_scale=((5, 1.5),)), marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_state_classes_train_as_every_npu(monkeypatch, workload, topo_spec, config, spec):
    """Training with a slow NPU, a late NPU or a slow link under fair, by classes by state: every NPU's row."""
    wl, topo = parse_workload(str(TEXT / workload)), parse_topology(topo_spec)
    settings, run_config = TrainingSpec(chunks=2, **spec), RunConfig(network="fair", **config)

    def run():
        return model_training(wl, topo, "themis", settings, run_config)

    simulated: list[int] = []
    with monkeypatch.context() as m:
        forced(m, simulated)
        fast = run()
    same_fields(fast, every_npu(monkeypatch, run))


def hd_case(p: int, late: int):
    """An all-reduce by halving-doubling on one Switch dim of p NPUs, NPU `late` late, under fair."""
    topo = parse_topology(f"SW({p},100,500,hd)")
    config = RunConfig(network="fair", npu_delay_ns=((late, 20_000.0),))
    return topo, config, Collective("all_reduce", 1 << 18, "float32", 1, (0,))


def hd_timelines(p: int, s: int) -> list[set[int]]:
    """The closed form of `hd_case`'s timelines: s alone, then classes of 1, 2, 4, ..., p/2 NPUs.

    Halving-doubling sends to the peer p/2, p/4, ..., 1 ahead; the late NPU s holds up, step by
    step, the NPUs it reaches (s + p/2, then s + p/4 and s + 3p/4, ...), the rest not.
    """
    out, reached = [{s}], [s]
    k = p // 2
    while k >= 1:
        new = {(r + k) % p for r in reached}
        out.append(new)
        reached += sorted(new)
        k //= 2
    return out


@pytest.mark.parametrize("p,s", [(16, 5), (32, 0), (64, 9)])
def test_hd_with_a_late_npu_runs_one_npu_per_timeline(monkeypatch, p, s):
    """A late NPU under hd: every NPU apart by structure, log2(p) + 1 timelines in the run; as many run.

    The default path (`by_classes`); the result is every NPU's.
    """
    topo, config, coll = hd_case(p, s)
    simulated: list[int] = []
    by: list[bool] = []
    init = World.__init__

    def counted(self, *args, classes=None, **kwargs):
        simulated.append(args[0].npus if classes is None else classes.count)
        by.append(classes is not None and classes.state)
        init(self, *args, classes=classes, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(World, "__init__", counted)
        fast, _ = model_collective(topo, coll, "baseline", config)
    expected = hd_timelines(p, s)
    assert len(expected) == int(np.log2(p)) + 1 and set().union(*expected) == set(range(p))
    assert simulated[-1] == len(expected) and by[-1]  # (the equitable classes keep every NPU apart here)
    plain, _ = every_npu(monkeypatch, lambda: model_collective(topo, coll, "baseline", config))
    same_fields(fast, plain)


@pytest.mark.parametrize("wrong", ["start", "merged"])
def test_a_planted_wrong_partition_is_caught(monkeypatch, wrong):
    """Classes the run sees apart raise a split, not a wrong answer.

    The start colours (the late NPU's receivers among the rest), or the true timelines with the
    late NPU's first receiver put among the NPUs it never holds up.
    """
    p, s = 16, 5
    topo, config, coll = hd_case(p, s)
    caught: list[Split] = []

    def planted(topology, config, kinds, body, rounds=16, keep=None):
        colour, kind_of = start_colours(topology, config, kinds)
        if wrong == "merged":
            parts = hd_timelines(p, s)
            for i, part in enumerate(parts):
                colour[sorted(part)] = i
            colour[(s + p // 2) % p] = len(parts) - 1
        classes = state_classes(colour, kind_of)
        with pytest.raises(Split) as split:
            World(topology, config, replayable=False, classes=classes, keep=keep).run(body)
        caught.append(split.value)
        return None  # (every NPU runs)

    with monkeypatch.context() as m:
        m.setattr(planner, "by_classes", planted)
        model_collective(topo, coll, "baseline", config)
    (split,) = caught
    ((members, keys),) = split.parts
    assert 1 < len(set(keys.tolist())) and len(keys) == len(members)


def test_packet_keeps_todays_path():
    """Classes by state need a fluid rule: under packet (and store-forward) they refuse, every NPU runs."""
    topo, _, _ = hd_case(8, 0)
    for rule in ("packet", "store-forward"):
        config = RunConfig(network=rule, npu_delay_ns=((0, 20_000.0),))
        assert by_state(topo, config, {}, lambda npu: None) is None


def test_one_instants_splits_all_made():
    """Every class one instant's checks see apart splits at once (`Split.merged`), twice: by both keys."""
    colour = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    first = Split(np.array([0, 1, 2, 3]), np.array([0, 0, 1, 1]), "ends")
    second = Split(np.array([4, 5, 6, 7]), np.array([0, 1, 0, 1]), "rates")
    third = Split(np.array([0, 1, 2, 3]), np.array([0, 1, 0, 1]), "rates")
    out = refined(colour, Split.merged([first, second, third]))
    parts = {frozenset(np.flatnonzero(out == c).tolist()) for c in np.unique(out)}
    assert parts == {frozenset({r}) for r in range(4)} | {frozenset({4, 6}), frozenset({5, 7})}
    assert Split.merged([first]) is first


def test_a_step_end_splits_by_every_members_end():
    """Members ending apart split by each one's end (own transfer or its senders'), all at once."""
    classes = state_classes(np.zeros(4, np.int64), np.zeros(4, np.int64))
    groups = (((1,), np.array([0])), ((2,), np.array([1])), ((3,), np.array([2, 3])))
    plan = StatePlan((), True, groups)
    check_end(classes, 0, plan, 2.0, {1: 5.0, 2: 5.0, 3: 5.0}, 5.0)  # (all end at 5: no split)
    with pytest.raises(Split) as split:
        check_end(classes, 0, plan, 2.0, {1: 5.0, 2: 1.0, 3: 4.0}, 5.0)  # (ends 5, 2, 4)
    ((members, keys),) = split.value.parts
    assert members.tolist() == [0, 1, 2, 3] and keys.tolist() == [2, 0, 1, 1]


def test_a_split_seen_before_a_failure_is_the_outcome():
    """An instant run on past a class seen apart may fail otherwise: the run raises the split."""
    topo, config, _ = hd_case(8, 0)
    colour, kind_of = start_colours(topo, config, {})
    world = World(topo, config, replayable=False, classes=state_classes(colour, kind_of))
    seen = Split(np.arange(1, 8), np.array([0, 0, 0, 1, 1, 1, 1]), "ends")
    world._splits.append(seen)

    def body(transport):
        raise RuntimeError("a state no NPU of the every-NPU run would reach")

    with pytest.raises(Split) as split:
        world.run(body)
    assert split.value is seen
