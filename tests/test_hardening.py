"""Rules for dying and silent ranks: bounded time, a one-line diagnosis, no complete-looking trace."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import ROOT, at_once, mpi_env, mpiexec_path

TIMEOUT_S = 5
STARTUP_BUDGET_S = 120  # MPI start-up of 8 ranks on a loaded 2-core machine can take tens of seconds


def read_lines(stream, lines: list[str], first: threading.Event | None) -> None:
    """Collect a pipe's lines until it closes; set `first` at the first one."""
    for line in stream:
        lines.append(line)
        if first is not None:
            first.set()


def launcher_keeps_survivors() -> list[str]:
    """Flags that stop the launcher from killing the survivors at once, so the watchdog speaks."""
    version = subprocess.run([mpiexec_path(), "--version"], capture_output=True, text=True).stdout
    return ["-disable-auto-cleanup"] if "HYDRA" in version.upper() else []


def processes() -> dict[int, list[bytes]]:
    """PID -> command line (its arguments) of every live process."""
    out = {}
    for pid in os.listdir("/proc"):
        try:
            out[int(pid)] = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except (ValueError, OSError):  # not a process, or gone
            continue
    return out


def job_pids(marker: str) -> dict[int, int]:
    """PID -> MPI rank of the live Python ranks whose command line contains `marker`."""
    out = {}
    for pid, argv in processes().items():
        cmd = b" ".join(argv).decode()
        if marker not in cmd or "themis_mpi" not in cmd:
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        ranks = [e.split(b"=", 1)[1] for e in env if e.startswith((b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK="))]
        if ranks:
            out[pid] = int(ranks[0])
    return out


def end_job(proc, marker: str) -> None:
    """Whatever a test left of a job: its launcher and every rank whose command line has `marker`."""
    if proc.poll() is None:
        proc.kill()
    for pid in job_pids(marker):
        os.kill(pid, signal.SIGKILL)


def strike(tmp_path, how: str, attempt: int):
    """Run 8 ranks, kill or freeze rank 5 mid-collective; return what happened."""
    trace = tmp_path / f"{how}{attempt}.h5"
    cmd = [
        mpiexec_path(),
        *launcher_keeps_survivors(),
        "-n",
        "8",
        sys.executable,
        "-m",
        "themis_mpi",
        "run",
        "-t",
        "2x2x2",
        "-b",
        "64M",
        "-c",
        "64",
        "-n",
        "1000",
        "-w",
        "0",
        "--timeout-s",
        str(TIMEOUT_S),
        "--trace",
        str(trace),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT
    )
    # rank 0 prints the header once MPI and the grid are up: strike after that, not during
    # start-up, whose length depends on the machine's load (a stop then is start-up's own rule)
    out, err_lines, started = [], [], threading.Event()
    readers = [
        threading.Thread(target=read_lines, args=(proc.stdout, out, started), daemon=True),
        threading.Thread(target=read_lines, args=(proc.stderr, err_lines, None), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        assert started.wait(STARTUP_BUDGET_S), f"the job did not start within {STARTUP_BUDGET_S} s"
        pids = job_pids(str(trace))
        assert len(pids) == 8, f"{len(pids)} ranks found"
        time.sleep(1)  # well inside the 1000 iterations
        victim_pid, victim = next((p, r) for p, r in pids.items() if r == 5)
        os.kill(victim_pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        struck = time.monotonic()
        proc.wait(timeout=TIMEOUT_S + 60)
        for reader in readers:
            reader.join(timeout=10)
        err = "".join(err_lines)
        while job_pids(str(trace)) and time.monotonic() - struck < TIMEOUT_S + 30:
            time.sleep(0.2)  # survivors that never waited on the lost rank time out on their own
        ended_after_s = time.monotonic() - struck
        survivors = job_pids(str(trace))
    finally:
        end_job(proc, str(trace))
    return proc.returncode, err, survivors, ended_after_s, victim, trace


def dead_or_silent(tmp_path, how: str) -> tuple[int, str, int]:
    """Kill or freeze rank 5 (`strike`) until a survivor speaks; the exit code, output and victim.

    Even with auto-cleanup off, MPICH's launcher sometimes ends the job itself when a rank is
    killed (exit 9), or its proxy crashes (``unable to forward PMI response``, exit 255, or
    mpiexec itself dies of the broken pipe, signal 13: once in a README run of 2026-11-28 at load
    9), taking every rank and their output with it before any survivor notices. Every attempt must
    still end all ranks in time; only a job the launcher ended without a word from us is retried
    (it did so in about 45 % of kills here), up to 8 attempts.
    """
    for attempt in range(8 if how == "kill" else 1):
        returncode, err, survivors, ended_after_s, victim, trace = strike(tmp_path, how, attempt)
        assert returncode != 0
        assert not survivors and ended_after_s < TIMEOUT_S + 30, (survivors, err[-2000:])
        assert not trace.exists()
        lines = [ln for ln in err.splitlines() if ln.startswith("themis-mpi: error:")]
        launcher_took_over = returncode in (9, 255, -13) and "Traceback" not in err
        if lines or not launcher_took_over:
            break
    return returncode, err, victim


def frozen_before_mpi(tmp_path) -> tuple[int, float, str, str]:
    """Rank 5 of 8 stopped before MPI_Init: the exit code, seconds from the stop, output, marker."""
    marker = str(tmp_path / "startup.json")
    cmd = [
        mpiexec_path(),
        "-n",
        "8",
        sys.executable,
        "-m",
        "themis_mpi",
        "run",
        "-t",
        "2x2x2",
        "-b",
        "1M",
        "-n",
        "1",
        "-w",
        "0",
        "--timeout-s",
        str(TIMEOUT_S),
        "--json",
        marker,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT
    )
    try:
        victim = None
        deadline = time.monotonic() + 30
        while victim is None and time.monotonic() < deadline:
            victim = next((pid for pid, rank in job_pids(marker).items() if rank == 5), None)
            time.sleep(0.02)
        assert victim is not None, "rank 5 did not start"
        os.kill(victim, signal.SIGSTOP)  # long before MPI_Init (the imports take longer)
        struck = time.monotonic()
        _, err = proc.communicate(timeout=TIMEOUT_S + 60)
        took_s = time.monotonic() - struck
    finally:
        end_job(proc, marker)
    return proc.returncode, took_s, err, marker


def frozen_before_grid() -> tuple[subprocess.CompletedProcess, float]:
    """Rank 5 of 8 stopped after MPI_Init, before the grid (tests/jobs/inject_fault.py): the job, its seconds."""
    return run_timed(
        [
            mpiexec_path(),
            *launcher_keeps_survivors(),
            "-n",
            "8",
            sys.executable,
            str(ROOT / "tests" / "jobs" / "inject_fault.py"),
            "freeze-start",
            "5",
            "run",
            "-t",
            "2x2x2",
            "-b",
            "1M",
            "-n",
            "1",
            "-w",
            "0",
            "--timeout-s",
            str(TIMEOUT_S),
        ],
        timeout_s=TIMEOUT_S + 90,
    )


def frozen_writing_trace(tmp_path) -> tuple[int, float, str, Path]:
    """Rank 0 of 8 stopped as it writes the trace: the exit code, the job's seconds, output, trace."""
    trace = tmp_path / "frozen.h5"
    cmd = [
        mpiexec_path(),
        *launcher_keeps_survivors(),
        "-n",
        "8",
        sys.executable,
        str(ROOT / "tests" / "jobs" / "inject_fault.py"),
        "freeze-write",
        "0",
        "run",
        "-t",
        "2x2x2",
        "-b",
        "1M",
        "-n",
        "1",
        "-w",
        "0",
        "--timeout-s",
        str(TIMEOUT_S),
        "--trace",
        str(trace),
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT
    )
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S + 90)
    finally:
        end_job(proc, str(trace))
    return proc.returncode, time.monotonic() - start, err, trace


def guard_past_its_timeout() -> tuple[int, float, str, str]:
    """A 'MPI_Init' of 60 s under a guard of 1 s (`guarded`): exit code, seconds, output, errors."""
    t0 = time.monotonic()
    proc = guarded(1, 60)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, time.monotonic() - t0, out, err


@pytest.fixture(scope="module")
def waits(request, tmp_path_factory) -> dict:
    """The jobs of the tests that wait for a timeout, run at once (`harness.at_once`): each test's outcome."""

    def folder(name: str) -> Path:
        return tmp_path_factory.mktemp(name)

    return at_once(
        request,
        {
            "test_a_dead_or_silent_rank_ends_the_job_with_a_diagnosis[kill]": lambda: dead_or_silent(
                folder("kill"), "kill"
            ),
            "test_a_dead_or_silent_rank_ends_the_job_with_a_diagnosis[stop]": lambda: dead_or_silent(
                folder("stop"), "stop"
            ),
            "test_a_rank_frozen_before_mpi_starts_ends_the_job_within_the_timeout": lambda: frozen_before_mpi(
                folder("startup")
            ),
            "test_a_rank_frozen_before_the_grid_is_built_is_named_within_the_timeout": frozen_before_grid,
            "test_rank_0_frozen_while_writing_the_trace_is_named_and_leaves_no_trace": lambda: (
                frozen_writing_trace(folder("write"))
            ),
            "test_the_start_up_guard_ends_a_rank_whose_mpi_does_not_start_in_time": guard_past_its_timeout,
        },
    )


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_dead_or_silent_rank_ends_the_job_with_a_diagnosis(request, waits, how):
    """A killed or frozen rank of 8 ends the job in time, with one line naming it; no trace is left (`dead_or_silent`)."""
    returncode, err, victim = waits[request.node.name].result()
    lines = [ln for ln in err.splitlines() if ln.startswith("themis-mpi: error:")]
    assert lines, err[-4000:] + f" returncode={returncode}"
    if how == "stop":  # every survivor sees the silence; the job says so once
        assert len(lines) == 1, lines
    named = [ln.split("; rank(s) ")[1].split(" did not answer")[0] for ln in lines if "did not answer" in ln]
    named += [ln.split("waiting for rank(s) ")[1].split(" in ")[0] for ln in lines if "waiting for" in ln]
    assert any(str(victim) in peers.split(", ") for peers in named), lines
    assert all("collective" in ln or "reduction" in ln or "barrier" in ln for ln in lines)
    assert "Traceback" not in err


FAULT_EXITS = {"usage": 2, "bug": 1, "stall": 3}


def run_timed(cmd: list[str], timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """Run a job to its end; return it and how long it took."""
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=timeout_s)
    return proc, time.monotonic() - start


def healthy_job_s() -> float:
    """How long a healthy 8-rank job of one small collective takes: start-up, the run, the ending."""
    baseline, took_s = run_timed(
        [
            mpiexec_path(),
            "-n",
            "8",
            sys.executable,
            "-m",
            "themis_mpi",
            "run",
            "-t",
            "2x2x2",
            "-b",
            "1M",
            "-c",
            "8",
            "-n",
            "1",
            "-w",
            "0",
            "-p",
            "baseline",
        ]
    )
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    return took_s


@pytest.fixture(scope="module")
def startup_s() -> float:
    """A healthy job's time, measured once for the six fault cases (`healthy_job_s`)."""
    return healthy_job_s()


@pytest.mark.parametrize("rank", [0, 3])
@pytest.mark.parametrize("kind", ["usage", "bug", "stall"])
def test_a_fault_on_one_rank_ends_every_rank_at_once(kind, rank, startup_s):
    """A user mistake, a bug or a stall raised on one rank ends all 8 ranks within 5 s with its exit code.

    The healthy job (`startup_s`, run once for the six cases) is the time a job takes anyway; a
    case over it by the margin times a healthy job again, in case the machine slowed since.
    """
    proc, took_s = run_timed(
        [
            mpiexec_path(),
            "-n",
            "8",
            sys.executable,
            str(ROOT / "tests" / "jobs" / "inject_fault.py"),
            kind,
            str(rank),
            "run",
            "-t",
            "2x2x2",
            "-b",
            "1M",
            "-c",
            "8",
            "-n",
            "1",
            "-w",
            "0",
            "--timeout-s",
            "60",
        ]
    )
    assert proc.returncode == FAULT_EXITS[kind], proc.stderr[-2000:]
    if took_s >= startup_s + TIMEOUT_S:
        startup_s = healthy_job_s()
    assert took_s < startup_s + TIMEOUT_S, (
        took_s,
        startup_s,
    )  # the other ranks did not wait for the watchdog
    if kind == "bug":
        assert proc.stderr.count("Traceback") == 1 and "ZeroDivisionError: injected bug" in proc.stderr
    else:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("themis-mpi: error:")]
        assert len(lines) == 1 and f"injected {'user mistake' if kind == 'usage' else 'stall'}" in lines[0]
        assert "Traceback" not in proc.stderr


def test_a_workload_that_does_not_fit_exits_2_on_every_rank_at_once():
    """The transformer's model-parallel group of 128 on 2x2x2: one line, exit 2, no rank left waiting."""
    proc, took_s = run_timed(
        [
            mpiexec_path(),
            "-n",
            "8",
            sys.executable,
            "-m",
            "themis_mpi",
            "train",
            str(ROOT / "traces" / "transformer_1t.txt"),
            "-t",
            "2x2x2",
        ]
    )
    assert proc.returncode == 2 and took_s < TIMEOUT_S + 10, (proc.returncode, took_s)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [
        "themis-mpi: error: model_parallel_NPU_group 128 does not match the leading dims of 2x2x2 "
        "(possible groups: 1, 2, 4, 8)"
    ]


def test_a_rank_frozen_before_mpi_starts_ends_the_job_within_the_timeout(request, waits):
    """A rank stopped before MPI_Init keeps the others in MPI_Init: they give up after the timeout, in one line."""
    returncode, took_s, err, marker = waits[request.node.name].result()
    assert returncode != 0 and took_s < TIMEOUT_S + 30
    lines = [ln for ln in err.splitlines() if ln.startswith("themis-mpi: error:")]
    assert lines == [
        f"themis-mpi: error: MPI did not start within {TIMEOUT_S} s (--timeout-s): a rank died or stopped "
        "before MPI_Init, or start-up is slower than that on this machine; aborting"
    ], err[-3000:]
    assert not os.path.exists(marker)


GUARDED = """
import sys, time
from themis_mpi.run.backend import _start_up_deadline
with _start_up_deadline(float(sys.argv[1])):
    time.sleep(float(sys.argv[2]))  # MPI_Init, as long as it takes
print("through", flush=True)
"""


def guards_of(pid: int) -> list[int]:
    """The live start-up guard processes of process `pid`."""
    return [p for p, argv in processes().items() if b"themis-mpi-guard" in argv and str(pid).encode() in argv]


def guarded(timeout_s: float, init_s: float, rank: int = 0) -> subprocess.Popen:
    """A process whose 'MPI_Init' takes init_s under a start-up guard of timeout_s, as rank `rank`."""
    env = dict(mpi_env(), PMI_RANK=str(rank))
    cmd = [sys.executable, "-c", GUARDED, str(timeout_s), str(init_s)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_the_start_up_guard_ends_a_rank_whose_mpi_does_not_start_in_time(request, waits):
    """Past the timeout, rank 0's guard says one line and kills its rank; it does not wait for MPI_Init."""
    returncode, took_s, out, err = waits[request.node.name].result()
    assert returncode == -signal.SIGKILL and took_s < 30
    assert out == ""
    assert err.splitlines() == [
        "themis-mpi: error: MPI did not start within 1 s (--timeout-s): a rank died or stopped "
        "before MPI_Init, or start-up is slower than that on this machine; aborting"
    ]


def test_the_start_up_guard_leaves_once_mpi_is_up_and_says_nothing():
    """A rank whose MPI starts in time goes on, silent, and its guard is gone when the rank goes on."""
    proc = guarded(30, 0.5, rank=3)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, "through\n", "")
    assert guards_of(proc.pid) == []


def test_the_start_up_guard_leaves_when_its_rank_dies_before_mpi_starts():
    """A rank killed in start-up leaves no guard behind to fire later."""
    proc = guarded(30, 60)
    deadline = time.monotonic() + 30
    while not guards_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert guards_of(proc.pid), "the guard did not start"
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while guards_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guards_of(proc.pid) == []


def test_a_rank_frozen_before_the_grid_is_built_is_named_within_the_timeout(request, waits):
    """A rank stopped after MPI_Init, before the grid: the others' start-up barrier names it and the job ends."""
    proc, took_s = waits[request.node.name].result()
    assert proc.returncode != 0 and took_s < TIMEOUT_S + 60
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("themis-mpi: error:")]
    assert lines and "start-up barrier" in lines[0] and "rank(s) 5 did not answer" in lines[0], proc.stderr[
        -3000:
    ]


def test_rank_0_frozen_while_writing_the_trace_is_named_and_leaves_no_trace(request, waits):
    """Rank 0 stops as it writes the trace: the others, waiting at the final barrier, name it and end the job."""
    returncode, took_s, err, trace = waits[request.node.name].result()
    assert returncode != 0 and took_s < TIMEOUT_S + 60
    lines = [ln for ln in err.splitlines() if ln.startswith("themis-mpi: error:")]
    assert lines and "final barrier" in lines[0] and "rank(s) 0 did not answer" in lines[0], err[-3000:]
    assert not trace.exists() and not list(trace.parent.glob(".*partial*"))


def test_a_wall_clock_step_longer_than_the_timeout_is_not_silence():
    """Under --clock wall a rank waiting for its own step deadline (2.4 s here) is not stalled by --timeout-s 1."""
    proc, _ = run_timed(
        [
            mpiexec_path(),
            "-n",
            "2",
            sys.executable,
            "-m",
            "themis_mpi",
            "run",
            "-t",
            "Ring(2,100,20)",
            "-b",
            "1M",
            "-c",
            "1",
            "-n",
            "1",
            "-w",
            "0",
            "-p",
            "baseline",
            "--clock",
            "wall",
            "--time-scale",
            "500000",
            "--timeout-s",
            "1",
            "--json",
            "-",
        ],
        timeout_s=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)
    assert row["wrong"] == 0 and row["time_us"] > 2.4e6 / 500000 * 1e6 / 1e6


def test_the_memory_check_gives_every_rank_the_same_answer(monkeypatch):
    """The pre-MPI memory check judges by MemTotal, so ranks that see different MemAvailable agree."""
    from themis_mpi import limits

    fields = {"MemTotal": 24 * 2**30, "MemAvailable": 2**30}
    monkeypatch.setattr(limits, "meminfo_bytes", lambda field: fields[field])
    monkeypatch.setenv("MPI_LOCALNRANKS", "256")
    limits.check_memory(8192, "an 8 KiB all-reduce")  # 256 x 64 MiB = 16 GiB: fits in 24 GiB
    fields["MemAvailable"] = 20 * 2**30
    limits.check_memory(8192, "an 8 KiB all-reduce")
    with pytest.raises(limits.UsageError, match="256 ranks on this machine need about 32.0 GiB"):
        limits.check_memory(64 << 20, "64 MiB buffers")
