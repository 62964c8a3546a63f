"""The model transport: one process, no data, the same engine, policies and cost model.

Collectives are symmetric, so one NPU's engine stands for all of them: its stages end when one
NPU's view of the links says (`timing.symmetric`): under ``ideal`` at their start plus the cost
model's step times, summed in the same order the emulator sums them; under a sharing rule as the
rule shares NPU 0's links. This answers questions about 1024+ NPU systems on a laptop, and must
agree with the emulator's virtual clock wherever both can run (a test).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from .config import RunConfig
from .engine import CollectiveRun, Engine, StageRun, VirtualClock, reduced_span
from .errors import UsageError
from .timing.symmetric import Symmetric, Timer
from .topology import Topology


class ModelTransport:
    """Ends every stage when its timer says; control calls act on one rank.

    Args:
        topology: the network.
        config: the run settings; the model runs on the virtual clock only.
        timer: what times its stages: one NPU's view of the run's rule by default (made on the
            first stage), or a recorded run (`timing.replay.Replay`).
    """

    name = "model"
    checks_data = False
    rank = 0
    ranks: Any = 0
    check_s = 0.0
    link_bytes = None  # (one NPU's view: the result counts its links' bytes from its stages)

    def __init__(self, topology: Topology, config: RunConfig, timer: Timer | None = None):
        if config.clock != "virtual":
            raise UsageError("the model runs on the virtual clock only; --clock wall needs mpiexec")
        self.topology = topology
        self.config = config = config.on(topology)  # (the default rule on nccl dims: ideal)
        self.clock = VirtualClock()
        self.cost = config.costs(self.topology)
        self.issue_ns: Any = config.late_ns(0)
        self._timer = timer

    @property
    def timer(self) -> Timer:
        """What times its stages (one NPU's view is made when first asked: it may refuse the run)."""
        if self._timer is None:
            self._timer = Symmetric(self.topology, self.config, self.cost)
        return self._timer

    # --- control: one rank, nothing to exchange --------------------------------------------------

    def bcast(self, array: np.ndarray, what: str, patient: bool = False) -> np.ndarray:
        """The array itself."""
        return array

    def serving(self) -> AbstractContextManager[None]:
        """Nobody to answer."""
        return nullcontext()

    def barrier(self, what: str) -> None:
        """Nothing to wait for."""

    def reduce(self, values, op: str, what: str = "") -> np.ndarray:
        """The values themselves."""
        return np.asarray(values)

    def span_ns(self, engine: Engine) -> tuple[float, float]:
        """The run's first issue and last end: this one NPU's."""
        return reduced_span(self.reduce, engine)

    def replaying(self, timer: Timer) -> ModelTransport:
        """A model transport with the same settings, timed by `timer` (a recorded run)."""
        return ModelTransport(self.topology, self.config, timer)

    # --- engine interface ----------------------------------------------------------------------

    def open(self, run: CollectiveRun) -> None:
        """No data in the model."""

    def close(self, run: CollectiveRun) -> None:
        """Nothing to check: ``run.wrong`` stays None."""

    def start(self, run: StageRun) -> None:
        """Hand the stage (or message) to its timer."""
        timer = self._timer if self._timer is not None else self.timer
        timer.start(run)

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The earliest batch of completions, or (horizon, []) if the horizon comes first."""
        timer = self._timer if self._timer is not None else self.timer
        return timer.next(horizon_ns)


class ModelBackend:
    """Where the model runs: this one process, which stands for rank 0."""

    name = "model"
    rank = 0

    def __init__(self, topology: Topology):
        self.topology = topology

    def transport(self, config: RunConfig) -> ModelTransport:
        """A model transport with these settings."""
        return ModelTransport(self.topology, config)

    def gather(self, events: np.ndarray) -> np.ndarray:
        """The events themselves: the model's one NPU stands for every rank."""
        return events

    def service(self) -> None:
        """Nobody to answer."""

    def close(self, barrier: bool = True) -> None:
        """Nothing to free."""
