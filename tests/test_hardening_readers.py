"""Hardening, round 4, part 1 (issue 46): readers, streams, resume and messages.

Every bad input of the issue's list is refused with one line that names the flag or the file line,
and exit 2 (in-process through `cli.app.main`, so the exit code and the line are checked without
a subprocess); a valid-but-heavy input is refused by a documented cap.
"""

from __future__ import annotations

import pytest

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
        (["-b", "-4M"], ("bad size '-4M'",)),
    ],
)
def test_values_that_start_with_a_dash_reach_their_check(capsys, argv, words):
    """A value starting with '-' is the flag's value (argparse said "expected one argument")."""
    refused(capsys, ["model", *argv], *words)


def test_a_bandwidth_list_of_dashes_keeps_every_default(capsys):
    """`--bandwidth -,-,-` keeps each dim's bandwidth: the same rows as without it."""
    argv = ["model", "-b", "1M", "-c", "4", "-q"]
    assert ran(capsys, [*argv, "--bandwidth", "-,-,-"]).split()[-40:] == ran(capsys, argv).split()[-40:]


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
