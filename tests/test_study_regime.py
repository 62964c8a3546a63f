"""Rules of scripts/study_regime.py, on a tiny case: GNMT on a 2-dim topology, two buckets, one speed."""

import json

import pytest
from harness import ROOT, script

from themis_mpi.config import RunConfig
from themis_mpi.policies import inter_names, intra_names
from themis_mpi.run.training import model_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

TOPO = "SW(4,100,700)_SW(4,50,1700)"
WORKLOAD = ROOT / "traces" / "per-layer" / "gnmt.txt"
BUCKETS = [0, 4, 64]  # GNMT's per-layer gradients are all over 4 MiB: 0 and 4 MiB are one plan
SPEED = 4


def load_script():
    """The script as a module (`harness.script`)."""
    return script("study_regime")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study's main path on the tiny case, with fifo and scf only; (module, rows, out folder)."""
    out = tmp_path_factory.mktemp("regime")
    module = load_script()
    argv = ["--traces", str(WORKLOAD.parent), "--workloads", "gnmt", "--topologies", TOPO]
    argv += ["--buckets", ",".join(map(str, BUCKETS)), "--speeds", str(SPEED), "--intra", "fifo,scf"]
    argv += ["--out", str(out), "--jobs", "1", "--resume", str(out / "runs.jsonl")]
    rows = module.main(argv)
    return module, rows, out, argv


def iteration_us(policy, intra, bucket):
    """`model_training`'s iteration time of GNMT on the tiny case, under the study's rule (its `NETWORK`)."""
    wl = parse_workload(str(WORKLOAD))
    spec = TrainingSpec(64, "float32", 2, 1 / SPEED, 1.0, bucket)
    config = RunConfig(intra=intra, network=load_script().NETWORK)
    return model_training(wl, parse_topology(TOPO), policy, spec, config).iteration_us


def test_themis_speedup_is_the_ratio_of_model_training_times(study):
    """Themis's speedup in a cell is baseline/FIFO's `model_training` time over Themis/SCF's."""
    _, rows, *_ = study
    for bucket in (0, 64):
        (row,) = [r for r in rows if r["bucket_mib"] == bucket]
        want = iteration_us("baseline", "fifo", bucket) / iteration_us("themis", "scf", bucket)
        assert row["themis_speedup"] == pytest.approx(want, rel=1e-12)


def test_best_is_the_fastest_pair_and_never_slower_than_themis(study):
    """The best pair is the minimum of every pair's time, so its speedup is at least Themis's."""
    _, rows, *_ = study
    for row in rows:
        assert row["iteration_us"][row["best"]] == min(row["iteration_us"].values())
        assert row["best_speedup"] >= row["themis_speedup"] >= 0
        assert row["best_speedup"] >= row["best64_speedup"] >= row["themis_speedup"]
        assert row["keeps_chunks"][row["best64"]]


def test_every_inter_policy_with_the_chosen_intra_policies_is_tried(study):
    """Each cell times every inter-dim policy of the registry with fifo and scf, and no other intra."""
    _, rows, *_ = study
    want = {f"{p}/{i}" for p in inter_names() for i in ("fifo", "scf")}
    for row in rows:
        assert set(row["iteration_us"]) == want


def test_the_default_pairs_are_every_registry_pair_reference_first(study):
    """Without --intra the pairs are every inter x intra pair of the registry, baseline/fifo first."""
    module, *_ = study
    pairs = module.schedules()
    assert pairs[0] == ("baseline", "fifo")
    assert set(pairs) == {(p, i) for p in inter_names() for i in intra_names()}
    assert len(pairs) == len(set(pairs))


def test_buckets_with_the_same_plan_share_one_run(study):
    """GNMT's 4 MiB buckets hold one gradient each: the cell is the per-layer run, time for time."""
    _, rows, *_ = study
    by_bucket = {r["bucket_mib"]: r for r in rows}
    assert by_bucket[4]["same_run_as_bucket_mib"] == 0
    assert by_bucket[4]["iteration_us"] == by_bucket[0]["iteration_us"]
    assert by_bucket[64]["same_run_as_bucket_mib"] == 64


def test_outputs_are_complete(study):
    """The JSON has one row per bucket and speed; the markdown has every bucket's row; the heat map exists."""
    _, rows, out, _ = study
    doc = json.loads((out / "regime.json").read_text())
    assert [(r["bucket_mib"], r["compute_speed"]) for r in doc] == [(b, SPEED) for b in BUCKETS]
    assert doc == json.loads(json.dumps(rows))
    md = (out / "regime.md").read_text()
    assert "**GNMT** (paper: 1.30x)" in md
    for label in ("per layer", "4 MiB", "64 MiB"):
        assert f"| {label} | " in md
    assert (out / "speedup_gnmt.png").stat().st_size > 1000


def test_resume_takes_the_runs_already_made(study):
    """A second study with the same --resume file runs nothing again and gives the same rows."""
    module, rows, out, argv = study
    runs = (out / "runs.jsonl").read_text().splitlines()
    assert len(runs) == 2 * 2 * len(inter_names())  # two bucket plans x fifo, scf x every inter policy
    assert module.main(argv) == rows
    assert (out / "runs.jsonl").read_text().splitlines() == runs


def test_a_subset_of_the_documented_command_gives_the_shipped_rows(tmp_path):
    """DLRM on one paper topology, the first three buckets, compute 4x: docs/regime/paper's rows, CPU times aside."""
    module = load_script()
    argv = ["--traces", str(WORKLOAD.parent), "--workloads", "dlrm", "--topologies", "3D-SW_SW_SW_hetero"]
    argv += ["--buckets", "0,4,25", "--speeds", "4", "--out", str(tmp_path), "--workers", "1"]
    rows = module.main(argv)
    shipped = json.loads((ROOT / "docs" / "regime" / "paper" / "regime.json").read_text())
    key = ("workload", "topology", "bucket_mib", "compute_speed")
    want = {tuple(r[k] for k in key): {k: v for k, v in r.items() if k != "cpu_s"} for r in shipped}
    assert len(rows) == 3
    for row in json.loads(json.dumps(rows)):
        assert {k: v for k, v in row.items() if k != "cpu_s"} == want[tuple(row[k] for k in key)]
