"""The model of per-rank graphs whose ranks wait for each other: one engine per rank, in lock step.

The model replays one NPU and takes every collective as symmetric. Point-to-point messages are
not: a pipeline stage's receive ends when its peer, another stage, has sent. `run_linked` runs
rank 0 and every rank it exchanges messages with, transitively (one per pipeline stage for a
generated LLM, whose stages' ranks are symmetric), each on its own engine and model transport,
as greenlets in this one thread (`timing.greenlets.Greenlets`) that decide as the emulator's ranks
do: a message ends at ``max(send issue, receive issue) + cost`` once both issues are known, and a
rank waits for its peer's issue whenever the message could end before its next event
(`mpi.transport.MpiTransport.wait_next`'s rule). So the same virtual times come out as on the
emulator, whatever order the ranks take turns in. A waiting rank yields to the next ready one and
is woken when its peer posts an issue it waits for (no threads: they handed off at the GIL's
switch interval). A schedule in which every rank waits is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..collectives import Collective
from ..config import RunConfig
from ..engine import Engine, MessageRun, StageRun
from ..errors import UsageError
from ..model import ModelTransport
from ..policies import Schedule
from ..progress import Progress
from ..timing.greenlets import Greenlets, matched
from ..timing.symmetric import Symmetric
from ..topology import Topology
from ..workloads.chakra import GraphReplay, Plan


class _Exchange(Greenlets):
    """The linked ranks as greenlets in this one thread, and the issue times of every message side.

    Args:
        topology: the network.
        config: the run settings.
        ranks: the linked ranks (rank 0 and its peers, transitively).
    """

    def __init__(self, topology: Topology, config: RunConfig, ranks: Sequence[int]):
        super().__init__(max(ranks) + 1, sorted(ranks))
        self.topology, self.config = topology, config
        self.issued: dict[tuple, float] = {}
        self.waiting: set[int] = set()  # ranks waiting for a peer's issue

    def transport(self, rank: int) -> LinkedTransport:
        """Rank `rank`'s model transport."""
        return LinkedTransport(self.topology, self.config, rank, self)

    def post(self, key: tuple, t_ns: float) -> None:
        """Post one message side's issue, ``((src, dst, tag), k, send)``; wake its peer if it waits."""
        self.issued[key] = t_ns
        (src, dst, _), _, send = key
        peer = dst if send else src
        if peer in self.waiting:
            self.waiting.discard(peer)
            self.ready.append(peer)

    def block(self, rank: int) -> None:
        """Wait until a peer of `rank` posts an issue it waits for."""
        self.waiting.add(rank)
        self._yield()

    def _stalled(self) -> str:
        """Nothing left to run: every rank finished (empty), or those left wait for each other (refused)."""
        if self.waiting:
            ranks = ", ".join(map(str, sorted(self.waiting)))
            raise UsageError(f"the graph deadlocks: ranks {ranks} each wait for a message nobody sends yet")
        return ""


class LinkedTransport(ModelTransport):
    """The model transport of one rank among several: messages wait for the peer's issue.

    Its stages and its messages end on one event loop, its one-NPU view's (``ideal``): a message's
    place among the ends of its instant is taken when it is issued, as a stage's is when it starts.
    """

    def __init__(self, topology: Topology, config: RunConfig, rank: int, exchange: _Exchange):
        view = Symmetric(topology, config, config.costs(topology))
        super().__init__(topology, config, view)
        self.view = view
        self.rank = self.ranks = rank
        self.issue_ns = config.late_ns(rank)
        self.exchange = exchange
        self._counts: dict[tuple, int] = {}
        self._pending: list[list] = []  # [run, peer key, cost, place in the loop's order]

    def start(self, run: StageRun) -> None:
        """Collectives as the model; a message posts its issue and waits for its peer's."""
        if not isinstance(run, MessageRun):
            self.view.start(run)
            return
        side, k = matched(self.rank, run, self._counts)
        self.exchange.post((side, k, run.send), run.start_ns)
        cost = self.cost(1).p2p_ns(run.path, run.nbytes)
        self._pending.append([run, (side, k, not run.send), cost, self.view.loop.reserve()])

    def _resolve(self) -> float:
        """Messages whose peer has issued get their end; returns the earliest end still unknown."""
        bound = math.inf
        keep = []
        issued = self.exchange.issued
        loop = self.view.loop
        for item in self._pending:
            run, key, cost, seq = item
            peer = issued.get(key)
            if peer is None:
                bound = min(bound, run.start_ns + cost)
                keep.append(item)
            else:
                loop.at(max(run.start_ns, peer) + cost, self.view.ended, run, seq)
        self._pending = keep
        return bound

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The earliest certain batch of ends (stages and messages, in start order), or the horizon."""
        if not self._pending:  # nothing waits for a peer: the answer is this rank's own
            first = self.view.loop.next_ns(self.view.rule)
            return self.view.next(first) if first <= horizon_ns else (horizon_ns, [])
        while True:
            bound = self._resolve()
            first = self.view.loop.next_ns(self.view.rule)
            if first <= horizon_ns and first < bound:
                return self.view.next(first)
            if horizon_ns < first and horizon_ns < bound:
                return horizon_ns, []
            self.exchange.block(self.rank)


def linked_ranks(plans: dict[int, Plan], plan_of) -> list[int]:
    """Rank 0 and every rank it exchanges messages with, transitively (`plan_of(rank)` plans one)."""
    seen, todo = [0], [0]
    while todo:
        rank = todo.pop()
        plan = plans.get(rank)
        if plan is None:
            plan = plans[rank] = plan_of(rank)
        for op in plan.ops:
            if op.peer >= 0 and op.peer not in seen:
                seen.append(op.peer)
                todo.append(op.peer)
    return sorted(seen)


def run_linked(
    topology: Topology,
    config: RunConfig,
    plans: dict[int, Plan],
    schedules: dict[Collective, Schedule],
    progress: Progress | None = None,
) -> dict[int, Engine]:
    """Every plan on its own engine, the ranks in lock step; returns each rank's finished engine.

    `progress` is told the nodes each rank has finished (all from this one thread).
    """
    world = _Exchange(topology, config, list(plans))

    def work(transport: LinkedTransport) -> Engine:
        engine = Engine(topology, transport, config)
        replay = GraphReplay(plans[transport.rank], schedules, progress=progress)
        engine.process(replay.process(engine))
        engine.run()
        return engine

    results = world.run(work)
    return {rank: results[rank] for rank in sorted(plans)}


def slowest(engines: Sequence[Engine]) -> float:
    """The last rank's end, in ns."""
    return max(e.now_ns for e in engines)
