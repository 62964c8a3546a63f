"""Rules for daily use: streaming rows, list-valued sweeps, CSV, the Python API, honest plots."""

import csv
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest
from harness import DATA, ROOT, local, mpi_env, mpiexec_path

import themis_mpi
from themis_mpi.analysis import queue_levels
from themis_mpi.results import median
from themis_mpi.units import format_size


def themis(*args, **kw):
    """`themis-mpi ARGS` in one process."""
    return local(args, **kw)


def test_a_run_prints_each_row_as_it_finishes_and_a_killed_sweep_keeps_them(tmp_path):
    """Under mpiexec the first row appears (and is in the CSV and JSON) while later sizes still run."""
    out_csv, out_json = tmp_path / "rows.csv", tmp_path / "rows.json"
    cmd = [
        mpiexec_path(),
        "-n",
        "8",
        sys.executable,
        "-m",
        "themis_mpi",
        "run",
        "-b",
        "1M",
        "-e",
        "256M",
        "-f",
        "16",
        "-p",
        "baseline",
        "-n",
        "3",
        "--csv",
        str(out_csv),
        "--json",
        str(out_json),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 120
        first = None
        while first is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-2000:]  # the job ended without a row
            if line.strip().startswith("1 MiB"):
                first = line
        assert first is not None
        time.sleep(0.5)
        assert proc.poll() is None, "the sweep was already over: it did not stream"
        proc.kill()  # mid-sweep (the 16 MiB and 256 MiB sizes are still to come)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["pkill", "-9", "-f", str(out_csv)], check=False)
    rows = list(csv.DictReader(out_csv.open()))
    assert 1 <= len(rows) < 3 and rows[0]["size_bytes"] == str(1 << 20) and rows[0]["wrong"] == "0"
    assert json.loads(out_json.read_text())[0]["size_bytes"] == 1 << 20


def test_a_list_valued_sweep_is_one_command_and_its_csv_has_every_row(tmp_path):
    """`model -t A,B -c 4,16,64 -b 1M -e 4M -f 4 -p both` writes 2 x 3 x 2 x 2 = 24 rows."""
    out = tmp_path / "sweep.csv"
    proc = themis(
        "model",
        "-t",
        "3D-SW_SW_SW_hetero,FC(8,175,700)_Ring(16,100,700)_SW(8,50,1700)",
        "-c",
        "4,16,64",
        "-b",
        "1M",
        "-e",
        "4M",
        "-f",
        "4",
        "--csv",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 24
    assert {r["topology"] for r in rows} == {
        "3D-SW_SW_SW_hetero",
        "FC(8,175,700,direct)_Ring(16,100,700,ring)_SW(8,50,1700,hd)",
    }
    assert {int(r["chunks"]) for r in rows} == {4, 16, 64} and {r["policy"] for r in rows} == {
        "baseline",
        "themis",
    }
    assert all(float(r["dim0_busy_us"]) <= float(r["time_us"]) * (1 + 1e-9) for r in rows)
    assert proc.stdout.count("# themis-mpi model: topology") == 2


def test_the_python_api_gives_the_same_numbers_as_the_command():
    """themis_mpi.sweep returns result objects equal to what `themis-mpi model --json -` prints."""
    results = themis_mpi.sweep(
        "3D-SW_SW_SW_hetero", size=["1M", "64M"], policy=["baseline", "themis"], chunks=64
    )
    assert [(r.size_bytes, r.policy) for r in results] == [
        (1 << 20, "baseline"),
        (1 << 20, "themis"),
        (64 << 20, "baseline"),
        (64 << 20, "themis"),
    ]
    proc = themis(
        "model",
        "-t",
        "3D-SW_SW_SW_hetero",
        "-b",
        "1M",
        "-e",
        "64M",
        "-f",
        "64",
        "--json",
        "-",
    )
    rows = json.loads(proc.stdout)
    assert [r["time_us"] for r in rows] == [r.time_us for r in results]


def test_the_python_api_takes_stragglers_and_schedulers_as_the_commands_do():
    """The API's sweep and train take stragglers and schedulers (mapping forms) and give the commands' numbers."""
    (late,) = themis_mpi.sweep("4x2", "1M", "baseline", 4, npu_delay_us={5: 30}, link_scale={(1, 2): 0.5})
    proc = themis("model", "-t", "4x2", "-b", "1M", "-c", "4", "-p", "baseline", "--json", "-",
                  "--npu-delay-us", "5=30", "--link-scale", "1:2=0.5")  # fmt: skip
    assert json.loads(proc.stdout)[0]["time_us"] == late.time_us
    workload = str(DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt")
    (row,) = themis_mpi.train(
        workload,
        "2x2x2",
        "themis",
        8,
        comm_scheduler="p3",
        npu_compute_scale={3: 1.5},
        compute_jitter=0.1,
        seed=1,
    )
    proc = themis("train", workload, "-t", "2x2x2", "-p", "themis", "-c", "8", "--comm-scheduler", "p3",
                  "--npu-compute-scale", "3=1.5", "--compute-jitter", "lognormal:0.1", "--seed", "1",
                  "--json", "-")  # fmt: skip
    assert json.loads(proc.stdout)[0]["iteration_us"] == row.iteration_us
    assert (row.scheduler, row.partition_mib) == ("p3", 4.0)


def test_to_dataframe_names_pandas_when_it_is_missing_or_builds_the_frame():
    """to_dataframe gives one row per result with per-dim columns, or says to install pandas."""
    results = themis_mpi.sweep("2x2x2", size="1M", policy="themis", chunks=4)
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(themis_mpi.api.UsageError, match="pip install pandas"):
            themis_mpi.to_dataframe(results)
        return
    frame = themis_mpi.to_dataframe(results)
    assert len(frame) == 1 and "dim0_busy_us" in frame.columns


@pytest.mark.parametrize(
    "queued,started",
    [
        ([0, 0, 1, 2], [0, 1, 2, 2]),  # queued and started at the same instant
        ([0, 5, 5, 5], [5, 5, 6, 7]),
        ([3.5], [3.5]),
    ],
)
def test_the_queue_depth_is_never_negative(queued, started):
    """Changes at one instant are applied together: a stage queued and started at once never shows."""
    times, levels = queue_levels(np.array(queued, float), np.array(started, float))
    assert (levels >= 0).all() and levels[-1] == 0 and (np.diff(times) > 0).all()


@pytest.mark.parametrize(
    "values", [[3.0], [2.0, 1.0], [5.0, 1.0, 4.0], [0.5, 9.0, 2.5, 7.0], [4.0, 4.0, 1.0, 4.0, 2.0]]
)
def test_the_plain_median_is_the_statistics_median(values):
    """The median every rank uses (no numpy.ma) is the middle value, or the mean of the two middle ones."""
    assert median(values) == statistics.median(values)


def test_one_size_format_everywhere():
    """Binary units in every human-facing size."""
    assert [format_size(n) for n in (512, 1024, 64 << 20, 1 << 30, 3 << 29)] == [
        "512 B",
        "1 KiB",
        "64 MiB",
        "1 GiB",
        "1.5 GiB",
    ]


def test_run_without_mpiexec_says_how_to_launch():
    """`themis-mpi run` started alone names the mpiexec command it needs."""
    proc = themis("run", "-t", "2x2x2")
    assert (
        proc.returncode == 2 and "mpiexec -n 8 themis-mpi run" in proc.stderr and proc.stderr.count("\n") == 1
    )


def test_export_window_is_on_the_exported_axis_and_an_empty_selection_is_refused(tmp_path):
    """The second collective starts after the first on the exported axis; a window past the end is an error."""
    trace, out = tmp_path / "t.h5", tmp_path / "t.json"
    assert themis("model", "-t", "2x2x2", "-b", "1M", "-c", "4", "--trace", str(trace)).returncode == 0
    doc = json.loads(themis("export", str(trace), "--perfetto", str(out)).returncode == 0 and out.read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    end_first = max(e["ts"] + e["dur"] for e in slices if e["args"]["collective"] == 0)
    proc = themis(
        "export", str(trace), "--perfetto", str(out), "--window", f"{end_first + 2},{end_first + 10}"
    )
    assert proc.returncode == 0
    kept = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert kept and {e["args"]["collective"] for e in kept} == {1}
    proc = themis("export", str(trace), "--perfetto", str(out), "--window", "1e9,2e9")
    assert proc.returncode == 2 and "keeps no stage" in proc.stderr


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(topology=None), "topology"),
        (dict(topology=5), "topology"),
        (dict(topology={}), "topology"),
        (dict(policy=None), "policy"),
        (dict(policy={"themis"}), "policy"),
        (dict(policy=(p for p in ["themis"])), "policy"),
        (dict(size=None), "size"),
        (dict(size=float("nan")), "size"),
        (dict(size=b"1M"), "size"),
        (dict(active_per_dim=1.5), "active_per_dim"),
        (dict(chunks=2.5), "chunks"),
        (dict(chunks=True), "chunks"),
    ],
)
def test_the_api_names_a_parameter_of_the_wrong_type(kwargs, name):
    """A wrong type is a TypeError naming the parameter and what it accepts, not an error from deep inside."""
    with pytest.raises(TypeError, match=f"^{name} must be "):
        themis_mpi.sweep(**kwargs)


def test_the_api_train_names_a_parameter_of_the_wrong_type():
    """The API's train checks its arguments the same way (a float chunk count is not truncated)."""
    with pytest.raises(TypeError, match="^chunks must be a whole number"):
        themis_mpi.train("traces/resnet152.txt", chunks=2.5)


def test_the_api_has_the_commands_overrides_buckets_and_chakra():
    """The API's sweep takes the overrides and --network, its train buckets and Chakra traces, as the CLI."""
    row = themis_mpi.sweep(
        size="1M", chunks=4, policy="themis", bandwidth_gbps=[None, None, 200], network="fair"
    )[0]
    proc = themis(
        "model",
        "-b",
        "1M",
        "-c",
        "4",
        "-p",
        "themis",
        "--bandwidth",
        ",,200",
        "--network",
        "fair",
        "--json",
        "-",
    )
    cli_row = json.loads(proc.stdout)[0]
    assert row.time_us == cli_row["time_us"] and row.topology == cli_row["topology"] and row.network == "fair"
    buckets = themis_mpi.train(
        str(DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt"), chunks=4, bucket_mib=25
    )
    plain = themis_mpi.train(str(DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt"), chunks=4)
    assert [r.collectives for r in buckets] == [8, 8] and buckets[0].collectives < plain[0].collectives
    graph = themis_mpi.train(str(DATA / "chakra-pytorch" / "chakra.0.et.gz"), chunks=4)
    assert [r.policy for r in graph] == ["baseline", "themis"] and graph[0].collectives == 5
