"""`workload gpt --run` sweeps as `train` does: comma lists expand into cells, rows go to files, resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from harness import in_process, local

GPT = [
    "workload",
    "gpt",
    "--layers",
    "8",
    "--hidden",
    "512",
    "--heads",
    "8",
    "--seq",
    "512",
    "--vocab",
    "1000",
]
GPT += ["--global-batch", "16", "--tp", "2", "--pp", "2", "--dp", "2", "--run", "-q"]
GRID = ["-t", "2x2x2,4x2", "-c", "4,16"]
RUNS = ("wall_s", "decision_s", "sweep_cell", "sweep_fingerprint")  # what differs between two runs of a cell


def rows_of(path) -> list[dict]:
    """A CSV's rows without the columns of one run (`RUNS`) and without empty cells."""
    with open(path) as f:
        return [{k: v for k, v in r.items() if k not in RUNS and v != ""} for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """The CSV of the sweep `GRID` with both policies on two workers, run once for the tests that read it."""
    out = tmp_path_factory.mktemp("swept") / "sweep.csv"
    proc = local([*GPT, *GRID, "--csv", str(out), "--workers", "2"])
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_sweep_on_two_workers_writes_the_rows_of_the_single_runs(swept, tmp_path):
    """2 topologies x 2 chunk counts x both policies: 8 rows, those of the 4 single runs, in grid order."""
    single = []
    for topology in ("2x2x2", "4x2"):
        for chunks in ("4", "16"):
            one = tmp_path / f"{topology}-{chunks}.csv"
            ran = in_process([*GPT, "-t", topology, "-c", chunks, "--csv", one])
            assert ran.returncode == 0, ran.stderr
            single += rows_of(one)
    rows = rows_of(swept)
    assert [(r["chunks"], r["policy"]) for r in rows] == [
        (c, p) for _ in range(2) for c in ("4", "16") for p in ("baseline", "themis")
    ]
    assert rows == single
    for r in rows:  # the priced parts are in every row, and add up (docs/workloads.md, "LLM training")
        parts = float(r["compute_us"]) + float(r["bubble_us"]) + float(r["exposed_us"])
        assert abs(parts - float(r["iteration_us"])) < 1e-6 * float(r["iteration_us"])
        assert float(r["stage0_activation_bytes"]) > float(r["stage1_activation_bytes"]) > 0  # 1F1B: 2 vs 1


def test_a_resumed_sweep_gives_the_same_rows(swept, tmp_path):
    """Rows deleted from the file, `--resume` runs their cells again and writes the whole sweep's rows.

    The file is the two workers' sweep (`swept`) without its last two rows, resumed serially.
    """
    out = tmp_path / "sweep.csv"
    lines = swept.read_text().splitlines(keepends=True)
    assert len(lines) == 9
    out.write_text("".join(lines[:7]))  # the header and the first six rows
    again = in_process([*GPT, *GRID, "--csv", out, "--resume"])
    assert again.returncode == 0, again.stderr
    assert "# resumed: 6 of 8 cells in the files, 2 left" in again.stdout
    assert rows_of(out) == rows_of(swept)


def test_a_bad_list_item_is_one_line_and_exit_2(tmp_path):
    """A bad policy, topology or chunk count in a list: one line on stderr, exit 2, no file."""
    for bad in (["-p", "baseline,nope"], ["-t", "2x2x2,nope"], ["-c", "4,0"]):
        proc = in_process([*GPT, *bad, "--csv", tmp_path / "x.csv"])
        assert proc.returncode == 2, (bad, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "x.csv").exists()


def test_out_and_simai_take_one_value(tmp_path):
    """--out writes one layout's files: a list of -t is refused in one line; so is -p for simai."""
    proc = in_process([*GPT, "-t", "2x2x2,4x2", "--out", tmp_path / "g"])
    assert proc.returncode == 2 and "one value" in proc.stderr
    proc = in_process(["workload", "simai", "tests/data/simai/microAllReduce.txt", "--run", "-p", "themis"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_rows_on_standard_output_come_alone(tmp_path):
    """`--jsonl -`: standard output holds the rows only (one per policy and network), the table goes to stderr."""
    proc = in_process([*GPT, "-t", "4x2", "-p", "baseline", "--network", "ideal,fair", "--jsonl", "-"])
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["policy"], r["network"]) for r in rows] == [("baseline", "ideal"), ("baseline", "fair")]
    assert "iteration_us" in proc.stderr and all(r["TP"] > 0 for r in rows)
