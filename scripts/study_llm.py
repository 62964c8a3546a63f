"""The LLM study: Themis vs baseline (and our other policies) on GPT-3 175B and a Mixtral-like MoE.

Usage::

    python scripts/study_llm.py [--out docs/llm] [--quick] [--models M,..] [--topologies T,..]
                                [--orders O,..] [--chunks 4] [--workers N|mpi]

Each cell is one model and layout (`themis-mpi workload gpt`) on one 1024-NPU topology under one
placement order (`--order`): GPT-3 175B at TP8 x PP8 x DP16 (Narayanan et al., SC'21) and the
`mixtral-8x7b` preset at TP8 x PP4 x DP32 x EP8, both 1F1B, ZeRO-0, micro-batch 1, H100 at 989
TFLOP/s x 0.5; on `HGX-H100-SW_SW_SW` and the Themis paper's four topologies; under Megatron's
order (tp-dp-pp: DP on the dims after TP) and tp-pp-dp (DP on the outermost dims). Every cell is
priced on the model, `chunks` chunks per collective, under each policy of `POLICIES`
(`run.priced.price_all`): the iteration, rank 0's compute, and per parallelism what its
communication costs the iteration (TP, DP, EP: the time saved were its collectives free; PP and
the bubble from the runs without collectives). The model runs one rank per pipeline stage (rank 0
and its PP peers, linked): the ranks of a stage run the same graph on symmetric groups, so one
stands for all of them. A cell whose groups do not fit the topology's dims is kept, with why.

Writes study.json (every cell) and study.md (the tables) into --out, atomically, and prints the
tables. ``--quick``: the `QUICK` cell only (the MoE on 4D-Ring_SW_SW_SW, about 20 s of CPU),
whose row equals the same cell of a full run (tests/test_study_llm.py checks it against docs/llm).
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.output import write_study
from themis_mpi.report import measured_on
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers
from themis_mpi.run.priced import price_all
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.llm import PRESETS, Layout, LlmConfig, fit_groups
from themis_mpi.workloads.training import TrainingSpec

MODELS = {
    "gpt3-175b": dict(tp=8, pp=8, dp=16),
    "mixtral-8x7b": dict(tp=8, pp=4, dp=32, ep=8),
}
TOPOLOGIES = [
    "HGX-H100-SW_SW_SW",
    "3D-SW_SW_SW_hetero",
    "3D-FC_Ring_SW",
    "4D-Ring_SW_SW_SW",
    "4D-Ring_FC_Ring_SW",
]
ORDERS = ["tp-dp-pp", "tp-pp-dp"]
POLICIES = [
    ("baseline", "fifo"),
    ("themis", "scf"),
    ("themisFlex", "scf"),
    ("themis-lat", "scf"),
    ("predictive", "scf"),
]
QUICK = [("mixtral-8x7b", "4D-Ring_SW_SW_SW", "tp-pp-dp")]
PARTS = ("TP", "PP", "DP", "EP")
WALL_CLOCK_KEYS = ("wall_s",)

NETWORK = (
    "ideal"  # pinned: its shipped rows ran under ideal; re-running under packet takes too long to redo here
)
# What checks the rows against every NPU, and what a whole cell by every NPU cost (study.md's last paragraph)
CHECKED = (
    "\nEach cell runs under ideal by the linked ranks (rank 0 and its pipeline peers, each collective timed "
    "by one NPU's symmetric view), which assumes that a stage's TP, DP and EP peers start their collectives "
    "together. tests/test_study_llm_every.py checks it on two cells cut to 16 NPUs (GPT-3 175B on HGX's "
    "dims, tp-dp-pp; the MoE on 4D-Ring_SW_SW_SW's, tp-pp-dp; TP2 x PP4 x DP2, EP2, 4 micro-batches): "
    "every policy's row equals, to the ns, the row of every NPU's engine in event order "
    "(timing.greenlets.NpuWorld: each collective step waits for its peers' sends, each message for its "
    "peer's issue). A whole 1024-NPU cell by every NPU is about 17 CPU minutes a run: the quick cell's "
    "baseline iteration (one of its 22 runs) by every NPU takes 1010 CPU s at 859 MiB peak RSS and gives "
    "the linked ranks' iteration to the ns (1,683,740.85 us; before every NPU kept its records and graph, "
    "it grew to 12.3 GiB at 53% of its nodes); the linked ranks run that iteration in 1.5 CPU s at 117 "
    "MiB peak RSS, the whole cell in 22 CPU s at 171 MiB.\n"
)


def _study_row(priced: dict) -> dict:
    """The study's keys of one priced policy, rounded to the ns.

    Its ``exposed_us`` is the iteration minus the compute (the bubble with the communication), as
    the study has always stated it. (`price_all` also splits the bubble and lists per-stage
    compute; the study's tables do not show those, and its shipped rows keep their keys.)
    """
    row = {"iteration_us": priced["iteration_us"], "compute_us": priced["compute_us"]}
    row["exposed_us"] = priced["iteration_us"] - priced["compute_us"]
    row.update({k: priced[k] for k in ("TP", "DP", "EP", "PP", "bubble_us")})
    return {k: round(v, 3) for k, v in row.items()}


def config_of(model: str, order: str) -> LlmConfig:
    """The model's preset shape at its study layout, under `order`."""
    return LlmConfig(**PRESETS[model], **MODELS[model], order=order)


def dims_of(topology, dims: tuple[int, ...]) -> list[list]:
    """A group's dims as [npus, GB/s] pairs."""
    return [[topology.dims[d].npus, topology.dims[d].bandwidth_gbps] for d in dims]


def priced_rows(c: LlmConfig, layout: Layout, chunks: int) -> dict[str, dict]:
    """Every policy's study row of one fitted cell, priced under the study's rule (`NETWORK`).

    (tests/test_study_llm_every.py prices cut cells so, and by every NPU under the same rule.)
    """
    spec = TrainingSpec(chunks, "float32", 1)
    priced = price_all(c, layout, [(p, RunConfig(intra=i, network=NETWORK)) for p, i in POLICIES], spec)
    return {p: _study_row(r) for p, r in priced.items()}


def run_cell(cell: tuple) -> dict:
    """One cell: its layout and every policy's priced iteration (or why its groups do not fit)."""
    model, topology, order, chunks = cell
    started = time.perf_counter()
    c = config_of(model, order)
    row: dict = {"model": model, "topology": topology, "order": order, "chunks": chunks}
    row.update(tp=c.tp, pp=c.pp, dp=c.dp, ep=c.ep, micro_batches=c.micro_batches)
    try:
        layout = fit_groups(c, parse_topology(topology))
    except UsageError as exc:
        return {**row, "fits": False, "why": str(exc), "wall_s": time.perf_counter() - started}
    topo = layout.topology
    row.update(fits=True, split=topo.spec())
    groups = {"TP": layout.tp, "DP": layout.dp, "EP": layout.ep, "EDP": layout.edp, "PP": layout.pp}
    row["dims"] = {g: list(d) for g, d in groups.items()}
    row["group_dims"] = {g: dims_of(topo, d) for g, d in groups.items()}
    row["policies"] = priced_rows(c, layout, chunks)
    base = row["policies"]["baseline"]["iteration_us"]
    times = {p: r["iteration_us"] for p, r in row["policies"].items()}
    best = min(times, key=lambda p: times[p])  # the first of equal times
    row.update(
        themis_speedup=base / times["themis"],
        best=best,
        best_speedup=base / times[best],
        wall_s=time.perf_counter() - started,
    )
    return row


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f}"


def _dims_text(row: dict, group: str) -> str:
    pairs = row["group_dims"][group]
    return " x ".join(f"{n}@{g:g}" for n, g in pairs) or "-"


def markdown(rows: list[dict], chunks: int) -> str:
    """The tables: per model, each cell's layout, the baseline's breakdown, and every policy's time."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        sel = [r for r in rows if r["model"] == model]
        r0 = sel[0]
        ep = f" x EP{r0['ep']}" if r0["ep"] > 1 else ""
        out.append(
            f"\n**{model}, TP{r0['tp']} x PP{r0['pp']} x DP{r0['dp']}{ep}, 1F1B, {r0['micro_batches']} "
            f"micro-batches, {chunks} chunks per collective** (ms per iteration; TP/PP/DP/EP: what each "
            "parallelism's communication costs the baseline's iteration; dims as npus@GB/s)\n"
        )
        out.append(
            "| topology | order | TP dims | DP dims | baseline | compute | TP | PP | DP | EP | bubble "
            "| Themis | Themis TP | Themis DP | speedup | best |"
        )
        out.append("|---" * 16 + "|")
        for r in sel:
            if not r["fits"]:
                out.append(f"| {r['topology']} | {r['order']} | does not fit: {r['why']} |" + " |" * 13)
                continue
            b, t = r["policies"]["baseline"], r["policies"]["themis"]
            cells = [
                r["topology"],
                r["order"],
                _dims_text(r, "TP"),
                _dims_text(r, "DP"),
                _ms(b["iteration_us"]),
                _ms(b["compute_us"]),
                *(_ms(b[k]) for k in PARTS),
                _ms(b["bubble_us"]),
                _ms(t["iteration_us"]),
                _ms(t["TP"]),
                _ms(t["DP"]),
                f"{r['themis_speedup']:.4f}x",
                f"{r['best']} {r['best_speedup']:.4f}x",
            ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/llm", help="output folder (docs/llm is the shipped copy)")
    ap.add_argument("--quick", action="store_true", help="the QUICK cell only (about 20 s of CPU)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (gpt3-175b,mixtral-8x7b)")
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES), help="comma-separated topologies")
    ap.add_argument("--orders", default=",".join(ORDERS), help="comma-separated --order values")
    ap.add_argument("--chunks", type=int, default=4, help="chunks per collective (4, as workload gpt --run)")
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    args = ap.parse_args(argv)
    args.models = args.models.split(",")
    unknown = set(args.models) - set(MODELS)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; use {', '.join(MODELS)}")
    args.topologies = re.split(r",(?![^(]*\))", args.topologies)  # inline specs hold commas
    args.orders = args.orders.split(",")
    if args.chunks < 1:
        ap.error("--chunks must be >= 1")
    return args


def cells_of(args: argparse.Namespace) -> list[tuple]:
    """The study's cells: model x topology x order (the QUICK ones with --quick)."""
    if args.quick:
        return [(*q, args.chunks) for q in QUICK]
    return [(m, t, o, args.chunks) for m in args.models for t in args.topologies for o in args.orders]


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    started = time.perf_counter()
    cells = cells_of(args)
    rows = []
    for i, row in enumerate(ordered_map(run_cell, cells, parse_workers(args.workers)), 1):
        rows.append(row)
        sys.stderr.write(f"{i}/{len(cells)} cells, {time.perf_counter() - started:.0f} s\n")
        sys.stderr.flush()
    elapsed = time.perf_counter() - started
    text = markdown(rows, args.chunks)
    runs = sum(len(r.get("policies", {})) for r in rows)
    text += (
        f"\n{len(rows)} cells, {runs} priced policies, in {elapsed:.1f} s (wall clock, {measured_on()}).\n"
    )
    text += CHECKED
    write_study(args.out, "study", text, rows)
    print(text)
    return rows


if __name__ == "__main__":
    main()
