"""Parallel and resumable sweeps: `model --workers` and `--resume` give the serial run's rows."""

from __future__ import annotations

from harness import ROOT, in_process, killed_sweep, local, mpirun, sweep_rows

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.policies import make_inter
from themis_mpi.run.coordinator import share_schedules
from themis_mpi.run.pool import FRESH_EACH_COLLECTIVE, carries_state
from themis_mpi.run.sweep import policy_configs, policy_names
from themis_mpi.topology import parse_topology

WALL = ("wall_s", "decision_s")  # the columns that differ between two runs of one sweep
GRID = [
    "-t",
    "3D-SW_SW_SW_hetero,4D-Ring_SW_SW_SW",
    "-b",
    "64M",
    "-e",
    "1G",
    "-f",
    "4",
    "-c",
    "16,64",
    "-p",
    "all",
]
# 2 topologies x 3 sizes x 2 chunk counts x every policy: cells slow enough (ms each) to be killed mid-sweep
SLOW_GRID = ["-t", "3D-SW_SW_SW_hetero,4D-Ring_SW_SW_SW", "-b", "1M", "-e", "4M", "-c", "64,256", "-p", "all"]


def rows_of(path) -> list[dict]:
    """A sweep file's rows without the wall-clock columns."""
    return sweep_rows(path, WALL)


def table(stdout: str) -> list[str]:
    """The printed rows and headers, the wall-clock column cut off."""
    return [line.rsplit(None, 1)[0] if not line.startswith("#") else line for line in stdout.splitlines()]


def test_two_workers_write_the_serial_rows_in_order(tmp_path):
    """`--workers 2` prints and writes the rows of `--workers 1`, in the same order (roundRobin included)."""
    one = in_process(["model", *GRID, "--workers", "1", "--json", str(tmp_path / "1.json"), "-q"])
    two = local(["model", *GRID, "--workers", "2", "--json", str(tmp_path / "2.json"), "-q"])
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    serial = rows_of(tmp_path / "1.json")
    cells = 2 * 3 * 2 * len(policy_names("all"))  # topologies x sizes x chunk counts x policies
    assert len(serial) == cells and rows_of(tmp_path / "2.json") == serial
    assert [r["sweep_cell"] for r in serial] == list(range(cells))
    assert table(two.stdout) == table(one.stdout)


def test_an_mpi_futures_pool_writes_the_serial_rows(tmp_path):
    """`mpiexec -n 3 python -m mpi4py.futures -m themis_mpi model ... --workers mpi` writes the serial rows."""
    one = in_process(["model", *GRID, "--json", str(tmp_path / "1.json"), "-q"])
    pool = mpirun(
        3, ["-m", "mpi4py.futures", "-m", "themis_mpi", "model", *GRID, "--workers", "mpi",
            "--json", str(tmp_path / "mpi.json"), "-q"], timeout_s=120,
    )  # fmt: skip
    assert one.returncode == pool.returncode == 0, pool.stderr
    assert rows_of(tmp_path / "mpi.json") == rows_of(tmp_path / "1.json")
    assert table(pool.stdout) == table(one.stdout)


def test_a_killed_sweep_resumed_completes_to_the_uninterrupted_files(tmp_path):
    """A sweep killed after some rows, a JSON line cut mid-write, resumes to the uninterrupted files."""
    full = {ext: tmp_path / f"full.{ext}" for ext in ("json", "csv", "jsonl")}
    part = {ext: tmp_path / f"part.{ext}" for ext in ("json", "csv", "jsonl")}
    files = lambda paths: [a for ext, p in paths.items() for a in (f"--{ext}", str(p))]  # noqa: E731
    done = in_process(["model", *SLOW_GRID, *files(full), "-q"])
    assert done.returncode == 0, done.stderr
    total = len(rows_of(full["json"]))
    killed_sweep(["model", *SLOW_GRID, *files(part), "-q"], part["jsonl"], 12)
    killed = min(len(rows_of(part["json"])), len(rows_of(part["csv"])), len(rows_of(part["jsonl"])))
    assert 0 < killed < total
    with open(part["jsonl"], "a") as f:
        f.write('{"op": "all_re')  # a row cut in the middle of its write
    again = local(["model", *SLOW_GRID, *files(part), "--resume", "--workers", "2", "-q"], timeout_s=300)
    assert again.returncode == 0, again.stderr
    assert f"# resumed: {killed} of {total} cells in the files" in again.stdout
    for ext in full:
        assert rows_of(part[ext]) == rows_of(full[ext]), ext


def test_a_different_grid_is_refused_on_resume(tmp_path):
    """Resuming a file of another grid is one line and exit 2, and the file is left as it was."""
    out = tmp_path / "rows.json"
    assert in_process(["model", "-c", "4,8", "--json", str(out), "-q"]).returncode == 0
    before = out.read_text()
    proc = in_process(["model", "-c", "4,16", "--json", str(out), "--resume", "-q"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "another sweep" in proc.stderr
    assert out.read_text() == before


def test_a_resumed_finished_sweep_runs_nothing(tmp_path):
    """Resuming a complete sweep runs no cell and leaves its rows as they were."""
    out = tmp_path / "rows.jsonl"
    assert in_process(["model", "-c", "4,8", "--jsonl", str(out), "-q"]).returncode == 0
    before = rows_of(out)
    again = in_process(["model", "-c", "4,8", "--jsonl", str(out), "--resume", "-q"])
    assert again.returncode == 0 and "# resumed: 4 of 4 cells in the files, 0 left" in again.stdout
    assert rows_of(out) == before


def test_run_refuses_workers_and_resume():
    """The emulator's sweep stays serial: `run --workers 2` and `run --resume` are one line and exit 2."""
    for flag in (["--workers", "2"], ["--resume"]):
        proc = in_process(["run", *flag])
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "run is serial" in proc.stderr


def test_bad_workers_and_a_resume_without_files_are_one_line_and_exit_2():
    """`--workers 0`, `x`, `mpi` outside mpi4py.futures, and `--resume` without a file: one line, exit 2."""
    for flags in (["--workers", "0"], ["--workers", "x"], ["--workers", "mpi"], ["--resume"]):
        proc = in_process(["model", *flags, "-q"])
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def test_policies_taken_as_fresh_schedule_a_collective_as_a_new_instance_does():
    """Each policy the pool does not replay schedules a collective after others as a fresh instance does."""
    topo = parse_topology("3D-SW_SW_SW_hetero")
    first = [
        Collective("all_reduce", 2**20, "float64", 16, (0, 1, 2)),
        Collective("all_gather", 2**18, "float32", 8, (0, 2)),
    ]
    last = Collective("reduce_scatter", 3 * 2**19, "float64", 32, (0, 1, 2))
    for cls in FRESH_EACH_COLLECTIVE:
        used, fresh = cls(), cls()
        assert not carries_state(used)
        transport = ModelTransport(topo, RunConfig(intra=used.default_intra))
        for coll in first:
            share_schedules(transport, used, [coll])
        (a,), _ = share_schedules(transport, used, [last])
        (b,), _ = share_schedules(transport, fresh, [last])
        assert (a.bounds == b.bounds).all() and (a.orders == b.orders).all() and a.label == b.label, cls.name
    assert carries_state(make_inter("roundRobin"))


def test_train_on_two_workers_gives_the_serial_rows(tmp_path):
    """`train --workers 2` writes the rows of a serial `train`, policy by policy (roundRobin's two intras too)."""
    workload = str(ROOT / "tests" / "data" / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt")
    argv = ["train", workload, "-t", "2x2x2", "-p", "all", "--intra", "auto,fifo", "-c", "8", "-n", "1"]
    one = in_process([*argv, "--json", str(tmp_path / "1.json")])
    two = local([*argv, "--workers", "2", "--json", str(tmp_path / "2.json")])
    assert one.returncode == two.returncode == 0, two.stderr
    assert rows_of(tmp_path / "2.json") == rows_of(tmp_path / "1.json")
    assert len(rows_of(tmp_path / "1.json")) == len(policy_configs("all", ["auto", "fifo"], RunConfig()))


def test_the_api_sweep_on_two_workers_gives_the_serial_results():
    """`themis_mpi.sweep(..., workers=2)` returns the serial results, in order (roundRobin included)."""
    import themis_mpi

    grid = dict(topology="3D-SW_SW_SW_hetero", size=["1M", "64M"], policy="all", chunks=[4, 16])
    serial, pooled = themis_mpi.sweep(**grid), themis_mpi.sweep(**grid, workers=2)
    strip = lambda rs: [{k: v for k, v in r.to_dict().items() if k not in WALL} for r in rs]  # noqa: E731
    assert len(serial) == 2 * 2 * len(policy_names("all")) and strip(pooled) == strip(serial)
