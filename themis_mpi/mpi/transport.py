"""The MPI transport: each rank is one NPU and really moves and reduces its chunks' data.

`MpiTransport` runs the stages the engine starts, all at once, with nonblocking uppercase calls
on numpy buffers over the grid's per-dim sub-communicators. Every data message carries the
sender's virtual send time; a step ends at ``max(own step start, send time + step time)``, and
under a wall clock not before that deadline has passed in real time.

The data path costs a rank CPU per step, and on an oversubscribed machine that CPU is the run
time, so it is kept short:

- A message of up to `FOLD_MAX_BYTES` carries the send time in its last 8 bytes: the block is
  copied into a staging buffer behind which the time is written, so one message per step and
  peer goes out instead of two. A larger block goes straight from the collective's buffer,
  preceded by an 8-byte header message; there the copy would cost more than the extra message.
  Under a timer (below) no send time is read, and a larger block goes alone.
- A step ends when its receives are done; its staged sends may still be in flight (their data
  is a copy, and each step stages into its own bytes), which saves waiting for the peer to
  acknowledge a rendezvous. Sends from the collective's buffer are waited for, as that buffer
  may change once the step ends. A stage's bytes are reused once its sends are done.
- A stage's steps (element ranges relative to its region), its step times and the layout of
  its buffers are planned once per stage shape (`_Shape`). The state of a finished stage, with
  its buffers and their views, is kept for the next stage of that shape; large scratch comes
  from the spares of finished stages.
- One ``Testsome`` over the requests of every running stage tests them all at once.

Waiting never spins: the rank yields or sleeps, backing off, between tests (`progress`).

Where the times come from is the transport's timer, given when it is made
(docs/design.md#emulator-times): none under ``ideal`` (the send times in the messages, plus the
cost model's step times, as above); under a sharing rule one NPU's view of the links
(`timing.symmetric.Symmetric`), which every rank runs on the same inputs as the model (the steps
only move and check the data, and a stage ends at the view's time once its data is all there);
and where one NPU's view is not exact, this rank's ends from a run of every NPU
(`timing.replay.Replay`, a twin transport made by `replaying`). NPUs may then start a dim's
stages in different orders, and messages carry the replay's stage numbers, common to all, as
their tags.

A collective with NPUs alike under a sharing rule needs neither the engine nor the timer here:
its times are the model's, the same on every rank, and its data moves as one program in the
model's stage order (`run_program`, `mpi.program`; the planner decides, `Plan.programmed`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager

import numpy as np
from mpi4py import MPI

from ..algorithms import COPY as STEP_COPY
from ..algorithms import REDUCE as STEP_REDUCE
from ..algorithms import SWAP as STEP_SWAP
from ..algorithms import Step
from ..collectives import Collective, owned_region, rs_dims
from ..config import RunConfig
from ..cost import A2A, AG, RS
from ..engine import CollectiveRun, Engine, MessageRun, StageRun, make_clock, reduced_span
from ..errors import Stalled, UsageError
from ..policies import origin, scheduler_origin
from ..timing.ideal import LinkScales
from ..timing.planner import emulator_timer
from ..timing.rules import rule_class
from ..timing.symmetric import Timer
from ..topology import Topology
from ..verify import count_wrong, fill_input
from .grid import CartGrid
from .program import Program, stage_steps
from .progress import Vigil, Watchdog

P2P_TAG_BASE, P2P_TAGS = 10000, 10000  # point-to-point tags on the Cartesian communicator (pings: 7001-2)
REDUCE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
HDR_BYTES = 8  # the send time, a float64 in ns
FOLD_MAX_BYTES = 64 << 10  # blocks up to this size travel with their send time in one message
ALIGN_BYTES = 64  # segments of a stage's buffer start on cache lines
POOL_AREA_MAX_BYTES = 1 << 20  # a stage state keeps buffers up to this size for the next stage
POOL_IDLE_MAX_BYTES = 64 << 20  # bytes kept in idle stage states, at most
MAX_SHAPES = 4096  # stage shapes planned before the cache starts over
# a program's round (`run_program`) waits for peers at that round: their messages come within tens
# of us once they run, so its first pauses sleep at most this long (longer left cores idle, and
# under load the rank sleeps too little to take its peers' core); then it backs off as others do
ROUND_SLEEP_S, ROUND_SHORT_PAUSES = 20e-6, 100
MAX_PROGRAMS = 64  # symmetric collectives' programs kept (each holds its persistent requests)
COPY, REDUCE, SWAP = 0, 1, 2
_NO_BUFFER = np.empty(0)
# one message of a step in a stage's buffer: (peer, start, stop, message, data, send time, folded)
_View = tuple[int, int, int, "np.ndarray | None", "np.ndarray | None", np.ndarray, bool]
MODES = {STEP_COPY: COPY, STEP_REDUCE: REDUCE, STEP_SWAP: SWAP}


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


class _StepPlan:
    """One step of a stage shape: its messages and where they sit in the stage's buffer.

    A message is ``(peer, start, stop, offset, nbytes, folded)``: element ranges relative to the
    stage's region; `offset` is the byte offset of its segment in the stage's buffer, or -1 when
    it is not staged (a large block sent from, or received into, the collective's buffer).
    Receive segments start at 0 in every step (a step's receives are applied before the next
    step posts); send segments start at `send_base` (`_Shape` gives every step its own).
    """

    __slots__ = ("mode", "sends", "recvs", "staged", "peers", "n_must", "recv_bytes", "send_bytes")

    def __init__(self, step: Step, itemsize: int, world: list[int], headers: bool = True):
        self.mode = MODES[step.mode]
        apart = 2 if headers else 1  # requests of a block sent apart: its header (the send time) and it
        recvs, sends, staged, peers = [], [], [], []
        at = 0
        for peer, a, b in step.recvs:
            nbytes = (b - a) * itemsize
            folded = nbytes <= FOLD_MAX_BYTES
            if folded:
                recvs.append((peer, a, b, at, nbytes, True))
                at += _aligned(nbytes + HDR_BYTES)
            elif self.mode == COPY:  # straight into place
                recvs.append((peer, a, b, -1, nbytes, False))
            else:  # scratch for the data, the header apart
                recvs.append((peer, a, b, at, nbytes, False))
                at += _aligned(nbytes)
            staged += [False] * (1 if folded else apart)
            peers += [world[peer]] * (1 if folded else apart)
        self.recv_bytes, at = at, 0
        for peer, a, b in step.sends:
            nbytes = (b - a) * itemsize
            folded = nbytes <= FOLD_MAX_BYTES
            sends.append((peer, a, b, at if folded else -1, nbytes, folded))
            if folded:
                at += _aligned(nbytes + HDR_BYTES)
            staged += [True] if folded else [False] * apart
            peers += [world[peer]] * (1 if folded else apart)
        self.send_bytes = at
        self.recvs, self.sends = tuple(recvs), tuple(sends)
        self.staged = tuple(staged)  # per request, in posting order: a staged send?
        self.peers = tuple(peers)  # per request, in posting order: the peer's world rank
        self.n_must = staged.count(False)  # requests the step waits for


class _Shape:
    """What every stage of one shape shares: its step plans, step times and buffer size.

    A shape is the dim, op, region length and element type of a stage, and whatever its step
    times depend on; the plans are relative to the region, so chunks at any offset share them.
    Finished stages' states wait in `free` for the next stage of the shape.
    """

    __slots__ = (
        "dim",
        "comm",
        "steps",
        "send_bases",
        "own",
        "costs",
        "send_ns",
        "extras",
        "area_bytes",
        "pooled",
        "retired",
        "free",
        "headers",
    )

    def __init__(
        self,
        dim: int,
        comm: MPI.Comm,
        steps: list[Step],
        own: tuple[int, int],
        costs: tuple[float, ...],
        itemsize: int,
        world: list[int],
        links: tuple = ((), None),
        headers: bool = True,
    ):
        self.dim, self.comm = dim, comm
        self.headers = headers  # a block sent apart goes after its send time (not under a timer)
        self.steps = [_StepPlan(st, itemsize, world, headers) for st in steps]
        at = max((st.recv_bytes for st in self.steps), default=0)
        self.send_bases = []
        for st in self.steps:
            self.send_bases.append(at)
            at += st.send_bytes
        self.area_bytes = at
        self.own = own  # the block an RS stage leaves, relative to its region
        self.costs = costs
        # per step: its own sends' time; per receive: what a scaled link adds (`timing.ideal.LinkScales`)
        self.send_ns, self.extras = links
        self.pooled = self.area_bytes <= POOL_AREA_MAX_BYTES
        self.retired = False  # dropped from the cache: its states are not kept
        self.free: list[_StageExec] = []


class _Sends:
    """The staged sends a stage has in flight: its bytes are reused only once they are done."""

    __slots__ = ("ex", "pending")

    def __init__(self, ex: _StageExec):
        self.ex, self.pending = ex, 0


class _StageExec:
    """The data path of one running stage: its place, progress, pending requests and buffers.

    Its buffer views are made once per buffer: ``views[k]`` holds step k's receives and sends,
    each ``(peer, start, stop, message, data, header, folded)``: the array MPI moves (None: the
    collective's own elements), the typed data in it and the send-time view; then the send-time
    views of the receives, and the owner of each request (the stage or its `_Sends`).
    """

    __slots__ = (
        "shape",
        "run",
        "tag",
        "lo",
        "buf",
        "ufunc",
        "k",
        "t_ns",
        "pending",
        "sending",
        "idle",
        "end_ns",
        "bound_ns",
        "area",
        "views",
        "hdr_send",
        "hdr_recv",
    )

    def __init__(self, shape: _Shape, run: StageRun):
        self.shape = shape
        self.run = run
        self.tag = self.lo = self.k = self.pending = 0
        self.sending = _Sends(self)
        self.idle = False  # ended, its sends still in flight
        self.buf = _NO_BUFFER
        self.ufunc: np.ufunc = np.add
        self.t_ns = self.bound_ns = 0.0
        self.end_ns: float | None = None
        self.area: np.ndarray | None = None
        self.views: list = []
        self.hdr_send = np.zeros(1)
        self.hdr_recv = np.zeros(max((len(st.recvs) for st in shape.steps), default=0))

    def attach(self, area: np.ndarray, dtype: np.dtype) -> None:
        """Make the views of every step into `area` (the stage's bytes)."""
        self.area = area
        self.views = []
        for st, base in zip(self.shape.steps, self.shape.send_bases):
            recvs: list[_View] = []
            sends: list[_View] = []
            hdrs = []
            for i, (peer, a, b, at, nbytes, folded) in enumerate(st.recvs):
                msg: np.ndarray | None
                data: np.ndarray | None
                if folded:
                    msg = area[at : at + nbytes + HDR_BYTES]
                    data, hdr = msg[:nbytes].view(dtype), msg[nbytes:].view(np.float64)
                else:
                    msg = data = None if at < 0 else area[at : at + nbytes].view(dtype)
                    hdr = self.hdr_recv[i : i + 1]
                recvs.append((peer, a, b, msg, data, hdr, folded))
                hdrs.append(hdr)
            for peer, a, b, at, nbytes, folded in st.sends:
                if folded:
                    seg = area[base + at : base + at + nbytes + HDR_BYTES]
                    sends.append(
                        (peer, a, b, seg, seg[:nbytes].view(dtype), seg[nbytes:].view(np.float64), True)
                    )
                else:
                    sends.append((peer, a, b, None, None, self.hdr_send, False))
            owners = tuple(self.sending if staged else self for staged in st.staged)
            self.views.append((tuple(recvs), tuple(sends), tuple(hdrs), owners))

    def lower_bound_ns(self) -> float:
        """The earliest end this stage can still have: the cost of its remaining steps."""
        t = self.t_ns
        for c in self.shape.costs[self.k :]:
            t = t + c
        return t


def p2p_payload(src: int, dst: int, tag: int, nbytes: int) -> np.ndarray:
    """The closed-form bytes a point-to-point message carries: they depend on both ends and the tag."""
    return ((np.arange(nbytes, dtype=np.int64) * 7 + src * 131 + dst * 17 + tag * 3) % 251).astype(np.uint8)


class _MessageExec:
    """One point-to-point message on this rank: its header exchange and its data.

    Both ends send their issue time to the other (the sender with the data, the receiver as an
    acknowledgement); both end at ``max(own issue, peer's issue) + cost``.
    """

    __slots__ = ("run", "t_ns", "cost_ns", "pending", "hdr_send", "hdr_recv", "data", "end_ns", "bound_ns")

    def __init__(self, run: MessageRun, cost_ns: float):
        self.run = run
        self.t_ns = run.start_ns
        self.cost_ns = cost_ns
        self.pending = 0
        self.hdr_send = np.array([run.start_ns])
        self.hdr_recv = np.empty(1)
        self.data = np.empty(run.nbytes, np.uint8)
        self.end_ns: float | None = None
        self.bound_ns = run.start_ns + cost_ns  # the end is never earlier


class _Data:
    """A collective's buffer on this rank and the region stack of each chunk."""

    __slots__ = ("collective", "buffer", "regions", "orders", "bounds", "dtype", "ufunc")

    def __init__(self, collective: Collective, buffer: np.ndarray, orders: np.ndarray, bounds: np.ndarray):
        self.collective, self.buffer, self.orders, self.bounds = collective, buffer, orders, bounds
        self.dtype = buffer.dtype
        self.ufunc = REDUCE_UFUNCS[collective.redop]
        self.regions: list[list[tuple[int, int]]] = []


class MpiTransport:
    """Executes stages on real data over the grid's sub-communicators.

    Args:
        grid: the Cartesian grid (its watchdog bounds every wait).
        config: the run settings (clock, time scale, endpoint delay).
        timer: what times its stages where its messages do not (a sharing rule:
            `timing.planner.emulator_timer`; a recorded run: `replaying`); None under ``ideal``.
    """

    name = "mpi"
    checks_data = True

    def __init__(self, grid: CartGrid, config: RunConfig, timer: Timer | None = None):
        self.grid = grid
        self.topology = grid.topology
        self.config = config = config.on(grid.topology)  # (the default rule on nccl dims: ideal)
        self.clock = make_clock(config.clock, config.time_scale)
        self._wall = self.clock.name == "wall"
        self.rank = self.ranks = grid.rank
        self.issue_ns = config.late_ns(self.rank)
        self.tag_mod = min(int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767), 1 << 20)
        self.cost = config.costs(self.topology)
        self.links = LinkScales(self.cost, config.link_scale)
        self._data: dict[int, _Data] = {}
        self._active: list[_StageExec | _MessageExec] = []
        # every pending request, with its stage (or message) and its peer's world rank
        self._reqs: list[MPI.Request] = []  # (completed ones stay, null, until the lists are compacted)
        self._owner: list[_StageExec | _MessageExec | _Sends] = []
        self._peers: list[int] = []
        self._live = 0  # requests not completed yet
        # steps whose requests are all done, not yet applied (a wall deadline ahead), and stages
        # whose sends are all done
        self._due: list[_StageExec | _MessageExec | _Sends] = []
        self._shapes: dict[tuple, _Shape] = {}
        self._idle_bytes = 0  # bytes held by idle stage states (`_Shape.free`)
        self._spare: list[np.ndarray] = []  # large scratch of finished stages, for reuse
        self._buffers: list[np.ndarray] = []  # buffers of finished collectives, for reuse
        self.check_s = 0.0  # wall seconds spent in result checks (the driver leaves them out of run times)
        self.timer = timer
        self._untimed = rule_class(config.network).routes  # a sharing rule: its timer must say
        self._flat = self.topology.flat
        if self.timer is not None and self._wall:
            raise UsageError(f"--network {config.network} runs on the virtual clock only (not --clock wall)")
        self._timed: tuple[float, list[StageRun]] | None = None  # ends the timer gave, data pending
        self._twins: list[MpiTransport] = []  # twins timed by a recorded run (`replaying`)
        self._programs: dict[Hashable, Program] = {}  # symmetric collectives' programs (`run_program`)
        self._program_scratch = _NO_BUFFER  # where their received data waits to be reduced

    # --- control (small messages, rank 0 coordinates) --------------------------------------------

    def bcast(self, array: np.ndarray, what: str, patient: bool = False) -> np.ndarray:
        """Rank 0's array on every rank (uppercase, in place)."""
        return self.grid.bcast(array, what, patient)

    def serving(self) -> AbstractContextManager[None]:
        """Answer the other ranks' pings while this rank computes on its own (rank 0 deciding)."""
        return self.grid.serving()

    def barrier(self, what: str) -> None:
        """Every rank has arrived."""
        self.grid.wait(self.grid.cart.Ibarrier(), what)

    def reduce(self, values, op: str, what: str = "a reduction of results") -> np.ndarray:
        """Element-wise sum, max or min over ranks, on every rank."""
        return self.grid.watchdog.allreduce(values, MPI_OPS[op], what)

    def span_ns(self, engine: Engine) -> tuple[float, float]:
        """The run's first issue and last end over every rank."""
        return reduced_span(self.reduce, engine)

    def replaying(self, timer: Timer) -> MpiTransport:
        """A twin on the same grid whose stages end as a recorded run says (its sends drain with these)."""
        twin = MpiTransport(self.grid, self.config, timer)
        self._twins.append(twin)
        return twin

    @property
    def link_bytes(self) -> list[float] | None:
        """Bytes each of this rank's links carried, where its timer knows them (a recorded run)."""
        return None if self.timer is None else self.timer.link_bytes

    # --- data ----------------------------------------------------------------------------------

    def open(self, run: CollectiveRun) -> None:
        """Fill a buffer with the closed-form input; each chunk's region starts at the run's bounds.

        A standalone all-gather starts from the block a reduce-scatter along the reversed order
        would leave, so its regions are narrowed ahead of time.
        """
        coll = run.collective
        data = _Data(coll, self._buffer(coll), run.orders, run.bounds)
        fill_input(data.buffer, self.topology, coll, self.grid.coords, run.orders, run.bounds)
        bounds = run.bounds.tolist()
        for k in range(len(bounds) - 1):
            stack = [(bounds[k], bounds[k + 1])]
            if coll.op == "all_gather":
                for d in rs_dims(self.topology, coll, run.orders[k]):
                    stack.append(owned_region(self.topology.dims[d].npus, self.grid.coords[d], *stack[-1]))
            data.regions.append(stack)
        self._data[run.coll_id] = data

    def close(self, run: CollectiveRun) -> None:
        """Check the result (when asked) and keep the buffer for the next collective."""
        data = self._data.pop(run.coll_id)
        if run.check:
            t0 = time.perf_counter()
            run.wrong = count_wrong(
                data.buffer, self.topology, data.collective, self.grid.coords, data.orders, data.bounds
            )
            self.check_s += time.perf_counter() - t0
        self._buffers.append(data.buffer)

    def _buffer(self, coll: Collective) -> np.ndarray:
        """A finished collective's buffer of the same shape, else fresh memory (spares dropped)."""
        for i, buf in enumerate(self._buffers):
            if buf.size == coll.count and buf.dtype == np.dtype(coll.dtype):
                return self._buffers.pop(i)
        self._buffers = []
        return np.empty(coll.count, dtype=coll.dtype)

    # --- a symmetric collective as one program (`mpi.program`) ----------------------------------

    def run_program(self, run: CollectiveRun, order: Sequence[StageRun], key: Hashable) -> np.ndarray:
        """Move an opened collective's data as one program in the model's stage start order.

        The planner calls the run symmetric (`timing.planner.Plan.programmed`): every rank runs
        the same order, so no engine and no timer run here (`mpi.program`).

        Args:
            run: the collective, opened (`open`), closed by the caller.
            order: the model's stage runs of it, in start order.
            key: what names that order (the same key, the same order): the program is compiled
                once per key.

        Returns:
            Each stage's wall start and end (perf_counter seconds), in `order`, shape (stages, 2).
        """
        data = self._data[run.coll_id]
        program = self._programs.get(key)
        if program is None:
            if len(self._programs) >= MAX_PROGRAMS:
                self._free_programs()
            program = Program(
                self.topology, self.grid.coords, self.grid.subcomms, data.collective, data.regions, order
            )
            self._programs[key] = program
        scratch = self._program_scratch
        if scratch.size < program.scratch_elems or scratch.dtype != data.dtype:
            scratch = self._program_scratch = np.empty(program.scratch_elems, data.dtype)
        live = [data.buffer, *self._buffers]  # (a program bound elsewhere lets its buffer go)
        for other in self._programs.values():
            if other.buffer is not None and not any(other.buffer is buf for buf in live):
                other.free()
        # (its own tag: a stage's messages take theirs below tag_mod)
        program.bind(data.buffer, scratch, self.tag_mod)
        at: list[list[int]] = [[0]]

        def waiting() -> str:  # (every stage of the round: a dead peer may be any of theirs)
            places = [program.where[i] for i in at[0]]
            peers = sorted({self.grid.world_ranks[d][p] for _, _, d, ps in places for p in ps})
            stages = "; ".join(f"chunk {chunk}, {op} on dim {d}" for chunk, op, d, _ in places)
            return (
                f"waiting for rank(s) {', '.join(map(str, peers))} in collective {run.coll_id} "
                f"({data.collective.op} of {data.collective.size_bytes} B), {stages}"
            )

        backoff = self.grid.watchdog.backoff(waiting)
        pause, testall = backoff.pause, MPI.Request.Testall

        def wait(reqs: list[MPI.Request], stages: list[int]) -> None:
            at[0] = stages
            try:
                while not testall(reqs):
                    pause(ROUND_SLEEP_S if backoff.idle < ROUND_SHORT_PAUSES else None)
            except MPI.Exception as exc:
                raise self._failure(exc, waiting()) from None
            backoff.reset()

        return program.run(data.ufunc, wait)

    def _free_programs(self) -> None:
        """Drop the compiled programs and free their persistent requests."""
        for program in self._programs.values():
            program.free()
        self._programs = {}

    # --- engine interface ----------------------------------------------------------------------

    def start(self, run: StageRun) -> None:
        """Post the first step of a stage the engine just started."""
        timer = self.timer
        if timer is not None:  # (one NPU's view refuses a message: it runs on every NPU's links)
            timer.start(run)
        if isinstance(run, MessageRun):
            self._start_message(run)
            return
        s = run.stage
        data = self._data[s.coll]
        stack = data.regions[s.chunk]
        op = s.op
        if op == AG:
            stack.pop()
        lo, hi = stack[-1]
        key = (
            s.dim,
            op,
            hi - lo,
            data.dtype,
            s.full_elems,
            s.index == 0,
            s.index == s.n_stages - 1,
            run.mem_shared,
            data.collective.dims if op == A2A else None,
            self._flat and s.plan,  # the NCCL-like model times a stage by its chunk's plan
        )
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shape(key, run, data)
        if op == RS:
            stack.append((lo + shape.own[0], lo + shape.own[1]))
        if shape.free:
            ex = shape.free.pop()
            if shape.pooled:
                self._idle_bytes -= shape.area_bytes
        else:
            ex = _StageExec(shape, run)
            if shape.pooled:
                ex.attach(np.empty(shape.area_bytes, np.uint8), data.dtype)
        if not shape.pooled:
            ex.attach(self._scratch(shape.area_bytes), data.dtype)
        # (a replay's NPUs may start a dim's stages in different orders: its numbers are common)
        number = run.dim_seq if timer is None else timer.number(run)
        ex.run, ex.tag, ex.lo, ex.buf, ex.ufunc = run, number % self.tag_mod, lo, data.buffer, data.ufunc
        ex.k, ex.t_ns, ex.end_ns = 0, run.start_ns, None
        run.wall_start_s = time.perf_counter()
        self._active.append(ex)
        if shape.steps:
            ex.bound_ns = ex.lower_bound_ns()
            self._post(ex)
        else:  # nothing to move (the engine never starts such a stage today)
            ex.pending = 0
            ex.end_ns = ex.bound_ns = ex.lower_bound_ns()

    def _shape(self, key: tuple, run: StageRun, data: _Data) -> _Shape:
        """Plan a stage shape (relative to its region) and remember it."""
        s = run.stage
        topo, collective = self.topology, data.collective
        dim = topo.dims[s.dim]
        c = self.grid.coords[s.dim]
        n = key[2]
        steps = stage_steps(topo, collective, s, c, 0, n)
        own = owned_region(dim.npus, c, 0, n) if s.op == RS else (0, n)
        costs = tuple(self.cost(s.itemsize).run_steps_ns(run))
        if self.timer is None and self._untimed:
            raise RuntimeError(
                f"the emulator under --network {self.config.network} needs its timer "
                "(timing.planner.emulator_timer, or a recorded run: `replaying`)"
            )
        if self.timer is not None:  # the links' time comes from the timer; steps move data
            costs = (0.0,) * len(steps)
        elif len(costs) != len(steps):  # (2.x's ring all-to-all: timed message by message, moved direct)
            costs = (0.0,) * (len(steps) - 1) + (sum(costs),)
        world = self.grid.world_ranks[s.dim]
        recv_peers = [[world[p] for p, _, _ in st.recvs] for st in steps]
        send_peers = [[world[p] for p, _, _ in st.sends] for st in steps]
        links = self.links.step_times(run, s.itemsize, self.rank, recv_peers, send_peers, costs)
        if len(self._shapes) >= MAX_SHAPES:
            for old in self._shapes.values():
                old.retired = True
            self._shapes, self._idle_bytes = {}, 0
        shape = _Shape(
            s.dim,
            self.grid.subcomms[s.dim],
            steps,
            own,
            costs,
            collective.itemsize,
            world,
            links,
            headers=self.timer is None,  # (a timer times the stages: no send time travels apart)
        )
        self._shapes[key] = shape
        return shape

    def _scratch(self, nbytes: int) -> np.ndarray:
        """Large scratch bytes for a stage: the smallest spare that fits, else fresh memory.

        Reuse spares the page faults of fresh memory, which dominate large single-chunk stages.
        When nothing fits, the spares are dropped, so they never outnumber the stages in flight.
        """
        fits = [i for i, spare in enumerate(self._spare) if spare.nbytes >= nbytes]
        if not fits:
            self._spare = []
            return np.empty(nbytes, np.uint8)
        return self._spare.pop(min(fits, key=lambda i: self._spare[i].nbytes))[:nbytes]

    def _release(self, ex: _StageExec) -> None:
        """A stage ended: once its sends are done, keep its state for the next stage of its shape."""
        ex.buf = _NO_BUFFER
        ex.idle = True
        if ex.sending.pending == 0:
            self._keep(ex)

    def _keep(self, ex: _StageExec) -> None:
        """Put an ended stage's state, its sends done, in its shape's pool (large bytes go spare)."""
        ex.idle = False
        shape = ex.shape
        if not shape.pooled:
            area = ex.area
            if area is not None:
                self._spare.append(area if area.base is None else area.base)  # the bytes it was cut from
            ex.area, ex.views = None, []
            if not shape.retired:
                shape.free.append(ex)
        elif not shape.retired and self._idle_bytes + shape.area_bytes <= POOL_IDLE_MAX_BYTES:
            self._idle_bytes += shape.area_bytes
            shape.free.append(ex)

    def drain(self, what: str = "the last sends") -> None:
        """Complete every request still pending (staged sends the peers have received), its twins' too."""
        for twin in self._twins:
            twin.drain(what)
        self._free_programs()
        backoff = self.grid.watchdog.backoff(lambda: f"in {what} {self._waiting_for()}")
        while self._live:
            if self._progress():
                backoff.reset()
            else:
                backoff.pause()

    def _start_message(self, run: MessageRun) -> None:
        """Post a point-to-point message's header exchange and data on the Cartesian communicator."""
        ex = _MessageExec(run, self.cost(1).p2p_ns(run.path, run.nbytes))
        comm, peer = self.grid.cart, run.peer
        data_tag = P2P_TAG_BASE + 2 * (run.tag % P2P_TAGS)
        run.wall_start_s = time.perf_counter()
        if run.send:
            ex.data[:] = p2p_payload(self.rank, peer, run.tag, run.nbytes)
            reqs = [
                comm.Irecv(ex.hdr_recv, peer, data_tag + 1),
                comm.Isend(ex.hdr_send, peer, data_tag),
                comm.Isend(ex.data, peer, data_tag),
            ]
        else:
            reqs = [
                comm.Irecv(ex.hdr_recv, peer, data_tag),
                comm.Irecv(ex.data, peer, data_tag),
                comm.Isend(ex.hdr_send, peer, data_tag + 1),
            ]
        self._reqs += reqs
        self._owner += [ex] * len(reqs)
        self._peers += [peer] * len(reqs)
        self._live += len(reqs)
        ex.pending = len(reqs)
        self._active.append(ex)

    def _finish_message(self, ex: _MessageExec) -> bool:
        """A message whose requests are done ends at max(own, peer's issue) + cost (check on receipt)."""
        ex.t_ns = max(ex.t_ns, float(ex.hdr_recv[0]))
        t_end = ex.t_ns + ex.cost_ns
        if self.clock.now_ns() < t_end:
            return False
        run = ex.run
        if not run.send:
            t0 = time.perf_counter()
            expected = p2p_payload(run.peer, self.rank, run.tag, run.nbytes)
            run.wrong = int(np.count_nonzero(ex.data != expected))
            self.check_s += time.perf_counter() - t0
        ex.end_ns = t_end
        run.wall_end_s = time.perf_counter()
        return True

    def _post(self, ex: _StageExec) -> None:
        """Post step k of a stage: its receives, then its sends, the send time on each."""
        recvs, sends, _, owners = ex.views[ex.k]
        comm, tag, buf, lo, t_ns = ex.shape.comm, ex.tag, ex.buf, ex.lo, ex.t_ns
        reqs = self._reqs
        for peer, a, b, msg, _, hdr, folded in recvs:
            if folded:
                reqs.append(comm.Irecv(msg, peer, tag))
            else:
                if ex.shape.headers:
                    reqs.append(comm.Irecv(hdr, peer, tag))
                reqs.append(comm.Irecv(buf[lo + a : lo + b] if msg is None else msg, peer, tag))
        ex.hdr_send[0] = t_ns
        for peer, a, b, msg, data, hdr, folded in sends:
            if folded:
                data[...] = buf[lo + a : lo + b]
                hdr[0] = t_ns
                reqs.append(comm.Isend(msg, peer, tag))
            else:
                if ex.shape.headers:
                    reqs.append(comm.Isend(hdr, peer, tag))
                reqs.append(comm.Isend(buf[lo + a : lo + b], peer, tag))
        step = ex.shape.steps[ex.k]
        ex.pending = step.n_must
        ex.sending.pending += len(owners) - step.n_must
        self._owner += owners
        self._peers += step.peers
        self._live += len(owners)
        if step.n_must == 0:
            self._due.append(ex)

    def _finish_step(self, ex: _StageExec | _MessageExec) -> bool:
        """Apply a step whose messages have all arrived; False while its wall deadline is ahead."""
        if isinstance(ex, _MessageExec):
            return self._finish_message(ex)
        recvs, _, hdrs, _ = ex.views[ex.k]
        costs = ex.shape.costs
        t_next = t = ex.t_ns
        if self.timer is None:  # (under a timer the steps only move the data: it says when stages end)
            sent_ns = -math.inf
            extras = ex.shape.extras
            for i, hdr in enumerate(hdrs):
                sent = float(hdr[0]) if extras is None else float(hdr[0]) + extras[ex.k][i]
                if sent > sent_ns:
                    sent_ns = sent
            t_next = max(t, t + ex.shape.send_ns[ex.k], sent_ns + costs[ex.k])
            if self._wall and self.clock.now_ns() < t_next:
                return False
        mode = ex.shape.steps[ex.k].mode
        buf, lo = ex.buf, ex.lo
        for _, a, b, _, data, _, _ in recvs:
            if data is None:  # received in place
                continue
            if mode == REDUCE:
                part = buf[lo + a : lo + b]
                ex.ufunc(part, data, out=part)
            else:
                buf[lo + a : lo + b] = data
        ex.t_ns = t_next
        ex.k += 1
        if ex.k == len(costs):
            ex.end_ns = t_next
            ex.run.wall_end_s = time.perf_counter()
        else:
            ex.bound_ns = ex.lower_bound_ns()
            self._post(ex)
        return True

    def _test(self) -> list[int] | None:
        """Test every pending request once: the indices of those that completed (None: none)."""
        try:
            return MPI.Request.Testsome(self._reqs)
        except MPI.Exception as exc:  # MPI saw a peer fail (when the launcher lets us live)
            raise self._failure(exc, self._waiting_for()) from None

    def _failure(self, exc: MPI.Exception, waiting: str) -> Stalled:
        """What a failed test of requests says: ranks that started different stages, or a dead peer."""
        # (Testsome reports a receive that met a larger message, another stage's, as "in status")
        if exc.Get_error_class() in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
            return Stalled(
                f"rank {self.grid.rank}: a message failed {waiting}: a receive met a message "
                f"of another size, so ranks started different stages ({self._order_hint()}), "
                "or a peer died"
            )
        failed = f"rank {self.grid.rank}: a message failed ({exc.Get_error_string()})"
        return Stalled(f"{failed} {waiting}; a peer died")

    def _order_hint(self) -> str:
        """What makes ranks start different stages: policies whose answers differ between ranks."""
        config = self.config
        given = [
            ("--comm-scheduler", config.comm_scheduler, scheduler_origin),
            ("--intra", config.intra, origin),
        ]
        plugins = [f"{flag} {name}" for flag, name, where in given if name and where(name) != "builtin"]
        named = f"the plugin {' or '.join(plugins)}" if plugins else "the policies"
        return f"{named} must give every rank the same priorities and positions"

    def _completed(self, done: list[int]) -> None:
        """Requests that completed: their stages' counts go down, the steps they finish are due.

        A completed request stays in the lists, null (``Testsome`` skips it), until none is left
        or they are mostly null: the lists are rebuilt now and then, not at every completion.
        """
        owner, due = self._owner, self._due
        for i in done:
            ex = owner[i]
            ex.pending -= 1
            if ex.pending == 0:
                due.append(ex)
        self._live -= len(done)
        reqs = self._reqs
        if not self._live:
            self._reqs, self._owner, self._peers = [], [], []
        elif len(reqs) > 4 * self._live + 16:
            keep = [i for i, req in enumerate(reqs) if req]
            self._reqs = [reqs[i] for i in keep]
            self._owner = [owner[i] for i in keep]
            self._peers = [self._peers[i] for i in keep]

    def _await(self, backoff) -> None:
        """Pause and test until a request completes: under the virtual clock nothing else can move.

        The tightest loop of a waiting rank (one per step and peer it waits for): a pause, which
        yields the core or sleeps, and one ``Testsome``.
        """
        pause, test = backoff.pause, self._test
        while True:
            pause()
            if self._live:
                done = test()
                if done:
                    self._completed(done)
                    return

    def _progress(self) -> bool:
        """Test every pending request once; apply the steps that are complete.

        Returns whether anything moved: a request completed or a step was applied.
        """
        moved = False
        if self._live:
            done = self._test()
            if done:
                moved = True
                self._completed(done)
        return self._apply_due() or moved

    def _apply_due(self) -> bool:
        """Apply the steps whose requests are all done (and keep stages whose sends are); whether one was."""
        moved = False
        if not self._due:
            return moved
        due, self._due = self._due, []
        for ex in due:
            if isinstance(ex, _Sends):  # a stage's sends are all done
                if ex.ex.idle:
                    self._keep(ex.ex)
                continue
            while ex.end_ns is None and ex.pending == 0:
                if not self._finish_step(ex):
                    self._due.append(ex)  # its wall deadline is ahead
                    break
                moved = True
        return moved

    def _waiting_for(self) -> str:
        """What this rank waits for: the peers of its incomplete messages, and their stages."""
        live = [i for i, req in enumerate(self._reqs) if req]  # (completed ones are null)
        peers = sorted({self._peers[i] for i in live})
        owners = [self._owner[i] for i in live]
        waiting = [o for o in owners if not isinstance(o, _Sends)]  # rather than sends
        first = waiting[0] if waiting else owners[0] if owners else None
        ex = first.ex if isinstance(first, _Sends) else first
        if ex is None:
            ex = self._active[0] if self._active else None
        if ex is None:
            return "with no message pending"
        s = ex.run.stage
        if isinstance(ex, _MessageExec):
            run = ex.run
            side = f"send to rank {run.peer}" if run.send else f"receive from rank {run.peer}"
            return (
                f"waiting for rank(s) {', '.join(map(str, peers))} in a point-to-point {side} "
                f"({run.nbytes} B, tag {run.tag})"
            )
        data = self._data.get(s.coll)  # None: the collective ended here, its last sends pending
        what = f" ({data.collective.op} of {data.collective.size_bytes} B)" if data else ""
        return (
            f"waiting for rank(s) {', '.join(map(str, peers))} in collective {s.coll}{what}, "
            f"chunk {s.chunk}, {s.op} on dim {s.dim}"
        )

    def _deadline_ns(self) -> float:
        """The earliest wall deadline a finished step or message waits for (wall clock)."""
        dues = [
            ex.t_ns + ex.cost_ns if isinstance(ex, _MessageExec) else ex.t_ns + ex.shape.costs[ex.k]
            for ex in self._due
            if not isinstance(ex, _Sends)
        ]
        return min(dues, default=math.inf)

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """Progress until the earliest completion (or the horizon) is certain; see `Engine.run`.

        A completion at virtual time t is certain once no running stage can still end before t
        (its remaining step costs say so). Both clocks decide alike, so every rank takes the
        same decisions; the wall clock only holds each step (and each timer) until its deadline.
        Without `certain` (an agreed order, `Engine.agree`) the earliest known completion will do.
        """
        if self.timer is not None:
            return self._wait_timed(horizon_ns)
        backoff = None
        progressed = True
        first_end, bound = math.inf, math.inf
        while True:
            if progressed:  # nothing else changes what is certain
                first_end, bound = math.inf, math.inf
                for ex in self._active:
                    end = ex.end_ns
                    if end is None:
                        if ex.bound_ns < bound:
                            bound = ex.bound_ns
                    elif end < first_end:
                        first_end = end
            if first_end <= horizon_ns and (first_end < bound or not certain and first_end < math.inf):
                done: list[_StageExec | _MessageExec] = []
                running: list[_StageExec | _MessageExec] = []
                for ex in self._active:
                    (done if ex.end_ns == first_end else running).append(ex)
                self._active = running
                for ex in done:
                    if isinstance(ex, _StageExec):
                        self._release(ex)
                return first_end, [ex.run for ex in done]
            if (
                horizon_ns < first_end
                and (horizon_ns < bound or not certain)
                and self.clock.now_ns() >= horizon_ns
            ):
                return horizon_ns, []
            progressed = self._progress()
            if progressed:
                if backoff is not None:
                    backoff.reset()
                continue
            if backoff is None:
                backoff = self.grid.watchdog.backoff(self._waiting_for)
            if not self._wall:  # only a message can move things: wait for one, then apply it
                self._await(backoff)
                self._apply_due()
                progressed = True
                backoff.reset()
                continue
            until_s = self.clock.seconds_until(min(self._deadline_ns(), horizon_ns))
            wait_s = None if until_s == math.inf else until_s
            backoff.pause(wait_s)
            if wait_s is not None and wait_s > 0:
                backoff.reset()  # waiting for our own deadline: silence counts from when it passes

    def _wait_timed(self, horizon_ns: float) -> tuple[float, list[StageRun]]:
        """Under a timer: its next ends (or the horizon), once their data is here.

        The stages that end are found once; then, as on the ideal path, steps are applied as
        they complete and, with nothing to apply, the rank waits for a request (`_await`).
        """
        if self._timed is None:
            assert self.timer is not None
            t_ns, runs = self.timer.next(horizon_ns)
            if not runs:
                return t_ns, []
            self._timed = (t_ns, runs)
        t_ns, runs = self._timed
        ending = {id(run) for run in runs}
        done: list[_StageExec | _MessageExec] = []
        running: list[_StageExec | _MessageExec] = []
        for ex in self._active:
            (done if id(ex.run) in ending else running).append(ex)
        assert len(done) == len(runs), "the timer ended a stage this transport does not run"
        backoff = None
        for ex in done:
            while ex.end_ns is None:
                if self._progress():
                    continue
                if backoff is None:
                    backoff = self.grid.watchdog.backoff(self._waiting_for)
                self._await(backoff)  # (only a message can move things)
                backoff.reset()
        self._timed = None
        self._active = running
        for ex in done:
            if isinstance(ex, _StageExec):
                self._release(ex)
        for run in runs:
            run.wall_end_s = time.perf_counter()
        return t_ns, runs


class MpiBackend:
    """Where the emulator runs: one MPI rank per NPU on a Cartesian grid it owns."""

    name = "mpi"

    def __init__(self, comm: MPI.Intracomm, topology: Topology, timeout_s: float):
        self.topology = topology
        self.world = Watchdog(comm, timeout_s)  # start-up and the last barrier, before and after the grid
        # from here to the end a thread names a rank that stops while this one is busy on its own
        # (the grid's blocking constructors, the model run that times the run, set-ups)
        self.vigil = Vigil(self.world, timeout_s) if comm.Get_size() > 1 else None
        # MPI's communicator constructors block; line the ranks up quietly first, so a rank that is
        # frozen or dead at start-up is named within the timeout instead of hanging everybody
        try:
            self.world.wait(comm.Ibarrier(), "the start-up barrier")
            self.grid = CartGrid(comm, topology, timeout_s)
        except BaseException:
            if self.vigil is not None:
                self.vigil.close()
            raise
        if self.vigil is not None:
            self.vigil.add([self.grid.watchdog])
        self.rank = self.grid.rank
        self._transports: list[MpiTransport] = []

    def transport(self, config: RunConfig) -> MpiTransport:
        """An MPI transport on this grid with these settings and the planner's timer (drained at `close`)."""
        transport = MpiTransport(self.grid, config, emulator_timer(self.topology, config))
        self._transports.append(transport)
        return transport

    def gather(self, events: np.ndarray) -> np.ndarray | None:
        """Every rank's events on rank 0 (None elsewhere), under the watchdog."""
        comm, what = self.grid.cart, "the gather of the trace events"
        counts = np.zeros(comm.Get_size(), np.int64)
        self.grid.wait(comm.Igather(np.array([events.nbytes], np.int64), counts, root=0), what)
        if comm.Get_rank() != 0:
            self.grid.wait(comm.Igatherv(events.view(np.uint8), None, root=0), what)
            return None
        everything = np.zeros(int(counts.sum()) // events.dtype.itemsize, events.dtype)
        self.grid.wait(
            comm.Igatherv(events.view(np.uint8), [everything.view(np.uint8), counts, None, MPI.BYTE], root=0),
            what,
        )
        return everything

    def service(self) -> None:
        """Answer liveness pings while this rank is busy on its own (rank 0 writing outputs)."""
        self.grid.watchdog.service()
        self.world.service()

    def close(self, barrier: bool = True) -> None:
        """Wait for every rank (rank 0 may still be writing), then free the grid's communicators.

        The wait is patient: it ends the job only if a rank stops answering pings, so a long
        trace write is fine and a frozen writer is named.
        """
        try:
            if barrier:
                for transport in self._transports:
                    transport.drain()
            if self.vigil is not None:  # no heartbeat may leave once a peer can be past the barrier
                self.vigil.close()
            if barrier:
                self.grid.watchdog.wait(self.grid.cart.Ibarrier(), "the final barrier", patient=True)
                if self.vigil is not None:
                    self.vigil.drain()
        finally:
            if self.vigil is not None:
                self.vigil.close()
            self.grid.close()
            self.world.close()
