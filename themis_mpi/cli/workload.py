"""`themis-mpi workload gpt`: an LLM's training iteration from its shape, as per-rank Chakra files.

It prints the model's figures (parameters, FLOPs, bytes per parallelism, the schedule's
micro-batches in flight), writes ``PREFIX.<rank>.et`` with ``--out`` (`train PREFIX` replays
them), and with ``--run`` prices one iteration on the model: time, compute, the communication
each parallelism exposes and the pipeline bubble (docs/workloads.md, "LLM training"). `workload
simai FILE` reads SimAI's extended text format and runs it: one stage, or with ``pp`` > 1 the
pipeline of its stages under 1F1B.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial

from ..api import SHAPE, gpt_config, write_gpt
from ..collectives import DEFAULT_DTYPE
from ..config import RunConfig
from ..errors import UsageError
from ..limits import MAX_BANDWIDTH_GBPS, MIN_BANDWIDTH_GBPS, in_range
from ..model import ModelTransport
from ..progress import Runs
from ..report import stragglers_line
from ..results import TrainingResult
from ..run.pool import parse_workers
from ..run.priced import PricedResult, price_cell, price_runs, stage_flight
from ..run.priced import gpt_cells as priced_cells
from ..run.sweep import TrainingCell
from ..run.training import graph_kinds, graph_run, graph_stragglers, run_graph
from ..timing.planner import chunk_steps
from ..timing.planner import plan as plan_of
from ..topology import Topology, parse_topology
from ..workloads.chakra import Graph, plan_graph
from ..workloads.llm import (
    PARALLELISMS,
    Layout,
    LazyTraces,
    LlmConfig,
    fit_groups,
    parse_order,
    parse_schedule,
    place_groups,
    traffic,
)
from ..workloads.simai import (
    GROUPS,
    SimaiTraces,
    SimaiWorkload,
    census,
    check_schedule,
    group_sizes,
    parse_simai,
    simai_graph,
    split_micro_batches,
)
from ..workloads.training import TrainingSpec
from .options import (
    Meter,
    all_topologies,
    chunk_counts,
    expect_lines,
    input_files,
    late_links,
    names,
    one_chunk_count,
    one_topology,
    slow_compute,
    split_list,
    table_to_stderr,
    training_sweep,
)

POLICIES = (("baseline", "fifo"), ("themis", "scf"))


def llm_config(args: argparse.Namespace) -> LlmConfig:
    """The flags (over a preset's shape) as an `LlmConfig` (`api.gpt_config`): a bad shape is refused."""
    return gpt_config(
        args.preset,
        {name: getattr(args, name) for name in SHAPE},
        lambda name: "--" + name.replace("_", "-"),
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        zero=args.zero,
        schedule=args.schedule,
        recompute=args.recompute,
        overlap_dp=args.overlap_dp,
        peak_tflops=args.peak_tflops,
        efficiency=args.efficiency,
        bytes_per_element=args.bytes_per_element,
        order=args.order,
    )


def _dims(dims: tuple[int, ...]) -> str:
    return ",".join(map(str, dims)) or "-"


def rank_formula(order: str) -> str:
    """How a rank is numbered from its group coordinates, e.g. ``tp + TP*(dp + DP*pp)``."""
    first, *rest = parse_order(order)
    text = rest[-1]
    for g in reversed(rest[:-1]):
        text = f"{g} + {g.upper()}*{text}" if text == rest[-1] else f"{g} + {g.upper()}*({text})"
    return f"{first} + {first.upper()}*({text})"


def summary(c: LlmConfig, layout: Layout) -> list[str]:
    """What the generated iteration holds, as comment lines."""
    nodes = LazyTraces(c, layout)[0].nodes
    sent = traffic(nodes)
    flight = stage_flight(c)
    topo = layout.topology
    moe = f", {c.experts} experts top-{c.topk}, EP {c.ep} on dims {_dims(layout.ep)}" if c.moe else ""
    schedule = c.schedule + (f":{c.chunks}" if c.schedule == "interleaved" else "")
    return [
        f"# gpt: {c.layers} layers, hidden {c.hidden}, {c.heads} heads, seq {c.seq}, vocab {c.vocab}, "
        f"ffn {c.ffn_hidden}{moe}; {c.params / 1e9:.2f}e9 parameters, {c.flops:.4g} FLOPs per iteration",
        f"# TP {c.tp} x PP {c.pp} x DP {c.dp} = {c.npus} NPUs on {topo.spec()}: TP dims {_dims(layout.tp)}, "
        f"DP dims {_dims(layout.dp)}, PP dims {_dims(layout.pp)} "
        f"(--order {c.order}: rank = {rank_formula(c.order)})",
        f"# {schedule}: {c.micro_batches} micro-batches of {c.micro_batch} per pipeline, ZeRO-{c.zero}"
        f"{', recompute' if c.recompute else ''}{', DP overlapped' if c.overlap_dp else ''}; "
        f"in flight per stage {' '.join(map(str, flight))}; "
        f"ideal bubble (p-1)/(m*V) = {(c.pp - 1) / (c.micro_batches * c.chunks):.3f}",
        "# rank 0 per iteration: "
        + ", ".join(f"{k} {sent[k] / 2**20:.2f} MiB" for k in PARALLELISMS)
        + f"; layer forward {c.layer_forward_ns / 1e3:.2f} us per micro-batch",
    ]


PRICED_HEAD = "policy iteration_us compute_us exposed_us TP_us PP_us DP_us EP_us bubble_us ideal_us imbal_us"


def priced_table(rows: Sequence[TrainingResult], n_dims: int = 0) -> str:
    """`workload gpt --run`'s rows: the title, a line per row and, per row, its stages' line."""
    lines = ["#" + "".join(f"{h:>14}" for h in [*PRICED_HEAD.split(), "speedup"])[1:]]
    stages = []
    for r in rows:
        assert isinstance(r, PricedResult)
        cells = [r.iteration_us, r.compute_us, r.exposed_us, r.TP, r.PP, r.DP, r.EP]
        cells += [r.bubble_us, r.ideal_bubble_us, r.imbalance_us]
        speed = f"{r.speedup:.3f}x" if r.speedup else "-"
        lines.append(f"{r.policy:>14}" + "".join(f"{v:14.2f}" for v in cells) + f"{speed:>14}")
        stages.append(
            f"#   {r.policy}: per pipeline stage compute "
            + " ".join(f"{us:.2f}" for us in r.stage_compute_us)
            + " us; activations in flight "
            + " ".join(f"{b / 2**20:.2f}" for b in r.stage_activation_bytes)
            + " MiB"
        )
    return "\n".join(lines + stages)


def gpt_cells(args: argparse.Namespace, c: LlmConfig) -> tuple[list[TrainingCell], dict[Topology, Layout]]:
    """`workload gpt --run`'s cells (`run.priced.gpt_cells`): -t x -c x -p x --network."""
    policies = args.policy if args.policy in ("all", "both") else split_list(args.policy)
    bases = [RunConfig(network=rule, mtu_bytes=args.mtu, **late_links(args)) for rule in names(args.network)]
    spec = TrainingSpec(4, DEFAULT_DTYPE, 1, **slow_compute(args))
    return priced_cells(c, all_topologies(args), chunk_counts(args), policies, bases, spec)


def run_gpt(args: argparse.Namespace, c: LlmConfig) -> int:
    """`workload gpt --run`: the sweep's cells priced, each row printed and saved as it ends."""
    cells, layouts = gpt_cells(args, c)
    formula = "2*S*b*H B: recompute" if c.recompute else "S*b*H*(10 + 24/t + 5*a*S/(H*t)) B"

    def head(group: list[TrainingCell]) -> list[str]:
        cell = group[0] if group else cells[0]
        chunks = ",".join(str(n) for n in dict.fromkeys(g.spec.chunks for g in group)) or "no"
        lines = [
            *([] if args.out else summary(c, layouts[cell.topology])),  # (--out said it)
            f"# model: one rank per pipeline stage, {chunks} chunks per collective; X = time saved were "
            "X's collectives free (PP: the messages, collectives left out); bubble = idle time with free "
            "communication, split into the schedule's ideal (p-1)/(m*V) x compute and stage imbalance; "
            f"exposed = iteration - compute - bubble; activations in flight = micro-batches in flight x "
            f"L/(p*V) layers x {formula}",
        ]
        return lines + _straggling(c, layouts[cell.topology], group or [cell])

    inputs = input_files(*split_list(args.topology))
    run, workers = partial(price_cell, c, layouts), parse_workers(args.workers)
    return training_sweep(args, cells, run, head, False, workers, inputs, ("workload", repr(c)), priced_table)


def _straggling(c: LlmConfig, layout: Layout, group: list[TrainingCell]) -> list[str]:
    """The stragglers' header line, and the planner's estimate where it expects a long run, as `train`'s.

    Planning each cell's run refuses in one line what no sharing rule takes (stragglers under ideal,
    one rule of a sweep too).
    """
    topo, config, spec = layout.topology, group[0].config, group[0].spec
    straggling = config.asymmetric or spec.heterogeneous
    lines = [stragglers_line(config, spec) + "; every part runs with them"] if straggling else []
    graph = Graph("<gpt>", LazyTraces(c, layout))  # type: ignore[arg-type]
    plans = [plan_graph(graph.trace(0), topo, 0, cell.spec, graph.groups) for cell in group]
    runs = price_runs(c, layout, 1)  # (each cell prices one policy)
    steps = [runs * chunk_steps(topo, [op.collective for op in p.ops if op.collective]) for p in plans]
    timings = [plan_of(graph_run(topo, cell.config, graph, p, cell.spec)) for cell, p in zip(group, plans)]
    kinds = graph_kinds(graph, True, spec)  # (every NPU's links build a graph per kind; none: every rank's)
    built = topo.npus if kinds is None else len({repr(kind) for kind in kinds.values()})
    nodes = len(plans[0].ops)
    return lines + expect_lines(timings[0], steps, spec, nodes, nodes * built)


def run_config(args: argparse.Namespace, intra: str, topology: Topology) -> RunConfig:
    """--run's settings of one intra policy (--network, --mtu, late NPUs, links), on the topology."""
    return RunConfig(intra=intra, network=args.network or "", mtu_bytes=args.mtu, **late_links(args)).on(
        topology
    )


def simai_network(npus: int, args: argparse.Namespace) -> Topology:
    """SimAI's README network for one stage: 8 GPUs per server on NVLink, a NIC per GPU beyond."""
    nv = in_range("--nvlink-gbps", args.nvlink_gbps, MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS, "GB/s")
    nic = in_range("--nic-gbps", args.nic_gbps, MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS, "GB/s")
    servers, per = max(1, npus // 8), min(8, npus)
    spec = f"SW({per},{nv:g},0)" + (f"_SW({servers},{nic:g},0)" if servers > 1 else "")
    return parse_topology(spec)


def cmd_simai(args: argparse.Namespace) -> int:
    """`themis-mpi workload simai FILE`: its layers and collectives per group; --run: our iteration."""
    wl = parse_simai(args.file)
    if wl.pp > 1:
        return cmd_simai_pipeline(wl, args)
    stage = wl.tp * wl.dp
    layout = place_groups(wl.tp, wl.ep, wl.dp, 1, simai_network(stage, args))
    print(
        f"# SimAI workload {args.file}: {len(wl.layers)} layers; TP {wl.tp}, EP {wl.ep}, PP {wl.pp} (vpp "
        f"{wl.vpp}, pp_comm {wl.pp_comm} B), DP {wl.dp}, ga {wl.ga}, {wl.all_gpus} GPUs; one stage of "
        f"{stage} NPUs on {layout.topology.spec()}"
    )
    print_census(wl)
    if args.run:
        spec = TrainingSpec(one_chunk_count(args, "workload simai"), DEFAULT_DTYPE, 1, **slow_compute(args))
        say_stragglers(args, spec, layout.topology)
        print("# model: one stage, symmetric, no pipeline messages or bubble; exposed G = time saved, G free")
        print(
            "#   policy  iteration_us    compute_us    exposed_us"
            + "".join(f"{g + '_us':>14}" for g in GROUPS)
        )
        meter = Meter(1, args.quiet)
        runs = Runs(meter.part(0), len(POLICIES) * (1 + len(GROUPS)))
        for policy, intra in POLICIES:
            config = run_config(args, intra, layout.topology)

            def run(drop: frozenset[str], policy: str = policy, config: RunConfig = config):
                graph = Graph(args.file, [simai_graph(wl, layout, drop)])
                return run_graph(
                    ModelTransport(layout.topology, config), graph, policy, spec, None, runs.next()
                )

            row = run(frozenset())
            saved = [row.iteration_us - run(frozenset((g,))).iteration_us for g in GROUPS]
            cells = [row.iteration_us, row.compute_us, row.exposed_comm_us, *saved]
            meter.write(f"{policy:>10}" + "".join(f"{v:14.2f}" for v in cells))
        meter.close()
    return 0


def print_census(wl: SimaiWorkload) -> None:
    """The file's collectives per group and op, one line each."""
    print("#   group  npus  op             collectives          bytes")
    sizes = group_sizes(wl)
    for (group, op), (n, b) in sorted(census(wl).items()):
        print(f"  {group:>7} {sizes[group]:5d}  {op:<13} {n:12d} {b:14d}")


def cmd_simai_pipeline(wl: SimaiWorkload, args: argparse.Namespace) -> int:
    """A SimAI file with pp > 1: its stages under --schedule (1F1B), priced as the GPT replay is."""
    layout = place_groups(wl.tp, wl.ep, wl.dp, wl.pp, simai_network(wl.all_gpus, args))
    pipe = split_micro_batches(wl)
    schedule = parse_schedule(args.schedule)
    check_schedule(wl, pipe, *schedule)
    name = args.schedule if schedule[0] == "interleaved" else schedule[0]
    cut = (
        f"{len(pipe.micro_batches)} micro-batches of {len(pipe.micro_batches[0])} lines, "
        f"{len(pipe.head) + len(pipe.tail)} step lines"
        if pipe.split
        else f"not cut into its ga {wl.ga} micro-batches: replayed as one"
    )
    print(
        f"# SimAI workload {args.file}: {len(wl.layers)} layers; TP {wl.tp}, EP {wl.ep}, PP {wl.pp} (vpp "
        f"{wl.vpp}, pp_comm {wl.pp_comm} B), DP {wl.dp}, ga {wl.ga}, {wl.all_gpus} GPUs on "
        f"{layout.topology.spec()}; PP dims {_dims(layout.pp)}; {cut}"
    )
    print_census(wl)
    if not args.run:
        return 0
    spec = TrainingSpec(one_chunk_count(args, "workload simai"), DEFAULT_DTYPE, 1, **slow_compute(args))
    say_stragglers(args, spec, layout.topology)
    print(
        f"# model: {name}, every stage the file, one rank per stage; exposed G = time saved, G free "
        "(PP: the messages, collectives left out); bubble = idle time with free communication"
    )
    head = ["policy", "iteration_us", "compute_us", "exposed_us", *(g + "_us" for g in GROUPS), "PP_us"]
    print("#" + "".join(f"{h:>14}" for h in [*head, "bubble_us"])[1:])
    topo = layout.topology
    free = topo.free()
    colls = frozenset(GROUPS)
    meter = Meter(1, args.quiet)
    runs = Runs(meter.part(0), 2 + len(POLICIES) * (1 + len(GROUPS)))

    def run(policy: str, config: RunConfig, drop: frozenset[str], on: Topology) -> tuple[float, float]:
        graph = Graph(args.file, SimaiTraces(wl, layout, drop, schedule))  # type: ignore[arg-type]
        row = run_graph(ModelTransport(on, config), graph, policy, spec, None, runs.next())
        return row.iteration_us, row.compute_us

    first = run_config(args, POLICIES[0][1], topo)
    messages, _ = run(POLICIES[0][0], first, colls, topo)
    idle, compute = run(POLICIES[0][0], first, colls, free)
    for policy, intra in POLICIES:
        config = run_config(args, intra, topo)
        full, _ = run(policy, config, frozenset(), topo)
        saved = [full - run(policy, config, frozenset((g,)), topo)[0] for g in GROUPS]
        cells = [full, compute, full - compute, *saved, messages - idle, idle - compute]
        meter.write(f"{policy:>14}" + "".join(f"{v:14.2f}" for v in cells))
    meter.close()
    return 0


def say_stragglers(args: argparse.Namespace, spec: TrainingSpec, topology: Topology) -> None:
    """`workload simai --run`'s stragglers line, where there are any (as `train` prints it)."""
    config = run_config(args, "fifo", topology)
    if graph_stragglers(topology, config, spec):
        print(stragglers_line(config, spec))


STRAGGLER_FLAGS = ("npu_compute_scale", "compute_jitter", "npu_delay_us", "link_scale")


def cmd_workload(args: argparse.Namespace) -> int:
    """`themis-mpi workload gpt`: the figures, the files (--out), the priced iteration (--run)."""
    if not args.run and any(getattr(args, name) for name in STRAGGLER_FLAGS):
        raise UsageError(
            "--npu-compute-scale, --compute-jitter, --npu-delay-us and --link-scale slow the priced "
            "iteration: give --run"
        )
    if args.kind == "simai":
        if not args.file:
            raise UsageError("workload simai needs a SimAI workload FILE")
        if args.policy != "both" or args.json or args.csv or args.jsonl or args.resume or args.workers != "1":
            raise UsageError(
                "workload simai prices baseline and themis on one network and prints its table: -p, --json, "
                "--csv, --jsonl, --resume and --workers are for workload gpt --run"
            )
        one_chunk_count(args, "workload simai")
        return cmd_simai(args)
    if args.file:
        raise UsageError("workload gpt takes no FILE; its shape comes from flags")
    with table_to_stderr(args):  # (`--json -`: the rows alone on standard output)
        return _gpt(args)


def _gpt(args: argparse.Namespace) -> int:
    """`workload gpt`: one layout's figures and files, or (--run without --out) the priced sweep."""
    c = llm_config(args)
    if args.run and not args.out:
        return run_gpt(args, c)
    if len(split_list(args.topology)) > 1 or len(chunk_counts(args)) > 1:
        raise UsageError("-t and -c take one value without --run and with --out (its files are one layout's)")
    layout = fit_groups(c, one_topology(args))
    for line in summary(c, layout):
        print(line, flush=True)
    if args.out:
        write_gpt(c, layout.topology, args.out)
        print(
            f"# wrote {args.out}.0.et .. {args.out}.{c.npus - 1}.et ({c.npus} files, pipeline schedule in "
            f"the graphs); replay: themis-mpi train {args.out} -t '{layout.topology.spec()}'"
        )
    return run_gpt(args, c) if args.run else 0
