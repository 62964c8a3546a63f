"""Several jobs on one network (`train --job`): solo times, the sharing rule's closed forms, the emulator."""

import json
import subprocess
import sys

import pytest
from harness import DATA, ROOT, cli_jobs, in_process, mpi_env

from themis_mpi.cli.app import main
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.run.jobs import Job, check_jobs, parse_placement, run_jobs
from themis_mpi.run.training import model_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

RESNET = DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt"
NIC = "SW(2,100,0)_SW(2,100,0)_NIC(0+1,100)"  # two dims behind one NIC as fast as each
SIZE_BYTES = 1 << 20


def one_collective(tmp_path, compute_ns: float = 0.0, name: str = "one.txt") -> str:
    """A DATA workload of one layer: `compute_ns` of weight-gradient compute, then a 1 MiB all-reduce."""
    path = tmp_path / name
    path.write_text(f"DATA\n1\nl0\t-1\t0\tNONE\t0\t0\tNONE\t0\t{compute_ns}\tALLREDUCE\t{SIZE_BYTES}\t0\n")
    return str(path)


def jobs_times(topo_spec, placements, path, network="fair", policy="baseline", **spec):
    """Each job's iteration time (us) on the model, the jobs given by their placements."""
    topo = parse_topology(topo_spec)
    spec = TrainingSpec(**{"chunks": 1, "iterations": 1, **spec})
    wl = parse_workload(path) if isinstance(path, str) else None
    jobs = [
        Job(wl or parse_workload(p), parse_placement(text), text)
        for p, text in zip(path if wl is None else [path] * len(placements), placements)
    ]
    check_jobs(jobs, topo, spec)
    result = run_jobs(ModelTransport(topo, RunConfig(network=network)), jobs, policy, spec)
    return [r.iteration_us for r in result.jobs]


def solo_all_reduce_us(topo_spec: str) -> float:
    """The closed form of the 1 MiB all-reduce on a 2-NPU switch dim at latency 0: S/2 out in RS, S/2 in AG."""
    return SIZE_BYTES / parse_topology(topo_spec).dims[0].bandwidth_bytes_per_ns / 1e3


def test_one_job_over_every_dim_trains_as_train_does():
    """A single job with the default placement gives `run_training`'s iteration exactly."""
    for policy in ("baseline", "themis"):
        spec = TrainingSpec(chunks=4, iterations=2)
        wl, topo = parse_workload(str(RESNET)), parse_topology("2x2x2")
        (alone,) = run_jobs(ModelTransport(topo, RunConfig()), [Job(wl)], policy, spec).jobs
        assert alone.iteration_us == model_training(wl, topo, policy, spec).iteration_us


@pytest.mark.parametrize("network", ["fair", "store-forward", "ideal"])
def test_jobs_on_disjoint_npus_that_share_no_port_each_get_their_solo_time(tmp_path, network):
    """Two jobs on the two halves of dim 2 (at=2/0, at=2/1) each train as on their 2-dim topology alone."""
    topo = "SW(2,100,500)_SW(2,50,700)_SW(2,50,700)_NIC(1+2,50)"
    paths = [str(RESNET), one_collective(tmp_path, 20000)]
    both = jobs_times(topo, ["dims=0,1:at=2/0", "dims=0,1:at=2/1"], paths, network, chunks=4, iterations=2)
    sub = parse_topology("SW(2,100,500)_SW(2,50,700)")
    for path, t_us in zip(paths, both):
        alone = model_training(
            parse_workload(path), sub, "baseline", TrainingSpec(chunks=4), RunConfig(network=network)
        )
        assert t_us == alone.iteration_us


def test_two_jobs_behind_one_nic_each_take_twice_their_solo_time_under_fair(tmp_path):
    """Two all-reduces at once on two dims behind one NIC of the dims' rate each get half of it: 2 S/B, solo S/B."""
    path = one_collective(tmp_path)
    t = solo_all_reduce_us(NIC)
    assert jobs_times(NIC, ["dims=0"], path) == pytest.approx([t], rel=1e-12)
    assert jobs_times(NIC, ["dims=0", "dims=1"], path) == pytest.approx([2 * t, 2 * t], rel=1e-12)


def test_two_jobs_behind_one_nic_keep_their_solo_time_under_ideal(tmp_path):
    """Under --network ideal concurrent stages share nothing, so each job keeps S/B."""
    t = solo_all_reduce_us(NIC)
    assert jobs_times(NIC, ["dims=0", "dims=1"], one_collective(tmp_path), "ideal") == pytest.approx(
        [t, t], rel=1e-12
    )


@pytest.mark.parametrize("compute_us", [10.0, 30.0])
def test_interleaved_jobs_get_their_solo_time_and_jobs_issued_together_pay_the_nic(tmp_path, compute_us):
    """Compute C >= T then an all-reduce T: together C + 2T per iteration; the second job half an iteration late, C + T."""
    t = solo_all_reduce_us(NIC)
    path = one_collective(tmp_path, compute_us * 1e3)
    together = jobs_times(NIC, ["dims=0", "dims=1"], path, iterations=3)
    assert together == pytest.approx([compute_us + 2 * t] * 2, rel=1e-12)
    half_us = (compute_us + t) / 2
    apart = jobs_times(NIC, ["dims=0", f"dims=1:delay_us={half_us!r}"], path, iterations=3)
    assert apart == pytest.approx([compute_us + t] * 2, rel=1e-12)


def test_a_jobs_compute_scale_scales_its_compute_alone(tmp_path):
    """compute_scale=2 on one job doubles its compute C (2C + T) and leaves the other at C + T (ideal)."""
    t = solo_all_reduce_us(NIC)
    path = one_collective(tmp_path, 10000)
    times = jobs_times(NIC, ["dims=0:compute_scale=2", "dims=1"], path, "ideal", iterations=2)
    assert times == pytest.approx([20 + t, 10 + t], rel=1e-12)


def test_two_jobs_on_one_dim_queue_there_as_two_collectives_do(tmp_path):
    """Two jobs on the same dim of the same NPUs are allowed: their collectives share its queue, 2T under both rules."""
    t = solo_all_reduce_us(NIC)
    for network in ("fair", "ideal"):
        times = jobs_times(NIC, ["dims=0", "dims=0"], one_collective(tmp_path), network)
        assert max(times) == pytest.approx(2 * t, rel=1e-12)


@pytest.mark.parametrize(
    "jobs,fragment",
    [
        (["A@dims=3"], "has dims 0..2"),
        (["A@dims=0:at=0/1"], "which the job also uses"),
        (["A@dims=0:at=2/5"], "is no slice"),
        (["A@dims=0:at=2/0", "A@dims=1"], "all jobs take at= on one dim"),
        (["A@dims=0:dim=1"], "is not dims=D,D.., at=D/I, delay_us=US or compute_scale=F"),
        (["A@dims=x"], "bad value"),
        (["A@delay_us=-1"], "delay_us"),
        (["A@dims=0:dims=1"], "names a key twice"),
        (["A@compute_scale=-2"], "compute_scale"),
    ],
)
def test_bad_placements_are_refused_in_one_line(tmp_path, capsys, jobs, fragment):
    """A placement the topology cannot take exits 2 with one line naming what is wrong."""
    path = one_collective(tmp_path)
    args = ["train", "-t", "2x2x2", "-c", "1", "-n", "1"]
    for job in jobs:
        args += ["--job", job.replace("A", path, 1)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1


def test_a_workload_that_does_not_fit_its_dims_is_refused(capsys):
    """A transformer whose model-parallel group needs more NPUs than its dims have is refused in one line."""
    path = DATA / "astra-sim-1.0-text" / "Transformer_HybridParallel.txt"
    assert main(["train", "-t", "2x2x2", "--job", f"{path}@dims=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "on its dims [0]: model_parallel_NPU_group 4 does not match" in err and len(err.splitlines()) == 1


def test_workload_and_job_together_are_refused(tmp_path, capsys):
    """WORKLOAD and --job are two ways to name what trains: one at a time."""
    path = one_collective(tmp_path)
    assert main(["train", path, "-t", "2x2x2", "--job", path]) == 2
    assert "not both" in capsys.readouterr().err


EMULATED = [
    (["C@dims=1", "C@dims=2:delay_us=7", "R@dims=0"], "fair", []),
    (["C@dims=0,1:at=2/0", "R@dims=0,1:at=2/1"], "store-forward", []),
    (["C@dims=0,1:compute_scale=0.5", "R@dims=1,2:delay_us=3"], "fair", ["--comm-scheduler", "p3"]),
]


def jobs_args(c: str, jobs: list[str], network: str, extra: list[str]) -> list[str]:
    """A training of `jobs` (C: the collective at path `c`, R: ResNet-50) on the module's 8-NPU topology."""
    args = ["train", "-t", "SW(2,100,500)_SW(2,50,700)_SW(2,50,700)_NIC(1+2,50)", "-c", "4", "-n", "2"]
    args += ["-p", "themis", "--network", network, *extra]
    for job in jobs:
        args += ["--job", job.replace("C", c, 1).replace("R", str(RESNET), 1)]
    return args


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> dict:
    """The emulator's runs of `EMULATED` in one mpiexec (`harness.cli_jobs`): per case, its args, job and rows."""
    tmp = tmp_path_factory.mktemp("jobs")
    c = one_collective(tmp, 20000)
    args = {i: jobs_args(c, *case) for i, case in enumerate(EMULATED)}
    done = cli_jobs({i: (8, [*a, "--json", str(tmp / f"emu{i}.json")]) for i, a in args.items()}, tmp)
    return {i: (a, done[i], tmp / f"emu{i}.json") for i, a in args.items()}


@pytest.mark.parametrize("jobs,network,extra", EMULATED)
def test_the_emulator_runs_jobs_on_8_ranks_in_the_models_time_with_exact_data(
    tmp_path, emulated, jobs, network, extra
):
    """On 8 ranks every rank runs its jobs: #wrong 0 and each job's iteration equals the model's."""
    args, emu, emu_json = emulated[EMULATED.index((jobs, network, extra))]
    assert emu.returncode == 0, emu.stderr[-2000:]
    model = in_process([*args, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr[-2000:]
    (e,), (m,) = (json.loads(f.read_text()) for f in (emu_json, tmp_path / "model.json"))
    assert [j["wrong"] for j in e["jobs"]] == [0] * len(jobs)
    assert [j["iteration_us"] for j in e["jobs"]] == [j["iteration_us"] for j in m["jobs"]]


def test_the_quick_study_rewrites_the_shipped_cells(tmp_path):
    """scripts/study_jobs.py --quick on two workers gives, for its cells, exactly the times shipped in docs/jobs/jobs.json."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "study_jobs.py"), "--quick", "--workers", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    new = json.loads((tmp_path / "jobs.json").read_text())
    shipped = json.loads((ROOT / "docs" / "jobs" / "jobs.json").read_text())
    key = ("pair", "placement", "ratio", "policy")
    by_key = {tuple(r[k] for k in key): r for r in shipped}
    assert new and all(tuple(r[k] for k in key) in by_key for r in new)
    for r in new:
        old = by_key[tuple(r[k] for k in key)]
        times = [k for k in r if k.endswith("_us") or k.endswith("_scale")]
        assert "matched_interleaved_us" in times
        assert {k: r[k] for k in times} == {k: old.get(k) for k in times}
