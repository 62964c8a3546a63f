"""The per-NPU model: every NPU's engine in one process, timed exactly as the emulator times it.

The one-NPU model (`model`) relies on symmetry: every NPU does the same at the same time.
Stragglers (late NPUs, scaled links, slow compute) break it. Here each NPU is a greenlet
running the same driver code as an MPI rank, with an `NpuTransport` in place of `MpiTransport`:
control calls meet, and a stage's steps exchange their send times (no data) through one
mailbox. A step ends once its own sends are done and every message it receives has arrived
(send time plus step time): the emulator's rules, so the two agree exactly. NPUs that differ
start each dim's stages in one agreed order (`engine.Engine.agree`).

Messages match as MPI matches them: by dim, receiver, sender and tag (the stage's start number
on its dim), first sent first received. One NPU runs at a time, until it waits; nothing is
decided by wall time, so a run is deterministic.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import greenlet
import numpy as np

from .algorithms import plan, plan_all_to_all
from .collectives import owned_region, rs_dims
from .config import RunConfig
from .cost import A2A, AG, RS, CostModels, LinkScales
from .engine import CollectiveRun, Engine, MessageRun, StageRun, VirtualClock
from .errors import UsageError
from .model import ModelTransport
from .network import IDEAL
from .policies import default_scheduler, make_scheduler
from .topology import Topology

T = TypeVar("T")
MAX_NPUS = 4096  # NPUs one process runs at once (the per-NPU model is for what breaks symmetry)


class Stalled(RuntimeError):
    """No NPU can move: a wait that nothing will end (a deadlock), or the job was abandoned."""


class Greenlets:
    """NPUs as greenlets in one process, one running at a time until it waits, and their meetings.

    The worlds of the per-NPU models (`NpuWorld` here, `npunet.World`) differ in what wakes a
    waiting NPU; what they share is here: `run` switches to the ready NPUs in the order they became
    ready, asks `_idle` when none is, and says what they wait for (`_stalled`) when none can move.
    Nothing depends on wall time, so a run is deterministic.

    Args:
        n: the NPUs.
    """

    def __init__(self, n: int):
        self.n = n
        self.ready: deque[int] = deque()
        self.arrived: list[int] = []  # NPUs at the current meeting
        self.met: list[Any] = []  # the last meeting's values
        self._reduction: tuple[list[Any], str, np.ndarray] | None = None  # (`reduced`: its last)
        self.slots: list[Any] = [None] * n
        self.hub: greenlet.greenlet | None = None

    def transport(self, rank: int) -> Any:
        """NPU `rank`'s transport, which its driver runs on."""
        raise NotImplementedError

    def _idle(self) -> bool:
        """No NPU is ready: wake some (True), or nothing will wake any (False, the default)."""
        return False

    def _stalled(self) -> str:
        """Why NPUs still wait once none can move (empty: every NPU finished)."""
        raise NotImplementedError

    def gather(self, rank: int, value: Any, what: str) -> list[Any]:
        """Every NPU's value, on every NPU."""
        self.slots[rank] = value
        self.arrived.append(rank)
        if len(self.arrived) < self.n:
            self._yield()
            return self.met
        self.met = list(self.slots)
        self.ready.extend(self.arrived[:-1])
        self.arrived = []
        return self.met

    def reduced(self, met: list[Any], op: str) -> np.ndarray:
        """A meeting's values reduced element-wise (sum, max or min), once for all its NPUs."""
        if self._reduction is None or self._reduction[0] is not met or self._reduction[1] != op:
            stacked = np.stack([np.asarray(v) for v in met])
            result = (
                stacked.sum(axis=0)
                if op == "sum"
                else stacked.max(axis=0)
                if op == "max"
                else stacked.min(axis=0)
            )
            self._reduction = (met, op, result)
        return self._reduction[2].copy()

    def _yield(self) -> None:
        assert self.hub is not None
        self.hub.switch()

    def run(self, body: Callable[[Any], T]) -> list[T]:
        """Run `body(transport)` on every NPU; every NPU's return, by rank. The first failure is raised."""
        results: list[Any] = [None] * self.n
        failures: list[BaseException] = []

        def npu(rank: int) -> None:
            try:
                results[rank] = body(self.transport(rank))
            except greenlet.GreenletExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - raised by run
                failures.append(exc)

        self.hub = greenlet.getcurrent()
        npus = [greenlet.greenlet(lambda r=r: npu(r), parent=self.hub) for r in range(self.n)]
        self.ready.extend(range(self.n))
        try:
            while not failures:
                if self.ready:
                    npus[self.ready.popleft()].switch()
                elif not self._idle():
                    break
        finally:
            for g in npus:  # unwind the NPUs left waiting (a failure or a deadlock)
                if g and not g.dead:
                    g.throw(greenlet.GreenletExit)
        if failures:
            raise failures[0]
        why = self._stalled()
        if why:
            raise Stalled(why)
        return results


class GreenletControl:
    """The control calls of an NPU of a `Greenlets` world: meetings of every NPU (`engine.Transport`)."""

    name = "npus"
    checks_data = False
    check_s = 0.0
    world: Any  # its `Greenlets` world
    rank: int

    def bcast(self, array: np.ndarray, what: str, patient: bool = False) -> np.ndarray:
        """Rank 0's array on every NPU, in place."""
        array[...] = self.world.gather(self.rank, array.copy(), what)[0]
        return array

    def serving(self) -> AbstractContextManager[None]:
        """Nobody needs an answer while rank 0 decides."""
        return nullcontext()

    def barrier(self, what: str) -> None:
        """Every NPU has arrived."""
        self.world.gather(self.rank, None, what)

    def reduce(self, values, op: str, what: str = "a reduction of results") -> np.ndarray:
        """Element-wise sum, max or min over NPUs, on every NPU."""
        return self.world.reduced(self.world.gather(self.rank, np.asarray(values), what), op)


class _Stage:
    """One running stage on one NPU: its step peers and times, and where it stands."""

    __slots__ = ("run", "dim", "tag", "steps", "keys", "costs", "send_ns", "extras", "k", "t_ns", "end_ns")

    def __init__(self, run: StageRun, dim: int, tag: int, steps: list, costs: tuple[float, ...], links):
        self.run, self.dim, self.tag, self.steps, self.costs = run, dim, tag, steps, costs
        self.keys: list[list[tuple]] = []  # per step, the mailbox keys of its receives
        # per step: its own sends' time; per receive: what a scaled link adds (`cost.LinkScales`)
        self.send_ns, self.extras = links
        self.k, self.t_ns = 0, run.start_ns
        self.end_ns: float | None = None

    def bound_ns(self) -> float:
        """The earliest end it can still have: the cost of its remaining steps."""
        t = self.t_ns
        for c in self.costs[self.k :]:
            t = t + c
        return t


class NpuWorld(Greenlets):
    """What the NPUs share: the mailbox and the meeting point (`Greenlets` runs them in turn).

    Each NPU runs in a greenlet until it must wait for a message or a meeting. When no NPU is
    ready while some have not finished, they wait for each other: a deadlock, an error that says
    what they wait for.

    Args:
        topology: the network.
        config: the run settings (ideal network, virtual clock).
    """

    def __init__(self, topology: Topology, config: RunConfig):
        if config.network != IDEAL:
            raise UsageError(
                f"NpuWorld times ideal links, not --network {config.network} (npunet.SharedWorld does)"
            )
        if topology.flat:
            raise UsageError("the per-NPU model (stragglers) does not run nccl dims")
        if topology.npus > MAX_NPUS:
            raise UsageError(
                f"the per-NPU model (stragglers) runs at most {MAX_NPUS} NPUs, not {topology.npus}"
            )
        super().__init__(topology.npus)
        self.topology, self.config = topology, config
        self.mail: dict[tuple, deque[float]] = defaultdict(deque)
        self.version = [0] * self.n  # per NPU, bumps at every send to it: a blocked NPU waits for it
        self.waiting: dict[int, Callable[[], str]] = {}  # NPUs blocked on the mailbox: what for
        self.cost = CostModels(topology, config.endpoint_delay_ns, config.compat, config.endpoint)
        self.links = LinkScales(self.cost, config.link_scale)
        self.plans: dict[tuple, list] = {}  # stage plans by their inputs: NPUs at one coordinate share them
        self.strides = [int(np.prod(topology.shape[:d], dtype=np.int64)) for d in range(len(topology.dims))]

    def post(self, key: tuple, t_ns: float) -> None:
        """Post a send time under its matching key, ``(receiver, dim, tag, sender)``."""
        self.mail[key].append(t_ns)
        dst = key[0]
        self.version[dst] += 1
        if self.waiting.pop(dst, None) is not None:
            self.ready.append(dst)

    def take(self, key: tuple) -> float | None:
        """The oldest send time under the key, or None if nothing came yet."""
        box = self.mail.get(key)
        if not box:
            return None
        t_ns = box.popleft()
        if not box:
            del self.mail[key]
        return t_ns

    def block(self, rank: int, seen: int, what: Callable[[], str]) -> None:
        """Wait until some NPU sends to `rank` (its version is past `seen`)."""
        if self.version[rank] == seen:
            self.waiting[rank] = what
            self._yield()

    def transport(self, rank: int) -> NpuTransport:
        """NPU `rank`'s transport."""
        return NpuTransport(self, rank)

    def _stalled(self) -> str:
        """What the first NPU left waits for, or who waits at a meeting."""
        stuck = sorted(self.waiting)
        if not stuck and not self.arrived:
            return ""
        what = self.waiting[stuck[0]]() if stuck else f"NPUs {self.arrived[:4]} wait at a meeting"
        return f"every NPU waits and none can move ({len(stuck)} on messages): {what}"


class NpuTransport(GreenletControl):
    """One NPU of the per-NPU model: the emulator's timing without data (`engine.Transport`).

    Args:
        world: what the NPUs share.
        rank: this NPU's rank (dim 0 varies fastest, as on the emulator's grid).
    """

    def __init__(self, world: NpuWorld, rank: int):
        self.world, self.rank = world, rank
        self.topology, self.config = world.topology, world.config
        self.clock = VirtualClock()
        self.cost, self.links = world.cost, world.links
        self.coords = tuple((rank // s) % d.npus for s, d in zip(world.strides, self.topology.dims))
        self._regions: dict[int, list[list[tuple[int, int]]]] = {}
        self._collectives: dict[int, CollectiveRun] = {}
        self._active: list[_Stage] = []

    # --- engine interface ------------------------------------------------------------------------

    def open(self, run: CollectiveRun) -> None:
        """Each chunk's region stack, as the emulator keeps it (an AG starts from its owned block)."""
        coll, bounds = run.collective, run.bounds.tolist()
        regions = []
        for k in range(len(bounds) - 1):
            stack = [(bounds[k], bounds[k + 1])]
            if coll.op == "all_gather":
                for d in rs_dims(self.topology, coll, run.orders[k]):
                    stack.append(owned_region(self.topology.dims[d].npus, self.coords[d], *stack[-1]))
            regions.append(stack)
        self._regions[run.coll_id] = regions
        self._collectives[run.coll_id] = run

    def close(self, run: CollectiveRun) -> None:
        """No data to check."""
        del self._regions[run.coll_id], self._collectives[run.coll_id]

    def start(self, run: StageRun) -> None:
        """Plan the stage's steps at this NPU's coordinate and send step 0's times."""
        if isinstance(run, MessageRun):
            raise UsageError("point-to-point messages do not run on the per-NPU model yet; use mpiexec")
        s = run.stage
        topo, coll = self.topology, self._collectives[s.coll].collective
        dim, c = topo.dims[s.dim], self.coords[s.dim]
        stack = self._regions[s.coll][s.chunk]
        if s.op == AG:
            stack.pop()
        lo, hi = stack[-1]
        n = hi - lo
        key = (s.dim, s.op, c, n, coll.dims if s.op == A2A else None)
        steps = self.world.plans.get(key)
        if steps is None:
            if s.op == A2A:
                stride = topo.group_strides(coll.dims)[s.dim]
                steps = plan_all_to_all(dim.npus, c, stride, topo.group_npus(coll.dims), 0, n)
            else:
                steps = plan(dim.algorithm, s.op, dim.npus, c, 0, n)
            self.world.plans[key] = steps
        if s.op == RS:
            own = owned_region(dim.npus, c, 0, n)
            stack.append((lo + own[0], lo + own[1]))
        costs = tuple(self.cost(coll.itemsize).run_steps_ns(run))
        if len(costs) != len(steps):  # (2.x's ring all-to-all: timed message by message, as the emulator)
            costs = (0.0,) * (len(steps) - 1) + (sum(costs),)
        recv_peers = [[self._peer(s.dim, p) for p, _, _ in st.recvs] for st in steps]
        send_peers = [[self._peer(s.dim, p) for p, _, _ in st.sends] for st in steps]
        links = self.links.step_times(run, coll.itemsize, self.rank, recv_peers, send_peers, costs)
        stage = _Stage(run, s.dim, run.dim_seq, steps, costs, links)
        stage.keys = [[(self.rank, s.dim, stage.tag, p) for p in peers] for peers in recv_peers]
        self._active.append(stage)
        if steps:
            self._post(stage)
        else:
            stage.end_ns = stage.bound_ns()

    def _peer(self, dim: int, coord: int) -> int:
        return self.rank + (coord - self.coords[dim]) * self.world.strides[dim]

    def _post(self, stage: _Stage) -> None:
        """Send the times of the stage's current step (the mailbox's lock held)."""
        world, dim = self.world, stage.dim
        for peer, _, _ in stage.steps[stage.k].sends:
            world.post((self._peer(dim, peer), dim, stage.tag, self.rank), stage.t_ns)

    def _progress(self) -> bool:
        """Apply every step whose send times have all come; whether any did."""
        moved = False
        world = self.world
        for stage in self._active:
            while stage.end_ns is None:
                keys = stage.keys[stage.k]
                mail = world.mail
                if not all(key in mail for key in keys) or (
                    len(set(keys)) < len(keys) and any(len(mail[key]) < keys.count(key) for key in set(keys))
                ):
                    break
                sent_ns = -math.inf
                extras = stage.extras[stage.k] if stage.extras else (0.0,) * len(keys)
                for key, extra_ns in zip(keys, extras):
                    t = world.take(key)
                    if t is not None and t + extra_ns > sent_ns:
                        sent_ns = t + extra_ns
                t = stage.t_ns
                stage.t_ns = max(t, t + stage.send_ns[stage.k], sent_ns + stage.costs[stage.k])
                stage.k += 1
                moved = True
                if stage.k == len(stage.costs):
                    stage.end_ns = stage.t_ns
                else:
                    self._post(stage)
        return moved

    def _waiting_for(self) -> str:
        waiting = [st for st in self._active if st.end_ns is None]
        if not waiting:
            return f"NPU {self.rank} waits for nothing"
        s = waiting[0].run.stage
        return f"NPU {self.rank} waits in collective {s.coll}, chunk {s.chunk}, {s.op} on dim {s.dim}"

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The earliest completions once certain (no running stage can still end before), or the horizon.

        Without `certain` (an agreed order) the earliest known completions will do.
        """
        while True:
            first_end, bound = math.inf, math.inf
            for stage in self._active:
                if stage.end_ns is None:
                    bound = min(bound, stage.bound_ns())
                elif stage.end_ns < first_end:
                    first_end = stage.end_ns
            if first_end <= horizon_ns and (first_end < bound or not certain and first_end < math.inf):
                done = [st for st in self._active if st.end_ns == first_end]
                self._active = [st for st in self._active if st.end_ns != first_end]
                return first_end, [st.run for st in done]
            if horizon_ns < first_end and (horizon_ns < bound or not certain):
                return horizon_ns, []  # (an agreed order times its processes apart: `engine.Process`)
            seen = self.world.version[self.rank]
            if not self._progress():
                self.world.block(self.rank, seen, self._waiting_for)


def vectorisable(config: RunConfig) -> bool:
    """Whether `NpuVectors` can time a run: not while the order of events matters.

    A gated communication scheduler starts a stage by what runs at that instant, and compute
    that shares the memory (`cost.Endpoint`) slows by what overlaps it; both need `NpuWorld`.
    """
    return not make_scheduler(default_scheduler(config)).gated and not config.endpoint.on


class NpuVectors(ModelTransport):
    """Every NPU at once: the engine runs one time per NPU in numpy vectors, under an agreed order.

    Under an agreed order (`engine.Engine.agree`) the engine is a dataflow: a stage starts at
    the later of its chunk's and its dim's previous ends, a process resumes at the later of its
    clock and its event's, so each time is a max and sum of others and the same program runs on
    every NPU. Run once with vectors for times (`engine.later`), it times all NPUs together; a
    stage's step ends come from every NPU's start by `NpuTransport`'s rules, step by step for all
    NPUs at once, as gathers over per-step peer tables. It equals `NpuWorld` exactly (a test).
    A stage's record keeps NPU 0's times once the engine has processed it (only stages in flight
    hold vectors), and `npu0` leaves NPU 0's view of the rest, as the emulator's rank 0 reports it.

    Args:
        topology: the network.
        config: the run settings (ideal network, virtual clock).
    """

    def __init__(self, topology: Topology, config: RunConfig):
        super().__init__(topology, config)
        topo, self.n = topology, topology.npus
        ranks = np.arange(self.n)
        self.strides = [int(np.prod(topo.shape[:d], dtype=np.int64)) for d in range(len(topo.dims))]
        self.coords = [(ranks // self.strides[d]) % dim.npus for d, dim in enumerate(topo.dims)]
        self.links = LinkScales(self.cost, config.link_scale)
        self.factors = [np.ones(self.n) for _ in topo.dims]
        for d, rank, f in config.link_scale:
            self.factors[d][rank] = f
        self.issue_ns = np.zeros(self.n)  # when each NPU starts its work (a late NPU later)
        for rank, delay_ns in config.npu_delay_ns:
            self.issue_ns[rank] = delay_ns
        # per chunk: its size and the dims it has reduce-scattered over; what that leaves every NPU
        self._regions: dict[int, list[tuple[int, list[int]]]] = {}
        self._sizes: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._colls: dict[int, CollectiveRun] = {}
        self._tables: dict[tuple, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}  # (`_step_tables`)
        self._done: deque[tuple[np.ndarray, StageRun]] = deque()
        self._returned: StageRun | None = None  # the last stage `wait_next` returned
        self.npu_end_ns = np.full(self.n, -math.inf)  # each NPU's latest stage end so far

    def _size(self, elems: int, dims: tuple[int, ...]) -> np.ndarray:
        """Every NPU's region size in a chunk of `elems` reduce-scattered over `dims` in turn.

        Each step keeps `collectives.owned_region` of the region at the NPU's coordinate; only
        sizes matter to the step plans, so chunks of one size share these arrays.
        """
        size = self._sizes.get((elems, dims))
        if size is None:
            if not dims:
                size = np.full(self.n, elems)
            else:
                d = dims[-1]
                p, c = self.topology.dims[d].npus, self.coords[d]
                q, r = np.divmod(self._size(elems, dims[:-1]), p)
                size = q + np.minimum(c + 1, r) - np.minimum(c, r)
            self._sizes[elems, dims] = size
        return size

    def open(self, run: CollectiveRun) -> None:
        """Each chunk's size and reduce-scatter path, as `NpuTransport.open` keeps its regions."""
        coll, sizes = run.collective, np.diff(run.bounds).tolist()
        paths = [
            rs_dims(self.topology, coll, run.orders[k]) if coll.op == "all_gather" else []
            for k in range(len(sizes))
        ]
        self._regions[run.coll_id] = [(m, list(path)) for m, path in zip(sizes, paths)]
        self._colls[run.coll_id] = run

    def close(self, run: CollectiveRun) -> None:
        """No data to check."""
        del self._regions[run.coll_id], self._colls[run.coll_id]

    def start(self, run: StageRun) -> None:
        """Every NPU's end of the stage, from every NPU's start (`run.start_ns`)."""
        if isinstance(run, MessageRun):
            raise UsageError("point-to-point messages do not run on the per-NPU model yet; use mpiexec")
        s, n = run.stage, self.n
        coll = self._colls[s.coll].collective
        elems, path = self._regions[s.coll][s.chunk]
        if s.op == AG:
            path.pop()
        size = self._size(elems, tuple(path))
        if s.op == RS:
            path.append(s.dim)
        tables = self._step_tables(s.dim, s.op, size, coll.dims if s.op == A2A else None)
        costs = self.cost(coll.itemsize).run_steps_ns(run)
        f_d = self.factors[s.dim]
        fs = np.unique(f_d)
        extras = np.array([self.links.factor_extra_ns(run, coll.itemsize, f) for f in fs.tolist()])
        f_ext = np.append(f_d, fs[0])  # (the padding peer n: any factor, its time is -inf)
        t: np.ndarray = np.full(n, run.start_ns) if np.isscalar(run.start_ns) else np.asarray(run.start_ns)
        for k, step_ns in enumerate(costs):
            recvs, sends, sending_any = tables[k]
            t_ext = np.append(t, -math.inf)
            if len(fs) == 1:  # every link of the dim at one pace: one extra for every message
                arrival = (t_ext[recvs] + extras[0][k]).max(axis=1, initial=-math.inf)
                sending = np.where(sending_any, extras[0][k], -math.inf)
            else:  # a message gains what the slower of its ends adds
                rx = extras[np.searchsorted(fs, np.minimum(f_d[:, None], f_ext[recvs])), k]
                arrival = (t_ext[recvs] + rx).max(axis=1, initial=-math.inf)
                sx = extras[np.searchsorted(fs, np.minimum(f_d[:, None], f_ext[sends])), k]
                sending = np.where(sends < n, sx, -math.inf).max(axis=1, initial=-math.inf)
            t = np.maximum(np.maximum(t, t + (step_ns + sending)), arrival + step_ns)
        self._done.append((t, run))

    def _step_tables(
        self, d: int, op: str, size: np.ndarray, a2a_dims: tuple | None
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per step, every NPU's receive and send peers (rows padded with NPU n) and who sends.

        A step's peers follow from the NPU's coordinate on dim d and the size of its region
        (`algorithms.plan`); NPUs alike in both share a plan.
        """
        key = (d, op, size.tobytes(), a2a_dims)
        tables = self._tables.get(key)
        if tables is not None:
            return tables
        topo, n, stride, c = self.topology, self.n, self.strides[d], self.coords[d]
        dim = topo.dims[d]
        keys, group = np.unique(c * (int(size.max()) + 1) + size, return_inverse=True)
        shapes = []
        for g in range(len(keys)):
            idx = np.flatnonzero(group == g)
            cg, m = int(c[idx[0]]), int(size[idx[0]])
            if op == A2A:
                steps = plan_all_to_all(
                    dim.npus, cg, topo.group_strides(a2a_dims)[d], topo.group_npus(a2a_dims), 0, m
                )
            else:
                steps = plan(dim.algorithm, op, dim.npus, cg, 0, m)
            shapes.append((cg, idx, steps))
        tables = []
        for k in range(min(len(steps) for _, _, steps in shapes)):
            recvs = np.full((n, max(len(steps[k].recvs) for _, _, steps in shapes)), n)
            sends = np.full((n, max(len(steps[k].sends) for _, _, steps in shapes)), n)
            for cg, idx, steps in shapes:
                for j, (p, _, _) in enumerate(steps[k].recvs):
                    recvs[idx, j] = idx + (p - cg) * stride
                for j, (p, _, _) in enumerate(steps[k].sends):
                    sends[idx, j] = idx + (p - cg) * stride
            tables.append((recvs, sends, np.asarray((sends < n).any(axis=1))))
        self._tables[key] = tables
        return tables

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The next stage whose ends are known (all are, once started), or (horizon, []).

        The stage returned before has been processed by now: its record keeps NPU 0's times
        (the vectors live on where the engine still needs them: its chunk and its dim).
        """
        last = self._returned
        if last is not None:
            np.maximum(self.npu_end_ns, last.end_ns, out=self.npu_end_ns)
            last.queued_ns, last.start_ns = npu0_ns(last.queued_ns), npu0_ns(last.start_ns)
            last.end_ns = npu0_ns(last.end_ns)
            self._returned = None
        if not self._done:
            return horizon_ns, []
        t, self._returned = self._done.popleft()
        return t, [self._returned]  # type: ignore[return-value]

    def npu0(self, engine: Engine) -> float:
        """Leave NPU 0's times in the engine's collectives and clock; returns the last NPU's end."""
        self.wait_next(math.inf)  # (the last stage's record)
        last_ns = float(max(np.max(engine.now_ns), np.max(engine.last_timer_ns), self.npu_end_ns.max()))
        for coll in engine.collectives:
            coll.issued_ns, coll.end_ns = npu0_ns(coll.issued_ns), npu0_ns(coll.end_ns)
        engine.now_ns = npu0_ns(engine.now_ns)
        return last_ns


def npu0_ns(t_ns: Any) -> float:
    """NPU 0's value of a time (a scalar stands for every NPU)."""
    return float(t_ns[0]) if isinstance(t_ns, np.ndarray) else float(t_ns)
