"""Rules for HDF5 traces, analysis, plots, Perfetto export and replay."""

import json

import h5py
import numpy as np
import pytest
from harness import cli_jobs, in_process

from themis_mpi.analysis import analyze_trace
from themis_mpi.errors import UsageError
from themis_mpi.perfetto import to_perfetto
from themis_mpi.trace import Trace

RUN_ARGS = ["-t", "2x2x2", "-b", "1M", "-c", "8", "--policy", "both"]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """The module's 8-rank runs in one mpiexec (`harness.cli_jobs`): the traced run, then its replay.

    Returns the folder and each run (``run``, ``replay``). The replay reads the run's trace, which
    rank 0 has written before the ranks leave the run's final barrier.
    """
    d = tmp_path_factory.mktemp("traces")
    run = ["run", *RUN_ARGS, "-n", "1", "-w", "0", "--trace", str(d / "run.h5")]
    run += ["--json", str(d / "run.json")]
    replay = ["replay", str(d / "run.h5"), "--trace", str(d / "replay.h5")]
    done = cli_jobs({"run": (8, run), "replay": (8, replay)}, d)
    assert done["run"].returncode == 0, done["run"].stderr
    return d, done


@pytest.fixture(scope="module")
def traces(emulated):
    d, _ = emulated
    proc = in_process(["model", *RUN_ARGS, "--trace", str(d / "model.h5"), "--json", str(d / "model.json")])
    assert proc.returncode == 0, proc.stderr
    return d


@pytest.mark.parametrize("name,ranks", [("run.h5", 8), ("model.h5", 1)])
def test_trace_reads_with_plain_h5py(traces, name, ranks):
    """The file holds metadata, topology, schedule, summaries and every rank's events."""
    with h5py.File(traces / name, "r") as f:
        for key in (
            "format",
            "format_version",
            "complete",
            "topology",
            "clock",
            "command_line",
            "start_time",
            "versions",
            "npus",
        ):
            assert key in f.attrs
        assert "mpi4py" in json.loads(f.attrs["versions"])
        for ds in ("topology", "collectives", "schedule", "summary_dims", "events"):
            assert ds in f
        ev = f["events"][()]
        for col in (
            "rank",
            "collective",
            "chunk",
            "stage",
            "op",
            "dim",
            "bytes",
            "queued_us",
            "start_us",
            "end_us",
            "wall_start_s",
            "wall_end_s",
        ):
            assert col in ev.dtype.names
        assert sorted(set(ev["rank"].tolist())) == list(range(ranks))
        assert len(f["collectives"]) == 2 and len(f["schedule"]) == 2 * 8
        # 8 chunks x (5 stages for the baseline, its last dim one AR stage; 6 for Themis), per rank
        assert len(ev) == ranks * 8 * (5 + 6)


@pytest.mark.parametrize("name", ["run.h5", "model.h5"])
def test_analyze_equals_the_runs_own_summary(traces, name):
    """Times, busy times and bytes recomputed from the events equal what the run reported."""
    rows = json.loads((traces / name.replace(".h5", ".json")).read_text())
    analysis = analyze_trace(Trace(str(traces / name)), rank=0)
    for run_row, a in zip(rows, analysis):
        assert a["time_us"] == pytest.approx(run_row["time_us"], rel=1e-12)
        assert a["utilization"] == pytest.approx(run_row["utilization"], rel=1e-12)
        for rd, ad in zip(run_row["dims"], a["dims"]):
            assert ad["busy_us"] == pytest.approx(rd["busy_us"], rel=1e-12)
            assert ad["bytes"] == rd["bytes"]


def test_analyze_writes_readable_plots(traces, tmp_path):
    """`analyze --plot` writes PNG timelines, utilization bars and queue depths."""
    proc = in_process(["analyze", str(traces / "run.h5"), str(traces / "model.h5"), "--plot", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert "utilization.png" in pngs and sum("timeline" in p for p in pngs) == 4
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert "side by side" in proc.stdout


def test_perfetto_events_have_the_required_fields_and_nest(traces):
    """Every event has ph, ts, pid, tid; slices on one track never partly overlap."""
    doc = to_perfetto(Trace(str(traces / "run.h5")))
    events = doc["traceEvents"]
    assert all({"ph", "ts", "pid", "tid"} <= set(e) for e in events)
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 8 * 8 * (5 + 6) and all(e["dur"] >= 0 for e in slices)
    tracks = {}
    for e in slices:
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (_, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-9 or e1 <= e0  # disjoint or nested
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert flows and len({e["id"] for e in flows}) * 2 == len(flows)


def test_perfetto_filters_ranks_and_window(traces, tmp_path):
    """--ranks and --window keep only the asked-for slices."""
    out = tmp_path / "p.json"
    proc = in_process(
        [
            "export",
            "--perfetto",
            str(out),
            str(traces / "run.h5"),
            "--ranks",
            "0,3",
            "--window",
            "0,5",
            "--collective",
            "0",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    slices = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert slices and {e["pid"] for e in slices} == {0, 3} and all(e["ts"] < 5 for e in slices)


def test_model_replay_of_an_emulator_trace_reproduces_every_event(traces, tmp_path):
    """Unchanged, a replay (model) reproduces every recorded event time and says so."""
    out = tmp_path / "replay.json"
    proc = in_process(["replay", str(traces / "run.h5"), "--json", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert f"reproduces all {8 * 8 * (5 + 6)} recorded stage events exactly" in proc.stdout
    assert json.loads(out.read_text())["max_event_diff_us"] == 0


def test_emulator_replay_reproduces_every_event(emulated):
    """Under mpiexec the replay moves real data again and reproduces every event time."""
    d, done = emulated
    out, proc = d / "replay.h5", done["replay"]
    assert proc.returncode == 0, proc.stderr
    assert "on the emulator" in proc.stdout and "exactly" in proc.stdout
    assert (Trace(str(out)).collectives["wrong"] == 0).all()


def test_replay_with_doubled_bandwidth_changes_only_that_dim(traces, tmp_path):
    """Doubling dim 1's bandwidth halves the bandwidth term of dim-1 stages and nothing else."""
    out = tmp_path / "fast.h5"
    proc = in_process(["replay", str(traces / "model.h5"), "--bandwidth", ",200,", "--trace", str(out)])
    assert proc.returncode == 0, proc.stderr
    before, after = Trace(str(traces / "model.h5")), Trace(str(out))
    wrote = f"# wrote {out}: {len(after.events)} stage events of {len(after.collectives)} collectives"
    assert proc.stdout.splitlines()[-1] == wrote  # like every writer
    key = ("collective", "chunk", "stage")
    a, b = np.sort(before.events, order=key), np.sort(after.events, order=key)
    assert (a["dim"] == b["dim"]).all() and (a["chunk"] == b["chunk"]).all()  # same schedule
    dur_a, dur_b = a["end_us"] - a["start_us"], b["end_us"] - b["start_us"]
    other = a["dim"] != 1
    np.testing.assert_allclose(dur_b[other], dur_a[other], rtol=1e-12)
    latency_us = 700e-3  # FC dim 1: one hop of 700 ns per step, one step (direct)
    np.testing.assert_allclose(dur_b[~other] - latency_us, (dur_a[~other] - latency_us) / 2, rtol=1e-9)
    assert (after.collectives["time_us"] <= before.collectives["time_us"]).all()


def test_truncated_and_foreign_files_get_one_clear_line(traces, tmp_path):
    """A truncated trace, a foreign HDF5 file and a text file are refused with one line."""
    data = (traces / "run.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = np.arange(3)
    (tmp_path / "text.h5").write_text("hello")
    for name, fragment in (
        ("cut.h5", "not a readable HDF5 file"),
        ("foreign.h5", "not a themis-mpi trace"),
        ("text.h5", "not a readable HDF5 file"),
        ("missing.h5", "no such trace file"),
    ):
        with pytest.raises(UsageError, match=fragment):
            Trace(str(tmp_path / name))
        proc = in_process(["analyze", str(tmp_path / name)])
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


def test_incomplete_trace_is_refused(traces, tmp_path):
    """A file whose complete flag is not set (a run that died while writing) is refused."""
    path = tmp_path / "incomplete.h5"
    path.write_bytes((traces / "model.h5").read_bytes())
    with h5py.File(path, "a") as f:
        f.attrs["complete"] = 0
    with pytest.raises(UsageError, match="incomplete"):
        Trace(str(path))


def test_analyze_compares_each_row_with_its_own_baseline():
    """Side by side, a row's speedup is over the baseline of its size and topology, not over the first row."""
    from themis_mpi.analysis import baseline_row, format_analysis

    def row(policy, size, topology, time_us):
        return {"trace": "t.h5", "topology": topology, "collective": 0, "op": "all_reduce", "policy": policy,
                "intra": "fifo", "size_bytes": size, "chunks": 4, "time_us": time_us, "ideal_us": 1.0,
                "utilization": 0.5, "algbw_gbps": 1.0, "busbw_gbps": 1.0, "wrong": 0, "ranks": 1, "dims": []}  # fmt: skip

    rows = [row("themis", 1 << 20, "A", 50.0), row("baseline", 2 << 20, "A", 90.0),
            row("baseline", 1 << 20, "B", 70.0), row("baseline", 1 << 20, "A", 100.0)]  # fmt: skip
    assert [baseline_row(rows, i) for i in range(4)] == [3, 1, 2, 3]
    table = format_analysis(rows).splitlines()
    assert table[-4].endswith("2.00x vs #3") and table[-1].endswith("ref")
    rows.append(row("themis", 4 << 20, "A", 10.0))
    assert baseline_row(rows, 4) is None and format_analysis(rows).splitlines()[-1].endswith(" -")
