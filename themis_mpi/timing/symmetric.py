"""One NPU's links stand for every NPU's: a symmetric run's stages on NPU 0's links under a rule.

Collectives are symmetric: every NPU starts the same stages at the same times, so the load that
this NPU's own transfers put on its outgoing links is the load on every link of that kind (and
on its in-links, which its peers' transfers fill alike). The model transport and, under a
sharing rule, every emulator rank run this same code on the same inputs, so they agree exactly.
Point-to-point messages and per-rank graphs under a sharing rule load NPUs unevenly: they run
on every NPU's links (`world`); so does ASTRA-sim 2.x's backend on an uneven dim
(`routes.uneven_dims`), where this view refuses to be made.

A dim's custom stage (``msccl:FILE`` on the dim, `algorithms.custom_stage`) is one event at
the time its file's programs take on the dim alone where it shares no link with other stages;
where it may (several active stages per dim, a shared port, under a sharing rule) it is a flow
of its rounds over this NPU's links like a built-in stage (`CustomStage.flow`).

Shortcuts: ``ideal`` takes a stage as one event, its end summed from the cost model's step times
(`ideal.Ideal.end_ns`) without a flow; ``fair`` sums solo stages ahead (`fair`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..algorithms import custom_stage
from ..config import RunConfig
from ..cost import ASTRA_SIM_2, CostModels
from ..engine import MessageRun
from ..errors import UsageError
from ..topology import Topology
from .events import EventLoop
from .ideal import Ideal
from .links import Flow, Step, physical_links
from .routes import StepPlanner, astra2_anticlockwise, astra2_steps, step_planner, uneven_dims
from .rules import STORE_FORWARD, make_rule, rule_class


class Timer(Protocol):
    """What a transport asks of the timing: stage ends (the one-NPU view, or a replay of every NPU)."""

    @property
    def link_bytes(self) -> list[float] | None:
        """What this NPU's links carried, where the timing knows it."""
        ...

    def start(self, run: Any) -> None:
        """A stage (or a message) starts at ``run.start_ns``."""

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """The next batch of ends at or before the horizon, or ``(horizon, [])``."""
        ...

    def number(self, run: Any) -> int:
        """The stage's number on its dim, common to every NPU (the emulator's message tag)."""
        ...


def one_npu_exact(topology: Topology, config: RunConfig) -> bool:
    """Whether one NPU's view times a symmetric run exactly: not under 2.x's backend on an uneven dim."""
    return not (config.compat == ASTRA_SIM_2 and config.network == STORE_FORWARD and uneven_dims(topology))


class _Sink:
    """The host of one NPU's rule: its loop and where stage ends go; a step waits for nothing else.

    It holds no reference to the rule, so a finished run is freed without the garbage collector.
    """

    __slots__ = ("loop", "ended_runs")

    def __init__(self) -> None:
        self.loop = EventLoop()
        self.ended_runs: list = []  # (one list for the run: its `append` ends a stage)

    def begin(self, flow: Flow) -> None:
        """Nothing to note."""

    def through(self, flow: Flow) -> bool:
        """A step waits for nothing else here: its peers' transfers are its own."""
        return True

    def ended(self, owner: Any) -> None:
        """A stage is over."""
        self.ended_runs.append(owner)


class Symmetric:
    """A symmetric run's stages on one NPU's links under the run's rule (`RunConfig.network`).

    `start` a stage at its start time; `next` advances to the earliest stage end at or before a
    horizon and returns ``(t, stages ending at t)``, or ``(horizon, [])``.

    Args:
        topology: the network.
        config: the run settings (its rule and compat).
        cost: the run's cost models.
    """

    link_bytes: list[float] | None = None  # (a result counts its links' bytes from its stages)

    def __init__(self, topology: Topology, config: RunConfig, cost: CostModels):
        if not one_npu_exact(topology, config):
            raise UsageError(
                f"--compat astra-sim-2 --network store-forward with halving-doubling on Ring dim "
                f"{uneven_dims(topology)[0]} runs every NPU, for single collectives (model, run) only; "
                "use --network ideal or another algorithm"
            )
        self.topology, self.config, self.cost = topology, config, cost
        self._sink = sink = _Sink()
        self.loop = sink.loop
        links = physical_links(topology) if rule_class(config.network).routes else ()
        self.rule = make_rule(config.network, links, sink, topology, config, count_bytes=False)
        self.loop.per_event = self.rule.per_event
        self.astra2 = config.compat == ASTRA_SIM_2
        self._alone = not self.rule.routes  # (``ideal``: a stage's end in one event, `Ideal.end_ns`)
        self._flat = topology.flat  # (the NCCL-like model times a stage by its chunk's plan)
        self._at, self._end = self.loop.at, sink.ended_runs.append  # (bound once: a stage's hot path)
        self._times: dict[tuple, tuple[float, ...]] = {}  # step times alone, by stage shape
        self._planners: dict[int, StepPlanner] = {}  # by element size
        self._routed: dict[tuple, tuple[Step, ...]] = {}  # 2.x's steps by stage shape
        self._custom = any(d.custom for d in topology.dims)  # (a dim's stages by a custom algorithm)

    def ended(self, owner: Any) -> None:
        """End a stage or message now (a message of the linked ranks, `run.linked`)."""
        self._end(owner)

    def start(self, run: Any) -> None:
        """A stage (or, under ``ideal``, a message) starts now (``run.start_ns``, the engine's time)."""
        if self._custom and not isinstance(run, MessageRun):
            custom = custom_stage(self.topology.dims[run.stage.dim])
            if custom is not None:  # (its time alone on the dim's links, or its rounds as a flow)
                if self.loop.idle(self.rule):
                    self.loop.now_ns = run.start_ns
                s = run.stage
                flow = None
                if not self._alone:
                    flow = custom.flow(s.op, s.full_elems, self._planner(s.itemsize))
                if flow is None:
                    self._at(run.start_ns + custom.time_ns(s.op, s.full_elems, s.itemsize), self._end, run)
                else:
                    self.rule.start(Flow(run, flow[0], flow[1], run.start_ns))
                return
        if self._alone:  # (one event: its end from its steps' times alone)
            self._at(Ideal.end_ns(run.start_ns, self.alone_ns(run)), self._end, run)
            return
        if isinstance(run, MessageRun):
            raise UsageError(  # (the planner runs them on every NPU's links: `world.World`)
                f"point-to-point messages under --network {self.config.network} run on every NPU's "
                "links (world.World), not on one NPU's"
            )
        loop = self.loop
        if loop.idle(self.rule):  # a new run's engine may start from 0
            loop.now_ns = run.start_ns
        s = run.stage
        planner = self._planner(s.itemsize)
        if self.astra2:  # (a transfer per message, after the stage's first endpoint delay)
            key = (s.itemsize, s.dim, s.op, s.full_elems, astra2_anticlockwise(s))
            steps = self._routed.get(key)
            if steps is None:
                steps = self._routed[key] = astra2_steps(planner, s.dim, s.op, s.full_elems, key[-1])
            self.rule.start(Flow(run, steps, False, run.start_ns, self.cost(s.itemsize).endpoint_delay_ns))
            return
        steps, uniform = planner.stage_plan(s.dim, s.op, s.full_elems)
        self.rule.start(Flow(run, steps, uniform, run.start_ns))

    def _planner(self, itemsize: int) -> StepPlanner:
        """The step planner of an element size, made once."""
        planner = self._planners.get(itemsize)
        if planner is None:
            planner = self._planners[itemsize] = step_planner(self.topology, self.cost(itemsize))
        return planner

    def alone_ns(self, run: Any) -> tuple[float, ...]:
        """The step times alone of a stage (`cost.CostModel.run_steps_ns`) or a message (its path's)."""
        if isinstance(run, MessageRun):  # the peer issues its side at the same time (symmetry)
            return (self.cost(1).p2p_ns(run.path, run.nbytes),)
        s = run.stage
        plan = s.plan if self._flat else None
        key = (
            s.itemsize,
            s.dim,
            s.op,
            s.full_elems,
            s.index == 0,
            s.index == s.n_stages - 1,
            run.mem_shared,
            plan,
        )
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = tuple(self.cost(s.itemsize).run_steps_ns(run))
        return times

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """Advance to the earliest stage end at or before the horizon: (t, stages), or (horizon, [])."""
        loop, rule, ended = self.loop, self.rule, self._sink.ended_runs
        while not ended:
            if not loop.step(horizon_ns, rule):
                return horizon_ns, []
        out = ended[:]
        ended.clear()
        return loop.now_ns, out

    def number(self, run: Any) -> int:
        """Its start number on its dim: every NPU starts the dim's stages in one order here."""
        return run.dim_seq
