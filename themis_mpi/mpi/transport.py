"""The MPI transport: each rank is one NPU and really moves and reduces its chunks' data.

`MpiTransport` runs the stages the engine starts, all at once, with nonblocking uppercase calls
on numpy buffers over the grid's per-dim sub-communicators. Every data message is preceded by
an 8-byte header with the sender's virtual send time; a step ends at ``max(own step start,
header + step time)``, and under a wall clock not before that deadline has passed in real time.
Waiting never spins: requests are tested with ``Testsome`` and the rank sleeps, backing off,
between tests (`progress`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .. import algorithms
from ..algorithms import Step, plan, plan_all_to_all
from ..check import count_wrong, fill_input
from ..collectives import Collective, owned_region, rs_dims
from ..cost import A2A, AG, RS, CostModels
from ..engine import CollectiveRun, MessageRun, StageRun, make_clock
from ..topology import Topology
from .grid import CartGrid
from .progress import Stalled, Watchdog

if TYPE_CHECKING:
    from ..driver import RunConfig

P2P_TAG_BASE, P2P_TAGS = 10000, 10000  # point-to-point tags on the Cartesian communicator (pings: 7001-2)
REDUCE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


class _StageExec:
    """The data path of one running stage: its steps, their costs and its pending requests."""

    __slots__ = (
        "run",
        "comm",
        "tag",
        "steps",
        "costs",
        "k",
        "t_ns",
        "pending",
        "hdr_send",
        "hdr_recv",
        "scratch",
        "end_ns",
        "bound_ns",
    )

    def __init__(
        self,
        run: StageRun,
        comm: MPI.Comm,
        tag: int,
        steps: list[Step],
        costs: tuple[float, ...],
        scratch: np.ndarray,
    ):
        self.run = run
        self.comm = comm
        self.tag = tag
        self.steps = steps
        self.costs = costs
        self.k = 0
        self.t_ns = run.start_ns
        self.pending = 0
        self.hdr_send = np.zeros(1)
        self.hdr_recv = np.empty(max((len(st.recvs) for st in steps), default=0))
        self.scratch = scratch
        self.end_ns: float | None = None
        self.bound_ns = self.lower_bound_ns()

    def lower_bound_ns(self) -> float:
        """The earliest end this stage can still have: the cost of its remaining steps."""
        t = self.t_ns
        for c in self.costs[self.k :]:
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

    __slots__ = ("run", "t_ns", "costs", "k", "pending", "hdr_send", "hdr_recv", "data", "end_ns", "bound_ns")

    def __init__(self, run: MessageRun, cost_ns: float):
        self.run = run
        self.t_ns = run.start_ns
        self.costs = (cost_ns,)
        self.k = 0
        self.pending = 0
        self.hdr_send = np.array([run.start_ns])
        self.hdr_recv = np.empty(1)
        self.data = np.empty(run.nbytes, np.uint8)
        self.end_ns: float | None = None
        self.bound_ns = run.start_ns + cost_ns  # the end is never earlier


class _Data:
    """A collective's buffer on this rank and the region stack of each chunk."""

    __slots__ = ("collective", "buffer", "regions", "orders", "bounds")

    def __init__(self, collective: Collective, buffer: np.ndarray, orders: np.ndarray, bounds: np.ndarray):
        self.collective, self.buffer, self.orders, self.bounds = collective, buffer, orders, bounds
        self.regions: list[list[tuple[int, int]]] = []


class MpiTransport:
    """Executes stages on real data over the grid's sub-communicators.

    Args:
        grid: the Cartesian grid (its watchdog bounds every wait).
        config: the run settings (clock, time scale, endpoint delay).
    """

    name = "mpi"
    checks_data = True

    def __init__(self, grid: CartGrid, config: RunConfig):
        self.grid = grid
        self.topology = grid.topology
        self.config = config
        self.clock = make_clock(config.clock, config.time_scale)
        self.rank = grid.rank
        self.tag_mod = min(int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767), 1 << 20)
        self.cost = CostModels(self.topology, config.endpoint_delay_ns, config.compat, config.endpoint)
        self._data: dict[int, _Data] = {}
        self._active: list[_StageExec | _MessageExec] = []
        self._reqs: list[MPI.Request] = []
        # (stage or message, peer's world rank) per request
        self._owner: list[tuple[_StageExec | _MessageExec, int]] = []
        self._spare: list[np.ndarray] = []  # scratch bytes of finished stages, for reuse
        self._buffers: list[np.ndarray] = []  # buffers of finished collectives, for reuse
        self.check_s = 0.0  # wall seconds spent in result checks (the driver leaves them out of run times)

    # --- control (small messages, rank 0 coordinates) --------------------------------------------

    def bcast(self, array: np.ndarray, what: str) -> np.ndarray:
        """Rank 0's array on every rank (uppercase, in place)."""
        return self.grid.bcast(array, what)

    def barrier(self, what: str) -> None:
        """Every rank has arrived."""
        self.grid.wait(self.grid.cart.Ibarrier(), what)

    def reduce(self, values, op: str, what: str = "a reduction of results") -> np.ndarray:
        """Element-wise sum, max or min over ranks, on every rank."""
        return self.grid.watchdog.allreduce(values, MPI_OPS[op], what)

    # --- data ----------------------------------------------------------------------------------

    def open(self, run: CollectiveRun) -> None:
        """Fill a buffer with the closed-form input; each chunk's region starts at the run's bounds.

        A standalone all-gather starts from the block a reduce-scatter along the reversed order
        would leave, so its regions are narrowed ahead of time.
        """
        coll = run.collective
        data = _Data(coll, self._buffer(coll), run.orders, run.bounds)
        fill_input(data.buffer, self.topology, coll, self.grid.coords, run.orders, run.bounds)
        bounds = run.bounds
        for k in range(len(bounds) - 1):
            stack = [(int(bounds[k]), int(bounds[k + 1]))]
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

    # --- engine interface ----------------------------------------------------------------------

    def start(self, run: StageRun) -> None:
        """Post the first step of a stage the engine just started."""
        if isinstance(run, MessageRun):
            self._start_message(run)
            return
        s = run.stage
        topo = self.topology
        dim = topo.dims[s.dim]
        c = self.grid.coords[s.dim]
        data = self._data[s.coll]
        stack = data.regions[s.chunk]
        if s.op == RS:
            region = stack[-1]
            stack.append(owned_region(dim.npus, c, *region))
        elif s.op == AG:
            stack.pop()
            region = stack[-1]
        else:
            region = stack[-1]
        collective = data.collective
        if s.op == A2A:
            stride = topo.group_strides(collective.dims)[s.dim]
            steps = plan_all_to_all(dim.npus, c, stride, topo.group_npus(collective.dims), *region)
        else:
            steps = plan(dim.algorithm, s.op, dim.npus, c, *region)
        scratch_elems = max(
            (sum(b - a for _, a, b in st.recvs) for st in steps if st.mode != algorithms.COPY), default=0
        )
        scratch = self._scratch(scratch_elems * collective.itemsize).view(collective.dtype)
        costs = self.cost(collective.itemsize).run_steps_ns(run)
        ex = _StageExec(run, self.grid.subcomms[s.dim], run.dim_seq % self.tag_mod, steps, costs, scratch)
        run.wall_start_s = time.perf_counter()
        self._active.append(ex)
        self._post(ex)

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
        self._owner += [(ex, peer)] * len(reqs)
        ex.pending = len(reqs)
        self._active.append(ex)

    def _finish_message(self, ex: _MessageExec) -> bool:
        """A message whose requests are done ends at max(own, peer's issue) + cost (check on receipt)."""
        ex.t_ns = max(ex.t_ns, float(ex.hdr_recv[0]))
        t_end = ex.t_ns + ex.costs[0]
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

    def _scratch(self, nbytes: int) -> np.ndarray:
        """Scratch bytes for a stage: the smallest spare that fits, else fresh memory.

        Reuse spares the page faults of fresh memory, which dominate large single-chunk stages.
        When nothing fits, the spares are dropped, so they never outnumber the stages in flight.
        """
        fits = [i for i, spare in enumerate(self._spare) if spare.nbytes >= nbytes]
        if not fits:
            self._spare = []
            return np.empty(nbytes, np.uint8)
        return self._spare.pop(min(fits, key=lambda i: self._spare[i].nbytes))[:nbytes]

    def _post(self, ex: _StageExec) -> None:
        step = ex.steps[ex.k]
        buf = self._data[ex.run.stage.coll].buffer
        comm, tag = ex.comm, ex.tag
        ex.hdr_send[0] = ex.t_ns
        world = self.grid.world_ranks[ex.run.stage.dim]
        offset = 0
        for i, (peer, a, b) in enumerate(step.recvs):
            self._reqs.append(comm.Irecv(ex.hdr_recv[i : i + 1], peer, tag))
            if step.mode == algorithms.COPY:
                self._reqs.append(comm.Irecv(buf[a:b], peer, tag))
            else:
                self._reqs.append(comm.Irecv(ex.scratch[offset : offset + b - a], peer, tag))
                offset += b - a
            self._owner += [(ex, world[peer])] * 2
        for peer, a, b in step.sends:
            self._reqs.append(comm.Isend(ex.hdr_send, peer, tag))
            self._reqs.append(comm.Isend(buf[a:b], peer, tag))
            self._owner += [(ex, world[peer])] * 2
        ex.pending = 2 * (len(step.recvs) + len(step.sends))

    def _finish_step(self, ex: _StageExec | _MessageExec) -> bool:
        """Apply a step whose messages have all arrived; False while its wall deadline is ahead."""
        if isinstance(ex, _MessageExec):
            return self._finish_message(ex)
        n_recvs = len(ex.steps[ex.k].recvs)
        sent_ns = max(ex.hdr_recv[:n_recvs].tolist(), default=-math.inf)
        t_next = max(ex.t_ns, sent_ns + ex.costs[ex.k])
        if self.clock.now_ns() < t_next:
            return False
        step = ex.steps[ex.k]
        if step.mode != algorithms.COPY:
            data = self._data[ex.run.stage.coll]
            buf = data.buffer
            ufunc = REDUCE_UFUNCS[data.collective.redop]
            offset = 0
            for _, a, b in step.recvs:
                part = ex.scratch[offset : offset + b - a]
                if step.mode == algorithms.REDUCE:
                    ufunc(buf[a:b], part, out=buf[a:b])
                else:
                    buf[a:b] = part
                offset += b - a
        ex.t_ns = t_next
        ex.k += 1
        if ex.k == len(ex.steps):
            ex.end_ns = t_next
            if ex.scratch.base is not None:
                self._spare.append(ex.scratch.base)  # the bytes it was cut from
            ex.run.wall_end_s = time.perf_counter()
        else:
            ex.bound_ns = ex.lower_bound_ns()
            self._post(ex)
        return True

    def _progress(self) -> bool:
        """Test every pending request once; finish the steps that are complete."""
        progressed = False
        if self._reqs:
            try:
                done = MPI.Request.Testsome(self._reqs)
            except MPI.Exception as exc:  # MPI saw a peer fail (when the launcher lets us live)
                raise Stalled(
                    f"rank {self.grid.rank}: a message failed ({exc.Get_error_string()}) "
                    f"{self._waiting_for()}; a peer died"
                ) from None
            if done:
                progressed = True
                finished = set(done)
                for i in done:
                    self._owner[i][0].pending -= 1
                keep = [i for i in range(len(self._reqs)) if i not in finished]
                self._reqs = [self._reqs[i] for i in keep]
                self._owner = [self._owner[i] for i in keep]
        for ex in self._active:
            while ex.end_ns is None and ex.pending == 0 and self._finish_step(ex):
                progressed = True
        return progressed

    def _waiting_for(self) -> str:
        """What this rank waits for: the peers of its incomplete messages, and their stages."""
        peers = sorted({peer for _, peer in self._owner})
        ex = self._owner[0][0] if self._owner else (self._active[0] if self._active else None)
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
        collective = self._data[s.coll].collective
        return (
            f"waiting for rank(s) {', '.join(map(str, peers))} in collective {s.coll} "
            f"({collective.op} of {collective.size_bytes} B), chunk {s.chunk}, {s.op} on dim {s.dim}"
        )

    def wait_next(self, horizon_ns: float) -> tuple[float, list[StageRun]]:
        """Progress until the earliest completion (or the horizon) is certain; see `Engine.run`.

        A completion at virtual time t is certain once no running stage can still end before t
        (its remaining step costs say so). Both clocks decide alike, so every rank takes the
        same decisions; the wall clock only holds each step (and each timer) until its deadline.
        """
        backoff = self.grid.watchdog.backoff(self._waiting_for)
        progressed = True
        first_end, bound = math.inf, math.inf
        while True:
            if progressed:  # nothing else changes what is certain
                first_end, bound = math.inf, math.inf
                for ex in self._active:
                    if ex.end_ns is None:
                        bound = min(bound, ex.bound_ns)
                    else:
                        first_end = min(first_end, ex.end_ns)
            if first_end <= horizon_ns and first_end < bound:
                done = [ex for ex in self._active if ex.end_ns == first_end]
                self._active = [ex for ex in self._active if ex.end_ns != first_end]
                return first_end, [ex.run for ex in done]
            if horizon_ns < first_end and horizon_ns < bound and self.clock.now_ns() >= horizon_ns:
                return horizon_ns, []
            progressed = self._progress()
            if progressed:
                backoff.reset()
                continue
            dues = [ex.t_ns + ex.costs[ex.k] for ex in self._active if ex.end_ns is None and ex.pending == 0]
            if horizon_ns < math.inf:
                dues.append(horizon_ns)
            wait_s = self.clock.seconds_until(min(dues)) if dues and self.clock.name == "wall" else None
            backoff.pause(wait_s)
            if wait_s is not None and wait_s > 0:
                backoff.reset()  # waiting for our own deadline: silence counts from when it passes


class MpiBackend:
    """Where the emulator runs: one MPI rank per NPU on a Cartesian grid it owns."""

    name = "mpi"

    def __init__(self, comm: MPI.Intracomm, topology: Topology, timeout_s: float):
        self.topology = topology
        self.world = Watchdog(comm, timeout_s)  # start-up and the last barrier, before and after the grid
        # MPI's communicator constructors block; line the ranks up quietly first, so a rank that is
        # frozen or dead at start-up is named within the timeout instead of hanging everybody
        self.world.wait(comm.Ibarrier(), "the start-up barrier")
        self.grid = CartGrid(comm, topology, timeout_s)
        self.rank = self.grid.rank

    def transport(self, config: RunConfig) -> MpiTransport:
        """An MPI transport on this grid with these settings."""
        return MpiTransport(self.grid, config)

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
                self.grid.watchdog.wait(self.grid.cart.Ibarrier(), "the final barrier", patient=True)
        finally:
            self.grid.close()
            self.world.close()
