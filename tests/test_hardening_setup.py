"""A rank stopped while the others set up on their own is named within the timeout (issue 46).

Between MPI_Init and a rank's first watched wait it builds the grid (MPI's blocking
constructors) and, under stragglers on a sharing rule, runs the model of every NPU's links that
times the run: minutes at 200 ranks on 2 cores. The vigil (`mpi.progress.Vigil`) watches those
phases: a stop there ends the job (exit 3) with one line naming the rank, not after the set-up.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from harness import ROOT, at_once, mpi_env, mpiexec_path
from test_hardening import end_job, job_pids, launcher_keeps_survivors

TIMEOUT_S = 5
MODEL_S = 120  # tests/jobs/inject_fault.py: how long the others' model runs last once a rank stops
STARTUP_BUDGET_S = 120  # MPI start-up of 8 ranks on a loaded 2-core machine can take tens of seconds
MICRO = "DATA\n2\nconv1 -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 1048576 5\nfc -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 4194304 5\n"


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def straggler_job(tmp_path, kind: str, rank: int, json_to: str) -> list[str]:
    """An 8-rank straggler training under tests/jobs/inject_fault.py KIND RANK, its rows to `json_to`."""
    workload = tmp_path / "micro.txt"
    workload.write_text(MICRO)
    inject = [str(ROOT / "tests" / "jobs" / "inject_fault.py"), kind, str(rank)]
    run = ["train", str(workload), "-t", "2x2x2", "--npu-delay-us", "3=5", "-p", "baseline", "-n", "1"]
    return [mpiexec_path(), *launcher_keeps_survivors(), "-n", "8", sys.executable, *inject, *run,
            "--timeout-s", str(TIMEOUT_S), "--json", json_to]  # fmt: skip


def frozen_in_set_up(tmp_path, kind: str, what: str) -> tuple[int, float, str, str]:
    """Rank 5 of a straggler job stopped in set-up (`what`): exit code, seconds from the stop, output, marker."""
    marker = str(tmp_path / "themis_mpi.json")  # (`job_pids` finds the ranks by it)
    proc = subprocess.Popen(
        straggler_job(tmp_path, kind, 5, marker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=mpi_env(),
        cwd=ROOT,
    )
    try:
        deadline, struck = time.monotonic() + STARTUP_BUDGET_S, None
        while struck is None and time.monotonic() < deadline and proc.poll() is None:
            if any(stopped(pid) for pid, rank in job_pids(marker).items() if rank == 5):
                struck = time.monotonic()
            time.sleep(0.05)
        assert struck is not None, f"rank 5 did not stop in {what}"
        _, err = proc.communicate(timeout=MODEL_S + 60)
        took_s = time.monotonic() - struck
    finally:
        end_job(proc, marker)
    return proc.returncode, took_s, err, marker


def busy_on_their_own(tmp_path) -> subprocess.CompletedProcess:
    """Every rank of a straggler job busy for 2x --timeout-s in its model run, nobody stopped."""
    cmd = straggler_job(tmp_path, "freeze-model", 99, "-")  # (no rank 99: nobody stops)
    env = dict(mpi_env(), THEMIS_MPI_TEST_MODEL_S=str(2 * TIMEOUT_S))
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=STARTUP_BUDGET_S + 120
    )


SET_UP = [
    ("freeze-grid", "the grid's blocking constructors"),
    ("freeze-model", "the model run of every NPU's links that times a straggler run"),
]


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory) -> dict:
    """The module's three jobs run at once (`harness.at_once`; each mostly waits for the vigil or its model run)."""
    name = "test_a_rank_frozen_in_set_up_is_named_within_the_timeout[{}-{}]"
    scenarios = {
        name.format(kind, what): lambda kind=kind, what=what: frozen_in_set_up(
            tmp_path_factory.mktemp(kind), kind, what
        )
        for kind, what in SET_UP
    }
    scenarios["test_ranks_busy_on_their_own_longer_than_the_timeout_are_not_silent"] = lambda: (
        busy_on_their_own(tmp_path_factory.mktemp("busy"))
    )
    return at_once(request, scenarios)


@pytest.mark.parametrize("kind, what", SET_UP)
def test_a_rank_frozen_in_set_up_is_named_within_the_timeout(request, jobs, kind, what):
    """Rank 5 stops in set-up (`what`) while the others stay busy: one line names it, exit 3, long before they finish."""
    returncode, took_s, err, marker = jobs[request.node.name].result()
    # without the vigil the others would notice only at their first wait, after MODEL_S busy
    assert returncode == 3 and took_s < MODEL_S / 2, (returncode, took_s, err[-3000:])
    lines = [ln for ln in err.splitlines() if ln.startswith("themis-mpi: error:")]
    assert len(lines) == 1 and "rank(s) 5 did not answer" in lines[0], err[-3000:]
    assert not os.path.exists(marker)


def test_ranks_busy_on_their_own_longer_than_the_timeout_are_not_silent(request, jobs):
    """Every rank busy for 2x --timeout-s in the model run (CPU-bound, 8 ranks on 2 cores): not a stall, exit 0."""
    proc = jobs[request.node.name].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)
    assert row["wrong"] == 0
