"""Hardening, round 4, part 1 (issue 46): readers, streams, resume and messages.

Every bad input of the issue's list is refused with one line that names the flag or the file line,
and exit 2 (in-process through `cli.app.main`, so the exit code and the line are checked without
a subprocess); a valid-but-heavy input is refused by a documented cap.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import resource
import subprocess
import sys

import pytest
from harness import DATA, ROOT

from themis_mpi.cli.app import main


def refused(capsys, argv: list[str], *words: str) -> str:
    """Run `themis-mpi ARGV` in this process: exit 2 and one line on stderr holding every word."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def ran(capsys, argv: list[str]) -> str:
    """Run `themis-mpi ARGV` in this process: exit 0; its standard output."""
    assert main(argv) == 0
    return capsys.readouterr().out


# --- flags -----------------------------------------------------------------------------------------


def test_a_straggler_flag_given_twice_keeps_both(capsys):
    """`--npu-delay-us 1=5 --npu-delay-us 2=7` keeps both late NPUs (the first was dropped)."""
    out = ran(
        capsys,
        ["model", "-b", "1M", "-c", "4", "-p", "baseline", "--npu-delay-us", "1=5", "--npu-delay-us", "2=7"],
    )
    assert "NPU 1 late by 5 us, NPU 2 late by 7 us" in out


def test_a_straggler_rank_given_twice_is_refused(capsys):
    """The same rank twice over two flags is refused, as it is in one."""
    refused(capsys, ["model", "--npu-delay-us", "1=5", "--npu-delay-us", "1=7"], "--npu-delay-us", "twice")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--npu-delay-us", "-1=5"], ("--npu-delay-us rank", "-1")),
        (["--link-scale", "-1:0=0.5"], ("--link-scale dim", "-1")),
        (["--bandwidth", "-,-,-5"], ("bandwidth", "-5")),
    ],
)
def test_values_that_start_with_a_dash_reach_their_check(capsys, argv, words):
    """A value starting with '-' is the flag's value (argparse said "expected one argument")."""
    refused(capsys, ["model", *argv], *words)


def test_a_bandwidth_list_of_dashes_keeps_every_default(capsys):
    """`--bandwidth -,-,-` keeps each dim's bandwidth: the same rows as without it (wall_s aside)."""

    def rows(extra: list[str]) -> list[list[str]]:
        out = ran(capsys, ["model", "-b", "1M", "-c", "4", "-q", *extra])
        return [line.split()[:-1] for line in out.splitlines() if not line.startswith("#")]

    assert rows(["--bandwidth", "-,-,-"]) == rows([])


@pytest.mark.parametrize(
    "argv",
    [
        ["model", "--json", ""],
        ["model", "--csv", ""],
        ["model", "--jsonl", ""],
        ["model", "--trace", ""],
        ["train", "traces/gnmt.txt", "--json", ""],
        ["analyze", "x.h5", "--plot", ""],
        ["plot", "x.csv", "--out", ""],
        ["workload", "gpt", "--preset", "gpt3-175b", "--out", ""],
        ["export", "x.h5", "--perfetto", ""],
        ["convert", "traces/gnmt.txt", ""],
    ],
)
def test_an_empty_output_path_is_refused(capsys, argv):
    """`--json ''` names no file: it was ignored (and `--out ''` wrote nothing); now one line, exit 2."""
    refused(capsys, argv, "an empty path names no file")


def test_compat_scheduling_without_compat_names_the_flags_given(capsys):
    """`--compat-scheduling FIFO` alone names itself and the fix, not a `--compat-fifo` that does not exist."""
    err = refused(
        capsys, ["model", "--compat-scheduling", "FIFO"], "--compat-scheduling FIFO", "--compat astra-sim-2"
    )
    assert "--compat-fifo" not in err


def test_the_endpoint_model_under_astra_sim_2_names_astra_sim_2(capsys):
    """`--compat astra-sim-2 --hbm-gbps 100` names the compat given, not astra-sim-1.0."""
    err = refused(capsys, ["model", "--compat", "astra-sim-2", "--hbm-gbps", "100"], "--compat astra-sim-2")
    assert "astra-sim-1.0" not in err


# --- SimAI workload files ----------------------------------------------------------------------------

SIMAI_HEADER = (
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 1 vpp: 1 ga: {ga} all_gpus: 4 "
    "checkpoints: 0 checkpoint_initiates: 0\n"
)
SIMAI_LINE = "l{i} -1 {fwd} ALLREDUCE {size} 1000 NONE 0 1000 ALLREDUCE 1048576 100\n"


def simai_file(tmp_path, count="2", ga="1", fwd="1000", size="1048576", lines=2) -> str:
    """A SimAI file of `lines` layer lines, the first with forward time `fwd` and size `size`."""
    path = tmp_path / "w.txt"
    body = [
        SIMAI_LINE.format(i=i, fwd=fwd if i == 0 else 1000, size=size if i == 0 else 1) for i in range(lines)
    ]
    path.write_text(SIMAI_HEADER.format(ga=ga) + f"{count}\n" + "".join(body))
    return str(path)


def test_a_good_simai_file_is_read(tmp_path, capsys):
    """The file the bad ones are made from is fine: its census counts both lines' collectives."""
    out = ran(capsys, ["workload", "simai", simai_file(tmp_path)])
    assert "DP     2  ALLREDUCE                2        2097152" in out


@pytest.mark.parametrize(
    ("field", "words"),
    [
        (dict(size="-1048576"), (":3:", "fwd collective bytes", "'-1048576'")),
        (dict(size="1.5"), (":3:", "fwd collective bytes", "'1.5'")),
        (dict(fwd="nan"), (":3:", "fwd compute time", "'nan'")),
        (dict(fwd="-5"), (":3:", "fwd compute time", "'-5'")),
        (dict(fwd="inf"), (":3:", "fwd compute time", "'inf'")),
        (dict(ga="0"), (":1:", "header ga", "'0'")),
        (dict(count="0"), (":2:", "the number of layers", "'0'")),
        (dict(count="3"), ("the header says 3 layers, the file has 2",)),
        (dict(count="1"), (":4:", "more layer lines than the 1 the header says")),
    ],
)
def test_a_bad_simai_field_is_refused_naming_its_line_and_field(tmp_path, capsys, field, words):
    """A negative size (dropped silently), a NaN or negative time (counted as 0), `ga: 0`: one line each."""
    refused(capsys, ["workload", "simai", simai_file(tmp_path, **field)], *words)


def test_a_binary_simai_file_is_refused(tmp_path, capsys):
    """A file that is not text: one line naming the line and the byte (a UnicodeDecodeError traceback)."""
    path = tmp_path / "w.bin"
    path.write_bytes(b"HYBRID_TRANSFORMER_FWD_IN_BCKWD \xff\xfe\x00\x8c\n" + bytes(range(256)) * 8)
    refused(capsys, ["workload", "simai", str(path)], ":1:", "not text", "0xff")


def test_a_5000_digit_layer_count_is_not_echoed_whole(tmp_path, capsys):
    """A 4,000- or 5,000-digit count: one short line (the count was echoed whole)."""
    for digits in (4000, 5000):
        err = refused(capsys, ["workload", "simai", simai_file(tmp_path, count="9" * digits)], ":2:")
        assert len(err) < 300, err


def test_a_million_layer_simai_file_is_refused_by_the_cap(tmp_path, capsys):
    """A 10^6-layer file (it ran past 60 s) is refused at its line 2 by the documented cap."""
    from themis_mpi.workloads.simai import MAX_SIMAI_LINES

    path = tmp_path / "big.txt"
    with open(path, "w") as f:
        f.write(SIMAI_HEADER.format(ga=1) + "1000000\n")
        f.writelines(SIMAI_LINE.format(i=i, fwd=1000, size=1) for i in range(1_000_000))
    refused(capsys, ["workload", "simai", str(path)], ":2:", f"between 1 and {MAX_SIMAI_LINES}", "a cap")
    page = " ".join((ROOT / "docs" / "workloads.md").read_text().split())
    assert f"more than {MAX_SIMAI_LINES:,} layer lines is refused" in page  # the cap is documented


# --- Chakra traces and their communicator groups ----------------------------------------------------

PYTORCH_ET = str(DATA / "chakra-pytorch" / "chakra.0.et.gz")


@pytest.mark.parametrize("members", ["[true, false]", "[0, 1.0]", "[]", '"01"'])
def test_a_communicator_group_of_non_integers_is_refused(tmp_path, capsys, members):
    """`{"7": [true, false]}` was taken as NPUs [1, 0]: a group lists integers."""
    path = tmp_path / "groups.json"
    path.write_text('{"7": ' + members + "}")
    refused(capsys, ["train", PYTORCH_ET, "--comm-group", str(path)], "group '7'", "NPU ids (integers)")


def zeros_gz(path, mib: int) -> str:
    """`mib` MiB of zero bytes, gzipped (a few KB on disk)."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(mib):
            f.write(bytes(1 << 20))
    return str(path)


def test_a_gzip_of_zeros_is_refused_at_its_first_node(tmp_path, capsys):
    """16 MiB of zeros decode to millions of empty records (it ran past 60 s): refused at the first."""
    path = zeros_gz(tmp_path / "zeros.et.gz", 16)
    refused(capsys, ["train", path], "byte 2: node 0", "an empty record")
    refused(capsys, ["convert", path, str(tmp_path / "z.txt")], "an empty record")


def test_a_gzip_of_zeros_is_refused_under_a_6_gb_address_limit(tmp_path):
    """32 MiB of zeros in a process limited to 6 GB of address space: one line, exit 2."""
    path = zeros_gz(tmp_path / "zeros.et.gz", 32)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "themis_mpi", "train", path],
        capture_output=True, text=True, timeout=120, preexec_fn=limit, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "an empty record" in proc.stderr


# --- YAML topologies -----------------------------------------------------------------------------------

NET_YAML = "topology: [{kind}]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n"


def test_a_duplicate_yaml_key_is_refused(tmp_path, capsys):
    """A key given twice kept its last value silently; now one line naming the key and its line."""
    path = tmp_path / "net.yml"
    path.write_text(NET_YAML.format(kind="Ring") + "npus_count: [8]\n")
    refused(capsys, ["model", "-t", str(path)], "line 5", "'npus_count' appears twice")


def test_a_megabyte_yaml_kind_is_not_echoed_whole(tmp_path, capsys):
    """A 1 MB kind is quoted by its start and its length (it was echoed whole)."""
    path = tmp_path / "net.yml"
    path.write_text(NET_YAML.format(kind="R" * 1_000_000))
    err = refused(capsys, ["model", "-t", str(path)], "unknown topology kind", "(1000000 characters)")
    assert len(err) < 300


# --- plot inputs, analyze --plot ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_files(tmp_path_factory):
    """A small model sweep written as --json, --jsonl and --csv."""
    folder = tmp_path_factory.mktemp("sweep")
    out = {fmt: folder / f"s.{fmt}" for fmt in ("json", "jsonl", "csv")}
    args = ["model", "-b", "1K", "-e", "4K", "-c", "4", "-q"]
    assert main([*args, *(x for fmt, p in out.items() for x in (f"--{fmt}", str(p)))]) == 0
    return out


def test_plot_reads_a_jsonl_file_as_json_lines(tmp_path, capsys, sweep_files):
    """A --jsonl file is read as JSON Lines (it was read as CSV, and a whole row was dumped in the error)."""
    out = tmp_path / "s.png"
    assert "time against size" in ran(
        capsys, ["plot", str(sweep_files["jsonl"]), "--y", "time", "--out", str(out)]
    )
    assert out.read_bytes()[:4] == b"\x89PNG"
    err = refused(capsys, ["plot", str(sweep_files["jsonl"]), "--y", "nope"], "row 1 has no column 'nope'")
    assert len(err) < 300, err


@pytest.mark.parametrize(
    ("column", "value", "axis", "words"),
    [
        ("size_bytes", 0, [], ("row 2: size_bytes '0'", "positive", "logarithmic")),
        ("size_bytes", -5, [], ("row 2: size_bytes '-5'", "positive")),
        ("size_bytes", float("nan"), [], ("row 2: size_bytes 'nan'",)),
        ("time_us", -1.0, ["--y", "time"], ("row 2: time_us '-1.0'", "positive")),
        ("busbw_gbps", float("inf"), [], ("row 2: busbw_gbps 'inf'", "a finite number")),
        ("busbw_gbps", "x" * 10_000, [], ("row 2: busbw_gbps", "(10000 characters)")),
    ],
)
def test_plot_refuses_values_its_axes_cannot_take(tmp_path, capsys, sweep_files, column, value, axis, words):
    """A size <= 0 on a log scale was matplotlib's traceback; NaN, inf and text are one line too."""
    rows = json.loads(sweep_files["json"].read_text())
    rows[1][column] = value
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    refused(capsys, ["plot", str(path), *axis], *words)


def test_plot_names_a_bad_json_line(tmp_path, capsys):
    """A JSON Lines file with a broken line: one line naming it."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"size_bytes": 1}\n{"size_bytes": \n')
    refused(capsys, ["plot", str(path)], "rows.jsonl:2: not a JSON row")


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs of the given options at a fresh folder (root only); skip when mounting is not allowed."""
    mounted = []

    def mount(options: str):
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip() or proc.returncode}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_analyze_plot_on_a_read_only_file_system_is_one_line(tmp_path, capsys, tmpfs):
    """`analyze --plot` into a read-only file system: one line before any work (it was an OSError traceback)."""
    trace = tmp_path / "t.h5"
    assert main(["model", "-b", "1M", "-c", "4", "-q", "--trace", str(trace)]) == 0
    read_only = tmpfs("size=1m,ro")
    capsys.readouterr()
    for target in (read_only, read_only / "new" / "dir"):
        refused(capsys, ["analyze", str(trace), "--plot", str(target)], "cannot write --plot", "not writable")


# --- streams that lose nothing: --jsonl on a full disk ---------------------------------------------

# 72 cells: 2 topologies x 6 sizes x these 6 policies (named, so that a new policy moves no count here)
SIX = "baseline,themis,themisFlex,roundRobin,themis-lat,predictive"
GRID = ["model", "-t", "2x2x2,4x2", "-b", "1K", "-e", "1M", "-f", "4", "-c", "4", "-p", SIX, "-q"]


def whole_rows(path) -> list[dict]:
    """Every line of a JSON Lines file, each a whole row (a torn one fails here)."""
    text = path.read_text()
    assert text.endswith("\n"), text[-200:]
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_jsonl_on_a_full_16k_tmpfs_is_one_line_and_whole_rows(capsys, tmpfs, workers):
    """A 16 KiB tmpfs fills mid-sweep: one line, exit 2, every line of the file a whole row."""
    path = tmpfs("size=16k") / "rows.jsonl"
    err = refused(
        capsys, [*GRID, "--workers", workers, "--jsonl", str(path)], "No space left on device", "whole"
    )
    rows = whole_rows(path)
    assert 0 < len(rows) < 72 and f"its {len(rows)} rows so far are whole" in err
    assert [r["sweep_cell"] for r in rows] == list(range(len(rows)))


def test_jsonl_on_a_disk_that_fills_mid_row_cuts_the_torn_row(tmp_path, capsys, monkeypatch):
    """Without a tmpfs: a file system that takes part of a row and then fails (ENOSPC), faked."""
    import errno

    from themis_mpi import output

    real_write, budget = os.write, [9000]

    def full_disk(fd: int, data) -> int:
        if fd <= 2:
            return real_write(fd, data)
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data[: budget[0]]))  # a short write: what fits
        budget[0] -= n
        return n

    path = tmp_path / "rows.jsonl"
    monkeypatch.setattr(output.os, "write", full_disk)
    refused(capsys, [*GRID, "--jsonl", str(path)], "No space left on device", "torn last one was cut off")
    monkeypatch.undo()
    rows = whole_rows(path)
    assert 0 < len(rows) < 72
    again = ran(capsys, [*GRID, "--jsonl", str(path), "--resume"])  # the disk has room again
    assert f"# resumed: {len(rows)} of 72 cells in the files" in again
    assert [r["sweep_cell"] for r in whole_rows(path)] == list(range(72))


# --- --resume checks every row it keeps ------------------------------------------------------------


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Rows equal but for this machine's wall-clock columns."""
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_s", "decision_s")} for r in rows]  # noqa: E731
    return strip(a) == strip(b)


@pytest.fixture(scope="module")
def full_sweep(tmp_path_factory):
    """The 72 rows of GRID, uninterrupted, as JSON Lines."""
    path = tmp_path_factory.mktemp("full") / "rows.jsonl"
    assert main([*GRID, "--jsonl", str(path)]) == 0
    return whole_rows(path)


def test_resume_drops_forged_rows_rewrites_the_file_and_says_how_many(tmp_path, capsys, full_sweep):
    """Negative, NaN and infinite values, a cell outside the sweep, rows written twice: all dropped.

    70 rows for a 66-cell sweep: the file is rewritten without them, one line says how many, and
    the sweep ends as the uninterrupted one.
    """
    rows = [dict(r) for r in full_sweep[:66]]
    rows[0]["time_us"], rows[1]["time_us"], rows[2]["busbw_gbps"] = -5.0, float("nan"), float("inf")
    rows += [dict(r) for r in rows[10:13]] + [{**rows[20], "sweep_cell": 500}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*GRID, "--jsonl", str(path), "--resume"]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "dropped 10 of 70 rows" in err, err
    assert "a negative or non-finite number: 3" in err and "a repeated cell: 6" in err
    assert "outside the sweep's 72 cells: 1" in err
    assert "# resumed: 60 of 72 cells in the files, 12 left" in out
    assert same_rows(whole_rows(path), full_sweep)


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_resume_checks_json_and_csv_rows_too(tmp_path, capsys, full_sweep, fmt):
    """A NaN or negative value in a --json or --csv file is dropped and the file rewritten without it."""
    path = tmp_path / f"rows.{fmt}"
    assert main([*GRID, f"--{fmt}", str(path)]) == 0
    text = path.read_text()
    if fmt == "json":
        rows = json.loads(text)
        rows[3]["time_us"], rows[4]["dims"][0]["busy_us"] = float("nan"), -1.0
        path.write_text(json.dumps(rows[:40]))
    else:
        table = list(csv.reader(text.splitlines()))
        time, busbw = table[0].index("time_us"), table[0].index("busbw_gbps")
        table[4][time], table[5][busbw] = "-3.5", "nan"
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(table[:41])
    capsys.readouterr()
    assert main([*GRID, f"--{fmt}", str(path), "--resume"]) == 0
    out, err = capsys.readouterr()
    assert "dropped 2 of 40 rows" in err and "a negative or non-finite number: 2" in err, err
    assert "# resumed: 38 of 72 cells in the files, 34 left" in out


def test_a_resume_file_nested_100000_deep_is_one_line(tmp_path, capsys):
    """JSON nested 100,000 deep in a --resume file was a RecursionError traceback."""
    for fmt in ("json", "jsonl"):
        path = tmp_path / f"deep.{fmt}"
        path.write_text("[" * 100_000 + "]" * 100_000 + ("\n{}\n" if fmt == "jsonl" else ""))
        refused(capsys, [*GRID, f"--{fmt}", str(path), "--resume"], "cannot resume from", str(path))


def test_fresh_rows_pass_the_row_check(full_sweep):
    """The one row check keeps every row a sweep writes (else --resume would run good cells again)."""
    from themis_mpi.results import flat_row
    from themis_mpi.run.sweep import check_row

    assert [check_row(flat_row(r)) for r in full_sweep] == [None] * 72
    assert check_row(flat_row({**full_sweep[0], "time_us": -1.0})) is not None
    assert check_row({"time_us": "nan"}) is not None and check_row({"time_us": "12.5"}) is None


# --- workload gpt and simai: shape flags and the cap ----------------------------------------------

GPT = ["workload", "gpt", "--layers", "8", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "10"]
GPT += ["-t", "SW(1,100,1)"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--layers", "1000000000"], ("--layers", "1000000000")),
        (["--layers", "1000000"], ("at most 1000000", "--layers")),
        (["--global-batch", "1000000000"], ("1000000000 micro-batches", "at most 1000000", "--global-batch")),
        (["--bytes-per-element", "0"], ("--bytes-per-element", "got 0")),
        (["--vocab", "0"], ("--vocab must be >= 1",)),
        (["--ffn", "0"], ("--ffn must be >= 1",)),
        (["--dp", "0"], ("--dp must be", "got 0")),
        (["--hidden", "-4"], ("--hidden", "got -4")),
        (["--peak-tflops", "nan"], ("--peak-tflops", "nan")),
        (["--efficiency", "inf"], ("--efficiency", "inf")),
        (["--seq", "16777216", "--micro-batch", "1048576", "--global-batch", "1048576"], ("bytes in one",)),
        (["--schedule", "interleaved:100000"], ("interleaved:V",)),
    ],
)
def test_workload_gpt_refuses_every_shape_flag_out_of_range(capsys, flags, words):
    """One line naming the flag, before anything is built.

    1e9 layers or a global batch of 1e9 built past 60 s; 0 bytes per element, vocab or ffn were
    taken; DP 0 was reported as the global batch.
    """
    err = refused(capsys, [*GPT, *flags], *words)
    assert "--global-batch" not in err or "--global-batch" in flags or "micro-batches" in err


def test_workload_gpt_out_is_capped_as_convert_is(tmp_path, capsys):
    """`--out` of 1,024 ranks of GPT-3 writes more than an ET file's cap in all: refused, nothing written."""
    argv = ["workload", "gpt", "--preset", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "16"]
    refused(
        capsys,
        [*argv, "-t", "HGX-H100-SW_SW_SW", "--out", str(tmp_path / "g")],
        "--out would write 1024 files",
    )
    assert list(tmp_path.iterdir()) == []


def test_the_node_count_bounds_every_generated_graph():
    """`rank_nodes`, which the cap counts, is never below a rank's real graph (and close to it)."""
    from themis_mpi.workloads.llm import LlmConfig, _line, fit_groups, rank_graph, rank_nodes

    small = dict(layers=8, hidden=64, heads=4, seq=32, vocab=100, micro_batch=2, global_batch=16)
    for extra in (
        dict(tp=2, pp=2, dp=2, recompute=True),
        dict(pp=4, schedule="interleaved", chunks=2),
        dict(dp=2, ep=2, experts=2, topk=1, zero=3, overlap_dp=True),
        dict(tp=2, pp=2, zero=1, schedule="gpipe"),
    ):
        c = LlmConfig(**small, **extra)
        layout = fit_groups(c, _line(c.npus))
        most = max(len(rank_graph(c, layout, r)) for r in range(c.npus))
        assert most <= rank_nodes(c) <= 1.5 * most, extra


@pytest.mark.parametrize("flag", ["--nic-gbps", "--nvlink-gbps"])
@pytest.mark.parametrize("value", ["nan", "-1", "0"])
def test_workload_simai_refuses_a_bandwidth_out_of_range(capsys, flag, value):
    """`--nic-gbps nan|-1` were accepted (on 8 GPUs the NIC was not even looked at)."""
    refused(capsys, ["workload", "simai", str(DATA / "simai" / "microAllReduce.txt"), flag, value], flag)


# --- plugins: orders as integers, a broken plugin under its own group -------------------------------

FLOAT_ORDER = """
from themis_mpi.policies import InterPolicy


class Floats(InterPolicy):
    name = "floats"
    description = "returns [0.9, 1.9, 2.9], which int() made 0, 1, 2"

    def order(self, chunk):
        return [0.9, 1.9, 2.9]


class Text(InterPolicy):
    name = "text"
    description = "returns '210', which int() made 2, 1, 0"

    def order(self, chunk):
        return "210"
"""

GOOD_SCHEDULER = """
from themis_mpi.policies import CommScheduler


class Later(CommScheduler):
    name = "later"
    description = "the later collective first"

    def priority(self, coll_id, need, collective):
        return -coll_id
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Install one-module plugins (module, source, group, entry line) into a fresh site, in this process."""
    from themis_mpi.policies import registry

    monkeypatch.setattr(registry, "_loaded", {})
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(module: str, source: str, group: str, entry: str) -> None:
        (tmp_path / f"{module}.py").write_text(source)
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")

    return install


@pytest.mark.parametrize(("name", "shown"), [("floats", "[0.9, 1.9, 2.9]"), ("text", "'210'")])
def test_a_plugin_order_that_is_not_integers_is_refused(capsys, plugins, name, shown):
    """Orders [0.9, 1.9, 2.9] and "210" were coerced with int(): now one line naming the policy."""
    plugins("odd_orders", FLOAT_ORDER, "themis_mpi.policies", f"{name} = odd_orders:{name.title()}")
    refused(
        capsys, ["model", "-b", "1M", "-c", "4", "-p", name, "-q"], f"policy {name!r}", shown, "as integers"
    )


def test_a_broken_scheduler_plugin_hides_nothing(capsys, plugins):
    """A scheduler plugin that fails on import is named once, under the scheduler group; the others stay."""
    plugins(
        "broken_sched",
        "raise ImportError('no such thing')\n",
        "themis_mpi.schedulers",
        "bad = broken_sched:X",
    )
    plugins("good_sched", GOOD_SCHEDULER, "themis_mpi.schedulers", "later = good_sched:Later")
    plugins("odd_orders", FLOAT_ORDER, "themis_mpi.policies", "floats = odd_orders:Floats")
    assert main(["policies"]) == 2
    out, err = capsys.readouterr()
    assert "  later " in out and "  floats " in out and "  themis " in out and "  bytescheduler " in out
    assert err.count("\n") == 1 and "scheduler plugin 'bad'" in err and "failed to load" in err, err
    assert "policy plugin" not in err
    # a missing scheduler is unknown, not the broken plugin's fault; the broken one names itself
    train = ["train", str(ROOT / "traces" / "gnmt.txt"), "-c", "1", "-n", "1"]
    err = refused(
        capsys, [*train, "--comm-scheduler", "nope"], "unknown communication scheduler 'nope'", "later"
    )
    assert "bad" not in err.split("use one of")[0]
    refused(capsys, [*train, "--comm-scheduler", "bad"], "scheduler plugin 'bad'", "failed to load")
    assert "later" in ran(capsys, [*train, "--comm-scheduler", "later"])


def test_resume_drops_rows_without_a_time_or_of_a_forged_shape(tmp_path, capsys, full_sweep):
    """A row of a cell and the fingerprint alone, or with its dims forged, is no row to keep."""
    rows = [dict(r) for r in full_sweep]
    fingerprint = rows[0]["sweep_fingerprint"]
    rows[30] = {"sweep_cell": 30, "sweep_fingerprint": fingerprint}
    rows[31]["dims"] = "forged"
    rows[32]["sweep_cell"] = True
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*GRID, "--jsonl", str(path), "--resume"]) == 0
    out, err = capsys.readouterr()
    assert "dropped 3 of 72 rows" in err and "no time_us: 1" in err and "a malformed row: 1" in err, err
    assert "# resumed: 69 of 72 cells in the files, 3 left" in out
    assert same_rows(whole_rows(path), full_sweep)
