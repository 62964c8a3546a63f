"""`train` sweeps as `model` does: comma lists expand into cells, rows stream to files, resume, pool, API."""

from __future__ import annotations

import json

from harness import cli_jobs, in_process, killed_sweep, local, sweep_rows

import themis_mpi
from themis_mpi.policies import make_inter
from themis_mpi.run.pool import chain_tasks

WORKLOAD = "traces/gnmt.txt"
GRID = ["-t", "2x2x2,4x2", "-c", "4,16", "-p", "both"]
RUNS = ("wall_s", "decision_s", "sweep_cell", "sweep_fingerprint")  # what differs between two runs of a cell


def rows_of(path) -> list[dict]:
    """A sweep file's rows without the columns of one run (`RUNS`)."""
    return sweep_rows(path, RUNS)


def test_a_sweep_on_two_workers_writes_the_rows_of_the_single_runs(tmp_path):
    """`-t 2x2x2,4x2 -c 4,16 -p both --workers 2`: 8 rows, those of the 4 runs of one topology and chunk count."""
    out = tmp_path / "sweep.csv"
    proc = local(["train", WORKLOAD, *GRID, "--csv", str(out), "--workers", "2", "-q"])
    assert proc.returncode == 0, proc.stderr
    single = []
    for topology in ("2x2x2", "4x2"):
        for chunks in ("4", "16"):
            one = tmp_path / f"{topology}-{chunks}.csv"
            ran = in_process(["train", WORKLOAD, "-t", topology, "-c", chunks, "--csv", one, "-q"])
            assert ran.returncode == 0, ran.stderr
            single += rows_of(one)
    swept = rows_of(out)
    assert len(swept) == 8
    assert [(r["topology"], r["chunks"], r["policy"]) for r in swept] == [
        (t, c, p) for t in ("2x2x2", "4x2") for c in ("4", "16") for p in ("baseline", "themis")
    ]
    for a, b in zip(swept, single):  # (the CSVs of one topology have fewer dim columns)
        assert {k: v for k, v in a.items() if v != ""} == {k: v for k, v in b.items() if v != ""}
    assert all(float(r["speedup"]) == 1.0 for r in swept if r["policy"] == "baseline")


def test_a_killed_sweep_resumed_gives_the_rows_of_the_whole_sweep(tmp_path):
    """The sweep SIGKILLed after its first rows, then resumed (on a pool), writes the uninterrupted rows."""
    full = {ext: tmp_path / f"full.{ext}" for ext in ("json", "csv", "jsonl")}
    part = {ext: tmp_path / f"part.{ext}" for ext in ("json", "csv", "jsonl")}
    files = lambda paths: [a for ext, p in paths.items() for a in (f"--{ext}", str(p))]  # noqa: E731
    done = in_process(["train", WORKLOAD, *GRID, *files(full), "-q"])
    assert done.returncode == 0, done.stderr
    total = len(rows_of(full["json"]))
    killed_sweep(["train", WORKLOAD, *GRID, *files(part), "-q"], part["jsonl"], 1, poll_s=0.002)
    killed = min(len(rows_of(part["json"])), len(rows_of(part["csv"])), len(rows_of(part["jsonl"])))
    assert 0 < killed < total
    again = local(["train", WORKLOAD, *GRID, *files(part), "--resume", "--workers", "2", "-q"], timeout_s=300)
    assert again.returncode == 0, again.stderr
    assert f"# resumed: {killed} of {total} cells in the files" in again.stdout
    for ext in full:
        assert rows_of(part[ext]) == rows_of(full[ext]), ext


def test_resume_drops_a_row_that_beats_physics_and_runs_its_cell_again(tmp_path):
    """A kept row whose iteration is shorter than its compute is dropped (said once) and run again."""
    out = tmp_path / "rows.json"
    assert in_process(["train", WORKLOAD, "-c", "4,16", "--json", out, "-q"]).returncode == 0
    before = rows_of(out)
    doc = json.loads(out.read_text())
    doc[1]["iteration_us"] = doc[1]["compute_us"] / 2
    out.write_text(json.dumps(doc))
    again = in_process(["train", WORKLOAD, "-c", "4,16", "--json", out, "--resume", "-q"])
    assert again.returncode == 0, again.stderr
    assert (
        "--resume dropped 1 of 4 rows" in again.stderr
        and "shorter than the slowest NPU's compute" in again.stderr
    )
    assert "# resumed: 3 of 4 cells in the files, 1 left" in again.stdout
    assert rows_of(out) == before


def test_the_api_returns_the_rows_that_json_stdout_prints():
    """`themis_mpi.train` with the same lists gives `train ... --json -`'s rows, field by field."""
    flags = ["-t", "2x2x2,4x2", "-c", "4", "-p", "both", "--network", "packet,fair"]
    proc = in_process(["train", WORKLOAD, *flags, "--json", "-", "-q"])
    assert proc.returncode == 0, proc.stderr
    printed = [{k: v for k, v in r.items() if k not in RUNS} for r in json.loads(proc.stdout)]
    results = themis_mpi.train(WORKLOAD, ["2x2x2", "4x2"], "both", [4], network=["packet", "fair"])
    rows = [{k: v for k, v in r.to_dict().items() if k not in RUNS} for r in results]
    assert len(rows) == len(printed) == 8
    for mine, theirs in zip(rows, printed):
        assert mine == theirs


def test_rule_and_scheduler_lists_expand_innermost_in_order():
    """`-p` x `--network` x `--comm-scheduler`: the rows come in that order, each with its own settings."""
    proc = in_process(["train", WORKLOAD, "-t", "4x2", "-c", "16", "-p", "baseline,themis",
                       "--network", "packet,fair", "--comm-scheduler", "fifo,p3", "--json", "-", "-q"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    expected = [(p, n, s) for p in ("baseline", "themis") for n in ("packet", "fair") for s in ("fifo", "p3")]
    assert [(r["policy"], r["network"], r["scheduler"]) for r in rows] == expected
    assert {r["partition_mib"] for r in rows if r["scheduler"] == "p3"} == {4.0}  # p3's own default
    assert {r["partition_mib"] for r in rows if r["scheduler"] == "fifo"} == {0.0}
    for r in rows:  # over the baseline of its own rule and scheduler
        base = next(b for b in rows if b["policy"] == "baseline" and b["network"] == r["network"]
                    and b["scheduler"] == r["scheduler"])  # fmt: skip
        assert r["speedup"] == base["iteration_us"] / r["iteration_us"]


def test_job_runs_take_one_value_and_say_so_in_one_line():
    """`--job` runs one topology and chunk count, and writes --json only: lists and the other files are refused."""
    job = ["train", "--job", f"{WORKLOAD}@dims=0"]
    for extra, said in (
        (["-c", "4,16"], "takes one chunk count"),
        (["--csv", "x.csv"], "--json only"),
    ):
        proc = in_process([*job, *extra])
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr


def test_resume_without_a_file_and_an_unknown_rule_are_one_line():
    """--resume needs a file to read; a rule of a --network list that is not known is named."""
    for extra, said in (
        (["--resume"], "give --json, --csv or --jsonl"),
        (["--network", "packet,warp"], "'warp'"),
    ):
        proc = in_process(["train", WORKLOAD, *extra])
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr


def test_plot_chooses_iteration_against_chunks_for_a_train_sweep(tmp_path):
    """`themis-mpi plot` on the sweep's CSV picks x chunks and y iteration time by itself, a line per policy."""
    out = tmp_path / "sweep.csv"
    assert in_process(["train", WORKLOAD, *GRID, "--csv", out, "-q"]).returncode == 0
    proc = in_process(["plot", out, "--out", tmp_path / "sweep.png"])
    assert proc.returncode == 0, proc.stderr
    assert "x chunks, y iteration_us" in proc.stdout and (tmp_path / "sweep.png").stat().st_size > 0


def test_a_policy_whose_state_carries_runs_its_earlier_cells_before_a_resumed_one():
    """`chain_tasks`: roundRobin's cells run in one task from its first (the skipped ones not kept)."""
    rr, base, themis = make_inter("roundRobin"), make_inter("baseline"), make_inter("themis")
    policies = [base, rr, themis, base, rr, themis, base, rr, themis]
    tasks = chain_tasks(policies, [3, 4, 5, 8])
    assert tasks == [[(3, True)], [(1, False), (4, True)], [(5, True)], [(8, True)]]
    assert chain_tasks(policies, []) == []


def test_api_sweep_takes_a_size_range_as_nccl_tests_does():
    """`sweep(begin=, end=, factor=)` runs the sizes of `-b -e -f`, the same rows as the list of them."""
    ranged = themis_mpi.sweep("2x2x2", begin="1M", end="16M", factor=4, policy="baseline")
    listed = themis_mpi.sweep("2x2x2", size=["1M", "4M", "16M"], policy="baseline")
    assert [r.size_bytes for r in ranged] == [2**20, 2**22, 2**24]
    assert [r.time_us for r in ranged] == [r.time_us for r in listed]


def test_api_gpt_writes_the_files_of_workload_gpt(tmp_path):
    """`api.gpt(topology, out, ...)` writes the bytes `workload gpt --out` writes and names its topology."""
    from themis_mpi import api

    shape = dict(layers=4, hidden=256, heads=4, seq=128, vocab=1000, global_batch=8, tp=2, pp=2, dp=2)
    flags = [a for name, value in shape.items() for a in (f"--{name.replace('_', '-')}", str(value))]
    proc = in_process(["workload", "gpt", *flags, "-t", "2x2x2", "--out", tmp_path / "cli" / "g"])
    assert proc.returncode == 0, proc.stderr
    config, topology = api.gpt("2x2x2", str(tmp_path / "api" / "g"), **shape)
    assert f"-t '{topology.spec()}'" in proc.stdout and config.npus == 8
    for rank in range(8):
        assert (tmp_path / "api" / f"g.{rank}.et").read_bytes() == (
            tmp_path / "cli" / f"g.{rank}.et"
        ).read_bytes()


def test_the_emulator_runs_the_sweep_serially_to_the_models_rows(tmp_path):
    """Under mpiexec a `-c 4,16` sweep runs cell by cell on real data: every row checked, the model's times."""
    out = tmp_path / "mpi.jsonl"
    proc = cli_jobs(
        {0: (8, ["train", WORKLOAD, "-t", "2x2x2", "-c", "4,16", "-n", "1", "--jsonl", str(out), "-q"])},
        tmp_path,
    )[0]
    assert proc.returncode == 0, proc.stderr
    model = in_process(["train", WORKLOAD, "-t", "2x2x2", "-c", "4,16", "-n", "1", "--json", "-", "-q"])
    emulated, modelled = rows_of(out), json.loads(model.stdout)
    assert [r["transport"] for r in emulated] == ["mpi"] * 4 and all(r["wrong"] == 0 for r in emulated)
    for mine, theirs in zip(emulated, modelled):
        for key in ("policy", "chunks", "iteration_us", "compute_us", "exposed_comm_us", "speedup"):
            assert mine[key] == theirs[key], key
