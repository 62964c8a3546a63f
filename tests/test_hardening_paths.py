"""Hardening, round 4, part 2 (issue 46): paths that took a flag they cannot honour, and tracebacks.

Each case is one line of the issue's list: refused with one line naming the flag or the item, exit
2 (in-process through `cli.app.main`).
"""

from __future__ import annotations

import json

import pytest
from harness import DATA
from test_hardening_readers import refused

from themis_mpi.cli.app import main

MICRO = "DATA\n2\nconv1 -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 1048576 5\nfc -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 4194304 5\n"
NCCL_LOG = DATA / "nccl-tests" / "h100x8_nvls_dgxc.txt"

CASES = {
    "an NCCL key given twice": (
        ["model", "-t", "SW(8,100,0,nccl)_NCCL(ll=100:0.5,ll=9999999:0.01)", "-b", "1M"],
        ["NCCL(...) gives ll twice"],
    ),
    "an NCCL protocol without its efficiency": (
        ["model", "-t", "SW(8,100,0,nccl)_NCCL(ll=100)", "-b", "1M"],
        ["NCCL ll takes BASE_NS:EFF", "'ll=100'"],
    ),
    "NCCL(algos=tree) on one level": (
        ["model", "-t", "SW(8,100,0,nccl)_NCCL(algos=tree)", "-b", "1M"],
        ["NCCL(algos=Tree", "add Ring"],
    ),
    "active chunks on an nccl dim": (
        ["model", "-t", "SW(8,100,0,nccl)", "-b", "1M", "-c", "8", "--active-chunks-per-dim", "8"],
        ["--active-chunks-per-dim 8", "one NCCL call at a time"],
    ),
    "calibrate --nccl-algo Tree on a one-node log": (
        ["calibrate", str(NCCL_LOG), "--nccl-algo", "Tree"],
        ["Tree cannot run all_reduce on 8 GPUs", "--nccl-algo"],
    ),
    **{
        f"a shared port under --compat {c}": (
            ["model", "-t", "SW(2,100,0)_SW(2,100,0)_NIC(0+1,10)", "-b", "1M", "--compat", c],
            [f"not part of --compat {c}", "NIC(...)"],
        )
        for c in ("astra-sim-1.0", "astra-sim-2")
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_input_is_one_line_and_exit_2(capsys, case):
    """The issue's probe is refused in one line naming what to change."""
    argv, words = CASES[case]
    refused(capsys, argv, *words)


@pytest.mark.parametrize("flag", [["--npu-compute-scale", "3=1.5"], ["--compute-jitter", "lognormal:0.3"]])
@pytest.mark.parametrize("compat", ["astra-sim-1.0", "astra-sim-2"])
def test_a_slow_npu_under_compat_is_refused_not_ten_times_faster(capsys, tmp_path, flag, compat):
    """Under --compat a slower NPU made training 10x faster (389 -> 38 us): the flag is now refused."""
    micro = tmp_path / "micro.txt"
    micro.write_text(MICRO)
    argv = ["train", str(micro), "-t", "2x2x2", "-n", "2", "-p", "baseline", "--compat", compat, *flag]
    refused(capsys, argv, f"--compat {compat} has identical NPUs", flag[0])


def test_1024_active_chunks_under_fair_finish_with_a_physical_time(tmp_path):
    """1024 stages in flight on a dim chained 1024 deep in `fair` (RecursionError): now a row at or above its bound."""
    out = tmp_path / "rows.json"
    argv = ["model", "-t", "SW(8,100,700)_SW(4,50,500)", "--network", "fair", "-b", "64M", "-c", "1024"]
    assert main([*argv, "--active-chunks-per-dim", "1024", "-p", "baseline", "-q", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and all(r["time_us"] >= r["ideal_us"] * (1 - 1e-9) for r in rows), rows


def deep_json(tmp_path) -> str:
    """A JSON document nested 100,000 deep (Python's json raises RecursionError on it)."""
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    return str(path)


def test_json_nested_100000_deep_is_one_line_for_every_json_input(capsys, tmp_path):
    """`calibrate --base` and `-t FIT.json` read it through one reader: "nested too deep", not a RecursionError."""
    deep = deep_json(tmp_path)
    two_node = str(DATA / "nccl-tests" / "h100x16_2node_ib_issue309_qoofyk.txt")
    refused(capsys, ["calibrate", two_node, "--base", deep], "cannot read --base", "nested too deep")
    refused(capsys, ["model", "-t", deep, "-b", "1M"], "not a calibrate --json file (nested too deep)")


def test_the_per_dim_fit_caps_its_chunks(capsys):
    """`calibrate --algorithm ring -c 65536` ran past 60 s (two engine runs per size): refused at its cap."""
    argv = ["calibrate", str(NCCL_LOG), "--algorithm", "ring", "-c", "65536"]
    refused(capsys, argv, "at most 4096 chunks, got 65536")


def test_a_log_with_unsorted_sizes_says_why_it_reads_as_many_tables(capsys, tmp_path):
    """Rows out of size order split the log into one-size tables: the line says so (it listed 15 "tables")."""
    lines = NCCL_LOG.read_text().splitlines()
    rows = [
        i for i, ln in enumerate(lines) if ln.split()[:1] and ln.split()[0].isdigit() and len(ln.split()) > 8
    ]
    first, last = rows[0], rows[-1]
    shuffled = lines[first : last + 1][::-1]  # largest first: every row starts a table
    log = tmp_path / "unsorted.txt"
    log.write_text("\n".join(lines[:first] + shuffled + lines[last + 1 :]) + "\n")
    refused(capsys, ["calibrate", str(log)], "sizes do not grow from row to row", "--table")
