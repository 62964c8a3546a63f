"""Every NPU's engine and links at once, on one event loop, under any rule that routes (`World`).

One NPU's view is exact only when every NPU does the same. Point-to-point messages load only
their sender's and receiver's links, per-rank graphs load NPUs unevenly, stragglers put them out
of step, and under ASTRA-sim 2.x's backend halving-doubling on a Ring sends some NPUs' messages
clockwise and others' counter-clockwise (`routes.uneven_dims`). There every NPU runs: its engine
in a greenlet, its stages and messages as flows of the run's rule over every NPU's links
(`routes.NpuRoutes`), all on one time-ordered loop (`events.EventLoop`): events of one instant
in the order they were scheduled, and an NPU whose stage ended runs before the next instant (the
next event, under 2.x: ASTRA-sim's handlers run at once). An NPU starts transfers only at its
current time, which is the loop's, so the loop is exact: no look-ahead, no rollback.

How a step waits:

- **This project's rules.** A stage step of NPU i is one transfer over i's links as one NPU's
  view spreads it (a Ring: half each way; a Switch: i's up-link, then the receivers'
  down-links; FullyConnected: the link to the peer; a shared port: i's out and the receivers'
  in). It ends when its own transfer is done **and** the transfers it receives in that step
  (the same stage on its peers, matched by the stage's key) are done, then its fixed delay.
  When every NPU does the same, each link carries what one NPU's view puts on its link of that
  kind, so both give the same times (a test). A message from a to b is one transfer over its
  dimension-ordered route; it starts once both sides have issued, and both end when it has
  arrived plus its fixed delay.
- **ASTRA-sim 2.x** (``--compat astra-sim-2 --network store-forward``), as its system layer
  does: a step on NPU i sends its messages and posts its receives at once
  (``HalvingDoubling::ready``); it ends when the messages it *receives* have arrived (at once, in
  a 0 ns event, if they came before it posted the receive: ``CommonNetworkApi::sim_recv``),
  then the endpoint delay and the reduction pass and the next step sends. Under symmetry a
  received message arrives when the NPU's own does, which is one NPU's view, so both give the
  same times there (a test).

Shortcuts: none (a step's end waits for its peers, so no rule sums ahead here); the memory of a
model run is bounded by not keeping the starts and ends the emulator's replay needs.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from ..algorithms import custom_stage
from ..config import RunConfig
from ..cost import AG, ASTRA_SIM_2, RS
from ..engine import CollectiveRun, MessageRun, StageRun, VirtualClock
from ..errors import Stalled, UsageError
from ..topology import Topology
from .classes import (
    Classes,
    Inexact,
    Split,
    Unproven,
    admitted,
    check_end,
    check_rates,
    fluid,
    message_family,
    npu_classes,
    pattern_key,
    refined,
    start_colours,
    state_classes,
    state_step,
)
from .events import EventLoop
from .greenlets import MAX_NPUS, GreenletControl, Greenlets
from .links import Flow, Step
from .replay import Replay, StageKey, stage_key
from .routes import NpuRoutes, NpuStep, astra2_anticlockwise, npu_stage_steps, step_planner, transfer_step
from .rules import IDEAL, make_rule

T = TypeVar("T")
STATE_ROUNDS = 16  # (runs classes by state may restart split: `by_state`)
STATE_BUDGET = 1  # (their NPUs summed over those runs, at most so many times every NPU: `by_state`)
PRIME_ELEMS = 1 << 20  # (the size whose all-reduce patterns classes start from: `by_classes`)


class _Npu:
    """Where one NPU's greenlet stands: stages ended and not yet taken, and what it waits for."""

    __slots__ = ("ended", "waiting")

    def __init__(self) -> None:
        self.ended: list[StageRun] = []
        self.waiting = False  # in `wait_next` (its horizon, when finite, is in `World._timed`)


class _Owner:
    """What a flow on every NPU's links belongs to: what its steps expect, and what its end means."""

    __slots__ = ()

    def begin(self, world: World, flow: Flow) -> None:
        """A step leaves: it expects nothing (a stage's step expects what it receives)."""

    def through(self, world: World, flow: Flow) -> bool:
        """Its transfers are through: it goes on now."""
        return True

    def ended(self, world: World) -> None:
        """It is over: nothing waits for it."""


class _Stage(_Owner):
    """A stage step by step on NPU `rank`'s links: the NPUs it receives from, and what it still waits for."""

    __slots__ = ("rank", "run", "key", "recvs", "consumers", "pending", "checks", "own_ns", "got")

    def __init__(self, rank: int, run: StageRun, key: StageKey, recvs: tuple, consumers: tuple, checks=None):
        self.rank, self.run, self.key, self.recvs, self.consumers = rank, run, key, recvs, consumers
        self.pending = 0  # its own transfer and the receipts of its step still to come
        self.checks = checks  # (classes by state) per step its `classes.StatePlan`
        self.own_ns = 0.0  # (classes by state) when its own transfer of the step was through
        self.got: dict[int, float] = {}  # (classes by state) when each sender's was

    def begin(self, world: World, flow: Flow) -> None:
        world.expect(flow)

    def through(self, world: World, flow: Flow) -> bool:
        world.transfer_done(flow)
        return False

    def ended(self, world: World) -> None:
        world.npu_ended(self.rank, self.run)


class _Message(_Owner):
    """A point-to-point message: its two sides, ``(rank, run)``, which end together."""

    __slots__ = ("ends",)

    def __init__(self, ends: tuple):
        self.ends = ends

    def ended(self, world: World) -> None:
        for rank, run in self.ends:
            world.npu_ended(rank, run)


class _Arrival(_Owner):
    """An ASTRA-sim 2.x message: the receive it matches, ``(receiver, sender, stage key, step)``.

    Its sender's step waits for nothing of it, so it ends at its arrival.
    """

    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def through(self, world: World, flow: Flow) -> bool:
        world.message_in(self.key)
        return False


class _Astra2Stage:
    """A stage on NPU `rank` under 2.x: its steps, the one it is in, the receipts it still waits for."""

    __slots__ = ("rank", "run", "key", "steps", "peers", "k", "pending")

    def __init__(self, rank: int, run: StageRun, key: StageKey, steps: tuple[NpuStep, ...], peers: tuple):
        self.rank, self.run, self.key, self.steps, self.peers = rank, run, key, steps, peers
        self.k = self.pending = 0


class World(Greenlets):
    """Every NPU's engine in a greenlet, its stages and messages on every NPU's links under the run's rule.

    Args:
        topology: the network.
        config: the run settings: a rule that routes (not ``ideal``: `greenlets.NpuWorld` and
            `vectors.NpuVectors` time every NPU there), no compat but 2.x's store-forward.
        replayable: keep the kept NPUs' stage starts and ends for `replay` (the emulator's
            rank needs its own), and say why a stall stalls (every NPU's: `run` runs again).
        classes: run one NPU per class, on its class's links weighed (`classes.Classes`; a
            rule classes admit, `classes.admitted`; not replayable); None: every NPU.
        keep: the NPUs whose result (their engines' records) and history are read (NPU 0 on
            the model, the rank itself under MPI); the others keep none, so a long run's memory
            does not grow with NPUs x stages. None: every NPU's.
    """

    def __init__(
        self,
        topology: Topology,
        config: RunConfig,
        replayable: bool = True,
        classes: Classes | None = None,
        keep: Collection[int] | None = None,
    ):
        if config.network == IDEAL or (config.compat and config.compat != ASTRA_SIM_2):
            raise UsageError(
                "every NPU's links take a sharing rule (--network fair, store-forward), "
                "or --compat astra-sim-2 --network store-forward"
            )
        simulated = topology.npus if classes is None else classes.count
        if simulated > MAX_NPUS:
            raise UsageError(f"every NPU's links run at most {MAX_NPUS} NPUs, not {topology.npus}")
        assert classes is None or not (replayable or config.compat or not admitted(config.network))
        if classes is None:
            super().__init__(topology.npus, keep=keep)
        else:
            super().__init__(topology.npus, classes.reps, classes.sizes, keep)
        self.classes = classes
        self.state = classes is not None and classes.state  # (checked as it runs: `classes.Split`)
        self._rates_checked = 0  # (by state) the rule's `rates_set` count last checked
        self._splits: list[Split] = []  # (by state) classes seen apart at this instant, split when it ends
        self.unit = not fluid(config.network)  # (with classes: every weight must be 1, `Classes.step`)
        self.topology, self.config = topology, config
        self.cost = config.costs(topology)
        self.routes = NpuRoutes(topology, config.link_scale)
        self.loop = EventLoop()
        self.rule = make_rule(config.network, self.routes.links, self, topology, config)
        self.loop.per_event = self.rule.per_event
        self.astra2 = config.compat == ASTRA_SIM_2
        self.replayable = replayable
        self.history = [replayable and self.kept(r) for r in range(self.n)]  # (starts and ends kept)
        self.npus = [_Npu() for _ in range(self.n)]
        self._timed: dict[int, float] = {}  # waiting NPUs with a finite horizon: the horizon
        # per kept NPU (`kept`): every stage's start (by its key) and its stage ends in the order it took them
        self.starts: list[dict[StageKey, float]] = [{} for _ in range(self.n)]
        self.order: list[list[list[StageKey]]] = [[[] for _ in topology.dims] for _ in range(self.n)]
        self.ends: list[list[tuple[float, tuple[StageKey, ...]]]] = [[] for _ in range(self.n)]
        self._plans: dict[tuple, tuple] = {}
        # this project's rules: a step's receipts (`transfer_done`) and messages' first sides
        self._sent: dict[tuple, int] = {}  # (key, step, sender) -> receivers yet to take it
        self._sent_ns: dict[tuple, float] = {}  # (classes by state) when those were through
        self._waiting: dict[tuple, list[Flow]] = {}  # (key, step, sender) -> receivers waiting
        self._counts: dict[tuple, int] = defaultdict(int)
        self._posted: dict[tuple, tuple[int, MessageRun]] = {}  # a message's first side, until the other
        # 2.x: messages in before their receive, receives before their message
        self._arrived: dict[tuple, int] = defaultdict(int)
        self._receives: dict[tuple, deque[_Astra2Stage]] = defaultdict(deque)
        self._messages: dict[tuple, Step] = {}
        self.arrival_ns: dict[tuple, float] = {}  # when the last 2.x message under each key arrived

    @property
    def now_ns(self) -> float:
        """The world's time: its loop's."""
        return self.loop.now_ns

    # --- the host of the rule ----------------------------------------------------------------------

    def begin(self, flow: Flow) -> None:
        """A flow's step starts: its owner says what it expects."""
        flow.owner.begin(self, flow)

    def expect(self, flow: Flow) -> None:
        """A stage's step starts: its receipts are the same step's transfers of the NPUs it receives from."""
        stage = flow.owner
        stage.pending = 1
        state = self.state
        if state:
            stage.got = {}
        for src in stage.recvs[flow.k]:
            tag = (stage.key, flow.k, src)
            left = self._sent.get(tag)
            if left is None:
                self._waiting.setdefault(tag, []).append(flow)
                stage.pending += 1
                continue
            if state:
                stage.got[src] = self._sent_ns[tag]
            if left == 1:
                del self._sent[tag]
                if state:
                    del self._sent_ns[tag]
            else:
                self._sent[tag] = left - 1

    def through(self, flow: Flow) -> bool:
        """A flow's transfers are through: its owner says what that means (and whether it goes on now)."""
        return flow.owner.through(self, flow)

    def ended(self, owner: Any) -> None:
        """A flow is over: its NPUs' stages or messages end."""
        owner.ended(self)

    def transfer_done(self, flow: Flow) -> None:
        """A stage step's own transfer is there: it ends once its receipts are too (theirs may end now)."""
        stage = flow.owner
        tag = (stage.key, flow.k, stage.rank)
        waiters = self._waiting.pop(tag, [])
        left = stage.consumers[flow.k] - len(waiters)
        if left > 0:
            self._sent[tag] = left
            if self.state:
                self._sent_ns[tag] = self.now_ns
        stage.pending -= 1
        if self.state:
            stage.own_ns = self.now_ns
            for other in waiters:
                other.owner.got[stage.rank] = self.now_ns
        if stage.pending == 0:
            self._step_end(flow)
        for other in waiters:
            other.owner.pending -= 1
            if other.owner.pending == 0:
                self._step_end(other)

    def _step_end(self, flow: Flow) -> None:
        """A stage step's transfer and receipts are through: it goes on (by state: its class proven)."""
        stage = flow.owner
        if stage.checks is not None:
            assert self.classes is not None
            plan = stage.checks[flow.k]
            try:
                check_end(self.classes, stage.rank, plan, stage.own_ns, stage.got, self.now_ns)
            except Split as split:  # (the instant runs on, for its other checks; time moves no further)
                self._splits.append(split)
        self.rule.resume(flow)

    def _check_rates(self) -> None:
        """The rates the rule set lift to every NPU's (`classes.check_rates`), or the run splits.

        Only the rates an instant ends with hold for a while: those set between two events of
        one instant (one class's transfer started, its like's not yet) hold for no time, so
        `_idle` checks when time moves past an instant whose rates the rule set.
        """
        assert self.classes is not None
        self._rates_checked = self.rule.rates_set  # type: ignore[attr-defined]
        moving = self.rule.moving_flows  # type: ignore[attr-defined]
        per_npu, capacity = self.routes.per_npu, self.routes.capacity
        check_rates(self.classes, ((f, f.owner.checks[f.k]) for f in moving), capacity, per_npu)

    def npu_ended(self, rank: int, run: StageRun) -> None:
        """A stage (or a message side) of NPU `rank` is over: the NPU runs next, if it waits."""
        npu = self.npus[rank]
        npu.ended.append(run)
        if npu.waiting:
            npu.waiting = False
            self._timed.pop(rank, None)
            self.ready.append(rank)

    # --- stages and messages in ---------------------------------------------------------------------

    def start(self, rank: int, run: StageRun) -> None:
        """A stage or a message side starts on NPU `rank` now."""
        if self.history[rank]:
            key = stage_key(run)
            self.starts[rank][key] = run.start_ns
            if not isinstance(run, MessageRun):
                self.order[rank][run.stage.dim].append(key)
        if isinstance(run, MessageRun):
            self._message(rank, run)
        elif self.astra2:
            self._astra2_stage(rank, run)
        else:
            self._stage(rank, run)

    def _stage(self, rank: int, run: StageRun) -> None:
        s = run.stage
        plan_key = (s.itemsize, s.dim, s.op, s.full_elems, rank)
        plan = self._plans.get(plan_key)
        if plan is None:
            plan = self._plans[plan_key] = self._plan(rank, s.itemsize, s.dim, s.op, s.full_elems)
        steps, recvs, consumers, checks = plan
        if not steps:
            self.npu_ended(rank, run)
            return
        self.rule.start(Flow(_Stage(rank, run, stage_key(run), recvs, consumers, checks), steps))

    def _plan(self, rank: int, itemsize: int, d: int, op: str, full_elems: int) -> tuple:
        """A stage's steps on NPU `rank`'s links, per step its senders and its receivers' count.

        A dim's custom files whose NPUs' rounds differ (`algorithms.CustomStage.every_npu`) are
        the NPU's own steps (`routes.NpuRoutes.custom_stage`). With classes, on its class's links
        weighed (`classes.Classes.step`); a pattern they were not refined by stops the run
        (`classes.Unproven`); such files stop it for good (`classes.Inexact`: every NPU runs).
        """
        cost = self.cost(itemsize)
        classes = self.classes
        custom = custom_stage(self.topology.dims[d])
        if custom is not None and custom.every_npu and classes is None:
            levels = custom.npu_steps(op, self.routes.coord(rank, d)[0], full_elems, itemsize)
            steps, recvs, consumers = self.routes.custom_stage(rank, cost, d, levels)
            return self.rule.prepared(steps), recvs, consumers, None
        steps, recvs, consumers = self.routes.stage(rank, cost, d, op, full_elems)
        if classes is None:
            return self.rule.prepared(steps), recvs, consumers, None
        peers = step_planner(self.topology, cost).stage_peers(d, op, full_elems)
        pattern = pattern_key(d, peers)
        if custom is not None and custom.every_npu:
            raise Inexact  # (no pattern refines by such files: every NPU runs, at once)
        if classes.state:
            p, stride = self.topology.dims[d].npus, self.routes.strides[d]
            made = [
                state_step(classes, rank, s, ks, p, stride, self.routes.per_npu, self.routes.capacity)
                for s, ks in zip(steps, peers)
            ]
            return (
                self.rule.prepared(tuple(m[0] for m in made)),
                tuple(m[1] for m in made),
                tuple(m[2] for m in made),
                tuple(m[3] for m in made),
            )
        if pattern not in classes.patterns:
            raise Unproven(pattern)
        c, base = self.routes.coord(rank, d)
        p, stride = self.topology.dims[d].npus, self.routes.strides[d]
        per_npu, capacity = self.routes.per_npu, self.routes.capacity
        return (
            self.rule.prepared(tuple(classes.step(rank, s, per_npu, capacity, self.unit) for s in steps)),
            tuple(classes.recvs(r) for r in recvs),
            tuple(classes.consumers(base + (c + k) % p * stride for k, _ in ks) for ks in peers),
            None,
        )

    def _message(self, rank: int, run: MessageRun) -> None:
        """A message side: its transfer starts once both sides are issued (the later issue is now).

        With classes the sides are the representatives' (`classes` module doc): they match by
        the classes of sender and receiver, the tag, the offset and the order.
        """
        if self.astra2:
            raise UsageError("point-to-point messages are not part of --compat astra-sim-2")
        src, dst = (rank, run.peer) if run.send else (run.peer, rank)
        classes = self.classes
        if classes is not None and classes.state:
            raise Inexact("point-to-point messages under classes by state")
        if classes is None:
            side: tuple = (src, dst, run.tag, run.send)
        else:
            pattern = (int(classes.kinds[src]), dst - src)
            if pattern not in classes.messages:
                raise Unproven(message=pattern)
            side = (int(classes.of[src]), int(classes.of[dst]), run.tag, dst - src, run.send)
        k = self._counts[side]
        self._counts[side] = k + 1
        other = self._posted.pop(side[:-1] + (not run.send, k), None)
        if other is None:
            self._posted[side + (k,)] = (rank, run)
            return
        (sender, send), (receiver, recv) = ((rank, run), other) if run.send else (other, (rank, run))
        cost = self.cost(1)
        dims = self.topology.dims
        delay_ns = 0.0
        for d, hops in send.path:
            delay_ns = delay_ns + (hops * dims[d].latency_ns + cost.endpoint_delay_ns)
        step = self.routes.message(sender, send.peer, send.nbytes, delay_ns)
        if classes is not None:
            step = classes.step(sender, step, self.routes.per_npu, self.routes.capacity, self.unit)
        self.rule.start(Flow(_Message(((sender, send), (receiver, recv))), (step,)))

    # --- ASTRA-sim 2.x's system layer ----------------------------------------------------------------

    def _astra2_stage(self, rank: int, run: StageRun) -> None:
        """A stage starts on NPU `rank` now: its first messages leave after one endpoint delay."""
        s = run.stage
        d, stride = s.dim, self.routes.strides[s.dim]
        c, base = self.routes.coord(rank, d)
        cost = self.cost(s.itemsize)
        key = (s.itemsize, d, s.op, s.full_elems, c, astra2_anticlockwise(s))
        steps = self._plans.get(key)
        if steps is None:
            steps = self._plans[key] = npu_stage_steps(cost, d, s.op, s.full_elems, c, key[-1])
        if not steps:
            self.npu_ended(rank, run)
            return
        peers = tuple(
            (tuple(base + q * stride for q in sends), tuple(base + q * stride for q in recvs))
            for _, sends, recvs, _ in steps  # (`NpuStep`s)
        )
        stage = _Astra2Stage(rank, run, stage_key(run), steps, peers)
        self.loop.at(run.start_ns + cost.endpoint_delay_ns, self._send, stage)

    def _send(self, stage: _Astra2Stage) -> None:
        """Step k: send its messages, then post its receives (`HalvingDoubling::ready`)."""
        step = stage.steps[stage.k]
        nbytes, sends = step.nbytes, step.sends
        send_ranks, recv_ranks = stage.peers[stage.k]
        dim = stage.run.stage.dim
        for q, dst in zip(sends, send_ranks):
            self.astra2_message(stage.rank, dim, q, nbytes, (dst, stage.rank, stage.key, stage.k))
        stage.pending = len(recv_ranks)
        for src in recv_ranks:
            key = (stage.rank, src, stage.key, stage.k)
            if self._arrived.get(key):
                self._arrived[key] -= 1
                if not self._arrived[key]:
                    del self._arrived[key]
                self.loop.at(self.loop.now_ns, self._received, stage)  # (`sim_recv`: a 0 ns event)
            else:
                self._receives[key].append(stage)

    def astra2_message(self, rank: int, dim: int, peer: int, nbytes: int, key: tuple) -> None:
        """Send a 2.x message now from NPU `rank` to the NPU at coordinate `peer` of a dim.

        `key` is what the receive matches, ``(receiver, sender, ...)``; its arrival time is kept
        in `arrival_ns` (the last one under that key).
        """
        step = self._messages.get((rank, dim, peer, nbytes))
        if step is None:
            step = self._messages[(rank, dim, peer, nbytes)] = transfer_step(
                float(nbytes), self.routes.astra2_route(rank, dim, peer)
            )
        self.rule.start(Flow(_Arrival(key), (step,)))

    def message_in(self, key: tuple) -> None:
        """A 2.x message is in: the receive posted for it completes, or it waits for one."""
        self.arrival_ns[key] = self.loop.now_ns
        posted = self._receives.get(key)
        if posted:
            stage = posted.popleft()
            if not posted:
                del self._receives[key]
            self._received(stage)
        else:
            self._arrived[key] += 1

    def _received(self, stage: _Astra2Stage) -> None:
        stage.pending -= 1
        if stage.pending == 0:
            self.loop.at(self.loop.now_ns + stage.steps[stage.k].delay_ns, self._step_done, stage)

    def _step_done(self, stage: _Astra2Stage) -> None:
        stage.k += 1
        if stage.k < len(stage.steps):
            self._send(stage)
        else:
            self.npu_ended(stage.rank, stage.run)

    def drain(self) -> None:
        """Run every queued event in time order: the links alone, with no NPU's engine (tools, tests)."""
        self.loop.drain()

    def stages_alone(self, plans: Mapping[int, tuple]) -> float:
        """One stage per NPU, given as its steps, senders and receivers' counts, alone on the links: its end.

        No engine runs: a check of a stage's steps against another timing of it (a dim's custom
        files against their programs, `run.custom`). The stages match their receipts as one stage.
        """
        for rank, (steps, recvs, consumers, *_) in plans.items():
            owner = _Stage(rank, None, ("alone",), recvs, consumers)  # type: ignore[arg-type]
            self.rule.start(Flow(owner, self.rule.prepared(steps)))
        while self.loop.step(math.inf, self.rule):  # (the rule's own events too: `fair` moves)
            pass
        return self.now_ns

    # --- the NPUs ---------------------------------------------------------------------------------

    def replay(self, rank: int) -> Replay:
        """NPU `rank`'s stage ends of the run, for an engine that takes the same decisions.

        With them go the stages' numbers on their dim, the same on every NPU (`Replay.number`),
        and the bytes its links carried.
        """
        assert self.history[rank], f"a world run without NPU {rank}'s starts and ends cannot replay it"
        numbers = {key: i for keys in self.order[rank] for i, key in enumerate(sorted(keys))}
        return Replay(rank, self.starts[rank], self.ends[rank], numbers, self.link_bytes(rank))

    def link_bytes(self, rank: int) -> list[float] | None:
        """Bytes each of NPU `rank`'s links carried (`links.physical_links` order); None under 2.x."""
        if self.astra2:
            return None
        if self.classes is not None:
            rank = self.classes.rep(rank)
        n = self.routes.per_npu
        return self.rule.carried[rank * n : (rank + 1) * n]

    def run(self, body: Callable[[Any], T]) -> list[T]:
        """`Greenlets.run`; a replayable world keeping some NPUs that stalls runs again keeping all (why).

        By state, classes seen apart at an instant split when it ends (`classes.Split`), also where
        the instant, run on past them, fails otherwise.
        """
        try:
            out = super().run(body)
        except Split:
            raise
        except Exception as exc:
            if self._splits:  # (the instant ran on past a class seen apart: its split is the outcome)
                raise Split.merged(self._splits) from exc
            if not isinstance(exc, Stalled) or not self.replayable or self.keep is None:
                raise
            World(self.topology, self.config).run(body)  # (the same run: it stalls, and says why)
            raise
        if self._splits:  # (seen apart at the last instant)
            raise Split.merged(self._splits)
        return out

    def wait(self, rank: int, horizon_ns: float) -> None:
        """NPU `rank` waits until a stage of its ends or the loop reaches the horizon."""
        npu = self.npus[rank]
        npu.waiting = True
        if horizon_ns < math.inf:
            self._timed[rank] = horizon_ns
        self._yield()

    def transport(self, rank: int) -> WorldTransport:
        """NPU `rank`'s transport."""
        return WorldTransport(self, rank)

    def _idle(self) -> bool:
        """Run what comes first: the loop's next event(s) or the NPUs' earliest horizon (False: neither).

        At a tie the event comes first, as one NPU's view takes it.
        """
        horizon = min(self._timed.values(), default=math.inf)
        t_ns = self.loop.next_ns(self.rule)
        if self.state and min(t_ns, horizon) > self.now_ns:  # (time moves: the rates set hold a while)
            if self.rule.rates_set != self._rates_checked:  # type: ignore[attr-defined]
                try:
                    self._check_rates()
                except Split as split:
                    self._splits.append(split)
            if self._splits:  # (every class this instant saw apart splits at once: `Split.merged`)
                raise Split.merged(self._splits)
        if t_ns < math.inf and t_ns <= horizon:
            self.loop.fire(t_ns, self.rule)
        elif horizon < math.inf:
            self.loop.advance(horizon, self.rule)
            for rank in sorted(r for r, h in self._timed.items() if h == horizon):
                del self._timed[rank]
                self.npus[rank].waiting = False
                self.ready.append(rank)
        else:
            return False
        return True

    def _stalled(self) -> str:
        """Who waits for what, and what the links know of it."""
        stuck = [r for r, n in enumerate(self.npus) if n.waiting]
        if not stuck and not self.arrived:
            return ""
        what = f"NPU {stuck[0]} waits for a message" if stuck else f"NPUs {self.arrived[:4]} at a meeting"
        return f"every NPU waits and none can move ({len(stuck)} on messages): {what}{self._why()}"

    def _why(self) -> str:
        """A stage waiting for a peer that started the dim's stages in another order, or a lone message."""
        if not self.replayable or self.keep is not None:  # (not every NPU's starts: who waits, not why)
            return ""
        for (key, _, sender), flows in self._waiting.items():
            if key not in self.starts[sender]:
                rank = flows[0].owner.rank
                dim = self.order[rank]
                d = next(i for i, keys in enumerate(dim) if key in keys)
                theirs = [k for k in self.order[sender][d] if k not in self.order[rank][d]][:1]
                return (
                    f"; NPU {rank} runs stage {key} on dim {d} and waits for NPU {sender}, which started "
                    f"another stage {theirs[0] if theirs else '?'} there first: the NPUs of a dim group "
                    "started its stages in different orders (their loads differ) and hold its slots "
                    "(more --active-chunks-per-dim, or fewer chunks, may help)"
                )
        if self._posted:
            src, dst, tag, send, _ = next(iter(self._posted))
            side = "send" if send else "receive"
            return f"; a {side} from NPU {src} to NPU {dst} (tag {tag}) has no matching side"
        return ""


class WorldTransport(GreenletControl):
    """One NPU of a `World`: the engine's transport, times only (`engine.Transport`).

    Args:
        world: what the NPUs share.
        rank: this NPU's rank (dim 0 varies fastest).
    """

    def __init__(self, world: World, rank: int):
        self.world, self.rank = world, rank
        self.topology, self.config = world.topology, world.config
        self.clock = VirtualClock()
        self.cost = world.cost
        self._npu = world.npus[rank]
        self.records_kept = world.kept(rank)  # (its engine's records: `engine.Engine.keeps_records`)

    @property
    def link_bytes(self) -> list[float] | None:
        """Bytes each of this NPU's links carried so far, where the world's links know them."""
        return self.world.link_bytes(self.rank)

    def open(self, run: CollectiveRun) -> None:
        """No data."""

    def close(self, run: CollectiveRun) -> None:
        """Nothing to check."""

    def start(self, run: StageRun) -> None:
        """Hand the stage or message to the links at its start, the world's time then.

        Only a late NPU's first work starts ahead of the world (`--npu-delay-us`): it waits for it.
        """
        while self.world.now_ns < run.start_ns:
            self.world.wait(self.rank, run.start_ns)
        self.world.start(self.rank, run)

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """This NPU's next stage ends (all at the world's time), or ``(horizon, [])``."""
        npu = self._npu
        if not npu.ended:
            self.world.wait(self.rank, horizon_ns)
        if npu.ended:
            ended, npu.ended = npu.ended, []
            if self.world.history[self.rank]:
                self.world.ends[self.rank].append((self.world.now_ns, tuple(stage_key(r) for r in ended)))
            return self.world.now_ns, ended
        return horizon_ns, []


def by_classes(
    topology: Topology,
    config: RunConfig,
    kinds: Mapping[int, Any],
    body: Callable[[Any], T],
    rounds: int = 16,
    keep: Collection[int] | None = None,
) -> list[T] | None:
    """`body` on one NPU per class on every NPU's links: its returns by rank (its representatives').

    The classes are refined by every stage and message pattern the run meets, starting from an
    all-reduce's (of `PRIME_ELEMS`: most runs then go once; where those set every NPU apart, from
    none); one it had not met stops the run, which starts again refined by it (at most `rounds`
    times). Where they keep every NPU apart under a fluid rule and the run sends no message,
    classes by state try instead (`by_state`). None where classes do not apply (a rule they do
    not admit, a compat), do not reduce, or meet a step they cannot weigh exactly
    (`classes.Inexact`; under a rule admitted where every weight is 1, classes of different
    sizes are refused before they run): every NPU runs.

    Args:
        topology: the network.
        config: the run settings (its rule and stragglers).
        kinds: what sets an NPU's program apart (e.g. its compute factor), by rank; ranks of one
            kind run one program, its messages' peers at the same rank offsets.
        body: the per-NPU run, on the transport it is given.
        rounds: runs to try before giving up on classes.
        keep: the NPUs whose returns are read (`World`'s `keep`); None: every representative's.
    """
    if config.compat or not admitted(config.network):
        return None
    patterns = primed_patterns(topology, config)
    messages: set = set()  # (met: proven or refused; `likely`: their likes, where provable)
    likely: set = set()
    routes = NpuRoutes(topology, config.link_scale)

    def vias(src: int, dst: int) -> set[int]:
        return {link // routes.per_npu for hop in routes.route(src, dst) for link, _ in hop}

    primed = True
    try:
        for _ in range(rounds):
            classes = npu_classes(topology, config, kinds, patterns, messages, vias, likely)
            if not fluid(config.network) and len(set(classes.sizes.tolist())) > 1:
                return None  # (a weight other than 1 somewhere, most likely: every NPU, before any run)
            if classes.count == topology.npus:
                if not primed:
                    if not state_may_run(config, bool(messages)):
                        return None
                    return by_state(topology, config, kinds, body, keep=keep)
                patterns, primed = set(), False  # (the run may not take those patterns: learn its own)
                continue
            try:
                return World(topology, config, replayable=False, classes=classes, keep=keep).run(body)
            except Unproven as exc:
                if exc.pattern is not None:
                    patterns.add(exc.pattern)
                if exc.message is not None:  # (and its likes: one more run learns them all at once)
                    messages.add(exc.message)
                    likely |= message_family(classes.kinds, exc.message)
    except Inexact:
        return None
    return None


def by_state(
    topology: Topology,
    config: RunConfig,
    kinds: Mapping[int, Any],
    body: Callable[[Any], T],
    rounds: int = STATE_ROUNDS,
    keep: Collection[int] | None = None,
) -> list[T] | None:
    """`body` on one NPU per class by state (`classes` module doc), under a fluid rule: as `by_classes`.

    The classes start from what sets NPUs apart before the run; a class the run sees apart
    (`classes.Split`) splits, and the run starts again (at most `rounds` times, and while the
    NPUs of the runs so far sum to at most `STATE_BUDGET` times every NPU: a run that splits
    stops there, so they cost no more than that many runs of every NPU). None where they reach
    every NPU, or the run takes what they cannot time (messages, a dim's custom files for each
    NPU: `classes.Inexact`): every NPU runs.
    """
    if not state_may_run(config):
        return None
    colour, kind_of = start_colours(topology, config, kinds)
    spent = 0  # NPUs the runs so far simulated (each, at most, to its end)
    try:
        for _ in range(rounds):
            classes = state_classes(colour, kind_of)
            spent += classes.count
            if classes.count == topology.npus or spent > STATE_BUDGET * topology.npus:
                return None
            try:
                return World(topology, config, replayable=False, classes=classes, keep=keep).run(body)
            except Split as split:
                colour = refined(colour, split)
    except Inexact:
        return None
    return None


def state_may_run(config: RunConfig, messages: bool = False) -> bool:
    """Whether classes by state may run (`by_state`): a fluid rule, no compat, no messages."""
    return not (config.compat or messages) and fluid(config.network)


def primed_patterns(topology: Topology, config: RunConfig) -> set:
    """The stage patterns classes start from: an all-reduce's of `PRIME_ELEMS` on every dim."""
    planner = step_planner(topology, config.costs(topology)(4))
    return {
        pattern_key(d, planner.stage_peers(d, op, PRIME_ELEMS))
        for d in range(len(topology.dims))
        for op in (RS, AG)
    }


def expected_npus(topology: Topology, config: RunConfig, kinds: Mapping[int, Any]) -> int:
    """The NPUs a run on every NPU's links is expected to simulate: its first classes', else every NPU.

    For an estimate (`planner.estimate`): the classes `by_classes` starts from; every NPU
    where they do not apply or do not reduce, and under a rule admitted where every weight is 1
    (`classes.UNIT`) where the classes differ in size.
    """
    n = topology.npus
    if config.compat or not admitted(config.network):
        return n
    try:
        classes = npu_classes(topology, config, kinds, primed_patterns(topology, config))
    except Inexact:
        return n
    if not fluid(config.network) and len(set(classes.sizes.tolist())) > 1:
        return n
    return classes.count
