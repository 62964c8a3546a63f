"""The per-NPU scheduling engine, shared by the MPI emulator and the model.

Every chunk is a small state machine walking its stage list. Each dim has one queue of waiting
stages and ``active_chunks_per_dim`` slots; when a slot frees, the head of the queue starts. The
intra-dim policy decides where a newly queued stage goes (`fifo` or `scf`, THEMIS.md).

Time is virtual, in ns. The engine never computes how long a stage takes: it hands started
stages to a transport and asks it for the next batch of completions. The model transport
answers from the cost model; the MPI transport answers from the timestamps carried by the
messages that really flowed. Completions at the same instant are applied together (in dim
order) before any stage starts, so the outcome never depends on the order MPI delivers them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from .collectives import Collective, Stage, chunk_stages
from .errors import UsageError
from .topology import Topology

INTRA_POLICIES = ("fifo", "scf")


@dataclass
class StageRun:
    """One stage's life on this NPU: queued, started, ended (virtual ns; wall s)."""

    stage: Stage
    queued_ns: float
    start_ns: float = math.nan
    end_ns: float = math.nan
    slot: int = -1
    dim_seq: int = -1
    wall_start_s: float = math.nan
    wall_end_s: float = math.nan


@dataclass
class CollectiveRun:
    """A collective in flight: its stage lists and when it was issued and finished."""

    coll_id: int
    collective: Collective
    orders: object
    stages: list[list[Stage]]
    issued_ns: float
    chunks_left: int
    end_ns: float = math.nan
    on_done: object = None
    runs: list[StageRun] = field(default_factory=list)


class Engine:
    """Queues, slots and the event loop of one NPU.

    Args:
        topology: the network.
        intra: intra-dim policy, fifo or scf.
        active_per_dim: stages each dim runs at once.
    """

    def __init__(self, topology: Topology, intra: str = "fifo", active_per_dim: int = 1):
        if intra not in INTRA_POLICIES:
            raise UsageError(f"unknown intra-dim policy {intra!r}; use fifo or scf")
        if active_per_dim < 1:
            raise UsageError(f"active chunks per dim must be >= 1, got {active_per_dim}")
        self.topology = topology
        self.intra = intra
        self.active_per_dim = active_per_dim
        n = len(topology.dims)
        self.queues: list[list[StageRun]] = [[] for _ in range(n)]
        self.slots: list[list[StageRun | None]] = [[None] * active_per_dim for _ in range(n)]
        self.started = [0] * n
        self.now_ns = 0.0
        self.collectives: list[CollectiveRun] = []
        self.records: list[StageRun] = []
        self._timers: list[tuple[float, int, object]] = []
        self._timer_seq = 0
        self._running = 0
        self.t0_wall_s = math.nan  # wall time of issue, set by the MPI runner

    # --- issuing -------------------------------------------------------------------------------

    def issue(self, collective: Collective, orders, on_done=None) -> CollectiveRun:
        """Issue a collective now: every chunk's first stage joins its dim's queue, in order."""
        coll_id = len(self.collectives)
        bounds = collective.chunk_bounds()
        stages = [
            chunk_stages(self.topology, collective, coll_id, k, int(bounds[k + 1] - bounds[k]),
                         orders[k])
            for k in range(collective.n_chunks)
        ]
        run = CollectiveRun(coll_id, collective, orders, stages, self.now_ns,
                            sum(1 for s in stages if s), on_done=on_done)
        self.collectives.append(run)
        for chunk_list in stages:
            if chunk_list:
                self._enqueue(chunk_list[0])
        if run.chunks_left == 0:
            self._collective_done(run)
        return run

    def at(self, t_ns: float, callback) -> None:
        """Call `callback(engine)` at virtual time t_ns (compute phases of a workload)."""
        heapq.heappush(self._timers, (t_ns, self._timer_seq, callback))
        self._timer_seq += 1

    # --- queues --------------------------------------------------------------------------------

    def _enqueue(self, stage: Stage) -> None:
        run = StageRun(stage, self.now_ns)
        queue = self.queues[stage.dim]
        if self.intra == "fifo" or stage.index == stage.n_stages - 2:
            queue.append(run)  # SCF sends a chunk's second-to-last stage to the tail
            return
        pos = 0
        while pos < len(queue) and queue[pos].stage.key_bytes < stage.key_bytes:
            pos += 1
        queue.insert(pos, run)

    def _start_free(self, transport) -> None:
        for d, queue in enumerate(self.queues):
            slots = self.slots[d]
            while queue and None in slots:
                run = queue.pop(0)
                run.slot = slots.index(None)
                run.dim_seq = self.started[d]
                run.start_ns = self.now_ns
                self.started[d] += 1
                slots[run.slot] = run
                self._running += 1
                transport.start(run)

    def _finish(self, run: StageRun) -> None:
        stage = run.stage
        self.slots[stage.dim][run.slot] = None
        self._running -= 1
        self.records.append(run)
        coll = self.collectives[stage.coll]
        coll.runs.append(run)
        chunk_list = coll.stages[stage.chunk]
        if stage.index + 1 < len(chunk_list):
            self._enqueue(chunk_list[stage.index + 1])
            return
        coll.chunks_left -= 1
        if coll.chunks_left == 0:
            self._collective_done(coll)

    def _collective_done(self, coll: CollectiveRun) -> None:
        coll.end_ns = self.now_ns
        if coll.on_done is not None:
            coll.on_done(self, coll)

    # --- the event loop ------------------------------------------------------------------------

    def run(self, transport) -> None:
        """Run until every issued stage and timer is done.

        The transport provides ``start(run)`` and ``wait_next(horizon_ns)``; the latter returns
        ``(t_ns, runs)``, the earliest completions at or before the horizon, or
        ``(horizon_ns, [])`` when none comes first.
        """
        while True:
            self._start_free(transport)
            if not self._running and not self._timers:
                return
            horizon = self._timers[0][0] if self._timers else math.inf
            t_ns, done = transport.wait_next(horizon)
            self.now_ns = t_ns
            if done:
                for run in sorted(done, key=lambda r: (r.stage.dim, r.slot)):
                    run.end_ns = t_ns
                    self._finish(run)
                continue
            while self._timers and self._timers[0][0] <= t_ns:
                _, _, callback = heapq.heappop(self._timers)
                callback(self)
