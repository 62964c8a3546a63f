"""The MPI transport: each rank is one NPU and really moves and reduces its chunks' data.

`CartGrid` builds the Cartesian communicator and one sub-communicator per dim (in the manner of
mpi4py-fft's ``Subcomm``). Rank numbering: MPI numbers Cartesian ranks row-major (the last
Cartesian coordinate varies fastest), and the grid is created with the topology's dims reversed,
so topology dim 0 varies fastest: ``rank = c0 + P0 * (c1 + P1 * (c2 + ...))``. The NPUs of one
dim-0 group are consecutive ranks, which a block-placing launcher puts on the same host.

`MpiTransport` runs the stages the engine starts, all at once, with nonblocking uppercase calls
on numpy buffers. Every data message is preceded by an 8-byte header with the sender's virtual
send time; a step ends at ``max(own step start, header + step time)`` (virtual clock) or when
its deadline has passed in real time (wall clock). Waiting never spins: requests are tested
with ``Testsome`` and the rank sleeps, backing off, between tests.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
from mpi4py import MPI

from . import algorithms
from .algorithms import owned_region, plan, plan_all_to_all
from .analysis import summarize
from .collectives import Collective, count_wrong, fill_input
from .cost import A2A, AG, RS, CostModel
from .engine import Engine, StageRun
from .errors import UsageError
from .policies import chunk_orders
from .topology import Topology

CLOCKS = ("virtual", "wall")
REDUCE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
MIN_SLEEP_S = 20e-6
MAX_SLEEP_S = float(os.environ.get("THEMIS_MPI_MAX_SLEEP_US", "500")) * 1e-6
YIELDS = int(os.environ.get("THEMIS_MPI_YIELDS", "20"))


DEFAULT_TIMEOUT_S = 60.0
PING, PONG = 7001, 7002
PING_GRACE_S = 2.0


class Stalled(Exception):
    """No progress for longer than the timeout: a peer died or stopped responding."""


class Health:
    """Liveness pings, point to point with their own tags on the Cartesian communicator.

    Nothing else sends point to point there (it carries only control collectives, which never
    match point-to-point messages), so no extra communicator is needed. Every waiting loop
    answers pings (`service`), so a rank that is alive answers even while it waits itself; a
    rank that timed out asks everybody (`silent`) and names those that stay quiet.
    """

    active: Health | None = None  # the grid in use; its waiting loops answer pings

    def __init__(self, comm: MPI.Comm):
        self.comm = comm
        self._byte = np.zeros(1, np.uint8)
        self._replies: list[MPI.Request] = []

    def service(self) -> None:
        """Answer every ping that has arrived."""
        status = MPI.Status()
        while self.comm.Iprobe(MPI.ANY_SOURCE, PING, status):
            source = status.Get_source()
            self.comm.Recv(self._byte, source, PING)
            self._replies.append(self.comm.Isend(self._byte, source, PONG))
        if len(self._replies) > 64:
            self._replies = [r for r in self._replies if not r.Test()]

    def silent(self) -> list[int]:
        """Ranks that do not answer a ping within PING_GRACE_S."""
        me, size = self.comm.Get_rank(), self.comm.Get_size()
        waiting = set(range(size)) - {me}
        for rank in sorted(waiting):
            try:
                self._replies.append(self.comm.Isend(self._byte, rank, PING))
            except MPI.Exception:
                pass  # it stays in `waiting`
        deadline, status = time.monotonic() + PING_GRACE_S, MPI.Status()
        while waiting and time.monotonic() < deadline:
            try:
                self.service()
                while self.comm.Iprobe(MPI.ANY_SOURCE, PONG, status):
                    self.comm.Recv(self._byte, status.Get_source(), PONG)
                    waiting.discard(status.Get_source())
            except MPI.Exception:
                break
            time.sleep(1e-3)
        return sorted(waiting)

    def close(self) -> None:
        """Complete the 1-byte replies (eager sends, already delivered); forget any other."""
        if self._replies:
            MPI.Request.Testall(self._replies)
        self._replies = []


class Backoff:
    """Idle between two tests without spinning, and notice when nothing moves any more.

    The first `YIELDS` pauses give the core away (``sched_yield``), which costs little when a
    peer is runnable; after that the rank sleeps from 20 us, doubling up to `MAX_SLEEP_S`.
    `reset` after progress. A pause more than `timeout_s` after the last reset raises `Stalled`
    with the message `describe()` returns.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, describe=lambda: "waiting"):
        self.timeout_s, self.describe = timeout_s, describe
        self.reset()

    def reset(self) -> None:
        """Start over after progress."""
        self.idle, self.sleep_s, self.since = 0, MIN_SLEEP_S, time.monotonic()

    def pause(self, limit_s: float | None = None) -> None:
        """Yield or sleep once; `limit_s` caps the sleep (a wall-clock deadline is near)."""
        health = Health.active
        if health is not None:
            health.service()
        if time.monotonic() - self.since > self.timeout_s:
            raise Stalled(f"rank {MPI.COMM_WORLD.Get_rank()}: no progress for {self.timeout_s:g} s "
                          f"{self.describe()}; {lost_ranks()}")
        self.idle += 1
        if self.idle <= YIELDS:
            os.sched_yield()
            return
        time.sleep(self.sleep_s if limit_s is None else max(0.0, min(self.sleep_s, limit_s)))
        self.sleep_s = min(2 * self.sleep_s, MAX_SLEEP_S)


def lost_ranks() -> str:
    """Which ranks no longer answer, for a diagnosis."""
    health = Health.active
    silent = health.silent() if health is not None else []
    if not silent:
        return "a peer died or stopped responding"
    return f"rank(s) {', '.join(map(str, silent))} did not answer (died or stopped)"


def wait(request: MPI.Request, timeout_s: float = DEFAULT_TIMEOUT_S, what: str = "a control collective"):
    """Complete a nonblocking request without spinning: test, then sleep, backing off.

    MPICH's blocking calls busy-poll; with more ranks than cores they starve the ranks that have
    work, so even control collectives (barrier, broadcast, reductions) go through here.
    """
    backoff = Backoff(timeout_s, lambda: f"in {what}")
    try:
        while not request.Test():
            backoff.pause()
    except MPI.Exception as exc:
        raise Stalled(f"rank {MPI.COMM_WORLD.Get_rank()}: {what} failed ({exc.Get_error_string()}); "
                      "a peer died") from None


def allreduce(comm: MPI.Comm, values, op=MPI.SUM, timeout_s: float = DEFAULT_TIMEOUT_S) -> np.ndarray:
    """Element-wise reduction of a small numpy array over comm, without spinning."""
    values = np.ascontiguousarray(values)
    out = np.empty_like(values)
    wait(comm.Iallreduce(values, out, op=op), timeout_s, "a reduction of results")
    return out


class CartGrid:
    """A Cartesian communicator mirroring the topology, with one sub-communicator per dim.

    Args:
        comm: the communicator to arrange; its size must equal the topology's NPU count.
        topology: the network.
    """

    def __init__(self, comm: MPI.Comm, topology: Topology):
        if comm.Get_size() != topology.npus:
            raise UsageError(
                f"topology {topology.label()} has {topology.npus} NPUs "
                f"({'x'.join(map(str, topology.shape))}) but {comm.Get_size()} MPI ranks were started"
            )
        n = len(topology.dims)
        self.topology = topology
        self.cart = comm.Create_cart(list(reversed(topology.shape)), periods=[True] * n,
                                     reorder=False)
        self.rank = self.cart.Get_rank()
        self.coords = tuple(reversed(self.cart.Get_coords(self.rank)))
        self.subcomms = []
        self.world_ranks = []  # per dim: world rank of each sub-communicator rank
        for d in range(n):
            remain = [False] * n
            remain[n - 1 - d] = True
            sub = self.cart.Sub(remain)
            self.subcomms.append(sub)
            group, world = sub.Get_group(), comm.Get_group()
            self.world_ranks.append(MPI.Group.Translate_ranks(group, list(range(sub.Get_size())), world))
            group.Free()
            world.Free()
        self.health = Health(self.cart)
        Health.active = self.health

    def close(self) -> None:
        """Free the sub-communicators and the Cartesian communicator."""
        if Health.active is self.health:
            Health.active = None
        self.health.close()
        for sub in self.subcomms:
            sub.Free()
        self.subcomms = []
        if self.cart != MPI.COMM_NULL:
            self.cart.Free()
            self.cart = MPI.COMM_NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _StageExec:
    """The data path of one running stage: its steps, their costs and its pending requests."""

    __slots__ = ("run", "comm", "tag", "steps", "costs", "k", "t_ns", "pending", "hdr_send",
                 "hdr_recv", "scratch", "end_ns", "bound_ns")

    def __init__(self, run, comm, tag, steps, costs, scratch):
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
        self.end_ns = None
        self.bound_ns = self.lower_bound_ns()

    def lower_bound_ns(self) -> float:
        """The earliest end this stage can still have: the cost of its remaining steps."""
        t = self.t_ns
        for c in self.costs[self.k:]:
            t = t + c
        return t


class MpiTransport:
    """Executes stages on real data over the grid's sub-communicators.

    Args:
        grid: the Cartesian grid.
        cost: the cost model (step times).
        clock: virtual or wall.
        time_scale: wall seconds per emulated second (wall clock only).
        timeout_s: seconds without any progress before the rank gives up (`Stalled`).
    """

    def __init__(self, grid: CartGrid, cost: CostModel, clock: str = "virtual",
                 time_scale: float = 1.0, timeout_s: float = DEFAULT_TIMEOUT_S):
        if clock not in CLOCKS:
            raise UsageError(f"unknown clock {clock!r}; use virtual or wall")
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise UsageError(f"time scale must be > 0, got {time_scale}")
        if not timeout_s > 0:
            raise UsageError(f"timeout must be > 0 s, got {timeout_s}")
        self.grid = grid
        self.cost = cost
        self.clock = clock
        self.time_scale = time_scale
        self.timeout_s = timeout_s
        self.tag_mod = min(int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767), 1 << 20)
        self._buffers: dict[int, tuple[Collective, np.ndarray]] = {}
        self._regions: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._active: list[_StageExec] = []
        self._reqs: list[MPI.Request] = []
        self._owner: list[tuple[_StageExec, int]] = []  # (stage, peer's world rank) per request
        self._spare: list[np.ndarray] = []  # scratch bytes of finished stages, for reuse
        self.t0_wall = MPI.Wtime()

    # --- data ----------------------------------------------------------------------------------

    def attach(self, coll_id: int, collective: Collective, buffer: np.ndarray, orders) -> None:
        """Register a collective's buffer; its chunks' regions start at their chunk bounds.

        A standalone all-gather starts from the block a reduce-scatter along the reversed order
        would leave, so its regions are narrowed ahead of time.
        """
        self._buffers[coll_id] = (collective, buffer)
        bounds = collective.chunk_bounds()
        topo = self.grid.topology
        for k in range(collective.n_chunks):
            stack = [(int(bounds[k]), int(bounds[k + 1]))]
            if collective.op == "all_gather":
                for d in reversed([int(x) for x in orders[k]]):
                    if d in collective.dims and topo.dims[d].npus > 1:
                        stack.append(owned_region(topo.dims[d].npus, self.grid.coords[d], *stack[-1]))
            self._regions[(coll_id, k)] = stack

    def detach(self, coll_id: int) -> None:
        """Forget a finished collective's buffer and regions."""
        collective, _ = self._buffers.pop(coll_id)
        for k in range(collective.n_chunks):
            self._regions.pop((coll_id, k), None)

    def now_ns(self) -> float:
        """Wall time since the transport started, in emulated ns."""
        return (MPI.Wtime() - self.t0_wall) / self.time_scale * 1e9

    # --- engine interface ----------------------------------------------------------------------

    def start(self, run: StageRun) -> None:
        """Post the first step of a stage the engine just started."""
        s = run.stage
        topo = self.grid.topology
        dim = topo.dims[s.dim]
        c = self.grid.coords[s.dim]
        stack = self._regions[(s.coll, s.chunk)]
        if s.op == RS:
            region = stack[-1]
            stack.append(owned_region(dim.npus, c, *region))
        elif s.op == AG:
            stack.pop()
            region = stack[-1]
        else:
            region = stack[-1]
        collective, _ = self._buffers[s.coll]
        if s.op == A2A:
            stride = topo.group_strides(collective.dims)[s.dim]
            steps = plan_all_to_all(dim.npus, c, stride, topo.group_npus(collective.dims), *region)
        else:
            steps = plan(dim.algorithm, s.op, dim.npus, c, *region)
        scratch_elems = max((sum(b - a for _, a, b in st.recvs) for st in steps
                             if st.mode != algorithms.COPY), default=0)
        scratch = self._scratch(scratch_elems * collective.itemsize).view(collective.dtype)
        ex = _StageExec(run, self.grid.subcomms[s.dim], run.dim_seq % self.tag_mod, steps,
                        self.cost.step_times_ns(s.dim, s.op, s.full_elems), scratch)
        run.wall_start_s = MPI.Wtime()
        self._active.append(ex)
        self._post(ex)

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
        _, buf = self._buffers[ex.run.stage.coll]
        comm, tag = ex.comm, ex.tag
        ex.hdr_send[0] = ex.t_ns
        world = self.grid.world_ranks[ex.run.stage.dim]
        offset = 0
        for i, (peer, a, b) in enumerate(step.recvs):
            self._reqs.append(comm.Irecv(ex.hdr_recv[i:i + 1], peer, tag))
            if step.mode == algorithms.COPY:
                self._reqs.append(comm.Irecv(buf[a:b], peer, tag))
            else:
                self._reqs.append(comm.Irecv(ex.scratch[offset:offset + b - a], peer, tag))
                offset += b - a
            self._owner += [(ex, world[peer])] * 2
        for peer, a, b in step.sends:
            self._reqs.append(comm.Isend(ex.hdr_send, peer, tag))
            self._reqs.append(comm.Isend(buf[a:b], peer, tag))
            self._owner += [(ex, world[peer])] * 2
        ex.pending = 2 * (len(step.recvs) + len(step.sends))

    def _finish_step(self, ex: _StageExec) -> bool:
        """Apply a step whose messages have all arrived; False while its wall deadline is ahead."""
        n_recvs = len(ex.steps[ex.k].recvs)
        sent_ns = max(ex.hdr_recv[:n_recvs].tolist(), default=-math.inf)
        t_next = max(ex.t_ns, sent_ns + ex.costs[ex.k])
        if self.clock == "wall" and self.now_ns() < t_next:
            return False
        step = ex.steps[ex.k]
        if step.mode != algorithms.COPY:
            collective, buf = self._buffers[ex.run.stage.coll]
            ufunc = REDUCE_UFUNCS[collective.redop]
            offset = 0
            for _, a, b in step.recvs:
                part = ex.scratch[offset:offset + b - a]
                if step.mode == algorithms.REDUCE:
                    ufunc(buf[a:b], part, out=buf[a:b])
                else:
                    buf[a:b] = part
                offset += b - a
        ex.t_ns = t_next
        ex.k += 1
        if ex.k == len(ex.steps):
            ex.end_ns = t_next
            self._spare.append(ex.scratch.base)  # the bytes it was cut from
            ex.run.wall_end_s = MPI.Wtime()
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
                raise Stalled(f"rank {self.grid.rank}: a message failed ({exc.Get_error_string()}) "
                              f"{self._waiting_for()}; a peer died") from None
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
        collective, _ = self._buffers[s.coll]
        return (f"waiting for rank(s) {', '.join(map(str, peers))} in collective {s.coll} "
                f"({collective.op} of {collective.size_bytes} B), chunk {s.chunk}, {s.op} on dim {s.dim}")

    def wait_next(self, horizon_ns: float):
        """Progress until the earliest completion (or the horizon) is certain; see `Engine.run`.

        A completion at virtual time t is certain once no running stage can still end before t
        (its remaining step costs say so). Both clocks decide alike, so every rank takes the
        same decisions; the wall clock only holds each step until its deadline has passed.
        """
        backoff = Backoff(self.timeout_s, self._waiting_for)
        wall = self.clock == "wall"
        progressed = True
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
            if horizon_ns < first_end and horizon_ns < bound:
                if not wall or self.now_ns() >= horizon_ns:
                    return horizon_ns, []
            progressed = self._progress()
            if progressed:
                backoff.reset()
                continue
            limit_s = None
            if wall:  # sleep no later than the nearest deadline
                dues = [ex.t_ns + ex.costs[ex.k] for ex in self._active
                        if ex.end_ns is None and ex.pending == 0]
                if dues:
                    limit_s = (min(dues) - self.now_ns()) * 1e-9 * self.time_scale
            backoff.pause(limit_s)


def broadcast_orders(grid: CartGrid, policy: str, collective: Collective, given=None,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> np.ndarray:
    """Every chunk's order, chosen by the coordinator (rank 0) and broadcast as one int32 array.

    `given` orders (a replay's) replace the policy's choice.
    """
    orders = np.empty((collective.n_chunks, len(grid.topology.dims)), dtype=np.int32)
    if grid.rank == 0:
        orders[:] = given if given is not None else chunk_orders(
            policy, grid.topology, collective.op, collective.size_bytes, collective.n_chunks,
            collective.dims)
    wait(grid.cart.Ibcast(orders, root=0), timeout_s, "the broadcast of the chunk orders")
    return orders


def run_collective(grid: CartGrid, collective: Collective, policy: str, intra: str = "fifo",
                   active_per_dim: int = 1, clock: str = "virtual", time_scale: float = 1.0,
                   endpoint_delay_ns: float = 0.0, buffer: np.ndarray | None = None,
                   check: bool = True, orders=None,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[dict, Engine]:
    """Run one collective on real data; every rank returns the same summary row.

    Returns:
        The summary (see `analysis.summarize`) with ``wrong`` (summed over ranks, None when not
        checked), ``wall_s`` (slowest rank) and ``clock``, and the engine holding this rank's
        stage records (with ``t0_wall_s``, the wall time the collective was issued). Under the
        wall clock ``time_us`` is the measured wall time divided by the time scale.
    """
    topo = grid.topology
    orders = broadcast_orders(grid, policy, collective, orders, timeout_s)
    if buffer is None:
        buffer = np.empty(collective.count, dtype=collective.dtype)
    fill_input(buffer, topo, collective, grid.coords, orders)
    cost = CostModel(topo, collective.itemsize, endpoint_delay_ns)
    engine = Engine(topo, intra, active_per_dim)
    transport = MpiTransport(grid, cost, clock, time_scale, timeout_s)
    wait(grid.cart.Ibarrier(), timeout_s, "the barrier before the collective")
    t0 = engine.t0_wall_s = transport.t0_wall = MPI.Wtime()
    run = engine.issue(collective, orders)
    transport.attach(run.coll_id, collective, buffer, orders)
    engine.run(transport)
    wall_s = MPI.Wtime() - t0
    transport.detach(run.coll_id)
    slowest = float(allreduce(grid.cart, [wall_s], MPI.MAX, timeout_s)[0])
    row = summarize(run, topo, cost, slowest / time_scale * 1e6 if clock == "wall" else None)
    if clock == "wall":
        row["virtual_us"] = (run.end_ns - run.issued_ns) / 1e3
    wrong = None
    if check:
        mine = count_wrong(buffer, topo, collective, grid.coords, orders)
        wrong = int(allreduce(grid.cart, np.array([mine], np.int64), timeout_s=timeout_s)[0])
    row.update(policy=policy, intra=intra, clock=clock, wrong=wrong, wall_s=slowest)
    return row, engine
