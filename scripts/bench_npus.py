"""The per-NPU model's cost (issue 33 item 3): CPU time against NPU count, with one straggler.

Usage::

    python scripts/bench_npus.py --classes [--timeout-s 900] [--out results]
    python scripts/bench_npus.py --timelines
    python scripts/bench_npus.py --llm [--out results]
    python scripts/bench_npus.py --world [--cut] [--only GNMT] [--before DIR] [--after DIR]
        [--timeout-s 900] [--out results]
    python scripts/bench_npus.py [--shapes 4x4x4,8x4x4,8x8x4,8x8x8,16x8x8,16x16x8,16x16x16]
        [--chunks 16,64] [--paper 3D-SW_SW_SW_hetero,...] [--train-chunks 16,64] [--network ideal]
        [--out results]

Two tables, on the model, in this process, CPU time (``time.process_time``):

- All-reduce: 64 MiB float32, Themis with scf, on Ring x FullyConnected x Switch dims (100,
  200, 50 GB/s) of the given shapes, with NPU 5 late by 50 us. On ideal links the closed form
  ``time = on-time + 50 us`` (column ``late-on_time``) must hold on every row; on shared links
  NPUs out of step may also meet on links. Also the stage steps every NPU ran and CPU per
  NPU-step. Target (ideal): 1024 NPUs, 64 chunks, under 10 s.
- Training: one ResNet-152 iteration (traces/per-layer/resnet152.txt, one all-reduce per layer,
  156) under Themis with NPU 5 computing at 1.5x, on the shapes above (16 chunks) and on the
  paper's 1024-NPU topologies (each --train-chunks). Column ``bound``: on time <= with the slow
  NPU <= every NPU at 1.5x (`--compute-scale 1.5`, the one-NPU model), which must hold. Target:
  a paper topology under 120 s.

With ``--classes`` it times, instead, the class-reduced runs (`themis_mpi.timing.classes`: one
NPU per class of NPUs proven alike) side by side with every NPU's, each run in a process of its
own for its wall and CPU seconds and peak RSS (``runs``: the worlds it made; a stage pattern the
classes had not met starts another): the 8,192-NPU all-reduce ``SW(16)_SW(32)_SW(16)`` with NPU
5 late by 50 us and NPU 300's dim-1 links at 0.5x under the default rule and under ``fair``, its
512-NPU cut ``SW(4)_SW(8)_SW(16)``, each with the dims' default algorithm (halving-doubling) and
with ``direct``, and a ResNet-152 iteration with NPU 5 at 1.5x compute on a 64-NPU cut (both
algorithms) and, by classes only, on 1024 NPUs; the 512-NPU cut and the 64-NPU ResNet-152 with
``direct`` also under the default ``packet`` rule (its classes only where they are all of one
size: there every NPU runs both ways). ``--timelines`` counts, per stage of that 512-NPU
halving-doubling all-reduce run on every NPU's links, the distinct (start, end) pairs over its
NPUs, under ``fair`` and ``store-forward``. ``--llm`` times one GPT-3 175B iteration (TP 8, 1F1B,
global batch 1536, 4 chunks) on ``HGX-H100-SW_SW_SW`` as TP8 x PP8 x DP16 and TP8 x PP4 x DP32
under the default rule, per policy in a process of its own (one rank per class: per pipeline
stage), and on a 64-NPU cut (TP8 x PP4 x DP2, 48 micro-batches a pipeline as at DP32) by classes
and by every NPU.

``--world`` runs issue 43's every-NPU-links cases as ``themis-mpi train`` commands, each in a
process of its own (its wall and CPU seconds and peak RSS from `os.wait4`): GNMT on
``HGX-H100-SW_SW_SW`` (16 chunks, NPU 5 at 1.5x compute) under the default rule and under
``fair``, ResNet-152 per layer on ``4D-Ring_FC_Ring_SW`` (NPU 5 at 1.5x, NPU 300's dim-1
links at 0.5x, baseline and themis) under ``fair``, and one generated GPT-3 175B iteration on
``HGX-H100-SW_SW_SW`` (TP8 x PP8 x DP16, 4 chunks, baseline, NPU 5 at 1.5x) under ``packet``
(`GPT_RUN`), and GNMT (16 chunks) and ResNet-152 per layer (16 chunks) with NPU 5 at 1.5x under
``ideal`` with bytescheduler (every NPU in event order, `greenlets.NpuWorld`); with ``--before
DIR`` (an older checkout of the package) each case runs there first, side by side; ``--cut``:
the GNMT cases on a 256-NPU cut of the HGX preset instead (its dims at 8 x 4 nodes), the
ResNet-152 cases on 64-, 128- and 256-NPU cuts of the 4D preset (its dims written out, NPU 30's
dim-1 links at 0.5x where scaled), and the GPT-3 case on the 64-NPU cut (TP8 x PP4 x DP2,
global batch 96).

Both run every NPU at once (`themis_mpi.timing.vectors.NpuVectors`, equal to running every NPU's engine:
tests/test_stragglers.py); under ``--network fair`` or ``store-forward`` on every NPU's links
(`themis_mpi.timing.world.World`, one event loop over every NPU's engine). Prints the tables
and the process's peak memory, and writes bench_npus.json and bench_npus.png (CPU against NPUs,
log-log) into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.output import write_json  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.run.training import model_training  # noqa: E402
from themis_mpi.timing.greenlets import MAX_NPUS  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec  # noqa: E402

DELAY_NS = 50_000.0
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RESNET152 = os.path.join(ROOT, "traces", "per-layer", "resnet152.txt")
SLOW = 1.5  # NPU 5's compute factor in the training rows
PAPER = "3D-SW_SW_SW_hetero,3D-FC_Ring_SW,4D-Ring_SW_SW_SW,4D-Ring_FC_Ring_SW"


def topology(shape: str):
    """Ring x FullyConnected x Switch with the given NPUs per dim."""
    a, b, c = (int(x) for x in shape.split("x"))
    return parse_topology(f"Ring({a},100,500)_FC({b},200,500)_SW({c},50,1000)")


def row(shape: str, chunks: int, network: str) -> dict:
    """One measured row."""
    topo = topology(shape)
    coll = Collective("all_reduce", 2**24, "float32", chunks, tuple(range(3)))
    on_time, _ = model_collective(topo, coll, "themis", RunConfig(intra="scf", network=network))
    cpu0 = time.process_time()
    late, engine = model_collective(
        topo, coll, "themis", RunConfig(intra="scf", npu_delay_ns=((5, DELAY_NS),), network=network)
    )
    cpu_s = time.process_time() - cpu0
    steps = topo.npus * sum(len(engine.transport.cost(4).run_steps_ns(r)) for r in engine.records)
    return {
        "topology": topo.spec(),
        "npus": topo.npus,
        "chunks": chunks,
        "time_us": late.time_us,
        "late_over_on_time_us": late.time_us - on_time.time_us,
        "closed_form_ok": abs(late.time_us - on_time.time_us - DELAY_NS / 1e3) < 1e-6,
        "cpu_s": cpu_s,
        "npu_steps": steps,
        "cpu_us_per_npu_step": cpu_s / steps * 1e6,
    }


def training_row(topo_spec: str, chunks: int, network: str) -> dict:
    """One ResNet-152 iteration with NPU 5 at 1.5x compute, timed, and its bounds."""
    topo, wl, config = parse_topology(topo_spec), parse_workload(RESNET152), RunConfig(network=network)
    on_time = model_training(wl, topo, "themis", TrainingSpec(chunks=chunks, iterations=1), config)
    alike = TrainingSpec(chunks=chunks, iterations=1, compute_scale=SLOW)
    everyone = model_training(wl, topo, "themis", alike, config)
    late = TrainingSpec(chunks=chunks, iterations=1, npu_compute_scale=((5, SLOW),))
    cpu0 = time.process_time()
    slow = model_training(wl, topo, "themis", late, config)
    cpu_s = time.process_time() - cpu0
    stages = topo.npus * sum(d.stages for d in slow.dims)
    return {
        "topology": topo_spec,
        "npus": topo.npus,
        "chunks": chunks,
        "on_time_us": on_time.iteration_us,
        "slow_npu_us": slow.iteration_us,
        "everyone_slow_us": everyone.iteration_us,
        "bound_ok": on_time.iteration_us <= slow.iteration_us <= everyone.iteration_us,
        "cpu_s": cpu_s,
        "npu_stages": stages,
        "cpu_us_per_npu_stage": cpu_s / stages * 1e6,
    }


CUT_8192 = "SW(16,100,500{a})_SW(32,50,1000{a})_SW(16,25,2000{a})"
CUT_512 = "SW(4,100,500{a})_SW(8,50,1000{a})_SW(16,25,2000{a})"
CUT_64 = "SW(4,100,500{a})_SW(4,50,1000{a})_SW(4,25,2000{a})"
# (label, topology, what, rule, every NPU too): what = all-reduce or resnet152
CLASS_CASES = [
    ("8192 NPUs, hd", CUT_8192.format(a=""), "all-reduce", "ideal", False),
    ("8192 NPUs, hd", CUT_8192.format(a=""), "all-reduce", "fair", True),
    ("8192 NPUs, direct", CUT_8192.format(a=",direct"), "all-reduce", "fair", True),
    ("512-NPU cut, hd", CUT_512.format(a=""), "all-reduce", "fair", True),
    ("512-NPU cut, direct", CUT_512.format(a=",direct"), "all-reduce", "fair", True),
    ("ResNet-152, 64, hd", CUT_64.format(a=""), "resnet152", "fair", True),
    ("ResNet-152, 64, direct", CUT_64.format(a=",direct"), "resnet152", "fair", True),
    (
        "ResNet-152, 1024, direct",
        "SW(8,100,500,direct)_SW(16,50,1000,direct)_SW(8,25,2000,direct)",
        "resnet152",
        "fair",
        False,
    ),
    # (the default rule: classes where they are all of one size; a lone straggler's are not)
    ("512-NPU cut, direct", CUT_512.format(a=",direct"), "all-reduce", "packet", True),
    ("ResNet-152, 64, direct", CUT_64.format(a=",direct"), "resnet152", "packet", True),
]


def one_case(topo_spec: str, what: str, network: str, every_npu: bool) -> dict:
    """One class case in this process: its time, wall seconds, NPUs simulated and peak RSS."""
    from themis_mpi.timing import planner, world

    simulated = [0, 0]  # NPUs the last world ran, worlds made (a pattern met late starts another)
    init = world.World.__init__

    def counted(self, *args, classes=None, **kwargs):
        simulated[:] = [args[0].npus if classes is None else classes.count, simulated[1] + 1]
        init(self, *args, classes=classes, **kwargs)

    world.World.__init__ = counted  # type: ignore[method-assign]  # (a count, for the table)
    if every_npu:  # every NPU's links, as before classes
        planner.by_classes = lambda *args, **kwargs: None  # type: ignore[assignment]
    topo = parse_topology(topo_spec)
    t0, cpu0 = time.perf_counter(), time.process_time()
    if what.startswith("gpt3-175b"):  # (gpt3-175b:PP:DP:BATCH: one iteration under `network`'s policy)
        time_us = gpt_iteration(topo_spec, *(int(x) for x in what.split(":")[1:]), network)
    elif what == "all-reduce":
        config = RunConfig(network=network, npu_delay_ns=((5, DELAY_NS),), link_scale=((1, 300, 0.5),))
        coll = Collective("all_reduce", 2**24, "float32", 16, tuple(range(len(topo.dims))))
        time_us = model_collective(topo, coll, "themis", config)[0].time_us
    else:
        spec = TrainingSpec(chunks=16, iterations=1, npu_compute_scale=((5, SLOW),))
        wl = parse_workload(RESNET152)
        time_us = model_training(wl, topo, "themis", spec, RunConfig(network=network)).iteration_us
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "time_us": time_us,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "simulated": simulated[0] or None,
        "worlds": simulated[1],
        "rss_mib": rss_mib,
    }


def gpt_iteration(topo_spec: str, pp: int, dp: int, batch: int, policy: str) -> float:
    """One GPT-3 175B iteration (TP 8, 1F1B, 4 chunks) on the model under the default rule."""
    from themis_mpi.cli.options import one_topology
    from themis_mpi.cli.parser import build_parser
    from themis_mpi.cli.workload import llm_config
    from themis_mpi.model import ModelTransport
    from themis_mpi.run.training import run_graph
    from themis_mpi.workloads.chakra import Graph
    from themis_mpi.workloads.llm import LazyTraces, fit_groups

    flags = f"--preset gpt3-175b --tp 8 --pp {pp} --dp {dp} --global-batch {batch} -t {topo_spec}"
    args = build_parser().parse_args(["workload", "gpt", *flags.split()])
    c = llm_config(args)
    layout = fit_groups(c, one_topology(args))
    graph = Graph(f"<gpt {policy}>", LazyTraces(c, layout, frozenset()))  # type: ignore[arg-type]
    config = RunConfig(intra="fifo" if policy == "baseline" else "scf")
    return run_graph(
        ModelTransport(layout.topology, config), graph, policy, TrainingSpec(4, "float32", 1)
    ).iteration_us


HGX_CUT_64 = "SW(8,419.1,700,hd)_SW(2,46.57,1700,hd)_SW(4,46.57,1700,hd)_NIC(1+2,46.57)"  # (2 x 4 nodes)


def in_process(case: str, timeout_s: float) -> dict:
    """One case (`one_case`'s arguments as JSON) in a process of its own: its row."""
    done = subprocess.run(
        [sys.executable, __file__, "--one", case],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


LLM_CASES = [  # (label, topology, PP, DP, global batch, every NPU too)
    ("TP8 x PP8 x DP16", "HGX-H100-SW_SW_SW", 8, 16, 1536, False),
    ("TP8 x PP4 x DP32", "HGX-H100-SW_SW_SW", 4, 32, 1536, False),
    ("64-NPU cut: TP8 x PP4 x DP2", HGX_CUT_64, 4, 2, 96, True),  # (48 micro-batches a pipeline, as above)
]


def llm_rows(out_json: str, timeout_s: float) -> list[dict]:
    """GPT-3 175B on HGX under the default rule: an iteration per policy (and path), each in a process."""
    rows: list[dict] = []
    print(
        f"{'GPT-3 175B on HGX':>28} {'policy':>9} {'path':>9} {'ran':>5} {'iteration_us':>14} "
        f"{'wall_s':>8} {'cpu_s':>8} {'rss_MiB':>8}"
    )
    for label, topo_spec, pp, dp, batch, every in LLM_CASES:
        for policy in ("baseline", "themis"):
            for path in ("classes", "every NPU") if every else ("classes",):
                case = json.dumps([topo_spec, f"gpt3-175b:{pp}:{dp}:{batch}", policy, path == "every NPU"])
                r = {"pp": pp, "dp": dp, "policy": policy, "path": path, "case": label}
                try:
                    r |= in_process(case, timeout_s)
                except subprocess.TimeoutExpired:
                    r |= {"time_us": None, "note": f"over {timeout_s:g} s"}
                rows.append(r)
                cells = (
                    f"{r['simulated'] or '-'!s:>5} {r['time_us']:>14.2f} {r['wall_s']:>8.2f} "
                    f"{r['cpu_s']:>8.2f} {r['rss_mib']:>8.0f}"
                    if r["time_us"] is not None
                    else f"{'-':>5} {r['note']:>14}"
                )
                print(f"{label:>28} {policy:>9} {path:>9} {cells}", flush=True)
                write_json(out_json, {"llm": rows})
    return rows


def class_rows(out_json: str, timeout_s: float, only: str = "") -> list[dict]:
    """Every class case by classes and by every NPU, side by side, each in a process of its own.

    `only`: the cases whose label contains it, or whose rule it is.
    """
    rows: list[dict] = []
    print(
        f"{'case':>24} {'what':>10} {'rule':>6} {'npus':>5} {'path':>9} {'ran':>5} {'runs':>4} "
        f"{'time_us':>11} {'wall_s':>8} {'cpu_s':>8} {'rss_MiB':>8}"
    )
    missing = {
        "time_us": None,
        "wall_s": None,
        "cpu_s": None,
        "simulated": None,
        "worlds": 0,
        "rss_mib": None,
    }
    for label, topo_spec, what, network, every in CLASS_CASES:
        if only not in label and only != network:
            continue
        npus = parse_topology(topo_spec).npus
        for path in (
            ("vectors",) if network == "ideal" else ("classes", "every NPU") if every else ("classes",)
        ):
            if path == "every NPU" and npus > MAX_NPUS:
                r = missing | {"note": "refused"}
            else:
                case = json.dumps([topo_spec, what, network, path == "every NPU"])
                try:
                    r = in_process(case, timeout_s)
                except subprocess.TimeoutExpired:
                    r = missing | {"note": "timeout"}
                except subprocess.CalledProcessError as exc:  # (e.g. every NPU's links refuse 8192 NPUs)
                    r = missing | {"note": "refused", "why": exc.stderr.strip().splitlines()[-1]}
            r |= {"case": label, "topology": topo_spec, "what": what, "network": network, "path": path}
            rows.append(r)
            ran = r["simulated"] if r["simulated"] is not None else "-"
            print(
                f"{label:>24} {what:>10} {network:>6} {npus:>5} {path:>9} {ran!s:>5} {r['worlds']:>4} "
                + (
                    f"{r['time_us']:>11.2f} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {r['rss_mib']:>8.0f}"
                    if r["time_us"] is not None
                    else f"{r['note']:>11}"
                ),
                flush=True,
            )
            write_json(out_json, {"classes": rows})
    return rows


HGX = "HGX-H100-SW_SW_SW"
HGX_CUT_256 = (
    "SW(8,419.1,700,hd)_SW(8,46.57,1700,hd)_SW(4,46.57,1700,hd)_NIC(1+2,46.57)"  # (its dims at 8 x 4)
)
WORLD_CASES = (  # (label, train's arguments)
    ("GNMT, HGX, packet", "traces/gnmt.txt -t HGX-H100-SW_SW_SW -c 16 --npu-compute-scale 5=1.5 -p baseline"),
    (
        "GNMT, HGX, fair",
        "traces/gnmt.txt -t HGX-H100-SW_SW_SW -c 16 --npu-compute-scale 5=1.5 -p baseline --network fair",
    ),
    (
        "ResNet-152, 4D, fair",
        "traces/per-layer/resnet152.txt -t 4D-Ring_FC_Ring_SW -c 16 --npu-compute-scale 5=1.5 "
        "--link-scale 1:300=0.5 -p baseline,themis --network fair",
    ),
    ("GPT-3, HGX, packet", f"gpt {HGX} 8 16 1536"),  # (`GPT_RUN`'s arguments: topology, PP, DP, batch)
    # under ideal a gated scheduler (bytescheduler) needs event order: every NPU in event order
    # (`greenlets.NpuWorld`), not vectorised
    (
        "GNMT, HGX, ideal",
        "traces/gnmt.txt -t HGX-H100-SW_SW_SW -c 16 --npu-compute-scale 5=1.5 -p baseline "
        "--network ideal --comm-scheduler bytescheduler",
    ),
    (
        "ResNet-152, 4D, ideal",
        "traces/per-layer/resnet152.txt -t 4D-Ring_FC_Ring_SW -c 16 --npu-compute-scale 5=1.5 -p baseline "
        "--network ideal --comm-scheduler bytescheduler",
    ),
)
# One GPT-3 175B iteration (TP 8, 1F1B, 4 chunks, baseline) with NPU 5 at 1.5x under packet: every
# NPU's links, every NPU (a class of 1 under packet). The functions it calls are the same before
# issue 43's memory change and after, so it runs on either checkout.
GPT_RUN = """
import sys
from themis_mpi.cli.options import one_topology
from themis_mpi.cli.parser import build_parser
from themis_mpi.cli.workload import llm_config
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.run.training import run_graph
from themis_mpi.workloads.chakra import Graph
from themis_mpi.workloads.llm import LazyTraces, fit_groups
from themis_mpi.workloads.training import TrainingSpec

topo, pp, dp, batch = sys.argv[1:]
flags = f"--preset gpt3-175b --tp 8 --pp {pp} --dp {dp} --global-batch {batch} -t {topo}"
args = build_parser().parse_args(["workload", "gpt", *flags.split()])
c = llm_config(args)
layout = fit_groups(c, one_topology(args))
graph = Graph("<gpt>", LazyTraces(c, layout, frozenset()))
spec = TrainingSpec(4, "float32", 1, npu_compute_scale=((5, 1.5),))
transport = ModelTransport(layout.topology, RunConfig(intra="fifo", network="packet"))
print("baseline -", run_graph(transport, graph, "baseline", spec).iteration_us)
"""


FOUR_D_CUTS = {  # (NPUs: the 4D preset's dims, cut)
    64: "Ring(4,375,20,ring)_FC(4,175,700,direct)_Ring(2,150,700,ring)_SW(2,100,1700,hd)",
    128: "Ring(4,375,20,ring)_FC(8,175,700,direct)_Ring(2,150,700,ring)_SW(2,100,1700,hd)",
    256: "Ring(4,375,20,ring)_FC(8,175,700,direct)_Ring(4,150,700,ring)_SW(2,100,1700,hd)",
}


def cut_cases() -> list[tuple[str, str]]:
    """`--cut`: the GNMT cases on the 256-NPU HGX cut, the ResNet-152 case on the 4D cuts."""
    cases = [
        (f"{label}, cut", flags.replace(HGX, HGX_CUT_256)) for label, flags in WORLD_CASES if "GNMT" in label
    ]
    cases.append(("GPT-3, HGX/64, packet", f"gpt {HGX_CUT_64} 4 2 96"))  # (TP8 x PP4 x DP2, 2 x 4 nodes)
    for label, flags in (case for case in WORLD_CASES if case[0].startswith("ResNet-152")):
        for npus, dims in FOUR_D_CUTS.items():
            cut = flags.replace("4D-Ring_FC_Ring_SW", dims).replace("1:300=", "1:30=")
            cases.append((label.replace("4D", f"4D/{npus}"), cut))
    return cases


def child_cpu_s(pid: int) -> float:
    """A running child's CPU seconds so far (Linux: /proc/PID/stat's utime and stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def train_run(root: str, flags: str, timeout_s: float) -> dict:
    """`themis-mpi train FLAGS -q` with the package at `root`: its rows, wall and CPU seconds, peak RSS.

    Flags ``gpt ARGS``: `GPT_RUN` with those arguments instead. Stopped after `timeout_s` CPU
    seconds of its own (the machine may be shared): then the rows it finished, and its figures
    at the stop.
    """
    words = flags.split()
    argv = ["-c", GPT_RUN, *words[1:]] if words[0] == "gpt" else ["-m", "themis_mpi", "train", *words, "-q"]
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, *argv],
            cwd=root,
            env=os.environ | {"PYTHONPATH": root},
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
        note, samples = "", []  # (CPU s, RSS MiB) every `SAMPLE_CPU_S` of the child's CPU
        while True:  # (reaped here, not by Popen: `os.wait4` gives the child's own CPU and peak RSS)
            pid, _, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            cpu_s = child_cpu_s(child.pid)
            if cpu_s >= SAMPLE_CPU_S * (len(samples) + 1):
                samples.append((round(cpu_s, 1), child_rss_mib(child.pid)))
            if cpu_s > timeout_s:
                child.kill()
                _, _, usage = os.wait4(child.pid, 0)
                note = f"stopped after {timeout_s:g} CPU s"
                break
            time.sleep(0.5)
        wall_s = time.perf_counter() - start
        out.seek(0)
        rows = [line.split() for line in out if line.strip() and not line.startswith("#")]
    return {
        "iteration_us": {r[0]: float(r[2]) for r in rows if len(r) > 2},
        "note": note,
        "wall_s": wall_s,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_mib": usage.ru_maxrss / 1024,  # (Linux: KiB)
        "rss_by_cpu": samples,
    }


SAMPLE_CPU_S = 30.0


def child_rss_mib(pid: int) -> float:
    """A running child's resident memory now (Linux: /proc/PID/status's VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def world_rows(
    out_json: str, before: str | None, timeout_s: float, cut: bool, after: str | None = None, only: str = ""
) -> list[dict]:
    """Issue 43's every-NPU-links cases (module doc), each with the older checkout first if given.

    `cut`: the cut cases instead (`cut_cases`); `after`: the checkout
    measured as "after" (default: this one); `only`: the cases whose label contains it.
    """
    here = after or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    rows: list[dict] = []
    print(f"{'case':>26} {'code':>7} {'iteration_us':>28} {'wall_s':>8} {'cpu_s':>8} {'rss_MiB':>8}")
    for label, flags in cut_cases() if cut else WORLD_CASES:
        if only not in label:
            continue
        for code, root in ([("before", before)] if before else []) + [("after", here)]:
            r = train_run(root, flags, timeout_s) | {"case": label, "code": code, "flags": flags}
            rows.append(r)
            shown = " ".join(f"{t:.2f}" for t in r["iteration_us"].values())
            figures = f"{r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {r['rss_mib']:>8.0f}"
            print(f"{label:>26} {code:>7} {shown:>28} {figures} {r['note']}", flush=True)
            if r["rss_by_cpu"]:
                print(
                    f"{'':>26} RSS MiB at CPU s: "
                    + ", ".join(f"{m:.0f} at {c:g}" for c, m in r["rss_by_cpu"])
                )
            write_json(out_json, {"world": rows})
    return rows


def timelines(topo_spec: str, network: str) -> list[int]:
    """Per stage, in start order, the distinct (start, end) pairs over every NPU of the all-reduce case.

    What classes by state could run (`docs/performance.md`): NPUs whose timelines agree.
    """
    from themis_mpi.model import ModelTransport
    from themis_mpi.run.collective import collective_on, symmetric_run
    from themis_mpi.run.coordinator import share_schedules
    from themis_mpi.timing.world import World

    topo = parse_topology(topo_spec)
    config = RunConfig(network=network, npu_delay_ns=((5, DELAY_NS),), link_scale=((1, 300, 0.5),))
    coll = Collective("all_reduce", 2**24, "float32", 16, tuple(range(len(topo.dims))))
    (schedule,), _ = share_schedules(ModelTransport(topo, config), "themis", [coll], None)
    order = symmetric_run(topo, config, coll, schedule)[0].start_order()
    world = World(topo, config, replayable=True)
    world.run(lambda npu: collective_on(npu, coll, schedule, False, order, True))
    pairs: dict = {}
    for rank in range(topo.npus):
        for end_ns, keys in world.ends[rank]:
            for key in keys:
                pairs.setdefault(key, set()).add((world.starts[rank][key], end_ns))
    return [len(pairs[k]) for k in sorted(pairs, key=lambda k: min(s for s, _ in pairs[k]))]


def plot(rows: list[dict], training: list[dict], path: str) -> None:
    """CPU against NPUs, log-log: one line per chunk count, all-reduce and training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from themis_mpi.output import atomic_path

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, table in (("all-reduce", rows), ("ResNet-152", training)):
        for chunks in sorted({r["chunks"] for r in table}):
            pts = sorted((r["npus"], r["cpu_s"]) for r in table if r["chunks"] == chunks and r["scaling"])
            if len(pts) > 1:
                ax.loglog(*zip(*pts), marker="o", label=f"{label}, {chunks} chunks")
    ax.set_xlabel("NPUs")
    ax.set_ylabel("CPU s (one straggler)")
    ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shapes", default="4x4x4,8x4x4,8x8x4,8x8x8,16x8x8,16x16x8,16x16x16", help="NPUs per dim, a list"
    )
    ap.add_argument("--chunks", default="16,64", help="all-reduce chunk counts (16,64)")
    ap.add_argument("--paper", default=PAPER, help="paper topologies for the training rows ('' for none)")
    ap.add_argument("--train-chunks", default="16,64", help="training chunk counts on the paper topologies")
    ap.add_argument(
        "--network", default="ideal", choices=("ideal", "fair", "store-forward"), help="sharing rule"
    )
    ap.add_argument("--out", default="results", help="output folder (default results)")
    ap.add_argument("--classes", action="store_true", help="the class-reduced cases instead (module doc)")
    ap.add_argument(
        "--timeout-s", type=float, default=900.0, help="--classes, --world: per run (900; --world: CPU s)"
    )
    ap.add_argument("--timelines", action="store_true", help="distinct timelines per stage (module doc)")
    ap.add_argument(
        "--llm", action="store_true", help="GPT-3 175B on HGX, one iteration per policy (module doc)"
    )
    ap.add_argument("--world", action="store_true", help="issue 43's every-NPU-links cases (module doc)")
    ap.add_argument("--before", help="--world: an older checkout of the package, run first side by side")
    ap.add_argument("--after", help="--world: the checkout measured as after (default: this one)")
    ap.add_argument("--only", default="", help="--world, --classes: the cases whose label (or rule) has this")
    ap.add_argument("--cut", action="store_true", help="--world: the cut cases (module doc)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # (one class case, in a process of its own)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_case(*json.loads(args.one))))
        return
    if args.timelines:
        for network in ("fair", "store-forward"):
            counts = timelines(CUT_512.format(a=""), network)
            print(f"{network}: {len(counts)} stages, distinct (start, end) pairs over 512 NPUs: ", end="")
            print(f"max {max(counts)}, mean {sum(counts) / len(counts):.1f}")
        return
    os.makedirs(args.out, exist_ok=True)
    if args.llm:
        llm_rows(os.path.join(args.out, "bench_llm.json"), args.timeout_s)
        return
    if args.world:
        path = os.path.join(args.out, "bench_world.json")
        world_rows(path, args.before, args.timeout_s, args.cut, args.after, args.only)
        return
    if args.classes:
        class_rows(os.path.join(args.out, "bench_classes.json"), args.timeout_s, args.only)
        return
    out_json = os.path.join(args.out, "bench_npus.json")
    rows: list[dict] = []
    training: list[dict] = []
    print(
        f"{'all-reduce on':>36} {'npus':>6} {'chunks':>6} {'time_us':>10} {'late-on_time':>12} {'cpu_s':>8} "
        f"{'us/npu-step':>11}"
    )
    for chunks in (int(c) for c in args.chunks.split(",")):
        for shape in args.shapes.split(","):
            r = row(shape, chunks, args.network) | {"shape": shape, "scaling": True}
            rows.append(r)
            print(
                f"{r['topology']:>36} {r['npus']:>6} {chunks:>6} {r['time_us']:>10.2f} "
                f"{r['late_over_on_time_us']:>+12.2f} {r['cpu_s']:>8.2f} "
                f"{r['cpu_us_per_npu_step']:>11.2f}",
                flush=True,
            )
            write_json(out_json, {"rows": rows, "training": training})
    print(
        f"\n{'ResNet-152, NPU 5 at 1.5x, on':>36} {'npus':>6} {'chunks':>6} {'on_time_us':>11} "
        f"{'slow_us':>10} {'bound':>5} {'cpu_s':>8} {'us/npu-stage':>12}"
    )
    cells = [(topology(shape).spec(), 16, shape, True) for shape in args.shapes.split(",")]
    cells += [(p, int(c), p, False) for c in args.train_chunks.split(",") for p in args.paper.split(",") if p]
    for spec, chunks, shape, scaling in cells:
        r = training_row(spec, chunks, args.network) | {"shape": shape, "scaling": scaling}
        training.append(r)
        print(
            f"{shape:>36} {r['npus']:>6} {chunks:>6} {r['on_time_us']:>11.1f} {r['slow_npu_us']:>10.1f} "
            f"{'ok' if r['bound_ok'] else 'NO':>5} {r['cpu_s']:>8.2f} {r['cpu_us_per_npu_stage']:>12.2f}",
            flush=True,
        )
        write_json(out_json, {"rows": rows, "training": training})
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (Linux: KiB)
    print(f"\nmax RSS of this process: {rss_mb:.0f} MiB")
    write_json(out_json, {"rows": rows, "training": training, "max_rss_mib": rss_mb})
    plot(rows, training, os.path.join(args.out, "bench_npus.png"))
    held = all(r["closed_form_ok"] for r in rows) and all(r["bound_ok"] for r in training)
    if args.network == "ideal" and not held:  # (on ideal links both must hold)
        sys.exit(1)


if __name__ == "__main__":
    main()
