"""The model transport: one process, no data, the same engine, policies and cost model.

Collectives are symmetric, so one NPU's engine stands for all of them: every stage ends at its
start plus the cost model's step times, summed in the same order the emulator sums them. This
answers questions about 1024+ NPU systems on a laptop, and must agree with the emulator's
virtual clock wherever both can run (a test).
"""

from __future__ import annotations

import heapq
import math
import time

from .analysis import summarize
from .collectives import Collective
from .cost import CostModel
from .engine import Engine, StageRun
from .policies import chunk_orders
from .topology import Topology


class ModelTransport:
    """Completes every stage at ``start + sum(step times)``."""

    def __init__(self, cost: CostModel):
        self.cost = cost
        self._heap: list[tuple[float, int, StageRun]] = []
        self._seq = 0

    def start(self, run: StageRun) -> None:
        """Schedule the stage's completion from the cost model."""
        s = run.stage
        end_ns = self.cost.stage_end_ns(s.dim, s.op, s.full_elems, run.start_ns)
        heapq.heappush(self._heap, (end_ns, self._seq, run))
        self._seq += 1

    def wait_next(self, horizon_ns: float):
        """The earliest batch of completions, or (horizon, []) if the horizon comes first."""
        if not self._heap or self._heap[0][0] > horizon_ns:
            return horizon_ns, []
        t_ns = self._heap[0][0]
        done = []
        while self._heap and self._heap[0][0] == t_ns:
            done.append(heapq.heappop(self._heap)[2])
        return t_ns, done


def run_engine(engine: Engine, cost: CostModel) -> None:
    """Run an engine to completion on the model transport."""
    engine.run(ModelTransport(cost))


def model_collective(topology: Topology, collective: Collective, policy: str,
                     intra: str = "fifo", active_per_dim: int = 1,
                     endpoint_delay_ns: float = 0.0, orders=None) -> tuple[dict, Engine]:
    """Model one collective; returns the same summary row as `emulator.run_collective`.

    `orders` replays given chunk orders instead of asking the policy.
    """
    t0 = time.perf_counter()
    if orders is None:
        orders = chunk_orders(policy, topology, collective.op, collective.size_bytes,
                              collective.n_chunks, collective.dims)
    cost = CostModel(topology, collective.itemsize, endpoint_delay_ns)
    engine = Engine(topology, intra, active_per_dim)
    engine.t0_wall_s = math.nan
    run = engine.issue(collective, orders)
    run_engine(engine, cost)
    row = summarize(run, topology, cost)
    row.update(policy=policy, intra=intra, clock="model", wrong=None,
               wall_s=time.perf_counter() - t0)
    return row, engine
