"""Every NPU as a greenlet in one process, and the per-NPU model of ``ideal`` links (`NpuWorld`).

`Greenlets` runs every NPU's driver, the same code as an MPI rank's, one NPU at a time until it
waits; its meetings (`GreenletControl`: bcast, barrier, reduce) stand for MPI's control calls.
Two worlds build on it: `NpuWorld` here, and `world.World` (every NPU's links under a sharing
rule). Nothing is decided by wall time, so a run is deterministic.

`NpuWorld` times stragglers on ``ideal`` links exactly as the emulator does: a stage's steps
exchange their send times (no data) through one mailbox, and a step ends once its own sends are
done and every message it receives has arrived (send time plus step time, plus what a scaled
link adds: `ideal.LinkScales`). Messages match as MPI matches them: by dim, receiver, sender and
tag (the stage's start number on its dim), first sent first received. NPUs that differ start
each dim's stages in one agreed order (`engine.Engine.agree`). The planner runs it where order
matters (a gated communication scheduler, compute that shares the memory); elsewhere the same
rule runs vectorised (`vectors`). A point-to-point message posts its issue time to its peer
through the same mailbox and ends on both NPUs at ``max(send issue, receive issue) + cost``, as
on the emulator and the linked ranks (`run.linked`): so per-rank graphs with messages run here
by every NPU, each collective's steps waiting for its peers (the planner times them by the
linked ranks; tests compare the two).

Shortcuts: none; a waiting NPU yields until a message to it comes (`NpuWorld.block`).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import greenlet
import numpy as np

from ..algorithms import plan, plan_all_to_all
from ..collectives import owned_region, rs_dims
from ..config import RunConfig
from ..cost import A2A, AG, RS
from ..engine import CollectiveRun, Engine, MessageRun, StageRun, VirtualClock, reduced_span
from ..errors import Stalled, UsageError
from ..topology import Topology
from .ideal import LinkScales
from .rules import IDEAL

T = TypeVar("T")
MAX_NPUS = 4096  # NPUs one process runs at once (the per-NPU models are for what breaks symmetry)
P2P_DIM = -1  # the mailbox's dim of a point-to-point message's issue (stages post under their dim)


def refuse_messages(run: StageRun) -> None:
    """Every NPU on ``ideal`` links (stragglers) runs no point-to-point message yet: one line."""
    if isinstance(run, MessageRun):
        raise UsageError("point-to-point messages do not run on the per-NPU model yet; use mpiexec")


def matched(rank: int, run: MessageRun, counts: dict[tuple, int]) -> tuple[tuple, int]:
    """A message side's ``(src, dst, tag)`` and its number among that side's (`counts` counts them).

    The k-th send of a pair and tag matches the k-th receive, as MPI matches them.
    """
    src, dst = (rank, run.peer) if run.send else (run.peer, rank)
    side = (src, dst, run.tag)
    k = counts.get((side, run.send), 0)
    counts[(side, run.send)] = k + 1
    return side, k


class Greenlets:
    """NPUs as greenlets in one process, one running at a time until it waits, and their meetings.

    The worlds of the per-NPU models (`NpuWorld` here, `world.World`) differ in what wakes a
    waiting NPU; what they share is here: `run` switches to the ready NPUs in the order they became
    ready, asks `_idle` when none is, and says what they wait for (`_stalled`) when none can move.
    Nothing depends on wall time, so a run is deterministic.

    Args:
        n: the NPUs.
        members: the NPUs that run, each standing for `weights` NPUs (`classes.Classes`: one
            per class); None: every NPU, each for itself.
        weights: per member, the NPUs it stands for (a sum over NPUs counts it so often).
        keep: the NPUs whose result is read (NPU 0 on the model, the rank itself under MPI): the
            others keep no engine records (`engine.Engine.keeps_records`), so a long run's
            memory does not grow with NPUs x stages. None: every NPU's.
    """

    def __init__(
        self,
        n: int,
        members: Sequence[int] | None = None,
        weights: np.ndarray | None = None,
        keep: Collection[int] | None = None,
    ):
        self.n = n
        self.members = range(n) if members is None else members
        self.weights = weights
        self.keep = None if keep is None else frozenset(keep)
        self.ready: deque[int] = deque()
        self.arrived: list[int] = []  # NPUs at the current meeting
        self.met: list[Any] = []  # the last meeting's values
        self._reduction: tuple[list[Any], str, np.ndarray] | None = None  # (`reduced`: its last)
        self.slots: list[Any] = [None] * n
        self.hub: greenlet.greenlet | None = None

    def kept(self, rank: int) -> bool:
        """Whether NPU `rank`'s result is kept (`keep`)."""
        return self.keep is None or rank in self.keep

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
        if len(self.arrived) < len(self.members):
            self._yield()
            return self.met
        self.met = [self.slots[r] for r in self.members]
        self.ready.extend(self.arrived[:-1])
        self.arrived = []
        return self.met

    def reduced(self, met: list[Any], op: str) -> np.ndarray:
        """A meeting's values reduced element-wise (sum, max or min), once for all its NPUs."""
        if self._reduction is None or self._reduction[0] is not met or self._reduction[1] != op:
            stacked = np.stack([np.asarray(v) for v in met])
            result = (
                (stacked.sum(axis=0) if self.weights is None else np.tensordot(self.weights, stacked, axes=1))
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
        """Run `body(transport)` on every member NPU; their returns, by rank (None: not a member).

        The first failure is raised.
        """
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
        npus = {r: greenlet.greenlet(lambda r=r: npu(r), parent=self.hub) for r in self.members}
        self.ready.extend(self.members)
        try:
            while not failures:
                if self.ready:
                    npus[self.ready.popleft()].switch()
                elif not self._idle():
                    break
        finally:
            for g in npus.values():  # unwind the NPUs left waiting (a failure or a deadlock)
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
    config: RunConfig

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

    @property
    def issue_ns(self) -> float:
        """When this NPU starts its work (a late NPU later)."""
        return self.config.late_ns(self.rank)

    @property
    def ranks(self) -> int:
        """This NPU's rank."""
        return self.rank

    @property
    def link_bytes(self) -> list[float] | None:
        """Bytes each of this NPU's links carried, where the world's links know them."""
        return None

    def span_ns(self, engine: Engine) -> tuple[float, float]:
        """The run's first issue and last end over every NPU of the world (a meeting of all)."""
        return reduced_span(self.reduce, engine)

    def replaying(self, timer: Any) -> GreenletControl:
        """Never asked: an NPU of a world is timed by the world itself."""
        raise RuntimeError("an NPU of a world is not replayed")


class _Stage:
    """One running stage on one NPU: its step peers and times, and where it stands."""

    __slots__ = ("run", "dim", "tag", "steps", "keys", "costs", "send_ns", "extras", "k", "t_ns", "end_ns")

    def __init__(self, run: StageRun, dim: int, tag: int, steps: list, costs: tuple[float, ...], links):
        self.run, self.dim, self.tag, self.steps, self.costs = run, dim, tag, steps, costs
        self.keys: list[list[tuple]] = []  # per step, the mailbox keys of its receives
        # per step: its own sends' time; per receive: what a scaled link adds (`ideal.LinkScales`)
        self.send_ns, self.extras = links
        self.k, self.t_ns = 0, run.start_ns
        self.end_ns: float | None = None

    def bound_ns(self) -> float:
        """The earliest end it can still have: the cost of its remaining steps."""
        t = self.t_ns
        for c in self.costs[self.k :]:
            t = t + c
        return t


class _Message:
    """One side of a point-to-point message on one NPU: the mailbox key of its peer's issue, its cost."""

    __slots__ = ("run", "key", "cost_ns", "end_ns")

    def __init__(self, run: MessageRun, key: tuple, cost_ns: float):
        self.run, self.key, self.cost_ns = run, key, cost_ns
        self.end_ns: float | None = None

    def bound_ns(self) -> float:
        """The earliest end it can still have: its peer issued no later than this side."""
        return self.run.start_ns + self.cost_ns


class NpuWorld(Greenlets):
    """What the NPUs share: the mailbox and the meeting point (`Greenlets` runs them in turn).

    Each NPU runs in a greenlet until it must wait for a message or a meeting. When no NPU is
    ready while some have not finished, they wait for each other: a deadlock, an error that says
    what they wait for.

    Args:
        topology: the network.
        config: the run settings (ideal network, virtual clock).
        keep: the NPUs whose result is read (`Greenlets`); the others return None.
    """

    def __init__(self, topology: Topology, config: RunConfig, keep: Collection[int] | None = None):
        if config.network != IDEAL:
            raise UsageError(f"NpuWorld times ideal links, not --network {config.network} (world.World does)")
        if topology.flat:
            raise UsageError("the per-NPU model (stragglers) does not run nccl dims")
        if topology.npus > MAX_NPUS:
            raise UsageError(
                f"the per-NPU model (stragglers) runs at most {MAX_NPUS} NPUs, not {topology.npus}"
            )
        super().__init__(topology.npus, keep=keep)
        self.topology, self.config = topology, config
        self.mail: dict[tuple, deque[float]] = defaultdict(deque)
        self.version = [0] * self.n  # per NPU, bumps at every send to it: a blocked NPU waits for it
        self.waiting: dict[int, Callable[[], str]] = {}  # NPUs blocked on the mailbox: what for
        self.cost = config.costs(topology)
        self.links = LinkScales(self.cost, config.link_scale)
        self.plans: dict[tuple, list] = {}  # stage plans by their inputs: NPUs at one coordinate share them
        self.strides = [int(np.prod(topology.shape[:d], dtype=np.int64)) for d in range(len(topology.dims))]

    def post(self, key: tuple, t_ns: float) -> None:
        """Post a send time under its matching key, ``(receiver, dim, tag, sender)``.

        A message side's issue: under ``(receiver, P2P_DIM, (src, dst, tag), k, sender)``.
        """
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

    def run(self, body: Callable[[Any], T]) -> list[T]:
        """`Greenlets.run`: the returns of the kept NPUs only (None for the others, once returned)."""
        if self.keep is None:
            return super().run(body)

        def kept_only(npu: NpuTransport) -> Any:
            result = body(npu)
            return result if self.kept(npu.rank) else None

        return super().run(kept_only)

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
        self.records_kept = world.kept(rank)  # (its engine's records: `engine.Engine.keeps_records`)
        self.coords = tuple((rank // s) % d.npus for s, d in zip(world.strides, self.topology.dims))
        self._regions: dict[int, dict[int, list[tuple[int, int]]]] = {}  # per collective, per started chunk
        self._collectives: dict[int, CollectiveRun] = {}
        self._active: list[_Stage | _Message] = []
        self._messages: dict[tuple, int] = {}  # per message side: the messages issued (`matched`)

    # --- engine interface ------------------------------------------------------------------------

    def open(self, run: CollectiveRun) -> None:
        """The collective's chunks get their region stacks as they start (`_stack`)."""
        self._regions[run.coll_id] = {}
        self._collectives[run.coll_id] = run

    def _stack(self, coll_id: int, chunk: int) -> list[tuple[int, int]]:
        """A chunk's region stack, as the emulator keeps it (an AG starts from its owned block).

        Made at the chunk's first stage, not at the collective's issue: a collective waiting in
        the queues holds none (memory, with every NPU's collectives in flight).
        """
        regions = self._regions[coll_id]
        stack = regions.get(chunk)
        if stack is None:
            run = self._collectives[coll_id]
            coll, (lo, hi) = run.collective, run.bounds[chunk : chunk + 2].tolist()
            stack = [(lo, hi)]
            if coll.op == "all_gather":
                for d in rs_dims(self.topology, coll, run.orders[chunk]):
                    stack.append(owned_region(self.topology.dims[d].npus, self.coords[d], *stack[-1]))
            regions[chunk] = stack
        return stack

    def close(self, run: CollectiveRun) -> None:
        """No data to check."""
        del self._regions[run.coll_id], self._collectives[run.coll_id]

    def start(self, run: StageRun) -> None:
        """Plan the stage's steps at this NPU's coordinate and send step 0's times (a message: its issue)."""
        if isinstance(run, MessageRun):
            self._message(run)
            return
        s = run.stage
        topo, coll = self.topology, self._collectives[s.coll].collective
        dim, c = topo.dims[s.dim], self.coords[s.dim]
        stack = self._stack(s.coll, s.chunk)
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
        costs = tuple(self.cost(s.itemsize).run_steps_ns(run))
        if len(costs) != len(steps):  # (2.x's ring all-to-all: timed message by message, as the emulator)
            costs = (0.0,) * (len(steps) - 1) + (sum(costs),)
        recv_peers = [[self._peer(s.dim, p) for p, _, _ in st.recvs] for st in steps]
        send_peers = [[self._peer(s.dim, p) for p, _, _ in st.sends] for st in steps]
        links = self.links.step_times(run, s.itemsize, self.rank, recv_peers, send_peers, costs)
        stage = _Stage(run, s.dim, run.dim_seq, steps, costs, links)
        stage.keys = [[(self.rank, s.dim, stage.tag, p) for p in peers] for peers in recv_peers]
        self._active.append(stage)
        if steps:
            self._post(stage)
        else:
            stage.end_ns = stage.bound_ns()

    def _message(self, run: MessageRun) -> None:
        """Post this side's issue to the peer; it ends once the peer's issue is in (`_progress`)."""
        if self.links:
            raise UsageError("point-to-point messages do not run over scaled links (--link-scale) here")
        side, k = matched(self.rank, run, self._messages)
        self.world.post((run.peer, P2P_DIM, side, k, self.rank), run.start_ns)
        cost_ns = self.cost(1).p2p_ns(run.path, run.nbytes)
        self._active.append(_Message(run, (self.rank, P2P_DIM, side, k, run.peer), cost_ns))

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
            if isinstance(stage, _Message):
                peer_ns = world.take(stage.key) if stage.end_ns is None else None
                if peer_ns is not None:
                    stage.end_ns = max(stage.run.start_ns, peer_ns) + stage.cost_ns
                    moved = True
                continue
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
        if isinstance(waiting[0], _Message):
            run = waiting[0].run
            return f"NPU {self.rank} waits for NPU {run.peer}'s side of a message (tag {run.tag})"
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
