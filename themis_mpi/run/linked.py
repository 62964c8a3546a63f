"""The model of per-rank graphs whose ranks wait for each other: one engine per rank, in lock step.

The model replays one NPU and takes every collective as symmetric. Point-to-point messages are
not: a pipeline stage's receive ends when its peer, another stage, has sent. `run_linked` runs
rank 0 and every rank it exchanges messages with, transitively (one per pipeline stage for a
generated LLM, whose stages' ranks are symmetric), each on its own engine and model transport,
in threads that decide as the emulator's ranks do: a message ends at ``max(send issue, receive
issue) + cost`` once both issues are known, and a rank waits for its peer's issue whenever the
message could end before its next event (`mpi.transport.MpiTransport.wait_next`'s rule). So the
same virtual times come out as on the emulator. A schedule in which every rank waits is refused.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from ..collectives import Collective
from ..config import RunConfig
from ..engine import Engine, MessageRun, StageRun
from ..errors import UsageError
from ..model import ModelTransport
from ..policies import Schedule
from ..progress import Progress
from ..timing.symmetric import Symmetric
from ..topology import Topology
from ..workloads.chakra import GraphReplay, Plan


class _Exchange:
    """Issue times of every message side, shared by the ranks' threads."""

    def __init__(self, ranks: int):
        self.cond = threading.Condition()
        self.issued: dict[tuple, float] = {}
        self.version = 0
        self.alive = ranks
        self.blocked: dict[int, int] = {}  # rank -> version it saw when it started waiting
        self.error: BaseException | None = None

    def post(self, key: tuple, t_ns: float) -> None:
        with self.cond:
            self.issued[key] = t_ns
            self.version += 1
            self.cond.notify_all()

    def leave(self) -> None:
        with self.cond:
            self.alive -= 1
            self.version += 1
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()


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
        src, dst = (self.rank, run.peer) if run.send else (run.peer, self.rank)
        side = (src, dst, run.tag)
        k = self._counts.get((side, run.send), 0)
        self._counts[(side, run.send)] = k + 1
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
        if not self._pending:  # nothing waits for a peer: the answer is this rank's own (no lock)
            first = self.view.loop.next_ns(self.view.rule)
            return self.view.next(first) if first <= horizon_ns else (horizon_ns, [])
        ex = self.exchange
        with ex.cond:
            while True:
                if ex.error is not None:
                    raise ex.error
                bound = self._resolve()
                first = self.view.loop.next_ns(self.view.rule)
                if first <= horizon_ns and first < bound:
                    return self.view.next(first)
                if horizon_ns < first and horizon_ns < bound:
                    return horizon_ns, []
                ex.blocked[self.rank] = ex.version
                if len(ex.blocked) == ex.alive and all(v == ex.version for v in ex.blocked.values()):
                    ranks = ", ".join(map(str, sorted(ex.blocked)))
                    ex.error = UsageError(
                        f"the graph deadlocks: ranks {ranks} each wait for a message nobody sends yet"
                    )
                    ex.cond.notify_all()
                    raise ex.error
                ex.cond.wait(timeout=1.0)
                ex.blocked.pop(self.rank, None)


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

    `progress` is told the nodes each rank has finished (from each rank's thread).
    """
    exchange = _Exchange(len(plans))
    engines: dict[int, Engine] = {}

    def work(rank: int) -> None:
        try:
            engine = Engine(topology, LinkedTransport(topology, config, rank, exchange), config)
            engines[rank] = engine
            replay = GraphReplay(plans[rank], schedules, progress=progress)
            engine.process(replay.process(engine))
            engine.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            exchange.fail(exc)
        finally:
            exchange.leave()

    threads = [threading.Thread(target=work, args=(rank,), daemon=True) for rank in sorted(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if exchange.error is not None:
        raise exchange.error
    return engines


def slowest(engines: Sequence[Engine]) -> float:
    """The last rank's end, in ns."""
    return max(e.now_ns for e in engines)
