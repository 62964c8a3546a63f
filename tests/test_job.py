"""Rules for a job as a whole: Ctrl-C is one line and exit 130; a one-process command runs once under mpiexec."""

import csv
import io
import json
import os
import signal
import subprocess
import sys

import pytest
from harness import ROOT, mpi_env

from themis_mpi.launch import mpiexec_path

RUN = ["-m", "themis_mpi", "run", "-b", "16M", "-n", "500", "-w", "0", "-c", "64"]


def interrupt_when(cmd: list[str], marker: str, timeout_s: float = 120) -> tuple[int, str]:
    """Start cmd in its own process group, SIGINT the group once stdout shows `marker`; (exit, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(),
                            cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker in line:
                os.killpg(proc.pid, signal.SIGINT)
                break
        _, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, err


MODEL = [sys.executable, "-m", "themis_mpi", "model", "-t", "3D-SW_SW_SW_hetero", "-b", "1M", "-e", "1G", "-f", "1.01",
         "-p", "all"]  # fmt: skip
EMULATOR = [mpiexec_path(), "-n", "4", sys.executable, *RUN, "-t", "Ring(4,100,20)"]


@pytest.mark.parametrize(
    "cmd", [MODEL, pytest.param(EMULATOR, marks=pytest.mark.mpi)], ids=["model", "emulator-4-ranks"]
)
def test_ctrl_c_mid_run_is_one_line_and_exit_130(cmd):
    """Ctrl-C once the run is under way (the table's header is out): `themis-mpi: interrupted` once, exit 130.

    Under mpiexec every rank gets the signal; the launcher ends the job when the first rank
    leaves, and on 2 cores shared by 4 ranks rank 0 is sometimes not scheduled in time to say its
    line (about 1 run in 5, as before this test was written down), or, rarer, the launcher (which
    gets the signal too) reports a rank it ended itself (exit 9 after rank 0's line, once in a CI
    run of 2026-11-28). The rule is kept in 3 tries.
    """
    tries = 3 if cmd is EMULATOR else 1
    for _ in range(tries):
        code, err = interrupt_when(cmd, "# themis-mpi")
        if err and code == 130:
            break
    assert code == 130, err
    assert err == "themis-mpi: interrupted\n", err


@pytest.mark.parametrize(
    "args",
    [["model", "-b", "1M", "-q"], ["policies"], ["calibrate", "tests/data/nccl-tests/h100x8_nvls_dgxc.txt"]],
    ids=["model", "policies", "calibrate"],
)
def test_a_one_process_command_under_mpiexec_runs_once(tmp_path, args):
    """`mpiexec -n 2 themis-mpi model ...`: rank 0 runs it, the other rank leaves; one output, one file."""
    out = tmp_path / "out.json"
    extra = ["--json", str(out)] if args[0] in ("model", "calibrate") else []
    proc = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "themis_mpi", *args, *extra],
                          capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    single = subprocess.run([sys.executable, "-m", "themis_mpi", *args], capture_output=True, text=True,
                            env=mpi_env(), cwd=ROOT, timeout=120)  # fmt: skip
    wall = [line.rsplit(None, 1)[0] for line in proc.stdout.splitlines()]  # (the last column may be wall_s)
    assert wall == [line.rsplit(None, 1)[0] for line in single.stdout.splitlines()]
    assert not extra or out.exists()


HALF_WRITTEN = """
import os, signal, sys, time
from themis_mpi import cli
from themis_mpi.output import atomic_path
signal.signal(signal.SIGINT, cli._interrupted)
with atomic_path(sys.argv[1]) as tmp:
    with open(tmp, "w") as f:
        f.write("half of a file")
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
"""


def test_ctrl_c_while_a_file_is_written_leaves_no_partial_file(tmp_path):
    """Interrupted between writing a temporary file and renaming it: exit 130, and the directory stays empty."""
    proc = subprocess.run([sys.executable, "-c", HALF_WRITTEN, str(tmp_path / "out.json")], capture_output=True,
                          text=True, env=mpi_env(), cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode == 130 and proc.stderr == "themis-mpi: interrupted\n", proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_wrong_data_ends_with_exit_1_after_the_report(tmp_path):
    """A Chakra receive of 2 KiB for a send of 1 KiB: the table shows #wrong, then one line and exit 1."""
    from themis_mpi.workloads.et import COMM_RECV_NODE, COMM_SEND_NODE, Attr, EtTrace, Node, write_et

    for r in range(4):

        def side(node_id, kind, peer_key, peer, nbytes):
            attrs = [
                Attr(peer_key, "int64", peer),
                Attr("comm_size", "int64", nbytes),
                Attr("comm_tag", "int64", 3),
            ]
            return Node(node_id, kind, COMM_SEND_NODE if kind == "send" else COMM_RECV_NODE, [], attrs=attrs)

        nodes = [
            side(1, "send", "comm_dst", (r + 1) % 4, 1024),
            side(2, "recv", "comm_src", (r - 1) % 4, 2048),
        ]
        write_et(str(tmp_path / f"mm.{r}.et"), EtTrace("x", "0.0.4", [], nodes))
    proc = subprocess.run([mpiexec_path(), "-n", "4", sys.executable, "-m", "themis_mpi", "train", str(tmp_path / "mm"),
                           "-t", "Ring(4,100,20)", "-c", "1", "-p", "baseline"],
                          capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    (row,) = [
        line for line in proc.stdout.splitlines() if line.split()[:1] == ["baseline"]
    ]  # (not its waits line)
    wrong = int(row.split()[6])
    assert wrong > 0 and proc.stderr == f"themis-mpi: error: {wrong} element(s) differ from the closed form\n"


@pytest.mark.parametrize("flag", ["--json", "--jsonl", "--csv"])
def test_dash_as_an_output_puts_pure_data_on_stdout(flag):
    """`model --json -`: stdout is the data alone (the table goes to stderr), so a pipe can read it."""
    proc = subprocess.run([sys.executable, "-m", "themis_mpi", "model", "-b", "1M", "-e", "2M", flag, "-", "-q"],
                          capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if flag == "--json":
        rows = json.loads(proc.stdout)
    elif flag == "--jsonl":
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
    else:
        rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [int(r["size_bytes"]) for r in rows] == [1 << 20, 1 << 20, 2 << 20, 2 << 20]
    assert "# themis-mpi model" in proc.stderr
