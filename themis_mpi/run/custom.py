"""A collective run by a custom algorithm (``--algorithm msccl:FILE``), on the model and the emulator.

The planner chooses this (`timing.planner.CUSTOM`): every NPU's program runs on every NPU's
links under the run's rule (`timing.programs`), a deterministic run that the model and every
emulator rank compute alike, so their times are the same to the ns. On the emulator each rank
then runs its own GPU's program on real numpy data, its messages rank to rank over MPI (uppercase
calls into buffers kept between the run's chunks, on a communicator of its own, one tag per
channel, so that MPI's order per (peer, tag) keeps each (peer, channel)'s order), and the result
is checked against the closed form (`msccl.custom.run_gpu`).

A dim's custom stages (`DimStages`, held for a run by `dim_stages`) run inside the engine's
schedules instead: their steps move the data through the MPI transport's stage path, and their
time is the file's programs on the dim alone, which one NPU's view takes as the stage's end;
where stages may share the dim's links (several at once, a shared port) under a sharing rule,
one NPU's view runs NPU 0's messages, level by level as its programs send them, as steps over
its links instead (`DimStages.flow`), or, for files whose NPUs' levels differ, every NPU's links
run each NPU's levels (`DimStages.npu_steps`, `timing.routes.NpuRoutes.custom_stage`).
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import numpy as np

from ..algorithms import Step, custom_stages
from ..collectives import Collective
from ..config import RunConfig
from ..cost import AG, RS
from ..engine import CollectiveRun, Engine, Transport
from ..errors import UsageError
from ..msccl.custom import Custom, chunk_bytes, dim_algorithms, run_gpu, stage_levels, stage_steps
from ..msccl.timing import reduction_ns
from ..nccl import custom_topology
from ..results import CollectiveResult, dim_bound_us, dim_results, link_results, summarize
from ..timing.links import Flow, Transfer, physical_links, rated
from ..timing.links import Step as LinkStep
from ..timing.programs import ProgramTimes, time_programs
from ..timing.routes import NpuRoutes, StepPlanner, step_planner
from ..timing.rules import IDEAL, STORE_FORWARD, rule_class
from ..timing.symmetric import Symmetric
from ..timing.world import World
from ..topology import Topology

LinkFlow = tuple[tuple[LinkStep, ...], bool]  # a stage's steps on one NPU's links, and whether uniform
TAG_BASE, TAGS = 1, 30000  # a custom algorithm's messages: TAG_BASE + channel


def time_custom(transport: Transport, collective: Collective, custom: Custom) -> ProgramTimes:
    """Every NPU's program on every NPU's links under the run's rule (`timing.programs`).

    On nccl dims the links and step latencies are the file's protocol's (`nccl.custom_topology`).
    """
    topology, config = transport.topology, transport.config
    if config.clock != "virtual":
        raise UsageError("custom algorithms run on the virtual clock only (not --clock wall)")
    cost = transport.cost(collective.itemsize)
    base_ns = 0.0
    if topology.flat:
        topology, base_ns = custom_topology(topology, custom.algo.proto)
    times = time_programs(
        topology,
        config.network,
        config,
        custom.progs,
        chunk_bytes(custom, collective),
        reduction_ns(cost),
        endpoint_delay_ns=cost.endpoint_delay_ns,
    )
    times.end_ns += base_ns
    return times


class _Mailbox:
    """This rank's messages over MPI (uppercase calls), on a communicator of its own.

    The k-th receive of an iteration lands in the k-th buffer, kept from one iteration to the
    next (grown when a message is larger); the sends of an iteration are completed before the
    next one takes the buffers again (a forwarded receive is sent from its buffer).
    """

    def __init__(self, grid: Any, dtype: str, what: str):
        self.grid, self.comm = grid, grid.cart.Dup()  # (no tag meets another message's)
        self.dtype, self.what = dtype, what
        self.pending: list[tuple[Any, np.ndarray]] = []  # sends in flight, with their data
        self.buffers: list[np.ndarray] = []
        self.k = 0

    def send(self, peer: int, chan: int, chunks: np.ndarray) -> None:
        """Post a send of the chunks to the peer on the channel."""
        self.pending.append((self.comm.Isend(chunks, peer, TAG_BASE + chan % TAGS), chunks))

    def receive(self, peer: int, chan: int, shape: tuple[int, ...]) -> np.ndarray:
        """The next message from the peer on the channel, in the iteration's next buffer."""
        n = int(np.prod(shape))
        if self.k == len(self.buffers):
            self.buffers.append(np.empty(n, dtype=self.dtype))
        elif self.buffers[self.k].size < n:
            self.buffers[self.k] = np.empty(n, dtype=self.dtype)
        buf = self.buffers[self.k][:n].reshape(shape)
        self.k += 1
        self.grid.wait(self.comm.Irecv(buf, peer, TAG_BASE + chan % TAGS), self.what)
        return buf

    def flush(self) -> None:
        """Complete the sends in flight; the buffers may be taken again."""
        for request, _ in self.pending:
            self.grid.wait(request, self.what)
        self.pending.clear()
        self.k = 0


def exchange(transport: Any, collective: Collective, custom: Custom) -> tuple[int, int]:
    """This rank's GPU on real data, its messages over MPI: (wrong elements, checked)."""
    box = _Mailbox(transport.grid, collective.dtype, f"a message of {custom.source}")
    try:
        return run_gpu(custom, collective, transport.rank, box.send, box.receive, box.flush)
    finally:
        box.flush()
        box.comm.Free()


def sends(link) -> bool:
    """Whether a link of an NPU carries what it sends (not a Switch's down-link into it)."""
    return not link.name.endswith(".down")


def custom_collective(
    transport: Transport, collective: Collective, custom: Custom, policy: str, decision_s: float = 0.0
) -> tuple[CollectiveResult, Engine]:
    """Run the collective by the custom algorithm; every rank returns the same result.

    Returns the result (``wrong`` summed over ranks on the emulator) and an engine with no stages
    (the custom algorithm's steps are not engine stages).
    """
    topology, config = transport.topology, transport.config
    transport.barrier("the barrier before the custom algorithm")
    t0 = time.perf_counter()
    times = time_custom(transport, collective, custom)
    wrong = None
    if transport.checks_data:
        bad, _ = exchange(transport, collective, custom)
        wrong = int(transport.reduce(np.array([bad], np.int64), "sum")[0])
    wall_s = float(transport.reduce([time.perf_counter() - t0], "max")[0])
    engine = Engine(topology, transport, config)
    bounds = collective.chunk_bounds()
    run = CollectiveRun(
        coll_id=0,
        collective=collective,
        orders=np.zeros((len(bounds) - 1, len(topology.dims)), dtype=np.int64),
        bounds=bounds,
        intra=engine.intra_policy(config.intra),
        stages=[],
        issued_ns=0.0,
        chunks_left=0,
        end_ns=times.end_ns,
        wrong=wrong,
    )
    result = summarize(
        run,
        topology,
        transport.cost,
        policy=policy,
        intra=config.intra,
        schedule=custom.label,
        decision_s=decision_s,
        clock="model" if transport.name == "model" else transport.clock.name,
        wrong=wrong,
        wall_s=wall_s,
        network=config.network,
    )
    time_us = result.time_us
    own = physical_links(topology)  # NPU 0's links: the first of every NPU's
    links = link_results([], topology, transport.cost, time_us, times.carried[: len(own)])
    dims = [
        replace(
            d, bytes=int(sum(x.bytes for x, link in zip(links, own) if link.dim == d.dim and sends(link)))
        )
        for d in dim_results([], topology, transport.cost, time_us, (0.0, times.end_ns), links)
    ]
    shown = links if config.network != IDEAL else []  # (`ideal` shows no links, as for built-ins)
    return replace(result, links=shown, dims=dims, dim_bound_us=dim_bound_us(dims, topology)), engine


class DimStages:
    """A custom algorithm as one dim's stages (`algorithms.CustomStage`).

    Its steps (the data's, on the emulator) are its files' ops in rounds
    (`msccl.custom.stage_steps`); a stage's time is its file's programs, every NPU of the dim,
    on the dim's links alone under the run's rule (`timing.programs`), which one NPU's view
    (`timing.symmetric`) takes as the stage's time on the model and on every emulator rank. The
    same run gives the row's figures of the dim (`load`: the bytes NPU 0 sends, what its links
    carry; `results.dim_results`). An all-reduce stage without an allreduce file runs the
    reduce-scatter file and then the all-gather file.

    Under a sharing rule where the dim's stages may meet other stages on its links (`shared`:
    several active stages per dim, or a port the dim shares), a stage is not timed alone: one
    NPU's view runs it as a flow of NPU 0's levels (its messages level by level as its programs
    send them, `msccl.custom.stage_levels`) over NPU 0's links (`flow`), among every other
    stage's, as a built-in stage's steps. That view stands for every NPU where the files are
    rotation-symmetric (every NPU's levels send the same bytes to the peers the same distance
    ahead, as the ring's do; on a Switch the same bytes out and in each level, as
    halving-doubling's and direct's too), and their levels alone must take their programs' time
    (`flow`): one line otherwise. Files whose NPUs' levels differ (`asymmetric`) run on every
    NPU's links instead (`every_npu`: the planner chooses them), each NPU by its own levels
    (`npu_steps`).
    """

    def __init__(self, topology: Topology, d: int, files: dict[str, Custom], config: RunConfig):
        self.alone = topology.with_dims([topology.dims[d]])
        self.topology, self.d = topology, d
        self.files, self.config = files, config
        meets = config.active_per_dim > 1 or topology.port_of(d) is not None  # (other stages on its links)
        self.shared = bool(rule_class(config.network).routes and meets)
        self._flows: dict[tuple, LinkFlow] = {}
        self.cost = config.costs(topology)
        # the dim's links alone ("dim0.up") named as the run's ("dim{d}.up"): NPU 0's come first
        self._names = [f"dim{d}." + link.name.split(".", 1)[1] for link in physical_links(self.alone)]
        self._runs: dict[tuple[str, int, int], tuple[float, float, dict[str, float]]] = {}
        self.every_npu = self.shared and self.asymmetric() is not None
        self._by_level: dict[tuple[str, int], list[list[Step]]] = {}
        self._checked: set[tuple[str, int, int]] = set()  # (op, elements, itemsize) whose levels were checked

    def _parts(self, op: str) -> list[Custom]:
        return [self.files[op]] if op in self.files else [self.files[RS], self.files[AG]]

    def steps(self, op: str, c: int, lo: int, hi: int) -> list[Step]:
        """The rank at coordinate c's steps on ``[lo, hi)``."""
        return [step for custom in self._parts(op) for step in stage_steps(custom, c, lo, hi)]

    def npu_steps(self, op: str, c: int, full_elems: int, itemsize: int) -> list[Step]:
        """The rank at coordinate c's steps: its files' levels in turn (`msccl.custom.stage_levels`).

        Level k is the same level of the same file on every rank, so what a rank sends in its
        step k its peer receives in its own. Every rank's levels alone on the dim's links must
        end when the files' programs alone do (as `flow` checks one NPU's levels), or the stage
        is refused in one line.
        """
        if (op, full_elems, itemsize) not in self._checked:
            self._check_levels(op, full_elems, itemsize)
            self._checked.add((op, full_elems, itemsize))
        return self._levels(op, full_elems)[c]

    def _check_levels(self, op: str, full_elems: int, itemsize: int) -> None:
        """Every rank's levels alone on the dim's own links against its programs there (`npu_steps`)."""
        every = self._levels(op, full_elems)
        idle = next(((c, k) for c, ks in enumerate(every) for k, x in enumerate(ks) if not x.sends), None)
        if idle is not None and self.config.network == STORE_FORWARD:
            raise UsageError(
                f"{self._sources(op)}: NPU {idle[0]} of dim {self.d} sends nothing in level {idle[1]} of "
                "its programs, and --network store-forward does not take a step without transfers; use "
                "--network fair or packet, or --active-chunks-per-dim 1 on a dim that shares no port"
            )
        cost = self.cost(itemsize)
        routes, world = NpuRoutes(self.alone), World(self.alone, self.config, replayable=False)
        end_ns = world.stages_alone(
            {c: routes.custom_stage(c, cost, 0, levels) for c, levels in enumerate(every)}
        )
        self._same_time(op, "every NPU's levels", end_ns, self.time_ns(op, full_elems, itemsize))

    def _same_time(self, op: str, whose: str, steps_ns: float, alone_ns: float, why: str = "") -> None:
        """Refuse in one line a stage whose steps alone do not end when its programs alone do."""
        if abs(steps_ns - alone_ns) > 1e-9 * alone_ns:
            raise UsageError(
                f"{self._sources(op)}: {whose} alone take {steps_ns / 1e3:.2f} us on dim {self.d}, its "
                f"programs {alone_ns / 1e3:.2f} us{why}, so it cannot share the dim's links with other "
                "stages here; use --active-chunks-per-dim 1 on a dim that shares no port, or --network ideal"
            )

    def _sources(self, op: str) -> str:
        """The stage's files, as a refusal names them."""
        return "+".join(custom.source for custom in self._parts(op))

    def _levels(self, op: str, full_elems: int) -> list[list[Step]]:
        """Every rank's steps of `npu_steps`, by coordinate (not checked)."""
        key = (op, full_elems)
        if key not in self._by_level:
            parts = [stage_levels(custom, 0, full_elems) for custom in self._parts(op)]
            self._by_level[key] = [[step for part in parts for step in part[c]] for c in range(len(parts[0]))]
        return self._by_level[key]

    def _run(self, op: str, full_elems: int, itemsize: int) -> tuple[float, float, dict[str, float]]:
        """One stage alone on the dim's links: its time, NPU 0's bytes sent, its links' bytes carried."""
        key = (op, full_elems, itemsize)
        if key not in self._runs:
            cost = self.cost(itemsize)
            end_ns, sent, carried = 0.0, 0.0, dict.fromkeys(self._names, 0.0)
            for custom in self._parts(op):
                times = time_programs(
                    self.alone,
                    self.config.network,
                    self.config,
                    custom.progs,
                    [full_elems * itemsize / custom.algo.nchunksperloop],
                    reduction_ns(cost, self.d),
                    endpoint_delay_ns=cost.endpoint_delay_ns,
                )
                end_ns, sent = end_ns + times.end_ns, sent + times.sent[0]
                for name, nbytes in zip(self._names, times.carried):
                    carried[name] += nbytes
            self._runs[key] = (end_ns, sent, carried)
        return self._runs[key]

    def time_ns(self, op: str, full_elems: int, itemsize: int) -> float:
        """One stage of `full_elems` elements alone on the dim's links."""
        return self._run(op, full_elems, itemsize)[0]

    def load(self, op: str, full_elems: int, itemsize: int) -> tuple[float, dict[str, float]]:
        """What one stage puts on the dim: bytes NPU 0 sends, and what each of its links carries."""
        _, sent, carried = self._run(op, full_elems, itemsize)
        return sent, carried

    def flow(self, op: str, full_elems: int, planner: StepPlanner) -> LinkFlow | None:
        """One stage as NPU 0's steps over its links, and whether they use the same links; None: timed alone.

        Each level of NPU 0 (`msccl.custom.stage_levels`) is a step: a transfer per message,
        over the links one NPU's view gives a message to the peer k ahead
        (`routes.StepPlanner.message_hops`), then the hops' latency and the endpoint delay, as a
        built-in stage's step (the planner's links, rates and cost model of the stage's element
        size).

        A level's messages leave as one step where the programs send each on its own (under
        ``packet``, one step's packets; under ``store-forward``, a step's transfers hop by hop
        together): the flow, alone on the links, must end when the file's programs alone do
        (`time_ns`), or the stage is refused in one line. None also for a file that runs on every
        NPU's links (`every_npu`; one NPU's view of it is an estimate: its time alone).
        """
        if not self.shared or self.every_npu:
            return None
        cost = planner.cost
        key = (op, full_elems, cost.itemsize, cost.endpoint_delay_ns)
        if key not in self._flows:
            self._flows[key] = self._steps(op, full_elems, planner, self.d)
            # the same levels alone on the dim's own links, against its programs there
            flow = self._steps(op, full_elems, step_planner(self.alone, cost), 0)
            solo = Symmetric(self.alone, self.config, self.cost)
            solo.rule.start(Flow(None, *flow))
            alone_ns = self.time_ns(op, full_elems, cost.itemsize)
            self._same_time(op, "its levels", solo.next(math.inf)[0], alone_ns)
        return self._flows[key]

    def _steps(self, op: str, full_elems: int, planner: StepPlanner, d: int) -> LinkFlow:
        """NPU 0's levels of a stage as steps on dim d of the planner's topology (`flow`)."""
        steps = tuple(
            self._round(step.sends, planner, d) for step in self._levels(op, full_elems)[0] if step.sends
        )
        return steps, all(step.usage == steps[0].usage for step in steps)

    def _round(self, sends: tuple[tuple[int, int, int], ...], planner: StepPlanner, d: int) -> LinkStep:
        """A level's messages from coordinate 0 as one step on NPU 0's links of dim d (`flow`)."""
        dim = planner.topology.dims[d]
        transfers, latency_ns = [], 0.0
        for peer, start, stop in sends:
            hops, n_hops = planner.message_hops(d, peer % dim.npus)
            transfers.append(Transfer(float((stop - start) * planner.cost.itemsize), hops))
            latency_ns = max(latency_ns, n_hops * dim.latency_ns)
        step = LinkStep(tuple(transfers), latency_ns + planner.cost.endpoint_delay_ns)
        return rated(step, planner.capacity)

    def asymmetric(self) -> int | None:
        """An NPU whose levels differ from NPU 0's (one NPU's view cannot stand for the file), or None."""
        dim = self.topology.dims[self.d]
        p, switch = dim.npus, dim.kind == "Switch"  # (on a Switch every peer is up, then down)

        def ahead(c: int, peers) -> list[tuple[int, int]]:
            return sorted((0 if switch else (q - c) % p, b - a) for q, a, b in peers)

        for custom in self.files.values():
            n = custom.algo.nchunksperloop
            levels = stage_levels(custom, 0, n)
            shapes = [
                [(ahead(c, s.sends), ahead(c, s.recvs) if switch else []) for s in levels[c]]
                for c in range(p)
            ]
            bad = next((c for c in range(1, p) if shapes[c] != shapes[0]), None)
            if bad is not None:
                return bad
        return None


def dim_stages(
    topology: Topology, config: RunConfig, collective: Collective, prove: bool
) -> AbstractContextManager[None]:
    """While held, the dims that name custom files run their stages by them (`DimStages`).

    The MPI transport asks `algorithms.plan` for a dim's steps by its built-in algorithm and size,
    so two dims of that one (algorithm, size) must not differ in custom files (one line).
    """
    stages: dict[tuple[str, int], DimStages] = {}
    files = dim_algorithms(topology, collective, prove)
    if files and (config.endpoint.ace or config.clock != "virtual" or config.asymmetric or config.compat):
        raise UsageError(
            "a dim's custom stages run on the virtual clock, with NPUs alike, without --ace and --compat"
        )
    for d, dim_files in files.items():
        dim = topology.dims[d]
        same = [e for e, x in enumerate(topology.dims) if (x.algorithm, x.npus) == (dim.algorithm, dim.npus)]
        other = next((e for e in same if topology.dims[e].custom != dim.custom), None)
        if other is not None:
            raise UsageError(
                f"dim {d} runs {dim.custom} and dim {other} of the same size and built-in algorithm "
                f"({dim.algorithm}) does not; give dim {other} the same --algorithm or another built-in one"
            )
        stage = DimStages(topology, d, dim_files, config)
        stages[dim.custom, dim.npus] = stages[dim.algorithm, dim.npus] = stage
    return custom_stages(stages)
