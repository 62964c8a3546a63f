"""One NPU's links stand for every NPU's: a symmetric run's stages on NPU 0's links under a rule.

Collectives are symmetric: every NPU starts the same stages at the same times, so the load that
this NPU's own transfers put on its outgoing links is the load on every link of that kind (and
on its in-links, which its peers' transfers fill alike). The model transport and, under a
sharing rule, every emulator rank run this same code on the same inputs, so they agree exactly.
Point-to-point messages and per-rank graphs under a sharing rule load NPUs unevenly: they run
on every NPU's links (`world`); so does ASTRA-sim 2.x's backend on an uneven dim
(`routes.uneven_dims`), where this view refuses to be made.

Shortcuts: ``ideal`` takes a stage as one event (its end summed from the cost model's step
times); ``fair`` sums solo stages ahead (`fair`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from ..config import RunConfig
from ..cost import ASTRA_SIM_2, CostModels
from ..errors import UsageError
from ..topology import Topology
from .events import EventLoop
from .links import Flow, Step, physical_links
from .routes import astra2_steps, step_planner, uneven_dims
from .rules import STORE_FORWARD, make_rule


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
        self.loop = EventLoop()
        self.rule = make_rule(config.network, physical_links(topology), self, topology, config.compat)
        self.loop.per_event = self.rule.per_event
        self.astra2 = config.compat == ASTRA_SIM_2
        self._ended: list = []
        self._alone: dict[tuple, tuple[Step, ...]] = {}  # steps by their times alone (`ideal`)
        self._routed: dict[tuple, tuple[tuple[Step, ...], bool]] = {}  # 2.x's steps by stage shape

    # --- the host of the rule ----------------------------------------------------------------------

    def begin(self, flow: Flow) -> None:
        """Nothing to note."""

    def through(self, flow: Flow) -> None:
        """A step waits for nothing else here: its peers' transfers are its own."""
        self.rule.resume(flow)

    def ended(self, owner: Any) -> None:
        """A stage is over."""
        self._ended.append(owner)

    # --- the timer -----------------------------------------------------------------------------------

    def start(self, run: Any) -> None:
        """A stage (or, under ``ideal``, a message) starts now (``run.start_ns``, the engine's time)."""
        if self.loop.idle(self.rule):  # a new run's engine may start from 0
            self.loop.now_ns = run.start_ns
        steps, uniform, lead = self._steps(run)
        self.rule.start(Flow(run, steps, uniform, run.start_ns, lead))

    def _steps(self, run: Any) -> tuple[tuple[Step, ...], bool, float | None]:
        """The stage's steps as the rule takes them: alone (``ideal``), or over its links."""
        s = run.stage
        if getattr(run, "path", None) is not None:  # a point-to-point message (`engine.MessageRun`)
            if self.rule.routes:
                raise UsageError(  # (the planner runs them on every NPU's links: `world.World`)
                    f"point-to-point messages under --network {self.config.network} run on every NPU's "
                    "links (world.World), not on one NPU's"
                )
            return (Step((), alone_ns=self.cost(1).p2p_ns(run.path, run.nbytes)),), False, None
        if not self.rule.routes:
            first, last = s.index == 0, s.index == s.n_stages - 1
            plan = s.plan if self.topology.flat else None  # the NCCL-like model times a stage by its plan
            key: tuple = (s.itemsize, s.dim, s.op, s.full_elems, first, last, run.mem_shared, plan)
            alone = self._alone.get(key)
            if alone is None:
                times = self.cost(s.itemsize).run_steps_ns(run)
                alone = self._alone[key] = tuple(Step((), alone_ns=t) for t in times)
            return alone, False, None
        planner = step_planner(self.topology, self.cost(s.itemsize))
        if not self.astra2:
            steps, uniform = planner.stage_plan(s.dim, s.op, s.full_elems)
            return steps, uniform, None
        key = (s.itemsize, s.dim, s.op, s.full_elems)
        routed = self._routed.get(key)
        if routed is None:
            routed = self._routed[key] = (astra2_steps(planner, s.dim, s.op, s.full_elems), False)
        return routed[0], False, self.cost(s.itemsize).endpoint_delay_ns

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """Advance to the earliest stage end at or before the horizon: (t, stages), or (horizon, [])."""
        loop, rule = self.loop, self.rule
        while True:
            if self._ended:
                ended, self._ended = self._ended, []
                return loop.now_ns, ended
            t = loop.next_ns(rule)
            if t > horizon_ns:
                loop.advance(horizon_ns, rule)
                return horizon_ns, []
            if t == math.inf:
                return horizon_ns, []
            loop.fire(t, rule)

    def number(self, run: Any) -> int:
        """Its start number on its dim: every NPU starts the dim's stages in one order here."""
        return run.dim_seq
