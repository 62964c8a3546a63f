"""Shared links: does Themis's gain survive a shared NIC, and what do concurrent chunks really buy?

Usage::

    python scripts/study_network.py [--traces traces] [--out docs/network] [--quick] [--workers N|mpi]

``--quick`` runs part 2 on `QUICK_WORKLOADS` only (parts 1, 3 and 4 whole); its rows are those of the
full study (a test compares them with docs/network).

Four parts, all on the model (1024 NPUs), under each sharing rule (ideal: nothing shared,
ASTRA-sim 1.0's rule; fair: max-min fair links; packet, the default: max-min per message with
packets' pipelining and no lockstep; store-forward: whole messages in arrival order):

1. One all-reduce (64 MiB and 1 GiB per NPU, 64 chunks) on the HGX H100 preset, whose dims 1
   and 2 leave each GPU through one NIC, and on the same machine with a NIC per dim; paper
   latencies and zero latency; baseline (FIFO) against Themis (SCF) and themis-ports (SCF).
2. Two training iterations of the four workloads in --traces on the same two machines (ideal,
   fair and packet).
3. Active chunks per dim 1, 2, 4, 8 x chunks 1 to 64, one 64 MiB all-reduce (baseline) on
   3D-SW_SW_SW_hetero with paper latencies (ASTRA-sim issue 155: do more splits congest links?).

4. A pipeline's point-to-point messages beside its data-parallel gradient reduction: a generated
   GPT (PP 4 x DP 4, 16 NPUs, every NPU's links), DP after the pipeline drains or overlapped with
   the last backward (``--overlap-dp``), on two switch levels with a NIC each or one NIC for both.

Writes network.json, network.md and three plots into --out and prints the tables.
"""

from __future__ import annotations

import argparse
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.cost import CostModels  # noqa: E402
from themis_mpi.output import atomic_path, write_study  # noqa: E402
from themis_mpi.report import measured_on  # noqa: E402
from themis_mpi.results import link_results  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers  # noqa: E402
from themis_mpi.run.priced import price  # noqa: E402
from themis_mpi.run.training import model_training  # noqa: E402
from themis_mpi.topology import PRESETS, parse_topology  # noqa: E402
from themis_mpi.workloads.llm import LlmConfig, fit_groups  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec  # noqa: E402

RULES = ("ideal", "fair", "packet", "store-forward")
TRAINING_RULES = ("ideal", "fair", "packet")
POLICIES = (("baseline", "fifo"), ("themis", "scf"), ("themis-ports", "scf"))
HGX = "HGX-H100-SW_SW_SW"
MACHINES = {"shared NIC": HGX, "NIC per dim": PRESETS[HGX].rsplit("_NIC", 1)[0]}
LATENCIES = {"paper latency": None, "zero latency": 0.0}
WORKLOADS = ("resnet152", "gnmt", "dlrm", "transformer_1t")
QUICK_WORKLOADS = ("resnet152", "dlrm")
SPLITS = (1, 2, 4, 8, 16, 32, 64)
ACTIVE = (1, 2, 4, 8)
MIB = 1 << 20
GPT = dict(layers=8, hidden=2048, heads=16, seq=1024, vocab=32000, micro_batch=1, global_batch=32, pp=4, dp=4)
PIPE_MACHINES = {  # DP on the first switch level, PP on the second (Megatron's order)
    "a NIC per level": "SW(4,50,1000)_SW(4,50,1000)",
    "one NIC": "SW(4,50,1000)_SW(4,50,1000)_NIC(0+1,50)",
}
PIPE_DP = {"after the drain": False, "overlapped": True}


def _topology(spec: str, latency: float | None):
    topo = parse_topology(spec)
    return topo if latency is None else topo.with_overrides(latency_ns=[latency] * len(topo.dims))


def _nic_pct(topo, result, engine) -> float | None:
    """The busiest direction of the shared NIC, in percent of its rate (None without one)."""
    links = link_results(engine.records, topo, CostModels(topo), result.time_us)
    nic = [link.busy_pct for link in links if link.name.startswith("port")]
    return max(nic) if nic else None


def all_reduce_part() -> list[dict]:
    """Part 1: one all-reduce per machine, latency, rule, size and policy."""
    rows = []
    for machine, spec in MACHINES.items():
        for latency_name, latency in LATENCIES.items():
            topo = _topology(spec, latency)
            for size in (64 * MIB, 1024 * MIB):
                coll = Collective("all_reduce", size // 8, "float64", 64, (0, 1, 2))
                for rule in RULES:
                    row = {"machine": machine, "latency": latency_name, "size_bytes": size, "rule": rule}
                    for policy, intra in POLICIES:
                        config = RunConfig(intra=intra, network=rule)
                        result, engine = model_collective(topo, coll, policy, config)
                        row[f"{policy}_us"] = result.time_us
                        row[f"{policy}_nic_pct"] = _nic_pct(topo, result, engine)
                    row["speedup"] = row["baseline_us"] / row["themis_us"]
                    row["ports_speedup"] = row["baseline_us"] / row["themis-ports_us"]
                    rows.append(row)
    return rows


def _training_row(point) -> dict:
    """Part 2's row of one workload, machine, latency and rule."""
    traces, name, machine, latency_name, rule = point
    wl = parse_workload(os.path.join(traces, f"{name}.txt"))
    topo = _topology(MACHINES[machine], LATENCIES[latency_name])
    spec = TrainingSpec(chunks=64, iterations=2)
    row = {"workload": name, "machine": machine, "latency": latency_name, "rule": rule}
    for policy, intra in POLICIES:
        result = model_training(wl, topo, policy, spec, RunConfig(intra=intra, network=rule))
        row[f"{policy}_us"] = result.iteration_us
    row["speedup"] = row["baseline_us"] / row["themis_us"]
    row["ports_speedup"] = row["baseline_us"] / row["themis-ports_us"]
    return row


def training_part(traces: str, workers: int | str = 1, workloads=WORKLOADS) -> list[dict]:
    """Part 2: two training iterations of each workload per machine, latency and rule."""
    points = [
        (traces, name, machine, latency_name, rule)
        for name in workloads
        for machine in MACHINES
        for latency_name in LATENCIES
        for rule in TRAINING_RULES
    ]
    return list(ordered_map(_training_row, points, workers))


def splits_part() -> list[dict]:
    """Part 3: active chunks x chunk counts under each rule (baseline, 64 MiB)."""
    topo = parse_topology("3D-SW_SW_SW_hetero")
    rows = []
    for rule in RULES:
        for active in ACTIVE:
            for chunks in SPLITS:
                coll = Collective("all_reduce", 64 * MIB // 8, "float64", chunks, (0, 1, 2))
                config = RunConfig(intra="fifo", active_per_dim=active, network=rule)
                result, engine = model_collective(topo, coll, "baseline", config)
                links = link_results(engine.records, topo, CostModels(topo), result.time_us)
                busiest = max(link.busy_pct for link in links)
                rows.append({"rule": rule, "active": active, "chunks": chunks, "time_us": result.time_us,
                             "ideal_us": result.ideal_us, "busiest_link_pct": busiest})  # fmt: skip
    return rows


def pipeline_part() -> list[dict]:
    """Part 4: a pipeline's messages beside its DP reduction, per schedule, DP timing, machine, rule."""
    rows = []
    for schedule in ("1f1b", "gpipe"):
        for dp_name, overlap in PIPE_DP.items():
            c = LlmConfig(**GPT, schedule=schedule, overlap_dp=overlap)  # type: ignore[arg-type]
            for machine, spec in PIPE_MACHINES.items():
                layout = fit_groups(c, parse_topology(spec))
                for rule in RULES:
                    r = price(c, layout, "baseline", RunConfig(network=rule), TrainingSpec(chunks=4))
                    keep = {k: r[k] for k in ("iteration_us", "compute_us", "DP", "PP", "bubble_us")}
                    rows.append(
                        {"schedule": schedule, "dp": dp_name, "machine": machine, "rule": rule, **keep}
                    )
    return rows


def _pipe(rows: list[dict], schedule: str, dp: str, machine: str, rule: str) -> dict:
    """Part 4's row of one cell."""
    return next(
        r for r in rows if (r["schedule"], r["dp"], r["machine"], r["rule"]) == (schedule, dp, machine, rule)
    )


def _pipeline_finding(pipe: list[dict]) -> str:
    """Part 4 in a few sentences, with its numbers."""
    drained = [_pipe(pipe, s, "after the drain", m, "fair")["iteration_us"] for s in ("1f1b", "gpipe")
               for m in PIPE_MACHINES]  # fmt: skip
    one, own = (_pipe(pipe, "gpipe", "overlapped", m, "fair") for m in ("one NIC", "a NIC per level"))
    one1, own1 = (_pipe(pipe, "1f1b", "overlapped", m, "fair") for m in ("one NIC", "a NIC per level"))
    same = drained[0] == drained[1] and drained[2] == drained[3]
    return (
        "- **A pipeline's messages meet its DP traffic only when DP overlaps the backward** (table 4). "
        f"With DP after the pipeline drains, one NIC for both levels costs {'nothing' if same else 'time'}: "
        "a stage's messages and its gradient reduction never run at once (each rank's steps form one "
        "chain). With `--overlap-dp` they do: under fair sharing GPipe's gradient reduction, hidden "
        f"behind the backward with a NIC per level (DP {own['DP']:.0f} us exposed), shows {one['DP']:.0f} us "
        f"through one NIC ({own['iteration_us']:.0f} -> {one['iteration_us']:.0f} us); 1F1B "
        f"{own1['iteration_us']:.0f} -> {one1['iteration_us']:.0f} us. Under ideal, which shares nothing, "
        "the NIC never matters."
    )


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _training_finding(training: list[dict]) -> str:
    """The workload whose Themis speedup moves most between ideal and fair, and by how much."""
    ideal = {(r["workload"], r["machine"], r["latency"]): r for r in training if r["rule"] == "ideal"}
    moves = [
        (abs(r["speedup"] - ideal[key]["speedup"]), r, ideal[key])
        for r in training
        if r["rule"] == "fair"
        for key in [(r["workload"], r["machine"], r["latency"])]
    ]
    delta, fair, was = max(moves, key=lambda m: m[0])
    return (
        f"- In training (table 2) Themis's speedup moves by at most {delta:.3f} between ideal and fair: "
        f"{fair['workload']} on the {fair['machine']} machine at {fair['latency']}, {was['speedup']:.3f}x -> "
        f"{fair['speedup']:.3f}x. With a NIC per dim nothing moves: with one active stage per dim and its "
        "own links, no two stages ever share a link."
    )


def _ports_finding(ar: list[dict]) -> str:
    """Where themis-ports recovers what Themis loses behind the shared NIC, and where it equals Themis."""

    def cell(machine: str, latency: str, size: int, rule: str) -> dict:
        return next(
            r
            for r in ar
            if (r["machine"], r["latency"], r["size_bytes"], r["rule"]) == (machine, latency, size, rule)
        )

    zero, big = (
        cell("shared NIC", "zero latency", 64 * MIB, "packet"),
        cell("shared NIC", "paper latency", 1024 * MIB, "packet"),
    )
    own = [r for r in ar if r["machine"] == "NIC per dim"]
    same = all(r["themis-ports_us"] == r["themis_us"] for r in own)
    worst = min(r["ports_speedup"] for r in ar if r["machine"] == "shared NIC" and r["rule"] != "ideal")
    return (
        "- **themis-ports keeps what Themis loses behind the shared NIC.** Under packet (the default) at "
        f"zero latency and 64 MiB it is {zero['ports_speedup']:.3f}x the baseline where Themis is "
        f"{zero['speedup']:.3f}x; at 1 GiB with the paper's latencies {big['ports_speedup']:.3f}x against "
        f"{big['speedup']:.3f}x. On the shared NIC under every sharing rule its worst is {worst:.3f}x. "
        + (
            "With a NIC per dim it gives Themis's times exactly in every cell (no port to see)."
            if same
            else "With a NIC per dim it differs from Themis in some cells (table 1)."
        )
    )


def findings(ar: list[dict], training: list[dict], splits: list[dict], pipe: list[dict]) -> list[str]:
    """What the tables say, with their numbers (so a rerun rewrites them)."""

    def speedup(machine: str, latency: str, rule: str) -> float:
        return next(
            r["speedup"] for r in ar
            if (r["machine"], r["latency"], r["rule"], r["size_bytes"]) == (machine, latency, rule, 64 * MIB)
        )  # fmt: skip

    def split(rule: str, active: int, chunks: int) -> float:
        return next(
            r["time_us"] for r in splits if (r["rule"], r["active"], r["chunks"]) == (rule, active, chunks)
        )

    ideal_nic = next(r for r in ar if (r["machine"], r["latency"], r["rule"], r["size_bytes"]) ==
                     ("shared NIC", "zero latency", "ideal", 64 * MIB))  # fmt: skip
    return [
        "## Findings",
        "",
        f"- **Themis's gain does not survive the shared NIC.** At zero latency (64 MiB) Themis is "
        f"{speedup('shared NIC', 'zero latency', 'ideal'):.3f}x the baseline when links share nothing, "
        f"but it keeps the NIC {ideal_nic['themis_nic_pct']:.0f} % busy: bandwidth the GPU does not have. "
        f"Under fair sharing it is {speedup('shared NIC', 'zero latency', 'fair'):.3f}x "
        f"(packet, the default, {speedup('shared NIC', 'zero latency', 'packet'):.3f}x; store-forward "
        f"{speedup('shared NIC', 'zero latency', 'store-forward'):.3f}x): it balances dims 1 "
        "and 2 as if each had its own 46.57 GB/s and moves load off NVLink onto the one NIC. With a NIC "
        f"per dim its {speedup('NIC per dim', 'zero latency', 'fair'):.3f}x stands under every rule.",
        f"- With the paper's latencies the gain is small either way ("
        f"{speedup('shared NIC', 'paper latency', 'ideal'):.3f}x ideal, "
        f"{speedup('shared NIC', 'paper latency', 'fair'):.3f}x fair at 64 MiB); at 1 GiB the shared NIC "
        "turns it into a loss (table 1).",
        _ports_finding(ar),
        _training_finding(training),
        f"- **Active chunks under ideal are free bandwidth**: 8 active chunks make 64 chunks "
        f"{split('ideal', 1, 64) / split('ideal', 8, 64):.1f}x faster and push the busiest link to several "
        "hundred percent. Under fair sharing they only overlap latencies: c chunks with a active take what "
        f"c/a chunks take with one (64 chunks: {split('fair', 1, 64):.1f} us with 1 active, "
        f"{split('fair', 8, 64):.1f} us with 8 = {split('fair', 1, 8):.1f} us of 8 chunks with 1). "
        f"Under packet (the default) the stages drift apart and hide each other's latency: 64 chunks with 8 "
        f"active take {split('packet', 8, 64):.1f} us (fair {split('fair', 8, 64):.1f}), and from 16 chunks "
        "the busiest link stays near 100 %. "
        "Under store-forward they pipeline the switch's two hops, which a single chunk cannot.",
        _pipeline_finding(pipe),
        "",
    ]


def markdown(
    ar: list[dict], training: list[dict], splits: list[dict], pipe: list[dict], seconds: float
) -> str:
    """The study's page."""
    lines = [
        "# Shared links: Themis on a shared NIC, and what concurrent chunks buy",
        "",
        "Generated by `python scripts/study_network.py --out docs/network` (the model: 1024 NPUs, part 4 16; "
        f"{seconds:.0f} s of CPU, {measured_on()}). Rules: `ideal` shares nothing (ASTRA-sim "
        "1.0's rule), `fair` is max-min fair on every link (the fluid bound), `packet` (the default) "
        "shares max-min per message with packets pipelined through switches and no lockstep "
        "(docs/time-model.md), `store-forward` serves whole messages in arrival order and a switch "
        "forwards a message once it has all of it (up, then down). Policies: the baseline (FIFO), "
        "Themis (SCF) and themis-ports (Themis with its loads per physical resource, SCF).",
        "",
        *findings(ar, training, splits, pipe),
        f"## 1. One all-reduce on {HGX}: dims 1 and 2 behind one NIC, or a NIC per dim",
        "",
        "64 chunks, float64. NIC% is the busiest direction of the shared NIC over the run (bytes over "
        "what the NIC can carry in that time): above 100 the schedule uses bandwidth the machine does "
        "not have.",
        "",
        "| machine | latency | size | rule | baseline us | Themis us | Themis/baseline speedup | "
        "themis-ports us | themis-ports speedup | baseline NIC% | Themis NIC% | themis-ports NIC% |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in ar:
        lines.append(
            f"| {r['machine']} | {r['latency']} | {r['size_bytes'] // MIB} MiB | {r['rule']} | "
            f"{r['baseline_us']:.2f} | {r['themis_us']:.2f} | {r['speedup']:.3f}x | "
            f"{r['themis-ports_us']:.2f} | {r['ports_speedup']:.3f}x | "
            f"{_fmt(r['baseline_nic_pct'])} | {_fmt(r['themis_nic_pct'])} | "
            f"{_fmt(r['themis-ports_nic_pct'])} |"
        )
    lines += [
        "",
        "## 2. Two training iterations (mean iteration time, 64 chunks per collective)",
        "",
        "| workload | machine | latency | rule | baseline us | Themis us | speedup | themis-ports us | "
        "themis-ports speedup |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in training:
        lines.append(
            f"| {r['workload']} | {r['machine']} | {r['latency']} | {r['rule']} | {r['baseline_us']:.2f} | "
            f"{r['themis_us']:.2f} | {r['speedup']:.3f}x | {r['themis-ports_us']:.2f} | "
            f"{r['ports_speedup']:.3f}x |"
        )
    lines += [
        "",
        "## 3. Active chunks per dim x chunks: 64 MiB all-reduce, baseline, 3D-SW_SW_SW_hetero",
        "",
        "Time in us (busiest link's busy %).",
        "",
        "| rule | active | " + " | ".join(f"{c} chunks" for c in SPLITS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in SPLITS) + " |",
    ]
    for rule in RULES:
        for active in ACTIVE:
            cells = [r for r in splits if r["rule"] == rule and r["active"] == active]
            lines.append(
                f"| {rule} | {active} | "
                + " | ".join(f"{r['time_us']:.1f} ({r['busiest_link_pct']:.0f} %)" for r in cells)
                + " |"
            )
    lines += [
        "",
        "## 4. A pipeline's messages beside its data-parallel reduction",
        "",
        "A generated GPT (8 layers, hidden 2048, seq 1024, PP 4 x DP 4, 8 micro-batches of 1; "
        "`themis-mpi workload gpt`), DP on the first switch level and PP on the second, every NPU's "
        "links (`--network fair|store-forward` run every NPU when a run has messages), baseline, 4 "
        "chunks per collective. DP: the gradients all-reduced after the pipeline drains, or one bucket "
        "per layer behind the last backward (`--overlap-dp`). Per parallelism, as `workload gpt --run` "
        "prices it: DP = the iteration minus the iteration without DP's collectives; PP = the messages "
        "alone minus the same on a free network; bubble = that free iteration minus compute.",
        "",
        "| schedule | DP | machine | rule | iteration us | compute us | DP us | PP us | bubble us |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in pipe:
        lines.append(
            f"| {r['schedule']} | {r['dp']} | {r['machine']} | {r['rule']} | {r['iteration_us']:.1f} | "
            f"{r['compute_us']:.1f} | {r['DP']:.1f} | {r['PP']:.1f} | {r['bubble_us']:.1f} |"
        )
    lines += ["", "![time vs chunks](splits.png)", "", "![Themis on the shared NIC](hgx_nic.png)", ""]
    lines += ["![pipeline beside DP](pipeline.png)", ""]
    return "\n".join(lines)


def plots(ar: list[dict], splits: list[dict], pipe: list[dict], out: str) -> list[str]:
    """splits.png (part 3), hgx_nic.png (part 1) and pipeline.png (part 4)."""
    fig, axes = plt.subplots(1, len(RULES), figsize=(16, 4), sharey=True)
    for ax, rule in zip(axes, RULES):
        for active in ACTIVE:
            cells = [r for r in splits if r["rule"] == rule and r["active"] == active]
            ax.plot(
                [r["chunks"] for r in cells],
                [r["time_us"] for r in cells],
                marker="o",
                label=f"{active} active",
            )
        ax.axhline(splits[0]["ideal_us"], color="grey", linestyle=":", label="ideal_us (bound)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(rule)
        ax.set_xlabel("chunks")
    axes[0].set_ylabel("64 MiB all-reduce time (us)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Baseline on 3D-SW_SW_SW_hetero: active chunks per dim x chunks, per sharing rule")
    fig.tight_layout()
    paths = [os.path.join(out, "splits.png"), os.path.join(out, "hgx_nic.png")]
    with atomic_path(paths[0]) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(10, 4))
    cells = [r for r in ar if r["size_bytes"] == 64 * MIB]
    labels = [f"{r['machine']}\n{r['latency']}\n{r['rule']}" for r in cells]
    colors = ["C0" if r["machine"] == "shared NIC" else "C1" for r in cells]
    at = range(len(cells))
    ax.bar([i - 0.2 for i in at], [r["speedup"] for r in cells], width=0.4, color=colors, label="Themis")
    ax.bar([i + 0.2 for i in at], [r["ports_speedup"] for r in cells], width=0.4, color=colors, hatch="//",
           edgecolor="black", label="themis-ports")  # fmt: skip
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xticks(list(at))
    ax.set_xticklabels(labels, fontsize=6, rotation=60, ha="right")
    ax.set_ylabel("speedup over the baseline")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(f"{HGX}, 64 MiB all-reduce: shared NIC (blue) or a NIC per dim (orange)", fontsize=9)
    fig.tight_layout()
    with atomic_path(paths[1]) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    cells = [(dp, rule) for dp in PIPE_DP for rule in RULES]
    for ax, schedule in zip(axes, ("1f1b", "gpipe")):
        for k, machine in enumerate(PIPE_MACHINES):
            values = [_pipe(pipe, schedule, dp, machine, rule)["iteration_us"] / 1e3 for dp, rule in cells]
            ax.bar([i + 0.4 * k for i in range(len(values))], values, width=0.4, label=machine)
        ax.set_xticks([i + 0.2 for i in range(len(cells))])
        ax.set_xticklabels([f"{dp}\n{rule}" for dp, rule in cells], fontsize=7)
        ax.set_title(f"{schedule}: GPT PP 4 x DP 4", fontsize=9)
    axes[0].set_ylabel("iteration (ms)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out, "pipeline.png"))
    with atomic_path(paths[2]) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return paths


def _cpu_s() -> float:
    """CPU seconds of this process and its finished worker processes."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def main(argv: list[str] | None = None) -> int:
    """Run the four parts, print the page, write JSON, Markdown and plots into --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="traces", help="folder with the four workloads (traces)")
    ap.add_argument("--out", default=os.path.join("results", "network"), help="output directory")
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    ap.add_argument("--quick", action="store_true", help=f"part 2 on {', '.join(QUICK_WORKLOADS)} only")
    args = ap.parse_args(argv)
    t0 = _cpu_s()
    workloads = QUICK_WORKLOADS if args.quick else WORKLOADS
    ar, training = all_reduce_part(), training_part(args.traces, parse_workers(args.workers), workloads)
    splits, pipe = splits_part(), pipeline_part()
    seconds = _cpu_s() - t0
    page = markdown(ar, training, splits, pipe, seconds)
    doc = {"all_reduce": ar, "training": training, "splits": splits, "pipeline": pipe}
    write_study(args.out, "network", page, doc)
    print(page)
    print(
        "# wrote "
        + " ".join(
            [os.path.join(args.out, n) for n in ("network.json", "network.md")]
            + plots(ar, splits, pipe, args.out)
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
