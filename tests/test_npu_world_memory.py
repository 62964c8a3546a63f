"""Every NPU in event order keeps engine records only for the NPUs whose result is read (issue 43)."""

from __future__ import annotations

import test_world_memory

from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine, InFlight
from themis_mpi.timing.greenlets import NpuWorld
from themis_mpi.topology import parse_topology

# a gated scheduler needs event order: the planner picks every NPU in event order (`GREENLETS`)
CONFIG = RunConfig(network="ideal", comm_scheduler="bytescheduler", link_scale=((1, 30, 0.5),))


def train_on_every_npu(monkeypatch, keep_all: bool) -> tuple[dict, list[NpuWorld], list[Engine]]:
    """The 64-NPU training of tests/test_world_memory.py with a slow NPU, under ideal in event order."""
    return test_world_memory.train_on_every_npu(monkeypatch, keep_all, NpuWorld, CONFIG)


def test_a_model_run_keeps_npu_0s_records_only_and_its_row(monkeypatch):
    """Only NPU 0's engine keeps its stage records and finished collectives; the row equals the one keeping all."""
    row, worlds, engines = train_on_every_npu(monkeypatch, keep_all=False)
    (world,) = worlds
    assert world.n == 64 and world.keep == {0}
    assert not world.mail  # (every send time posted was taken)
    by_rank = {
        e.transport.rank: e for e in engines if isinstance(getattr(e.transport, "world", None), NpuWorld)
    }
    assert sorted(by_rank) == list(range(64))
    kept = by_rank[0]
    assert kept.records and len(kept.collectives) > 1 and all(c.stages and c.runs for c in kept.collectives)
    others = [e for rank, e in by_rank.items() if rank]
    assert all(isinstance(e.collectives, InFlight) for e in others)
    assert all(len(e.collectives) == len(kept.collectives) for e in others)  # (as many issued)
    assert not any(e.records or e.collectives.live for e in others)  # (nothing kept once all ended)

    kept_row, kept_worlds, kept_engines = train_on_every_npu(monkeypatch, keep_all=True)
    assert kept_worlds[0].keep is None
    assert all(e.records for e in kept_engines if isinstance(getattr(e.transport, "world", None), NpuWorld))
    assert row == kept_row


def test_a_world_keeping_some_npus_returns_theirs_only():
    """The NPUs not kept return None; the kept ones what they return keeping every NPU."""
    topo = parse_topology("2x2x2")
    config = RunConfig(network="ideal", npu_delay_ns=((5, 1000.0),))

    def body(npu):
        return npu.rank * 10, npu.issue_ns

    every = NpuWorld(topo, config).run(body)
    assert all(every) and every[5] == (50, 1000.0)
    assert NpuWorld(topo, config, keep=[0, 5]).run(body) == [
        r if rank in (0, 5) else None for rank, r in enumerate(every)
    ]
