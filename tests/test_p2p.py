"""Every NPU's links under --network fair|store-forward (`npunet.SharedWorld`): point-to-point traffic.

The one-NPU `network.Network` times symmetric collectives; messages and per-rank graphs run on
every NPU's links. Here: both give the same times where NPUs are alike, the closed forms of a
message beside a collective, and emulator == model with messages under both rules.
"""

import pytest

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine
from themis_mpi.model import ModelTransport
from themis_mpi.npunet import SharedWorld
from themis_mpi.policies.base import fixed_schedule
from themis_mpi.topology import parse_topology

SYMMETRIC = [
    "Ring(8,100,20,ring)",
    "SW(8,100,500,hd)",
    "SW(8,100,500,direct)",
    "FC(8,350,500,hd)",
    "Ring(4,100,20,ring)_SW(2,50,700,hd)",
    "Ring(2,100,20,ring)_SW(4,50,500,hd)_SW(2,50,500,ring)_NIC(1+2,46.57)",
    "FC(4,100,50,direct)_SW(2,50,500,ina)",
]


def stage_times(engine: Engine) -> dict:
    """Every stage's (start, end) by its key."""
    return {(r.stage.coll, r.stage.chunk, r.stage.index): (r.start_ns, r.end_ns) for r in engine.records}


@pytest.mark.parametrize("topology", SYMMETRIC)
@pytest.mark.parametrize("rule", ["fair", "store-forward"])
@pytest.mark.parametrize("active", [1, 2, 4])
def test_every_npu_equals_one_npu_where_npus_are_alike(topology, rule, active):
    """Two all-reduces over every dim, 7 chunks: every NPU's stage starts and ends equal the one-NPU network's, to the ns."""
    topo = parse_topology(topology)
    cfg = RunConfig(network=rule, active_per_dim=active)
    dims = tuple(range(len(topo.dims)))
    colls = [
        Collective("all_reduce", (1 << 20) // 4, "float32", 7, dims),
        Collective("all_gather", 1 << 16, "float32", 3, dims[::-1]),
    ]
    schedules = [
        fixed_schedule(colls[0], [list(dims)] * 7, True, "fifo"),
        fixed_schedule(colls[1], [list(dims[::-1])] * 3, False, "fifo"),
    ]

    def play(transport):
        engine = Engine(topo, transport, cfg)
        for coll, schedule in zip(colls, schedules):
            engine.issue(coll, schedule)
        engine.run()
        return engine

    one = stage_times(play(ModelTransport(topo, cfg)))
    every = [stage_times(engine) for engine in SharedWorld(topo, cfg).run(play)]
    assert len(one) > 7 and all(times == one for times in every)
