"""Long commands speak at once: the header before any run, progress on stderr, and a cost estimate.

`train`, `workload ... --run`, `replay` and `calibrate` print their ``# ...`` header before they
simulate, then progress (a bar with the ETA on a terminal, lines off one, nothing with ``-q``)
counted where the work happens (`progress.Progress`), and `train` says when the planner's
`estimate` passes `timing.planner.SAY_ABOVE_S`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import time

import harness
import pytest

from themis_mpi.calibrate.ncclfit import RESTARTS
from themis_mpi.cli.options import Meter, expect_line
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.replay import replay_trace
from themis_mpi.run.backend import open_backend
from themis_mpi.run.training import run_graph, run_training
from themis_mpi.timing.planner import (
    COLLECTIVE,
    ONE_NPU,
    SAY_ABOVE_S,
    TRAINING,
    VECTORS,
    WORLD,
    Run,
    chunk_steps,
    estimate,
    plan,
)
from themis_mpi.topology import parse_topology
from themis_mpi.trace import Trace
from themis_mpi.workloads.chakra import Graph
from themis_mpi.workloads.llm import LazyTraces, LlmConfig, fit_groups
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

GNMT = str(harness.ROOT / "traces" / "gnmt.txt")
TRACE = str(harness.ROOT / "docs" / "trace" / "run.h5")
LOG = str(harness.DATA / "nccl-tests" / "h100x8_nvls_dgxc.txt")
SLOW_FAIR = ["-t", "2x2x2", "--network", "fair", "--npu-compute-scale", "5=1.5"]  # every NPU's links
PROGRESS = re.compile(r"^themis-mpi: (\w+: )?\d+% done in \d+ s, ETA (\d+ s|\?)$")
GPT = [
    "workload",
    "gpt",
    "--layers",
    "4",
    "--hidden",
    "1024",
    "--heads",
    "8",
    "--seq",
    "512",
    "--vocab",
    "1000",
]
GPT += ["--tp", "2", "--pp", "2", "--dp", "2", "-t", "2x2x2", "--run"]


@pytest.fixture
def every_update(monkeypatch):
    """Off a terminal, a progress line at every update (not every few seconds)."""
    monkeypatch.setattr(Meter, "NOTE_S", 0.0)


def _progress_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("themis-mpi: ")]


class Calls:
    """A `Progress` that keeps every call."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def __call__(self, done: int, total: int) -> None:
        """Keep the call."""
        self.calls.append((done, total))


# --- the library tells what it did, in its own units ------------------------------------------------


def test_the_training_loop_tells_every_layer_step_once_forward_and_backward():
    """One NPU's view: iterations x layers x 2 steps, told 1, 2, ... up to all of them."""
    wl, calls = parse_workload(GNMT), Calls()
    spec = TrainingSpec(chunks=4, iterations=2)
    run_training(ModelTransport(parse_topology("2x2x2"), RunConfig()), wl, "baseline", spec, calls)
    total = 2 * len(wl.layers) * 2
    assert calls.calls == [(k, total) for k in range(1, total + 1)]


def test_every_npu_tells_its_own_steps_and_each_reaches_the_end():
    """On every NPU's links each NPU's loop tells its steps: every count up to the total, once per NPU."""
    wl, calls = parse_workload(GNMT), Calls()
    topo = parse_topology("2x2x2")
    spec = TrainingSpec(chunks=2, iterations=1, npu_compute_scale=((5, 1.5),))
    # (packet: every NPU runs; under fair the NPUs alike would run as one class, `timing.classes`)
    run_training(ModelTransport(topo, RunConfig(network="packet")), wl, "baseline", spec, calls)
    total = len(wl.layers) * 2
    assert sorted(calls.calls) == sorted((k, total) for k in range(1, total + 1) for _ in range(topo.npus))


def test_a_graph_replay_tells_its_nodes_and_the_linked_ranks_theirs():
    """A generated LLM's pipeline (the linked ranks, greenlets): every rank's nodes, each to its last."""
    c = LlmConfig(
        layers=2, hidden=256, heads=4, seq=128, vocab=100, micro_batch=1, global_batch=4, tp=2, pp=2, dp=2
    )
    layout = fit_groups(c, parse_topology("2x2x2"))
    graph, calls = Graph("<gpt>", LazyTraces(c, layout)), Calls()  # type: ignore[arg-type]
    run_graph(
        ModelTransport(layout.topology, RunConfig()), graph, "baseline", TrainingSpec(chunks=2), None, calls
    )
    ends = {total for done, total in calls.calls if done == total}
    assert calls.calls and ends == {total for _, total in calls.calls}
    assert all(0 < done <= total for done, total in calls.calls)


def test_a_trace_replay_tells_each_collective():
    trace, calls = Trace(TRACE), Calls()
    with open_backend(trace.topology(), False, 60.0) as backend:
        replay_trace(trace, trace.topology(), backend, 60.0, progress=calls)
    n = len(trace.collectives)
    assert calls.calls == [(k, n) for k in range(1, n + 1)]


# --- the estimate ------------------------------------------------------------------------------------


def test_chunk_steps_is_chunks_times_dim_visits_times_the_algorithm_steps():
    """An all-reduce visits each dim twice: ring P-1 steps, halving-doubling log2 P, direct 1."""
    topo = parse_topology("Ring(4,100,500,ring)_SW(8,50,1000,hd)_FC(4,200,500,direct)")
    assert chunk_steps(topo, [Collective("all_reduce", 2**20, "float32", 16, (0, 1, 2))]) == 16 * 2 * (
        3 + 3 + 1
    )
    assert chunk_steps(topo, [Collective("all_gather", 2**20, "float32", 4, (1,))]) == 4 * 3


def test_the_estimate_orders_runs_as_their_work_does():
    """One NPU's view < every NPU of the same run; 1024 NPUs > 64; the reason names the simulator and the cause."""
    # (packet: a class of 1 beside larger ones runs every NPU; fair's classes: test_classes_messages.py)
    config, slow = RunConfig(network="packet"), RunConfig(network="packet", npu_delay_ns=((5, 1e3),))
    small, big = parse_topology("4x4x4"), parse_topology("16x8x8")
    one, _ = estimate(plan(Run(big, config, TRAINING)), 5000)
    every, why = estimate(plan(Run(big, slow, TRAINING)), 5000)
    few, _ = estimate(plan(Run(small, slow, TRAINING)), 5000)
    assert plan(Run(big, config, TRAINING)).simulator == ONE_NPU and one < every
    assert few < every
    assert (
        why.startswith(f"{WORLD} under packet") and "NPU 5 starts late" in why and "1024 NPUs x 5,000" in why
    )
    ideal = RunConfig(network="ideal", npu_delay_ns=((5, 1e3),))
    vectors = [estimate(plan(Run(t, ideal, COLLECTIVE)), 5000) for t in (small, big)]
    assert plan(Run(small, ideal, COLLECTIVE)).simulator == VECTORS
    assert vectors[0][0] < vectors[1][0] < every
    _, why = estimate(plan(Run(big, config, TRAINING, slow_compute=True)), 10, [5])
    assert "NPU 5 computes slower" in why
    assert estimate(plan(Run(big, config, TRAINING)), 2000)[0] < one  # fewer steps, less time


def test_the_expect_line_comes_only_above_the_threshold(monkeypatch):
    assert expect_line(SAY_ABOVE_S, "why") is None
    assert expect_line(SAY_ABOVE_S + 1, "why") == f"# expect ~{SAY_ABOVE_S + 1:.0f} s: why"
    assert expect_line(240, "why") == "# expect ~4 min: why"
    monkeypatch.setenv("THEMIS_MPI_EXPECT_S", "0")
    assert expect_line(0.5, "why") == "# expect ~0.5 s: why"


# --- the commands, off a terminal (in this process) ------------------------------------------------------


def test_train_prints_the_header_and_estimate_then_plain_progress_lines_then_the_table(
    every_update, monkeypatch
):
    monkeypatch.setenv("THEMIS_MPI_EXPECT_S", "0")  # any run says what it expects
    out = harness.in_process(["train", GNMT, "-c", "2", "-n", "1", *SLOW_FAIR])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"# workload {GNMT}: DATA")
    expect = [line for line in lines if line.startswith("# expect ~")]
    assert len(expect) == 1 and f"{WORLD} under fair (NPU 5 computes slower, 8 NPUs x" in expect[0]
    assert lines.index(expect[0]) < next(i for i, line in enumerate(lines) if line.startswith("#   policy"))
    progress = _progress_lines(out.stderr)
    assert progress and all(PROGRESS.match(line) for line in progress), out.stderr
    assert {line.split(":")[1].strip() for line in progress} == {"baseline", "themis"}
    assert "themis-mpi:" not in out.stdout


def test_train_says_nothing_of_its_cost_below_the_threshold():
    out = harness.in_process(["train", GNMT, "-c", "2", "-n", "1", "-t", "2x2x2"])
    assert out.returncode == 0 and "# expect" not in out.stdout


def test_quiet_prints_no_progress(every_update):
    for args in (["train", GNMT, "-c", "2", "-n", "1", *SLOW_FAIR], ["replay", TRACE], [*GPT]):
        out = harness.in_process([*args, "-q"])
        assert out.returncode == 0 and out.stderr == "", (args, out.stderr)
        assert out.stdout.startswith("# ")


def test_json_on_stdout_is_only_the_rows_and_the_progress_is_on_stderr(every_update):
    out = harness.in_process(["train", GNMT, "-c", "2", "-n", "1", *SLOW_FAIR, "--json", "-"])
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["policy"] for r in rows] == ["baseline", "themis"]
    assert out.stderr.startswith(f"# workload {GNMT}") and _progress_lines(out.stderr)


@pytest.mark.parametrize(
    "args, header",
    [
        (["replay", TRACE], f"# replay of {TRACE}"),
        (["calibrate", LOG], f"# calibrate {LOG}:"),
        (GPT, "# gpt: 4 layers"),
    ],
    ids=["replay", "calibrate", "workload"],
)
def test_replay_calibrate_and_workload_print_the_header_then_progress(every_update, args, header):
    out = harness.in_process(args)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(header)
    progress = _progress_lines(out.stderr)
    assert progress and all(PROGRESS.match(line) for line in progress), out.stderr
    assert "100% done" in progress[-1]
    if args[0] == "calibrate":  # one line per whole staged fit
        assert [line.split("% done")[0][-3:].strip() for line in progress] == [
            f"{100 * k // RESTARTS}" for k in range(1, RESTARTS + 1)
        ]


# --- in processes of their own: the order on one stream, a terminal, MPI ----------------------------------


def _env(**extra: str) -> dict:
    return {**harness.mpi_env(), **extra}


@pytest.mark.parametrize(
    "args, header",
    [
        (["train", GNMT, "-c", "2", "-n", "1", *SLOW_FAIR], "# workload"),
        (["replay", TRACE], "# replay of"),
        (["calibrate", LOG], "# calibrate"),
        (GPT, "# gpt:"),
    ],
    ids=["train", "replay", "calibrate", "workload"],
)
def test_on_one_pipe_the_header_comes_before_the_first_progress_line(args, header):
    """Stdout and stderr on one pipe: the header was written (flushed) before the run told anything."""
    out = subprocess.run(
        [sys.executable, "-m", "themis_mpi", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        cwd=harness.ROOT,
        env=_env(THEMIS_MPI_PROGRESS_S="0"),
    )
    assert out.returncode == 0, out.stdout
    lines = out.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if PROGRESS.match(line))
    assert lines[0].startswith(header) and 0 < first


def test_train_on_a_terminal_shows_the_header_first_then_a_bar_with_eta():
    """Through a pseudo-terminal: the header arrives while the run is still going, before the bar and the table."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size
    slow = ["-c", "8", "--network", "fair", "--npu-compute-scale", "5=1.5", "-t", "4x4x4"]  # a few seconds
    cmd = [sys.executable, "-m", "themis_mpi", "train", GNMT, *slow]
    proc = subprocess.Popen(cmd, stdout=follower, stderr=follower, cwd=harness.ROOT, env=_env())
    os.close(follower)
    seen, header_at_s, end_s = b"", None, None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        seen += chunk
        if header_at_s is None and b"# workload" in seen:
            header_at_s = time.monotonic()
    proc.wait(timeout=60)
    end_s = time.monotonic()
    os.close(leader)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert header_at_s is not None and header_at_s < end_s
    header, bar, table = text.index("# workload"), text.find("% |"), text.index("#   policy")
    assert 0 <= header < bar < table, text
    assert "ETA" in text[bar:table] and "baseline" in text[header:table]


def test_under_mpi_only_rank_0_prints_the_header_and_progress():
    """8 ranks each run the loop; the lines are rank 0's alone: one header, no more lines than updates."""
    env = _env(THEMIS_MPI_PROGRESS_S="0")
    cmd = [harness.mpiexec_path(), "-n", "8", sys.executable, "-m", "themis_mpi", "train", GNMT]
    cmd += ["-c", "2", "-n", "1", "-t", "2x2x2", "-p", "baseline"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=harness.ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("# workload") == 1
    progress = _progress_lines(out.stderr)
    steps = len(parse_workload(GNMT).layers) * 2  # one policy, one iteration
    assert 0 < len(progress) <= steps, out.stderr


def test_no_eta_is_extrapolated_from_under_one_per_cent_of_the_work(monkeypatch):
    """0.0005 % done after 19 s said "ETA 3847682 s" (the 200k-node graph's first line): now "?"."""
    from themis_mpi.cli import options

    meter = options.Meter(1, quiet=True)
    monkeypatch.setattr(options.time, "perf_counter", lambda: meter.t0_s + 19.0)
    meter.fraction = 5e-6
    assert meter.line().endswith("ETA ?")
    meter.fraction = 0.4
    assert meter.line() == "40% done in 19 s, ETA 28 s"
