"""Physics on every row (issue 46): no link above its rate but under ``ideal``, no time below its bound.

`results.physics_violation` is the one check; every collective and training result passes it
when it is made (`results.checked`), and `--resume` drops a row read back that fails it. Here:
random topologies with shared ports, every registered rule and both compat modes, late NPUs and
scaled links, active chunks, and training with slow NPUs, each row checked; and a planted row of
each kind is caught.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from test_network import topologies

from themis_mpi.cli.app import main
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.results import BeyondPhysics, checked, physics_violation
from themis_mpi.run.collective import model_collective
from themis_mpi.run.sweep import check_row
from themis_mpi.run.training import model_training
from themis_mpi.timing.rules import rule_names
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

MICRO = (
    "DATA\n2\nconv1 -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 1048576 5\n"
    "fc -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 4194304 5\n"
)
MODES = [("", rule) for rule in rule_names()] + [("astra-sim-1.0", "ideal"), ("astra-sim-2", "store-forward")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=topologies(),
    mode=st.sampled_from(MODES),
    policy=st.sampled_from(["baseline", "themis", "themis-ports"]),
    chunks=st.sampled_from([1, 4, 16]),
    active=st.sampled_from([1, 2, 8]),
    late=st.sampled_from([(), ((1, 2000.0),)]),
    scaled=st.sampled_from([(), ((0, 0, 0.5),), ((0, 1, 4.0),)]),
)
def test_every_collective_row_holds_physics(topo, mode, policy, chunks, active, late, scaled):
    """Each row: no link over its rate unless ideal says so, never below ideal_us otherwise."""
    compat, rule = mode
    coll = Collective("all_reduce", (2 << 20) // 4, "float32", chunks, tuple(range(len(topo.dims))))
    try:
        config = RunConfig(
            intra="scf",
            network=rule,
            compat=compat,
            active_per_dim=active,
            npu_delay_ns=late,
            link_scale=scaled,
        )
        result, _ = model_collective(topo, coll, policy, config)
    except UsageError:  # a combination a path refuses (compat with ports or stragglers, ...)
        reject()
    assert physics_violation(vars(result)) is None
    assert result.beyond_physics is False or rule == "ideal"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("slow", [(), ((3, 1.5),)])
def test_every_training_row_holds_physics(tmp_path, mode, slow):
    """Training on a shared-port topology under each rule and compat, with and without a slow NPU."""
    compat, rule = mode
    path = tmp_path / "micro.txt"
    path.write_text(MICRO)
    spec = TrainingSpec(chunks=4, iterations=2, npu_compute_scale=slow)
    topology = "SW(2,100,700)_SW(2,50,500)_SW(2,25,500)" + ("" if compat else "_NIC(1+2,30)")
    try:
        config = RunConfig(network=rule, compat=compat)
        row = model_training(parse_workload(str(path)), parse_topology(topology), "themis", spec, config)
    except UsageError:
        pytest.skip(f"{compat or rule} refuses a slow NPU")
    assert physics_violation(vars(row)) is None
    assert row.iteration_us >= row.max_compute_us >= row.compute_us


def test_a_planted_row_beyond_physics_is_caught(tmp_path):
    """A sharing rule's row over its links, a time below its bound, an iteration shorter than compute."""
    topo_row = {"network": "fair", "beyond_physics": True, "time_us": 10.0, "ideal_us": 5.0}
    assert "above its rate under --network fair" in physics_violation(topo_row)
    assert physics_violation({**topo_row, "network": "ideal"}) is None  # ideal says so, and may
    below = {"network": "packet", "beyond_physics": False, "time_us": 4.0, "ideal_us": 5.0, "topology": "2x2"}
    assert "below its bound" in physics_violation(below)
    assert physics_violation({**below, "topology": "SW(8,100,0,nccl)"}) is None  # fitted times, not links
    assert physics_violation({**below, "topology": "SW(8,100,0,ina)"}) is None  # the switch reduces
    assert "shorter than the slowest NPU's compute" in physics_violation(
        {"iteration_us": 1.0, "compute_us": 2.0}
    )
    result, _ = model_collective(
        parse_topology("2x2x2"),
        Collective("all_reduce", 1 << 17, "float64", 4, (0, 1, 2)),
        "baseline",
        RunConfig(),
    )
    with pytest.raises(BeyondPhysics, match="below its bound"):
        checked(_Forged({**vars(result), "ideal_us": 2 * result.time_us}))


def test_an_iteration_shorter_than_the_slowest_npus_compute_is_caught(tmp_path):
    """A planted row longer than NPU 0's compute but shorter than the slowest NPU's fails; a real straggler row passes."""
    path = tmp_path / "micro.txt"
    path.write_text(MICRO)
    spec = TrainingSpec(chunks=4, npu_compute_scale=((3, 3.0),))
    row = model_training(parse_workload(str(path)), parse_topology("2x2x2"), "themis", spec, RunConfig())
    assert row.max_compute_us == pytest.approx(3 * row.compute_us, rel=1e-12)  # NPU 3 at 3x
    assert physics_violation(vars(row)) is None and row.iteration_us >= row.max_compute_us
    planted = {**vars(row), "iteration_us": 2 * row.compute_us}  # the old check: above compute_us, passes
    assert planted["iteration_us"] > planted["compute_us"]
    assert "shorter than the slowest NPU's compute" in physics_violation(planted)
    with pytest.raises(BeyondPhysics, match="slowest NPU"):
        checked(_Forged(planted))


def test_resume_drops_a_row_that_beats_physics(tmp_path, capsys):
    """A resumed row whose time is below its bound is dropped and run again, as a fresh row is checked."""
    out = tmp_path / "rows.json"
    argv = ["model", "-t", "2x2x2", "-b", "1M", "-e", "4M", "-f", "4", "-c", "4", "-q", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert check_row(rows[0]) is None
    forged = [{**rows[0], "time_us": rows[0]["ideal_us"] / 2}, *rows[1:]]
    assert "below its bound" in check_row(forged[0])
    out.write_text(json.dumps(forged))
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    assert "dropped 1" in capsys.readouterr().err
    timeless = lambda rs: [{k: v for k, v in r.items() if k not in ("wall_s", "decision_s")} for r in rs]  # noqa: E731
    assert timeless(json.loads(out.read_text())) == timeless(rows)


class _Forged:
    """An object whose fields are given (a result as a bug might have made it)."""

    def __init__(self, fields: dict):
        self.__dict__.update(fields)
