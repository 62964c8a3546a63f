"""`themis-mpi workload gpt`: an LLM's training iteration from its shape, as per-rank Chakra files.

It prints the model's figures (parameters, FLOPs, bytes per parallelism, the schedule's
micro-batches in flight), writes ``PREFIX.<rank>.et`` with ``--out`` (`train PREFIX` replays
them), and with ``--run`` prices one iteration on the model: time, compute, the communication
each parallelism exposes and the pipeline bubble (docs/workloads.md#llm-training-generated-from-a-models-shape).
"""

from __future__ import annotations

import argparse

from ..config import RunConfig
from ..errors import UsageError
from ..model import ModelTransport
from ..run.training import run_graph
from ..topology import Topology
from ..workloads.chakra import Graph
from ..workloads.llm import (
    PARALLELISMS,
    PRESETS,
    Layout,
    LazyTraces,
    LlmConfig,
    fit_groups,
    in_flight,
    parse_schedule,
    stage_order,
    traffic,
    write_llm,
)
from ..workloads.training import TrainingSpec
from .options import one_topology

SHAPE = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "experts", "topk", "micro_batch", "global_batch")
POLICIES = (("baseline", "fifo"), ("themis", "scf"))


def llm_config(args: argparse.Namespace) -> LlmConfig:
    """The flags (over a preset's shape) as an `LlmConfig`; a shape that does not divide is refused."""
    shape = dict(PRESETS[args.preset]) if args.preset else {}
    for name in SHAPE:
        value = getattr(args, name)
        if value is not None:
            shape[name] = value
    missing = [n for n in ("layers", "hidden", "heads", "seq", "vocab") if n not in shape]
    if missing:
        raise UsageError(f"workload gpt needs --{' --'.join(missing).replace('_', '-')} (or --preset)")
    shape.setdefault("micro_batch", 1)
    shape.setdefault("global_batch", shape["micro_batch"] * args.dp)
    schedule, chunks = parse_schedule(args.schedule)
    return LlmConfig(
        **shape,
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        zero=args.zero,
        schedule=schedule,
        chunks=chunks,
        recompute=args.recompute,
        peak_tflops=args.peak_tflops,
        efficiency=args.efficiency,
        bytes_per_element=args.bytes_per_element,
    )


def _dims(dims: tuple[int, ...]) -> str:
    return ",".join(map(str, dims)) or "-"


def summary(c: LlmConfig, layout: Layout) -> list[str]:
    """What the generated iteration holds, as comment lines."""
    nodes = LazyTraces(c, layout)[0].nodes
    sent = traffic(nodes)
    flight = [in_flight(stage_order(c.schedule, c.pp, s, c.micro_batches, c.chunks)) for s in range(c.pp)]
    topo = layout.topology
    moe = f", {c.experts} experts top-{c.topk}, EP {c.ep} on dims {_dims(layout.ep)}" if c.moe else ""
    schedule = c.schedule + (f":{c.chunks}" if c.schedule == "interleaved" else "")
    return [
        f"# gpt: {c.layers} layers, hidden {c.hidden}, {c.heads} heads, seq {c.seq}, vocab {c.vocab}, "
        f"ffn {c.ffn_hidden}{moe}; {c.params / 1e9:.2f}e9 parameters, {c.flops:.4g} FLOPs per iteration",
        f"# TP {c.tp} x PP {c.pp} x DP {c.dp} = {c.npus} NPUs on {topo.spec()}: TP dims {_dims(layout.tp)}, "
        f"DP dims {_dims(layout.dp)}, PP dims {_dims(layout.pp)} (rank = tp + TP*(dp + DP*pp))",
        f"# {schedule}: {c.micro_batches} micro-batches of {c.micro_batch} per pipeline, ZeRO-{c.zero}"
        f"{', recompute' if c.recompute else ''}; in flight per stage {' '.join(map(str, flight))}; "
        f"ideal bubble (p-1)/(m*V) = {(c.pp - 1) / (c.micro_batches * c.chunks):.3f}",
        "# rank 0 per iteration: "
        + ", ".join(f"{k} {sent[k] / 2**20:.2f} MiB" for k in PARALLELISMS)
        + f"; layer forward {c.layer_forward_ns / 1e3:.2f} us per micro-batch",
    ]


def price(c: LlmConfig, layout: Layout, policy: str, config: RunConfig, spec: TrainingSpec) -> dict:
    """One iteration on the model, and what each parallelism's communication and the bubble cost it."""

    def run(drop: frozenset[str], topo: Topology) -> tuple[float, float]:
        graph = Graph(f"<gpt {policy}>", LazyTraces(c, layout, drop))  # type: ignore[arg-type]
        row = run_graph(ModelTransport(topo, config), graph, policy, spec)
        return row.iteration_us, row.compute_us

    topo = layout.topology
    free = topo.with_overrides([1e6] * len(topo.dims), [0.0] * len(topo.dims))
    full, compute = run(frozenset(), topo)
    out = {"iteration_us": full, "compute_us": compute, "exposed_us": full - compute}
    colls = frozenset(("TP", "DP", "EP"))
    for k in ("TP", "DP", "EP"):
        out[k] = full - run(frozenset((k,)), topo)[0]
    messages, _ = run(colls, topo)
    idle, _ = run(colls, free)
    out["PP"] = messages - idle
    out["bubble_us"] = idle - compute
    return out


def cmd_workload(args: argparse.Namespace) -> int:
    """`themis-mpi workload gpt`: the figures, the files (--out), the priced iteration (--run)."""
    c = llm_config(args)
    layout = fit_groups(c, one_topology(args))
    for line in summary(c, layout):
        print(line)
    if args.out:
        write_llm(c, layout.topology, args.out)
        print(
            f"# wrote {args.out}.0.et .. {args.out}.{c.npus - 1}.et ({c.npus} files, pipeline schedule in "
            f"the graphs); replay: themis-mpi train {args.out} -t '{layout.topology.spec()}'"
        )
    if args.run:
        spec = TrainingSpec(args.chunks, "float32", 1)
        print(
            f"# model: one rank per pipeline stage, {spec.chunks} chunks per collective; exposed X = time "
            "saved were X's collectives free (PP: the messages, collectives left out); bubble = idle time "
            "with free communication"
        )
        head = "policy iteration_us compute_us exposed_us TP_us PP_us DP_us EP_us bubble_us".split()
        print("#" + "".join(f"{h:>14}" for h in head)[1:])
        for policy, intra in POLICIES:
            r = price(c, layout, policy, RunConfig(intra=intra), spec)
            cells = [r["iteration_us"], r["compute_us"], r["exposed_us"], r["TP"], r["PP"], r["DP"], r["EP"]]
            print(f"{policy:>14}" + "".join(f"{v:14.2f}" for v in [*cells, r["bubble_us"]]))
    return 0
