"""The model transport: one process, no data, the same engine, policies and cost model.

Collectives are symmetric, so one NPU's engine stands for all of them: every stage ends at its
start plus the cost model's step times, summed in the same order the emulator sums them. This
answers questions about 1024+ NPU systems on a laptop, and must agree with the emulator's
virtual clock wherever both can run (a test).
"""

from __future__ import annotations

import heapq
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from .config import RunConfig
from .cost import CostModels
from .engine import CollectiveRun, MessageRun, StageRun, VirtualClock
from .errors import UsageError
from .network import IDEAL, make_network
from .topology import Topology


class ModelTransport:
    """Completes every stage at ``start + sum(step times)``; control calls act on one rank.

    Args:
        topology: the network.
        config: the run settings; the model runs on the virtual clock only.
    """

    name = "model"
    checks_data = False
    rank = 0
    check_s = 0.0

    def __init__(self, topology: Topology, config: RunConfig):
        if config.clock != "virtual":
            raise UsageError("the model runs on the virtual clock only; --clock wall needs mpiexec")
        self.topology = topology
        self.config = config
        self.clock = VirtualClock()
        self.cost = CostModels(self.topology, config.endpoint_delay_ns, config.compat, config.endpoint)
        self._heap: list[tuple[float, int, StageRun]] = []
        self._steps: dict[tuple, tuple[float, ...]] = {}  # step times by stage shape (`run_steps_ns`)
        self._seq = 0
        self.network = (
            None
            if config.network == IDEAL
            else make_network(topology, config.network, self.cost, config.compat)
        )

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

    # --- engine interface ----------------------------------------------------------------------

    def open(self, run: CollectiveRun) -> None:
        """No data in the model."""

    def close(self, run: CollectiveRun) -> None:
        """Nothing to check: ``run.wrong`` stays None."""

    def start(self, run: StageRun) -> None:
        """Schedule the stage's completion from the cost model (or hand it to the shared links)."""
        if self.network is not None:
            if isinstance(run, MessageRun):
                raise UsageError(  # (the drivers run them on every NPU's links: `npunet.SharedWorld`)
                    f"point-to-point messages under --network {self.config.network} run on every NPU's "
                    "links (npunet.SharedWorld), not on one NPU's"
                )
            self.network.start(run)
            return
        s = run.stage
        if isinstance(run, MessageRun):  # the peer issues its side at the same time (symmetry)
            end_ns = run.start_ns + self.cost(1).p2p_ns(run.path, run.nbytes)
        else:
            first, last = s.index == 0, s.index == s.n_stages - 1
            plan = s.plan if self.topology.flat else None  # the NCCL-like model times a stage by its plan
            key = (s.itemsize, s.dim, s.op, s.full_elems, first, last, run.mem_shared, plan)
            steps = self._steps.get(key)
            if steps is None:
                steps = self._steps[key] = self.cost(s.itemsize).run_steps_ns(run)
            end_ns = run.start_ns
            for step_ns in steps:
                end_ns = end_ns + step_ns
        heapq.heappush(self._heap, (end_ns, self._seq, run))
        self._seq += 1

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The earliest batch of completions, or (horizon, []) if the horizon comes first."""
        if self.network is not None:
            return self.network.next(horizon_ns)
        if not self._heap or self._heap[0][0] > horizon_ns:
            return horizon_ns, []
        t_ns = self._heap[0][0]
        done = []
        while self._heap and self._heap[0][0] == t_ns:
            done.append(heapq.heappop(self._heap)[2])
        return t_ns, done


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
