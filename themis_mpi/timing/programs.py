"""Per-NPU programs (a custom algorithm's steps) on every NPU's links under any sharing rule.

A custom algorithm (`msccl.program.GpuProgram`: threadblocks of ordered steps with peers, chunk
counts and waits) runs here as the emulator's ranks run it, with each message a flow of the
run's rule (`links.LinkModel`, made by `rules.make_rule`) over every NPU's links
(`routes.NpuRoutes`), all on one time-ordered loop (`events.EventLoop`):

- A threadblock runs its steps in order, `iterations` times (RCCL's loop: iteration i moves
  chunks of ``iterations[i]`` bytes); a step of iteration i waits for the steps of iteration i
  of its GPU that it names (`Op.waits`).
- A step starts once its threadblock's previous step has ended, its waits have ended and, if it
  receives, its message has arrived; a reducing step then takes `reduce_ns` of its bytes; a
  sending step then sends its message (one transfer over `NpuRoutes.route`, then the route's
  latency and endpoint delays) and ends when it has arrived. A fused step (``rcs``, ``rrcs``)
  thus forwards what it has received whole.
- A sharing rule shares the links among the messages in flight. A rule that shares nothing
  (``ideal``: each step its time alone) would let an NPU's messages of different threadblocks
  each take a link's whole rate at once, faster than the link: such rules run the messages
  under ``fair`` (max-min fair shares), which is what one message alone gets under ``ideal``
  too (``bytes / tightest rate + delay``).

The run is deterministic (events of one instant in scheduling order), so every emulator rank
computes the same times the model does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..topology import Topology
from .events import EventLoop
from .links import Flow, LinkModel, Step
from .routes import NpuRoutes
from .rules import FAIR, make_rule, rule_class


class Program(Protocol):
    """One NPU's threadblocks, each a tuple of steps (`msccl.program.GpuProgram` is one).

    A step has ``type``, ``send_peer``, ``recv_peer`` (-1: none), ``chan``, ``count`` (chunks)
    and ``waits`` ((threadblock, step) of its NPU), as `msccl.program.Op`.
    """

    @property
    def gpu(self) -> int:
        """The NPU it runs on."""
        ...

    @property
    def threadblocks(self) -> tuple[tuple[Any, ...], ...]:
        """Its threadblocks' steps."""
        ...


class ProgramTimes:
    """The result of `time_programs`: the last end, and each link's carried bytes.

    Attributes:
        end_ns: when the last step of every NPU ended.
        carried: bytes each link of `links` carried (every NPU's, `NpuRoutes.links` order).
        links: the links' names.
        messages: messages sent.
        sent: bytes each NPU's steps sent (its own messages, each once, whatever their hops).
    """

    def __init__(
        self,
        end_ns: float,
        carried: list[float],
        links: tuple[str, ...],
        messages: int,
        sent: list[float] | None = None,
    ):
        self.end_ns, self.carried, self.links, self.messages = end_ns, carried, links, messages
        self.sent = sent or []


class _Threadblock:
    """A threadblock's place: the step it is at (over iterations), whether it runs one."""

    __slots__ = ("gpu", "tb", "ops", "pc", "busy", "queued")

    def __init__(self, gpu: int, tb: int, ops: tuple):
        self.gpu, self.tb, self.ops = gpu, tb, ops
        self.pc = 0  # steps done, iterations included
        self.busy = False
        self.queued = False


class ProgramWorld:
    """Every NPU's program on every NPU's links (module doc); the `links.Host` of the run's rule."""

    def __init__(
        self,
        topology: Topology,
        rule: str,
        settings: Any,
        progs: Sequence[Program],
        iterations: Sequence[float],
        reduce_ns: Callable[[float], float],
        endpoint_delay_ns: float = 0.0,
    ):
        self.topology = topology
        self.routes = NpuRoutes(topology)
        self.loop = EventLoop()
        self.rule: LinkModel = make_rule(rule, self.routes.links, self, topology, settings)
        self.loop.per_event = self.rule.per_event
        self.iterations = list(iterations)
        self.reduce_ns = reduce_ns
        self.endpoint_delay_ns = endpoint_delay_ns
        self.tbs = [[_Threadblock(p.gpu, t, ops) for t, ops in enumerate(p.threadblocks)] for p in progs]
        self.arrived: dict[tuple[int, int, int], list[float]] = {}  # (src, dst, chan) -> arrivals
        self.taken: dict[tuple[int, int, int], int] = {}  # receives done per connection
        self.waiting: dict[tuple, list[_Threadblock]] = {}  # what a threadblock waits for -> it
        self.end_ns = 0.0
        self.messages = 0
        self.sent = [0.0] * len(progs)  # bytes each NPU's steps sent
        self._steps: dict[tuple[int, int, float], Step] = {}

    # --- the host of the rule ------------------------------------------------------------------

    def begin(self, flow: Flow) -> None:
        """A message leaves: nothing to note."""

    def through(self, flow: Flow) -> bool:
        """A message's transfer is through: its delay follows at once."""
        return True

    def ended(self, owner: Any) -> None:
        """A message has arrived: its sending step ends, its receiver may go on."""
        tb, key = owner
        self.arrived.setdefault(key, []).append(self.loop.now_ns)
        self._wake(("msg", key))
        self._done(tb)

    # --- the programs ----------------------------------------------------------------------------

    def message(self, src: int, dst: int, nbytes: float) -> Step:
        """A message's one step: over its route, then its hops' latency and endpoint delays."""
        key = (src, dst, nbytes)
        step = self._steps.get(key)
        if step is None:
            hops = self.routes.route(src, dst)
            delay = 0.0
            for d, n_hops in self.path(src, dst):
                delay = delay + (n_hops * self.topology.dims[d].latency_ns + self.endpoint_delay_ns)
            step = self.routes.message(src, dst, nbytes, delay)  # type: ignore[arg-type]
            alone = nbytes / step.solo_rate + delay if hops else delay
            step = self._steps[key] = Step(step.transfers, step.delay_ns, alone, step.solo_rate)
        return step

    def path(self, src: int, dst: int) -> list[tuple[int, int]]:
        """(dim, hops) of every dim a message crosses (`routes.NpuRoutes.route`'s hops)."""
        out = []
        for d, dim in enumerate(self.topology.dims):
            a, _ = self.routes.coord(src, d)
            b, _ = self.routes.coord(dst, d)
            if a != b:
                k = (b - a) % dim.npus
                out.append(
                    (d, min(k, dim.npus - k) if dim.kind == "Ring" else 2 if dim.kind == "Switch" else 1)
                )
        return out

    def run(self) -> ProgramTimes:
        """Run every threadblock to its end; the times."""
        for gpu in self.tbs:
            for tb in gpu:
                self._queue(tb)
        loop, rule = self.loop, self.rule
        while not loop.idle(rule):
            loop.fire(loop.next_ns(rule), rule)
        stuck = [
            (tb.gpu, tb.tb) for gpu in self.tbs for tb in gpu if tb.pc < len(tb.ops) * len(self.iterations)
        ]
        if stuck:  # a checked program never stops (`msccl.check.deadlock`)
            raise RuntimeError(f"threadblocks {stuck[:4]} never finished")
        names = tuple(link.name for link in self.routes.links)
        return ProgramTimes(self.end_ns, list(self.rule.carried), names, self.messages, self.sent)

    def _queue(self, tb: _Threadblock) -> None:
        if not tb.queued:
            tb.queued = True
            self.loop.at(self.loop.now_ns, self._try, tb)

    def _wake(self, what: tuple) -> None:
        for tb in self.waiting.pop(what, ()):
            self._queue(tb)

    def _try(self, tb: _Threadblock) -> None:
        """Start the threadblock's next step if it may (module doc), else wait for what it needs."""
        tb.queued = False
        n = len(tb.ops)
        if tb.busy or tb.pc >= n * len(self.iterations):
            return
        it, op = divmod(tb.pc, n)
        op = tb.ops[op]
        gpu = self.tbs[tb.gpu]
        for u, s in op.waits:
            if gpu[u].pc <= it * len(gpu[u].ops) + s:
                self.waiting.setdefault(("tb", tb.gpu, u), []).append(tb)
                return
        if op.recv_peer >= 0:
            key = (op.recv_peer, tb.gpu, op.chan)
            if len(self.arrived.get(key, ())) <= self.taken.get(key, 0):
                self.waiting.setdefault(("msg", key), []).append(tb)
                return
            self.taken[key] = self.taken.get(key, 0) + 1
        tb.busy = True
        nbytes = op.count * self.iterations[it]
        extra = self.reduce_ns(nbytes) if op.type in _REDUCES else 0.0
        if extra > 0:
            self.loop.at(self.loop.now_ns + extra, self._act, (tb, op, nbytes))
        else:
            self._act((tb, op, nbytes))

    def _act(self, item: tuple) -> None:
        tb, op, nbytes = item
        if op.send_peer < 0:
            self._done(tb)
            return
        self.messages += 1
        self.sent[tb.gpu] += nbytes
        step = self.message(tb.gpu, op.send_peer, nbytes)
        key = (tb.gpu, op.send_peer, op.chan)
        self.rule.start(Flow((tb, key), (step,), start_ns=self.loop.now_ns))

    def _done(self, tb: _Threadblock) -> None:
        tb.busy = False
        tb.pc += 1
        self.end_ns = max(self.end_ns, self.loop.now_ns)
        self._wake(("tb", tb.gpu, tb.tb))
        self._queue(tb)


_REDUCES = frozenset({"rrs", "rrc", "rrcs", "re"})  # `msccl.ir.REDUCES` (this layer sits below msccl)


def time_programs(
    topology: Topology,
    rule: str,
    settings: Any,
    progs: Sequence[Program],
    iterations: Sequence[float],
    reduce_ns: Callable[[float], float] = lambda n_bytes: 0.0,
    endpoint_delay_ns: float = 0.0,
) -> ProgramTimes:
    """Every NPU's program on every NPU's links under `rule` (module doc).

    Args:
        topology: the network; NPU g runs ``progs[g]``.
        rule: the ``--network`` rule's name.
        settings: the run's settings a rule may read (`config.RunConfig`).
        progs: one per NPU.
        iterations: bytes of one chunk in each iteration of the programs' loop.
        reduce_ns: what a reduction of so many bytes costs.
        endpoint_delay_ns: added once per dim a message crosses, as to a point-to-point message.
    """
    if not iterations:
        return ProgramTimes(0.0, [], (), 0)
    if not rule_class(rule).routes:  # separate messages that shared nothing would beat the links' rate
        rule = FAIR
    world = ProgramWorld(topology, rule, settings, progs, iterations, reduce_ns, endpoint_delay_ns)
    return world.run()
