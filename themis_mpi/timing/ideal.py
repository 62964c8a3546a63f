"""``ideal``: transfers share nothing; a step takes the cost model's time alone (ASTRA-sim 1.0's rule).

On one NPU's links a stage ends at its start plus its steps' times, summed in the order the
emulator sums them (`cost.CostModel.run_steps_ns`: the NPU's memory, the NCCL-like model and
ASTRA-sim's message rules included), in one event. Every NPU under ``ideal`` (stragglers) is
timed by the emulator's own per-message rule instead: a step ends once its own sends are done
and every message it receives has arrived, a message over a scaled link (`LinkScales`) at the
scaled bandwidth (`greenlets`, `vectors`, and the emulator's ranks themselves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ..cost import CostModels
from ..errors import UsageError
from .links import Flow, LinkModel, check_link_scale


class Ideal(LinkModel):
    """Each flow ends at its start plus its steps' times alone (`links.Step.alone_ns`), sharing nothing."""

    name = "ideal"
    routes = False

    def start(self, flow: Flow) -> None:
        """Schedule the flow's end: no step of it waits for anything."""
        self.loop.at(
            self.end_ns(flow.start_ns, [step.alone_ns for step in flow.steps]), self.host.ended, flow.owner
        )

    @staticmethod
    def end_ns(start_ns: float, times_ns: Sequence[float]) -> float:
        """The end of steps of these times from start_ns, summed one by one as the emulator sums them."""
        end_ns = start_ns
        for step_ns in times_ns:
            end_ns = end_ns + step_ns
        return end_ns

    def resume(self, flow: Flow) -> None:
        """Never asked: an ideal flow's steps wait for nothing (every NPU runs the per-message rule)."""
        raise RuntimeError("ideal flows run in one event; no step of theirs is held")


class LinkScales:
    """Single NPUs' links that run at F times their dim's bandwidth (``--link-scale DIM:RANK=F``).

    A scaled NPU's links in the dim run at F both ways (to a Switch: its up- and down-link), so a
    message between two NPUs runs at the smaller factor of its ends. A step waits for its slowest
    message: a message over a scaled link costs the step's time at the scaled bandwidth, which
    `extra_ns` gives as the difference to the unscaled step.

    Args:
        costs: the run's unscaled cost models.
        scales: ``(dim, rank, factor)`` triples.
    """

    def __init__(self, costs: CostModels, scales: tuple[tuple[int, int, float], ...]):
        self.costs = costs
        self.factors = {(d, rank): f for d, rank, f in scales}
        topo = costs.topology
        check_link_scale(topo, scales)
        if scales and topo.flat:
            raise UsageError("--link-scale does not apply to nccl dims")
        self._scaled: dict[tuple[int, float], CostModels] = {}

    def __bool__(self) -> bool:
        return bool(self.factors)

    def factor(self, dim: int, a: int, b: int) -> float:
        """The rate factor of the link between NPUs a and b in the dim."""
        return min(self.factors.get((dim, a), 1.0), self.factors.get((dim, b), 1.0))

    def factor_extra_ns(self, run, itemsize: int, f: float) -> tuple[float, ...]:
        """Per step of a started stage, what a message over a link at factor f adds to it."""
        base = self.costs(itemsize).run_steps_ns(run)
        if f == 1.0:
            return (0.0,) * len(base)
        scaled = self._model(run.stage.dim, f)(itemsize).run_steps_ns(run)
        return tuple(s - b for s, b in zip(scaled, base))

    def extra_ns(self, run, itemsize: int, rank: int, peers) -> tuple[tuple[float, ...], ...]:
        """Per step of a started stage, per message received from ``peers[k][i]`` (ranks): its added time."""
        d = run.stage.dim
        extras: dict[float, tuple[float, ...]] = {}
        rows = []
        for k, step_peers in enumerate(peers):
            row = []
            for peer in step_peers:
                f = self.factor(d, rank, peer)
                if f not in extras:
                    extras[f] = self.factor_extra_ns(run, itemsize, f)
                row.append(extras[f][k])
            rows.append(tuple(row))
        return tuple(rows)

    def step_times(self, run, itemsize: int, rank: int, recv_peers, send_peers, costs):
        """What a started stage's steps wait for, beside their receives' send times plus `costs`.

        Returns, per step, the time its own sends take (a step ends once they are done too:
        ``-inf`` without sends) and, per receive, what a scaled link adds to it (None: nothing
        is scaled). `recv_peers` and `send_peers` hold each step's peers as ranks.
        """
        send_ns = [c if peers else -math.inf for c, peers in zip(costs, send_peers)]
        if not self.factors:
            return tuple(send_ns), None
        for k, row in enumerate(self.extra_ns(run, itemsize, rank, send_peers)):
            if row:
                send_ns[k] += max(row)
        return tuple(send_ns), self.extra_ns(run, itemsize, rank, recv_peers)

    def _model(self, d: int, f: float) -> CostModels:
        if (d, f) not in self._scaled:
            topo, c = self.costs.topology, self.costs
            dims = list(topo.dims)
            dims[d] = replace(dims[d], bandwidth_gbps=dims[d].bandwidth_gbps * f)
            self._scaled[(d, f)] = CostModels(topo.with_dims(dims), c.endpoint_delay_ns, c.compat, c.endpoint)
        return self._scaled[(d, f)]
