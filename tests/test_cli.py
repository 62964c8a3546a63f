"""Rules for the `themis-mpi` command line: under mpiexec exactly as a user would, or in-process where no process is needed."""

import json
import runpy
import sys

import pytest
from harness import cli, cli_jobs, in_process

from themis_mpi.topology import parse_topology

BOTH_ARGS = ["run", "--topology", "2x2x2", "-b", "64M", "--policy", "both", "-n", "1", "-w", "0"]
WALL_MODEL_ARGS = ["-t", "2x2x2", "-b", "4M", "-c", "8", "--policy", "both"]
WALL_ARGS = ["run", *WALL_MODEL_ARGS, "--clock", "wall", "--time-scale", "200", "-n", "1", "-w", "0"]


@pytest.fixture(scope="module")
def runs8(tmp_path_factory) -> dict:
    """This module's 8-rank runs in one mpiexec (`harness.cli_jobs`): key -> (the run, its JSON file)."""
    tmp = tmp_path_factory.mktemp("runs8")
    args = {"both": BOTH_ARGS, "wall": WALL_ARGS}
    done = cli_jobs({k: (8, [*a, "--json", str(tmp / f"{k}.json")]) for k, a in args.items()}, tmp)
    return {k: (done[k], tmp / f"{k}.json") for k in args}


def test_themis_beats_baseline_on_2x2x2_with_exact_results(runs8):
    """`run -t 2x2x2 -b 64M --policy both`: wrong = 0 for both; Themis faster; baseline ~58 %."""
    proc, out = runs8["both"]
    assert proc.returncode == 0, proc.stderr
    rows = {r["policy"]: r for r in json.loads(out.read_text())}
    assert rows["baseline"]["wrong"] == 0 and rows["themis"]["wrong"] == 0
    assert rows["themis"]["time_us"] < rows["baseline"]["time_us"]
    assert rows["baseline"]["utilization"] == pytest.approx(0.58, abs=0.01)
    assert "#wrong" in proc.stdout and "(GB/s)" in proc.stdout
    assert proc.stdout.count("64 MiB") == 2  # rank 0 alone prints the table


def test_json_rows_hold_the_documented_fields(tmp_path):
    """Every JSON row has policy, size, chunks, times, utilization, wrong, wall_s, iters, dims."""
    out = tmp_path / "rows.json"
    args = [
        "run",
        "-t",
        "Ring(4,100,20)",
        "-b",
        "1K",
        "-e",
        "8K",
        "-f",
        "2",
        "-c",
        "4",
        "--policy",
        "themis",
        "-n",
        "2",
        "--json",
        str(out),
    ]
    proc = cli_jobs({0: (4, args)}, tmp_path)[0]  # (a run of the resident job)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [r["size_bytes"] for r in rows] == [1024, 2048, 4096, 8192]
    for r in rows:
        for key in (
            "policy",
            "size_bytes",
            "chunks",
            "time_us",
            "ideal_us",
            "utilization",
            "wrong",
            "wall_s",
            "iters",
        ):
            assert key in r
        assert r["iters"] == 2 and r["wrong"] == 0
        assert {"busy_us", "bytes", "utilization"} <= set(r["dims"][0])


BAD_INPUTS = [
    (4, ["run", "-t", "2x2x2"], "but 4 MPI ranks were started"),
    (2, ["run", "-t", "no-such-preset"], "unknown topology preset"),
    (2, ["run", "-t", "SW(2,100"], "malformed topology dim"),
    (2, ["run", "-t", "Ring(2,1,1)", "-c", "0"], "chunks must be between 1 and"),
    (2, ["run", "-t", "Ring(2,1,1)", "-c", "-3"], "chunks must be between 1 and"),
    (2, ["run", "-t", "Ring(2,1,1)", "-b", "0"], "size must be positive"),
    (2, ["run", "-t", "Ring(2,1,1)", "--minbytes=-4M"], "bad size"),
    (2, ["run", "-t", "Ring(2,1,1)", "-b", "-4M"], "expected one argument"),
    (2, ["run", "-t", "Ring(2,1,1)", "-b", "12X"], "bad size"),
    (2, ["run", "-t", "Ring(2,1,1)", "-b", "2", "-d", "float64"], "smaller than one float64"),
    (6, ["run", "-t", "SW(6,100,700,hd)"], "power-of-two"),
    (2, ["run", "-t", "Ring(2,1,1)", "--policy", "greedy"], "unknown policy 'greedy'"),
    (2, ["run", "-t", "Ring(2,1,1)", "--dims", "3"], "--dims must list"),
]


def one_error_line(proc, fragment: str) -> None:
    """Non-zero exit, one line on standard error that holds `fragment`, no traceback."""
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("ranks,args,fragment", [BAD_INPUTS[i] for i in (0, 2, 3, 7)])
def test_bad_input_gets_one_line_and_nonzero_exit_on_every_rank(ranks, args, fragment):
    """A user mistake prints one error line, no traceback, and the job exits non-zero (a mismatch, a parse, a value, argparse)."""
    one_error_line(cli(ranks, args, timeout_s=60), fragment)


@pytest.mark.parametrize("ranks,args,fragment", BAD_INPUTS[1:])
def test_bad_input_gets_one_line_and_exit_2_before_mpi_starts(ranks, args, fragment):
    """Each mistake is found before MPI starts (in this process, no MPI): one line and exit 2."""
    proc = in_process(args)
    one_error_line(proc, fragment)
    assert proc.returncode == 2


def test_wall_clock_never_beats_the_virtual_clock(tmp_path, runs8):
    """Wall-clock mode waits out every step's deadline, so it never ends before the virtual clock."""
    proc, wall_out = runs8["wall"]
    model_out = tmp_path / "model.json"
    assert proc.returncode == 0, proc.stderr
    model = in_process(["model", *WALL_MODEL_ARGS, "--json", str(model_out)])
    assert model.returncode == 0, model.stderr
    virtual = {r["policy"]: r["time_us"] for r in json.loads(model_out.read_text())}
    for r in json.loads(wall_out.read_text()):
        assert r["wrong"] == 0 and r["clock"] == "wall"
        assert r["time_us"] >= virtual[r["policy"]]
        assert r["wall_s"] >= virtual[r["policy"]] * 1e-6 * 200


def test_model_command_prints_the_same_columns_without_mpi(tmp_path):
    """`themis-mpi model` runs in one process and writes the same JSON fields as `run`."""
    out = tmp_path / "model.json"
    proc = in_process(["model", "-t", "3D-SW_SW_SW_hetero", "-b", "1G", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert {r["policy"] for r in rows} == {"baseline", "themis"}
    assert all(r["wrong"] is None and len(r["dims"]) == 3 for r in rows)


def test_info_names_every_version():
    """`themis-mpi info` reports the package, numpy, mpi4py, h5py and MPI library versions."""
    proc = in_process(["info"])
    assert proc.returncode == 0, proc.stderr
    for name in ("themis-mpi", "numpy", "mpi4py", "h5py", "MPI"):
        assert f"{name}:" in proc.stdout


def test_every_listed_preset_is_its_inline_form():
    """`themis-mpi topologies`: each preset's inline form parses to the preset's dims and NPU count."""
    proc = in_process(["topologies"])
    assert proc.returncode == 0, proc.stderr
    rows = [
        line.split()
        for line in proc.stdout.splitlines()
        if line.startswith("  ") and line.split()[0][0] != "#"
    ]
    assert len(rows) >= 5
    for name, npus, inline in rows:
        preset, spelled = parse_topology(name), parse_topology(inline)
        assert spelled.dims == preset.dims and preset.npus == int(npus), name


def test_every_listed_policy_runs_on_the_model():
    """`themis-mpi policies`: each inter-dim policy it lists is taken by `model -p` and runs."""
    proc = in_process(["policies"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("# intra-dim")[0].splitlines()
    names = [line.split()[0] for line in lines if line.startswith("  ")]
    assert {"baseline", "themis"} <= set(names)
    for name in names:
        ran = in_process(
            ["model", "-t", "Ring(4,100,20)_SW(2,50,700)", "-b", "64K", "-c", "4", "-p", name, "-q"]
        )
        assert ran.returncode == 0 and f" {name} " in ran.stdout, (name, ran.stderr)


def test_a_model_trace_replays_to_the_models_times(tmp_path):
    """`model --trace` then `replay`: every collective's replayed time is the time the model printed."""
    trace, rows, replayed = tmp_path / "m.h5", tmp_path / "m.json", tmp_path / "r.json"
    args = ["model", "-t", "2x2x2", "-b", "1M", "-c", "8", "-p", "both"]
    assert in_process([*args, "--trace", str(trace), "--json", str(rows)]).returncode == 0
    proc = in_process(["replay", str(trace), "--json", str(replayed)])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(replayed.read_text())
    assert report["unchanged"] and report["max_event_diff_us"] == 0.0
    got = [c["replay_us"] for c in report["collectives"]]
    assert got == [r["time_us"] for r in json.loads(rows.read_text())] and len(got) == 2


def test_python_m_runs_the_command_and_a_worker_import_does_not(capsys, monkeypatch):
    """`python -m themis_mpi ARGS` is the command (its exit code); imported by another name it runs nothing."""
    monkeypatch.setattr(sys, "argv", ["themis_mpi", "model", "-t", "SW(2,100", "-q"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("themis_mpi", run_name="__main__")
    assert done.value.code == 2 and "malformed topology dim" in capsys.readouterr().err
    runpy.run_module("themis_mpi", run_name="__worker__")  # as mpi4py.futures' workers import it
    assert capsys.readouterr() == ("", "")
