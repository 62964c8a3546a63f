"""The per-NPU scheduling engine, shared by the MPI emulator and the model.

Every chunk is a small state machine walking its stage list. Each dim has one queue of waiting
stages and ``active_per_dim`` slots; when a slot frees, the head of the queue starts. The
intra-dim policy of the stage's collective (`policies.IntraPolicy`: fifo, scf, rg, lrpf or a
plugin) decides where a newly queued stage goes among the waiting ones.

Time is virtual, in ns. The engine never computes how long a stage takes: it hands started
stages to a `Transport` and asks it for the next batch of completions. The model transport
answers from the cost model; the MPI transport answers from the timestamps carried by the
messages that really flowed. Completions at the same instant are applied together (in dim
order, then slot) before any stage starts, so the outcome never depends on the order MPI
delivers them. A collective's chunks are issued one by one: a chunk whose first dim has a free
slot starts before the next chunk is queued, so chunk 0 goes first under every queue policy.

With ``compat="astra-sim-1.0"`` the engine follows ASTRA-sim 1.0's ``Sys.cc`` in two more ways:
completions at the same instant are processed one at a time in `CostModel.finish_order_key`
order (ASTRA-sim runs the events of one tick in registration order), each starting the stages it
frees (``notify_stream_removed``, then ``notify_stream_added``) before the next is processed; and
an AR stage queues as in a FIFO queue, which puts a later collective's stages ahead of the waiting
stages of earlier ones (``insert_stream`` with the ``LIFO`` priority of ``get_priority``).

Between collectives, the communication scheduler (`policies.scheduler`, ``--comm-scheduler``)
ranks each collective when it is issued: a dim's queue is kept in that order (the intra-dim policy
places a stage among those of equal priority), and a gated scheduler (bytescheduler's credit) may
hold the head while its slots are free. The default, fifo, ranks nothing.

Workloads are processes, as in SimPy: generators that ``yield engine.timeout(ns)`` for compute
and ``yield engine.issue(collective, schedule)`` to wait for a collective (or keep the returned
`CollectiveRun` and yield it later, to overlap).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .collectives import ChunkStages, Collective, Stage, chunk_plan, element_bounds, priced_chunks
from .config import RunConfig
from .cost import AR, ASTRA_SIM_2, P2P, CostModel, is_astra
from .errors import UsageError, shown
from .nccl import CALL
from .policies import (
    UNKNOWN,
    IntraPolicy,
    Need,
    PolicyError,
    QueueView,
    Schedule,
    default_scheduler,
    make_intra,
    make_scheduler,
    origin,
    scheduler_origin,
)
from .topology import Topology
from .watchdog import watch

# --- clocks ------------------------------------------------------------------------------------


def later(a: Any, b: Any) -> Any:
    """The later of two times; elementwise for times that hold one value per NPU (`timing.vectors`)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


def order_key(t_ns: Any) -> float:
    """A time's place in the timer queue: itself, or the earliest NPU's for a per-NPU vector."""
    return float(t_ns.min()) if isinstance(t_ns, np.ndarray) else t_ns


class VirtualClock:
    """Emulated time only: every deadline counts as reached at once (SimPy's `Environment`)."""

    name = "virtual"
    scale = 1.0

    def start(self) -> None:
        """Nothing to start."""

    def now_ns(self) -> float:
        """Virtual time never waits, so it is always 'after' every deadline."""
        return math.inf

    def seconds_until(self, t_ns: float) -> float:
        """No real time to wait."""
        return 0.0


class WallClock:
    """Emulated time held in real time, `scale` wall seconds per emulated second.

    SimPy's `RealtimeEnvironment`: decisions stay those of the virtual clock; a step or a compute
    delay only ends once its emulated deadline has passed in real time.
    """

    name = "wall"

    def __init__(self, scale: float = 1.0):
        if not (math.isfinite(scale) and scale > 0):
            raise UsageError(f"time scale must be a finite number > 0, got {scale}")
        self.scale = scale
        self.t0_s = time.perf_counter()

    def start(self) -> None:
        """Emulated time 0 is now."""
        self.t0_s = time.perf_counter()

    def now_ns(self) -> float:
        """Emulated ns since `start`."""
        return (time.perf_counter() - self.t0_s) / self.scale * 1e9

    def seconds_until(self, t_ns: float) -> float:
        """Real seconds until emulated time t_ns (<= 0 once it has passed)."""
        return (t_ns - self.now_ns()) * 1e-9 * self.scale


Clock = VirtualClock | WallClock


def make_clock(name: str, scale: float = 1.0) -> Clock:
    """`virtual` or `wall` (with its scale)."""
    if name == "virtual":
        return VirtualClock()
    if name == "wall":
        return WallClock(scale)
    raise UsageError(f"unknown clock {name!r}; use virtual or wall")


# --- events and processes ----------------------------------------------------------------------


NEVER_NS = -math.inf  # (one float for every event not yet triggered)


class Event:
    """Something a process can wait for; it triggers once, with an optional value."""

    __slots__ = ("triggered", "value", "time_ns", "_callbacks")  # (a graph replay holds one per node)

    def __init__(self) -> None:
        self.triggered = False
        self.value: Any = None
        self.time_ns = NEVER_NS  # when it triggered, where the engine says (`Engine.agree`)
        self._callbacks: list[Callable[[Event], None]] | tuple[()] = []

    def succeed(self, value: Any = None, time_ns: float = -math.inf) -> None:
        """Trigger now and run the waiters, in the order they came."""
        self.triggered, self.value, self.time_ns = True, value, time_ns
        callbacks, self._callbacks = self._callbacks, ()  # (no list kept: a triggered event calls at once)
        for callback in callbacks:
            callback(self)

    def add_callback(self, callback: Callable[[Event], None]) -> None:
        """Run `callback(event)` when triggered (at once if it already is)."""
        if self.triggered:
            callback(self)
        else:
            self._callbacks.append(callback)  # type: ignore[union-attr]  # (a list until triggered)


ProcessGenerator = Generator[Event, Any, Any]


class Process(Event):
    """Drives a generator: each yielded event resumes it when triggered; it triggers on return.

    Under an agreed order (`Engine.agree`) events come as they are known, not in time order, so
    a process keeps its own clock: it resumes at the later of its own time and its event's, and
    the engine's `now_ns` is that time while the process runs.
    """

    def __init__(self, generator: ProcessGenerator, engine: Engine | None = None):
        super().__init__()
        self._generator = generator
        self._engine = engine
        self._now_ns = -math.inf if engine is None else engine.now_ns
        self._resume(None)

    def _resume(self, event: Event | None) -> None:
        value = None if event is None else event.value
        engine = self._engine if self._engine is not None and self._engine.agreed is not None else None
        if engine is not None and event is not None:
            engine.now_ns = self._now_ns = later(self._now_ns, event.time_ns)
        while True:  # a loop, not recursion: chains of triggered events can be long
            try:
                target = self._generator.send(value)
            except StopIteration as stop:
                self.succeed(stop.value, self._now_ns)
                return
            if not target.triggered:
                if engine is not None:
                    self._now_ns = engine.now_ns
                target.add_callback(self._resume)
                return
            if engine is not None:
                engine.now_ns = self._now_ns = later(engine.now_ns, target.time_ns)
            value = target.value


# --- runs --------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class StageRun:
    """One stage's life on this NPU: queued, started, ended (virtual ns; wall s); equal only to itself."""

    stage: Stage
    queued_ns: float
    start_ns: float = math.nan
    end_ns: float = math.nan
    slot: int = -1
    dim_seq: int = -1
    start_seq: int = -1
    wall_start_s: float = math.nan
    wall_end_s: float = math.nan
    mem_shared: bool = False  # a compute phase was running when it started (`cost.Endpoint`)


@dataclass(eq=False)
class MessageRun(StageRun):
    """A point-to-point message on this NPU, a send or a receive (`Engine.message`).

    It takes no dim slot and shares no queue: it starts when issued and ends, on both NPUs, at
    ``max(send issue, receive issue) + CostModel.p2p_ns(path, nbytes)``. ``done`` triggers then.

    Attributes:
        peer: the other NPU's rank.
        send: True on the sender.
        nbytes: message bytes.
        tag: the trace's tag (sends and receives of one pair and tag match in issue order).
        path: (dim, hops) of every dim the message crosses, in dim order.
        wrong: bytes received that differ from the closed form (receiver, emulator only).
        done: triggers when the message is complete on this NPU.
    """

    peer: int = -1
    send: bool = True
    nbytes: int = 0
    tag: int = 0
    path: tuple[tuple[int, int], ...] = ()
    wrong: int | None = None
    done: Event = field(default_factory=Event)


@dataclass(eq=False)
class CollectiveRun(Event):
    """A collective in flight; as an `Event` it triggers when its last chunk is done.

    Attributes:
        coll_id: issue order on this engine.
        collective: what was issued.
        orders: every chunk's dim order, shape (chunks, n_dims).
        bounds: element bounds of the chunks, shape (chunks + 1,) (what the data moves).
        intra: the intra-dim policy its stages queue by.
        fuse_last: an all-reduce's last dim runs as one AR stage.
        stages: every chunk's stage list (the engine's: `ChunkStages`).
        issued_ns: virtual issue time.
        chunks_left: chunks not finished yet.
        check: whether the transport checks the result against the closed form.
        end_ns: virtual end time.
        wrong: wrong elements on this NPU (None when not checked).
        runs: the stage runs, in completion order.
        priority: its communication scheduler's priority (lower goes first; `policies.scheduler`).
        schedule_bounds: the schedule's bounds as broadcast (priced words for a policy that sizes
            its chunks, `collectives.element_bounds`; else `bounds`).
    """

    coll_id: int
    collective: Collective
    orders: np.ndarray
    bounds: np.ndarray
    intra: IntraPolicy
    stages: list[Sequence[Stage]]
    issued_ns: float
    chunks_left: int
    check: bool = True
    fuse_last: int = False
    end_ns: float = math.nan
    wrong: int | None = None
    runs: list[StageRun] = field(default_factory=list)
    priority: float = 0.0
    schedule_bounds: np.ndarray | None = None
    last_end_ns: Any = -math.inf  # under an agreed order: the latest chunk end so far

    def __post_init__(self) -> None:
        Event.__init__(self)


class Transport(Protocol):
    """The world that moves the data: the model (one process) or MPI (one rank per NPU).

    The engine uses `open`, `start`, `wait_next` and `close`; the driver uses the rest: the
    control calls through which rank 0 coordinates (small messages only) and the settings.
    """

    @property
    def name(self) -> str:
        """Model or mpi."""
        ...

    @property
    def checks_data(self) -> bool:
        """Whether `close` checks results (sets ``run.wrong``)."""
        ...

    @property
    def topology(self) -> Topology:
        """The network."""
        ...

    @property
    def config(self) -> RunConfig:
        """The run settings."""
        ...

    @property
    def clock(self) -> Clock:
        """Virtual, or wall with its scale."""
        ...

    @property
    def rank(self) -> int:
        """This NPU's rank (0 in the model)."""
        ...

    check_s: float  # wall seconds spent checking results since the run started (not run time)

    @property
    def issue_ns(self) -> Any:
        """When this NPU starts its work (a late NPU later); a vector of every NPU's at once."""
        ...

    @property
    def ranks(self) -> Any:
        """This NPU's rank, or every NPU's (a vector transport times them all at once)."""
        ...

    @property
    def link_bytes(self) -> list[float] | None:
        """Bytes each of this NPU's links carried, where its timing knows them (every NPU's links)."""
        ...

    @property
    def cost(self) -> Callable[[int], CostModel]:
        """The cost model of one element size (`cost.CostModels`)."""
        ...

    def bcast(self, array: np.ndarray, what: str, patient: bool = False) -> np.ndarray:
        """Rank 0's array on every rank, in place (`patient`: rank 0 may take long, `serving`)."""
        ...

    def serving(self) -> AbstractContextManager[None]:
        """While this rank computes on its own, the others still hear that it is alive."""
        ...

    def barrier(self, what: str) -> None:
        """Wait until every rank has arrived."""

    def reduce(self, values: Any, op: str, what: str = ...) -> np.ndarray:
        """Element-wise sum, max or min over ranks, on every rank."""
        ...

    def open(self, run: CollectiveRun) -> None:
        """A collective was issued: prepare its data before any of its stages starts."""

    def start(self, run: StageRun) -> None:
        """A stage started at ``run.start_ns``."""

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The earliest completions at or before the horizon, or ``(horizon_ns, [])``.

        `certain`: no running stage may still end earlier. Without it (an agreed order, where
        start times follow from the data alone) any known completions will do.
        """
        ...

    def close(self, run: CollectiveRun) -> None:
        """A collective finished: check its data (set ``run.wrong``) and release it."""

    def span_ns(self, engine: Engine) -> tuple[float, float]:
        """Once the run is over: its first issue and last end over every NPU it spans.

        Reduced over the ranks (or a world's NPUs); a vector transport takes them from its
        vectors and leaves NPU 0's view of the times in the engine.
        """
        ...

    def replaying(self, timer: Any) -> Transport:
        """This transport's twin, timed by a recorded run of every NPU (`timing.replay.Replay`)."""
        ...


def reduced_span(reduce: Callable[..., np.ndarray], engine: Engine) -> tuple[float, float]:
    """This NPU's first issue and last event, reduced over every NPU (`Transport.span_ns`)."""
    collectives = engine.collectives
    if isinstance(collectives, InFlight):  # (its finished collectives are not kept: their first issue is)
        first_ns = collectives.first_issued_ns
    else:
        first_ns = min((c.issued_ns for c in collectives), default=0.0)
    ends = [r.end_ns for r in engine.records]
    last_ns = max([engine.now_ns, engine.last_timer_ns, engine.last_end_ns] + ends)
    first = float(reduce([first_ns], "min", "the run's first issue")[0])
    return first, float(reduce([last_ns], "max", "the run's last end")[0])


class InFlight:
    """An engine's collectives where nobody reads its records: those in flight, by issue order.

    As the list it stands for: its length is how many were issued (the next one's id), an id
    in flight indexes its run, iterating gives those in flight; the first issue is kept, for
    `reduced_span`. A finished collective is dropped (`Engine._collective_done`), so a long run
    of every NPU's engines holds no run per NPU and collective.
    """

    def __init__(self) -> None:
        self.live: dict[int, CollectiveRun] = {}
        self.issued = 0
        self.first_issued_ns = 0.0

    def append(self, run: CollectiveRun) -> None:
        """A collective issued."""
        self.first_issued_ns = run.issued_ns if not self.issued else min(self.first_issued_ns, run.issued_ns)
        self.live[self.issued] = run
        self.issued += 1

    def drop(self, run: CollectiveRun) -> None:
        """A collective finished."""
        del self.live[run.coll_id]

    def __len__(self) -> int:
        return self.issued

    def __getitem__(self, coll_id: int) -> CollectiveRun:
        return self.live[coll_id]

    def __iter__(self) -> Iterator[CollectiveRun]:
        return iter(list(self.live.values()))


# --- the engine --------------------------------------------------------------------------------


class Engine:
    """Queues, slots and the event loop of one NPU.

    Args:
        topology: the network.
        transport: who runs the started stages.
        config: the run's settings: the default intra-dim policy (a collective's schedule may
            bring its own), stages each dim runs at once, and compat ("astra-sim-1.0": ASTRA-sim's
            tie and priority rules, see the module doc).
    """

    def __init__(self, topology: Topology, transport: Transport, config: RunConfig):
        self.topology = topology
        self.transport = transport
        self.intra = config.intra
        self._intra: dict[str, IntraPolicy] = {}
        self._watched_intra: dict[int, float] = {}  # plugin policies on the model: id -> --timeout-s
        self.intra_policy(config.intra)
        self.compat = config.compat
        self.active_per_dim = active_per_dim = config.active_per_dim
        self.astra = is_astra(config.compat)
        n = len(topology.dims)
        self.queues: list[list[StageRun]] = [[] for _ in range(n)]
        # what an intra-dim policy sees of each dim: the waiting stages (kept beside `queues`, so
        # that queueing costs no copy) and the count of running ones
        # (ASTRA-sim 2.x's FIFO between collectives is the plain tail, its LIFO the compat rule)
        scheduler = default_scheduler(config)
        self.scheduler = make_scheduler(scheduler)
        # a plugin scheduler runs on every rank at once, so no rank's watchdog sees it hang: watch it
        plugin = scheduler_origin(scheduler) != "builtin"
        self._scheduler_watch_s = config.timeout_s if plugin else None
        self._scheduler_call(self.scheduler.setup, config)
        self._ranked, self._gated = bool(self.scheduler.ranked), bool(self.scheduler.gated)
        view_compat = config.compat if scheduler == "lifo" else ""
        self.views = [QueueView([], 0, view_compat) for _ in range(n)]
        # ASTRA-sim 2.x's workload layer: one collective in flight per NPU, the next issued after
        self.one_at_a_time = config.compat == ASTRA_SIM_2 and not config.compat_concurrent
        self._deferred: list[CollectiveRun] = []
        self._in_flight = 0
        self.slots: list[list[StageRun | None]] = [[None] * active_per_dim for _ in range(n)]
        self._fifo = self.intra_policy("fifo")
        self._plans: dict[tuple, list[tuple]] = {}  # chunk plans by shape and order
        self.started = [0] * n
        self.now_ns: Any = 0.0  # one time per NPU (a numpy vector) under `timing.vectors.NpuVectors`
        self.records: list[StageRun] = []
        # an NPU of a world whose result nobody reads keeps no records (`world.World`'s `keep`):
        # a long run's memory; its latest stage end stands in for them (`reduced_span`), and its
        # collectives in flight for the list of every one issued (`InFlight`)
        self.keeps_records: bool = getattr(transport, "records_kept", True)
        self.collectives: list[CollectiveRun] | InFlight = [] if self.keeps_records else InFlight()
        self.last_end_ns: Any = -math.inf  # (without records only)
        self.messages: list[MessageRun] = []
        self._timers: list[tuple[float, int, Event, Any]] = []  # (order key, seq, event, time)
        self._timer_seq = 0
        self._running = 0
        self._claimed: list[StageRun] = []  # started, not yet handed to the transport
        self._n_started = 0
        self.computing = 0  # compute phases running now (training replay; `cost.Endpoint`)
        self.t0_wall_s = math.nan  # perf_counter() at the first issue (stage wall times count from it)
        # per dim, the (collective, chunk, stage index) every NPU starts there, in that order (`agree`)
        self.agreed: list[list[tuple[int, int, int]]] | None = None
        self._agreed_waiting: list[dict[tuple[int, int, int], StageRun]] = [{} for _ in range(n)]
        self.dim_free_ns = [0.0] * n  # under an agreed order: when each dim's last stage ended
        self.last_timer_ns: Any = -math.inf  # under an agreed order: the latest timer that fired

    # --- the process API -----------------------------------------------------------------------

    def issue(
        self, collective: Collective, schedule: Schedule, check: bool = True, need: Need = UNKNOWN
    ) -> CollectiveRun:
        """Issue a collective now under its schedule, chunk by chunk (a chunk whose first dim is free starts).

        Args:
            collective: what to issue.
            schedule: its chunk bounds, every chunk's dim order, the baseline's fused last dim and
                its intra-dim policy ("" = the engine's).
            check: let the transport check the result against the closed form.
            need: when the workload needs its result (the communication scheduler ranks by it).
        """
        coll_id = len(self.collectives)
        bounds = np.asarray(schedule.bounds, dtype=np.int64)
        orders = np.asarray(schedule.orders, dtype=np.int32)
        fuse_last = schedule.fuse_last
        unit, sizes, whole = priced_chunks(collective, bounds)  # timing prices bytes, the data moves elements
        given, bounds = bounds, element_bounds(collective, bounds)  # (a sized stream's words, onto elements)
        rows = orders.tolist()
        stages: list[Sequence[Stage]] = []
        for k, size in enumerate(sizes):
            key = (collective.op, collective.dims, size, tuple(rows[k]), fuse_last)
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = chunk_plan(self.topology, collective, size, rows[k], fuse_last)
            call = ((CALL, whole, k == 0),) if self.topology.flat else ()  # one NCCL call
            stages.append(ChunkStages.of(plan, coll_id, k, unit, call))
        run = CollectiveRun(
            coll_id,
            collective,
            orders,
            bounds,
            self.intra_policy(schedule.intra or self.intra),
            stages,
            self.now_ns,
            sum(1 for s in stages if s),
            check,
            fuse_last,
        )
        run.schedule_bounds = given
        if self._ranked:
            run.priority = self._priority(coll_id, need, collective)
        self.collectives.append(run)
        if self.one_at_a_time and self._in_flight:
            self._deferred.append(run)
            return run
        self._launch(run)
        return run

    def _launch(self, run: CollectiveRun) -> None:
        """Open the collective and queue its chunks (each one whose first dim is free starts)."""
        self._in_flight += 1
        run.issued_ns = self.now_ns
        self.transport.open(run)
        stages = run.stages
        for chunk_list in stages:
            if chunk_list:
                first = chunk_list[0]
                self._enqueue(first)
                self._claim_free((first.dim,))
        if run.chunks_left == 0:
            self._collective_done(run)

    def message(
        self, peer: int, path: tuple[tuple[int, int], ...], nbytes: int, tag: int, send: bool
    ) -> MessageRun:
        """Issue a point-to-point send (or receive) now; yield ``run.done`` to wait for it."""
        dim = path[0][0] if path else 0
        stage = Stage(-1, len(self.messages), 0, 1, dim, P2P, nbytes, nbytes, 1)
        run = MessageRun(
            stage, self.now_ns, self.now_ns, peer=peer, send=send, nbytes=nbytes, tag=tag, path=path
        )
        run.start_seq = self._n_started
        self._n_started += 1
        self.messages.append(run)
        self._running += 1
        self._claimed.append(run)
        return run

    def timeout(self, delay_ns: float) -> Event:
        """An event `delay_ns` from now (always through the timer queue, even for 0)."""
        return self.at(self.now_ns + delay_ns)

    def at(self, t_ns: float) -> Event:
        """An event at virtual time t_ns."""
        event = Event()
        heapq.heappush(self._timers, (order_key(t_ns), self._timer_seq, event, t_ns))
        self._timer_seq += 1
        return event

    def process(self, generator: ProcessGenerator) -> Process:
        """Start a process now; it runs until its first wait before this returns."""
        return Process(generator, self)

    def agree(self, order: list[list[tuple[int, int, int]]]) -> None:
        """Start each dim's stages in this order only, whatever the queue policy put first.

        NPUs that run at different paces (a late NPU) fill their queues in different orders,
        while a dim group's members must run the same stage under the same start number (its
        messages' tag). The order every NPU agrees on is the one a run without the late NPU
        gives (`start_order`): a stage waits, with its slot free, until the stages before it
        in that order have started here.
        """
        self.agreed = order

    def start_order(self) -> list[list[tuple[int, int, int]]]:
        """Per dim, the (collective, chunk, stage index) of every stage started so far, in start order."""
        order: list[list[tuple[int, int, int]]] = [[] for _ in self.topology.dims]
        runs = self.records + [run for run in self.running_stages()]
        for run in sorted(runs, key=lambda r: r.dim_seq):
            s = run.stage
            order[s.dim].append((s.coll, s.chunk, s.index))
        return order

    # --- queues --------------------------------------------------------------------------------

    def _scheduler_call(self, method: Callable[..., Any], *args: Any) -> Any:
        """Call the scheduler; an error (and a plugin's hang, on the model) ends the run in one line."""
        what = f"communication scheduler {self.scheduler.name!r}"
        try:
            if self._scheduler_watch_s is None:
                return method(*args)
            timeout_s = self._scheduler_watch_s
            with watch(timeout_s, f"{what} did not answer within {timeout_s:g} s (--timeout-s)"):
                return method(*args)
        except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
            raise PolicyError(f"{what} failed: {type(exc).__name__}: {exc}") from None

    def _priority(self, coll_id: int, need: Need, collective: Collective) -> float:
        """The scheduler's priority of a collective, checked (a plugin's error names it)."""
        value = self._scheduler_call(self.scheduler.priority, coll_id, need, collective)
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        try:
            priority = float(value) if number else math.nan
        except OverflowError:  # an int past a float's range, e.g. 10**400
            priority = math.nan
        if priority != priority:
            raise PolicyError(
                f"communication scheduler {self.scheduler.name!r} returned priority {shown(value)}; "
                "it must be a number a float holds"
            )
        return priority

    def _in_band(self, stage: Stage, pos: int) -> int:
        """The intra-dim policy's position, kept among the waiting stages of the same priority."""
        collectives = self.collectives
        priority = collectives[stage.coll].priority
        queue = self.queues[stage.dim]

        def key(r: StageRun) -> float:
            return collectives[r.stage.coll].priority

        lo = bisect.bisect_left(queue, priority, key=key)
        hi = bisect.bisect_right(queue, priority, lo, key=key)
        return min(max(pos, lo), hi)

    def _may_start(self, d: int, run: StageRun) -> bool:
        """Whether a gated scheduler lets the head of dim d's queue start now (always, on an idle dim)."""
        running = [r.stage for r in self.slots[d] if r is not None]
        return not running or bool(self._scheduler_call(self.scheduler.may_start, run.stage, running))

    def intra_policy(self, name: str) -> IntraPolicy:
        """The engine's instance of an intra-dim policy, made on first use."""
        if name not in self._intra:
            self._intra[name] = policy = make_intra(name)
            if origin(name) != "builtin":  # every rank runs it at once: no rank's watchdog sees it hang
                self._watched_intra[id(policy)] = self.transport.config.timeout_s
        return self._intra[name]

    def _enqueue(self, stage: Stage) -> None:
        run = StageRun(stage, self.now_ns)
        view = self.views[stage.dim]
        # (ASTRA-sim queues All-Reduce phases FIFO, by priority)
        policy = self._fifo if self.astra and stage.op == AR else self.collectives[stage.coll].intra
        waiting = view.waiting
        n = len(waiting)
        try:
            timeout_s = self._watched_intra.get(id(policy))
            if timeout_s is None:
                pos = policy.position(view, stage)
            else:
                with watch(timeout_s, f"intra-dim policy {policy.name!r} did not place a stage within "
                           f"{timeout_s:g} s (--timeout-s); a plugin that never returns?"):  # fmt: skip
                    pos = policy.position(view, stage)
        except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
            raise PolicyError(
                f"intra-dim policy {policy.name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        if view.waiting is not waiting or len(waiting) != n:
            raise PolicyError(
                f"intra-dim policy {policy.name!r} changed the queue it was shown; it may only read it"
            )
        returned = pos
        if type(pos) is not int:
            pos = int(pos) if isinstance(pos, np.integer) else -1
        if self._ranked and 0 <= pos <= n:
            pos = self._in_band(stage, pos)
        if self.agreed is not None:
            self._agreed_waiting[stage.dim][stage.coll, stage.chunk, stage.index] = run
        if pos == n:
            self.queues[stage.dim].append(run)
            waiting.append(stage)  # type: ignore[attr-defined]
        elif 0 <= pos < n:
            self.queues[stage.dim].insert(pos, run)
            waiting.insert(pos, stage)  # type: ignore[attr-defined]
        else:
            raise PolicyError(
                f"intra-dim policy {policy.name!r} returned position {shown(returned)}; it must be an int "
                f"between 0 and {n}"
            )

    def _claim_free(self, dims: Sequence[int]) -> None:
        """Start the heads of the queues of `dims` that have a free slot.

        The stages start now; the transport hears of them at the next `_start_claimed`. Only a
        dim whose slot was freed or whose queue grew can have both a free slot and a waiting
        stage, so the callers name those dims instead of scanning all.
        """
        for d in dims:
            queue, view = self.queues[d], self.views[d]
            while queue and view.running < self.active_per_dim:
                i = 0 if self.agreed is None else self._agreed_index(d)
                if i < 0 or (self._gated and not self._may_start(d, queue[i])):
                    break
                run = queue.pop(i)
                view.waiting.pop(i)  # type: ignore[attr-defined]
                if self.agreed is not None:
                    s = run.stage
                    del self._agreed_waiting[d][s.coll, s.chunk, s.index]
                view.running += 1
                slots = self.slots[d]
                run.slot = slot = slots.index(None)
                slots[slot] = run
                run.dim_seq = self.started[d]
                self.started[d] += 1
                run.start_seq = self._n_started
                self._n_started += 1
                agreed = self.agreed is not None
                run.start_ns = later(run.queued_ns, self.dim_free_ns[d]) if agreed else self.now_ns
                run.mem_shared = self.computing > 0
                self._running += 1
                self._claimed.append(run)

    def _agreed_index(self, d: int) -> int:
        """Where the next stage of the agreed order waits in dim d's queue; -1 if not yet queued."""
        order = self.agreed[d]  # type: ignore[index]
        seq = self.started[d]
        if seq >= len(order):
            raise UsageError(f"dim {d} starts more stages than the agreed order holds ({len(order)})")
        run = self._agreed_waiting[d].get(order[seq])
        return -1 if run is None else self.queues[d].index(run)  # (by identity: fast)

    def _start_claimed(self) -> None:
        claimed, self._claimed = self._claimed, []
        for run in claimed:
            self.transport.start(run)

    def _finish(self, run: StageRun) -> int | None:
        """Free the stage's slot and queue its chunk's next stage; returns that stage's dim."""
        if isinstance(run, MessageRun):
            self._running -= 1
            run.done.succeed(None, self.now_ns)
            return None
        stage = run.stage
        self.slots[stage.dim][run.slot] = None
        self.dim_free_ns[stage.dim] = run.end_ns
        self.views[stage.dim].running -= 1
        self._running -= 1
        coll = self.collectives[stage.coll]
        if self.keeps_records:
            self.records.append(run)
            coll.runs.append(run)
        elif run.end_ns > self.last_end_ns:
            self.last_end_ns = run.end_ns
        chunk_list = coll.stages[stage.chunk]
        if stage.index + 1 < len(chunk_list):
            following = chunk_list[stage.index + 1]
            self._enqueue(following)
            return following.dim
        coll.chunks_left -= 1
        if self.agreed is not None:  # (a chunk's last stage ends after its others, on every NPU)
            coll.last_end_ns = later(coll.last_end_ns, run.end_ns)
        if coll.chunks_left == 0:
            self._collective_done(coll)
        return None

    def _collective_done(self, coll: CollectiveRun) -> None:
        ran = coll.runs or (not self.keeps_records and coll.last_end_ns != -math.inf)  # (a stage ended)
        if self.agreed is not None and ran:  # completions come as known: resume at the end
            self.now_ns = coll.last_end_ns
        coll.end_ns = self.now_ns
        if isinstance(self.collectives, InFlight):  # (nobody reads it or its stages now)
            coll.stages = []
            self.collectives.drop(coll)
        self._in_flight -= 1
        self.transport.close(coll)
        coll.succeed(None, self.now_ns)
        if self._deferred and not self._in_flight:
            self._launch(self._deferred.pop(0))

    def recorded(self, run: CollectiveRun, records: list[StageRun]) -> None:
        """A collective that ran elsewhere, as if issued and run here: its run and stage records.

        The emulator's symmetric runs move their data as a program in the model's order
        (`mpi.program`); their times and records are the model's.
        """
        run.runs = records
        self.collectives.append(run)
        self.records.extend(records)
        self.now_ns = run.end_ns

    # --- the event loop ------------------------------------------------------------------------

    def running_stages(self) -> list[StageRun]:
        """The stages holding a dim slot now."""
        return [run for slots in self.slots for run in slots if run is not None]

    def _finish_order_key(self, run: StageRun, t_ns: float) -> tuple[float, ...]:
        s = run.stage
        return self.transport.cost(s.itemsize).finish_order_key(s.dim, s.op, s.full_elems, t_ns)

    def run(self) -> None:
        """Run until every issued stage and timer is done.

        Python's cyclic garbage collector is paused meanwhile: the loop allocates a few objects per
        stage and keeps them (the records), which made the collector's full passes cost as much as
        the loop itself at thousands of chunks; it runs again once the loop is done.
        """
        paused = gc.isenabled()
        gc.disable()
        try:
            self._loop()
        finally:
            if paused:
                gc.enable()

    def _loop(self) -> None:
        while True:
            if self._claimed:
                self._start_claimed()
            if not self._running and not self._timers:
                return
            horizon = self._timers[0][0] if self._timers else math.inf
            t_ns, done = self.transport.wait_next(horizon, self.agreed is None)
            self.now_ns = t_ns
            if done and self.astra:  # one at a time, each starting what it frees
                for run in sorted(done, key=lambda r: (self._finish_order_key(r, t_ns), r.start_seq)):
                    run.end_ns = t_ns
                    nxt = self._finish(run)
                    self._claim_free((run.stage.dim,) if nxt is None else (run.stage.dim, nxt))
                continue
            if len(done) == 1:
                run = done[0]
                run.end_ns = t_ns
                d = run.stage.dim
                nxt = self._finish(run)
                self._claim_free((d,) if nxt is None or nxt == d else (d, nxt) if d < nxt else (nxt, d))
                continue
            if done:
                done.sort(key=lambda r: (r.stage.dim, r.slot))
                dims = set()
                for run in done:
                    run.end_ns = t_ns
                    dims.add(run.stage.dim)
                    nxt = self._finish(run)
                    if nxt is not None:
                        dims.add(nxt)
                self._claim_free(sorted(dims))
                continue
            while self._timers and self._timers[0][0] <= t_ns:
                _, _, event, t_event = heapq.heappop(self._timers)
                if self.agreed is not None:  # events come as known: remember the latest
                    self.last_timer_ns = later(self.last_timer_ns, t_event)
                event.succeed(None, t_event)
