"""Every NPU's links keep per-NPU history and engine records only for the NPUs whose result is read (issue 43)."""

from __future__ import annotations

from harness import DATA

from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine
from themis_mpi.run.training import model_training
from themis_mpi.timing import planner
from themis_mpi.timing.world import World
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

TOPO = "Ring(4,100,500)_FC(4,50,300)_SW(4,80,700)"  # 64 NPUs
CONFIG = RunConfig(network="fair", link_scale=((1, 30, 0.5),))
SPEC = TrainingSpec(chunks=4, npu_compute_scale=((5, 1.5),))


def train_on_every_npu(
    monkeypatch, keep_all: bool, world: type = World, config: RunConfig = CONFIG
) -> tuple[dict, list, list[Engine]]:
    """A 64-NPU training run with a slow NPU on every NPU (`world`, as the planner makes it): its row, worlds, engines.

    Under fair on every NPU's links (`World`, classes switched off: every NPU runs), or under
    ideal in event order (`greenlets.NpuWorld`, with a config that needs it); `keep_all` keeps
    every NPU's records and history.
    """
    worlds: list = []
    engines: list[Engine] = []

    class Recorded(world):
        def __init__(self, *args, **kwargs):
            if keep_all:
                kwargs["keep"] = None
            super().__init__(*args, **kwargs)
            worlds.append(self)

    engine_init = Engine.__init__

    def init(self, *args, **kwargs):
        engine_init(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(planner, world.__name__, Recorded)
    monkeypatch.setattr(planner, "by_classes", lambda *args, **kwargs: None)
    monkeypatch.setattr(Engine, "__init__", init)
    workload = parse_workload(str(DATA / "astra-sim-1.0-text" / "MLP_HybridParallel_Data_Model.txt"))
    row = model_training(workload, parse_topology(TOPO), "baseline", SPEC, config).to_dict()
    for key in ("wall_s", "decision_s"):
        row.pop(key)
    return row, worlds, engines


def test_a_model_run_keeps_npu_0s_records_and_history_only_and_its_row(monkeypatch):
    """Only NPU 0's starts, ends and stage records are kept; the row equals the one with everything kept."""
    row, worlds, engines = train_on_every_npu(monkeypatch, keep_all=False)
    (world,) = worlds
    assert world.n == 64 and world.keep == {0}
    histories = [r for r in range(64) if world.starts[r] or world.ends[r] or any(world.order[r])]
    assert histories == ([0] if world.replayable else [])
    by_rank = {e.transport.rank: e for e in engines if hasattr(e.transport, "world")}
    assert sorted(by_rank) == list(range(64))
    assert by_rank[0].records and all(c.stages for c in by_rank[0].collectives)
    others = [e for rank, e in by_rank.items() if rank]
    assert not any(e.records or any(c.runs or c.stages for c in e.collectives) for e in others)

    kept_row, kept_worlds, _ = train_on_every_npu(monkeypatch, keep_all=True)
    assert kept_worlds[0].keep is None
    assert row == kept_row


def test_a_stall_with_some_npus_kept_still_says_why(monkeypatch):
    """A replayable world keeping NPU 0 only runs again keeping every NPU when it stalls, to name the cause."""
    import test_p2p

    kept: list[World] = []

    class KeepingZero(World):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **({"keep": [0]} | kwargs))
            kept.append(self)

    monkeypatch.setattr(test_p2p, "World", KeepingZero)
    test_p2p.test_npus_that_start_a_dims_stages_in_different_orders_are_named()  # (its match, inside)
    assert [w.keep for w in kept] == [{0}]  # (the second run, a plain World, kept every NPU)
    assert kept[0]._stalled() and not kept[0]._why()  # (alone it says who waits, not why)
