"""Stragglers in `workload gpt --run` (issue 43): the priced iteration with a slow, late or badly linked NPU.

``--run`` takes `train`'s straggler flags, and `api.price_gpt` the same keywords; every run of
the split runs with them (`run.priced.price_all`). Checked against the other path (``--out``
then `train` of the files with the same flags), against a closed form (every NPU at 1.5x is the
accelerator 1.5x slower), with the parts adding up and a slow last stage growing the bubble by
at least its extra compute; under ``ideal`` the planner's one line before any header.
"""

from __future__ import annotations

import json
import re

import pytest
from harness import in_process
from test_classes_messages import random_llm

from themis_mpi import api

GPT = ["workload", "gpt", *"--layers 8 --hidden 64 --heads 4 --seq 32 --vocab 100 --micro-batch 2".split(),
       *"--global-batch 16 --tp 2 --pp 4 --dp 2 --peak-tflops 1 -c 4".split()]  # fmt: skip
TOPOLOGY = "SW(4,100,500)_SW(2,50,1000)_SW(2,50,800)"  # (16 NPUs: TP 2 x DP 2 x PP 4)
SPLIT = ("iteration_us", "compute_us", "exposed_us", "TP", "PP", "DP", "EP", "bubble_us", "ideal_bubble_us",
         "imbalance_us", "stage_compute_us")  # fmt: skip


def priced(flags: list[str]) -> tuple[dict[str, float], str]:
    """`workload gpt --run --json -` with `flags`: each policy's iteration, and the header (standard error)."""
    proc = in_process([*GPT, "-t", TOPOLOGY, "--run", "-q", "--json", "-", *flags])
    assert proc.returncode == 0, proc.stderr
    return {r["policy"]: r["iteration_us"] for r in json.loads(proc.stdout)}, proc.stderr


def replayed(tmp_path, flags: list[str]) -> dict[str, float]:
    """`workload gpt --out`, then `train` of its files on the topology it names with `flags`: each policy's iteration."""
    prefix = str(tmp_path / "gpt")
    wrote = in_process([*GPT, "-t", TOPOLOGY, "--out", prefix])
    assert wrote.returncode == 0, wrote.stderr
    fitted = re.search(r"themis-mpi train \S+ -t '([^']+)'", wrote.stdout)
    assert fitted, wrote.stdout
    proc = in_process(["train", prefix, "-t", fitted.group(1), "-c", "4", "-q", "--json", "-", *flags])
    assert proc.returncode == 0, proc.stderr
    return {r["policy"]: r["iteration_us"] for r in json.loads(proc.stdout)}


@pytest.mark.parametrize(
    "flags",
    [
        "--npu-compute-scale 5=1.5",
        "--npu-compute-scale 12=2 --npu-delay-us 3=20 --link-scale 1:2=0.5 --network fair",
        "--compute-jitter lognormal:0.2 --seed 3 --network store-forward",
    ],
)
def test_run_with_stragglers_is_the_replay_of_its_files_with_them(tmp_path, flags):
    """``--run`` with stragglers gives each policy's iteration of `train` on the ``--out`` files with the same flags.

    The header says the stragglers (every part runs with them), and the straggler is felt.
    """
    network = flags.split()[flags.split().index("--network") :] if "--network" in flags else []
    got, header = priced(flags.split())
    assert got == replayed(tmp_path, flags.split())
    assert re.search(r"^#   stragglers: .*; every part runs with them$", header, re.M), header
    healthy, _ = priced(network)
    assert all(got[p] != healthy[p] for p in got)


@pytest.mark.parametrize("rule", ["packet", "fair"])
def test_every_npu_at_one_and_a_half_is_an_accelerator_one_and_a_half_times_slower(rule):
    """Every NPU at 1.5x (`npu_compute_scale` on each) on 1.5 TFLOP/s is the healthy run on 1 TFLOP/s: every part.

    That is ``--compute-scale 1.5`` (a factor on every compute time) where the generator sets the
    compute times from the peak: each run of the split is the same iteration, times.
    """
    model = dict(
        layers=8, hidden=64, heads=4, seq=32, vocab=100, micro_batch=2, global_batch=16, tp=2, pp=4, dp=2
    )
    each = api.price_gpt(TOPOLOGY, "baseline", 4, network=rule, npu_compute_scale={r: 1.5 for r in range(16)},
                         peak_tflops=1.5, **model)[0].to_dict()  # fmt: skip
    fast = api.price_gpt(TOPOLOGY, "baseline", 4, network=rule, peak_tflops=1.0, **model)[0].to_dict()
    assert {k: each[k] for k in SPLIT} == {k: fast[k] for k in SPLIT}
    assert each["TP"] > 0 and each["PP"] > 0 and each["DP"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_a_slow_last_stage_adds_up_and_grows_the_bubble_by_its_extra_compute(seed):
    """Random small LLMs (16-64 NPUs, 1F1B or GPipe), rank 0's last-stage NPU at 1.5x under fair.

    The parts add up as without stragglers (compute + ideal bubble + imbalance + exposed =
    iteration). The bubble is measured on a free network, where the last stage (the largest: the
    LM head) never idles between its first forward and its last backward, so slowed by F it
    grows by at least (F - 1) x that stage's compute (`test_graph_stragglers`' bound); rank 0's
    compute does not move.
    """
    topology, shape = random_llm(300 + seed)
    shape.pop("chunks")  # (the interleaved schedule's; `price_gpt`'s chunks are per collective)
    shape["schedule"] = ("1f1b", "gpipe")[seed % 2]
    model = dict(layers=8, hidden=256, heads=8, seq=128, vocab=1000, micro_batch=1, peak_tflops=5.0, **shape)
    last = shape["tp"] * shape["dp"] * (shape["pp"] - 1)  # (rank 0's pipeline's last stage)
    healthy = api.price_gpt(topology, "baseline", 2, network="fair", **model)[0]
    slow = api.price_gpt(topology, "baseline", 2, network="fair", npu_compute_scale={last: 1.5}, **model)[0]
    for r in (healthy, slow):
        parts = r.compute_us + r.ideal_bubble_us + r.imbalance_us + r.exposed_us
        assert parts == pytest.approx(r.iteration_us, rel=1e-12)
        assert r.bubble_us == pytest.approx(r.ideal_bubble_us + r.imbalance_us, rel=1e-12)
    assert slow.compute_us == healthy.compute_us
    assert slow.stage_compute_us[-1] == pytest.approx(1.5 * healthy.stage_compute_us[-1], rel=1e-12)
    extra = 0.5 * healthy.stage_compute_us[-1]
    assert slow.bubble_us >= healthy.bubble_us + extra * (1 - 1e-9)
    assert slow.iteration_us >= healthy.iteration_us


def test_a_slow_npu_in_a_simai_stage_holds_every_collective():
    """`workload simai --run` takes them too: one stage, NPU 3 at 1.5x; every TP all-reduce waits for it."""
    args = ["workload", "simai", "tests/data/simai/microAllReduce.txt", "--run", "-q"]
    table = [line.split() for line in in_process(args).stdout.splitlines() if line.startswith("  baseline")]
    proc = in_process([*args, "--npu-compute-scale", "3=1.5"])
    assert proc.returncode == 0, proc.stderr
    slow = [line.split() for line in proc.stdout.splitlines() if line.startswith("  baseline")]
    compute_us = float(table[0][2])
    assert float(slow[0][2]) == compute_us  # (rank 0's)
    assert float(slow[0][1]) >= 1.5 * compute_us and float(slow[0][1]) > float(table[0][1])
    assert "#   stragglers: NPU 3 computes at 1.5x the time" in proc.stdout


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--run", "--npu-compute-scale", "5=1.5", "--network", "ideal"],
         "stragglers in graphs run under a sharing rule (packet, fair, store-forward): drop --network ideal"),
        (["--run", "--link-scale", "0:1=0.5", "--network", "fair,ideal"], "drop --network ideal"),
        (["--npu-delay-us", "5=20"], "slow the priced iteration: give --run"),
    ],
)  # fmt: skip
def test_a_straggler_under_ideal_or_without_run_is_one_line_exit_2(flags, says):
    """Under ``ideal`` (one rule of a sweep too) the planner's one line, before any header; without ``--run``, one line."""
    proc = in_process([*GPT, "-t", TOPOLOGY, *flags])
    said = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(said) == 1, proc.stderr
    assert said[0].endswith(says) and proc.stdout == ""


def test_the_header_gives_the_planners_estimate_before_the_table(monkeypatch):
    """Above the threshold (lowered here) the header names the planner's choice and the slow NPU, as `train`'s does."""
    monkeypatch.setenv("THEMIS_MPI_EXPECT_S", "0")
    proc = in_process([*GPT, "-t", TOPOLOGY, "--run", "-q", "-p", "baseline", "--network", "fair",
                       "--npu-compute-scale", "5=1.5"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    expect = [i for i, line in enumerate(lines) if line.startswith("# expect ~")]
    table = next(i for i, line in enumerate(lines) if line.startswith("#       policy"))
    assert len(expect) == 1 and expect[0] < table, proc.stdout
    assert "under fair (NPU 5 computes slower" in lines[expect[0]]
