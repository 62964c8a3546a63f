"""`themis-ports`: Themis's greedy rule with its loads kept per physical resource.

Themis (docs/design.md#themis) balances one load per dim, as if every dim had its own links. Where
several dims leave the NPU through one port (`topology.Port`, e.g. HGX's NIC under dims 1 and 2)
their bytes meet on that port, and balancing the dims moves load onto it. This policy keeps a load
per resource: each dim's own links (Themis's loads, the same updates) and each shared port (the
bytes of every stage on its dims, at the port's rate). A dim's level is the load of the busiest
resource it crosses; the dims are sorted by level and the threshold compares levels. Dims tied at
one port's level go in the order of their stages' fixed delay, least first. The rule, with why:
docs/policies.md#themis-ports-themis-that-sees-shared-ports. Without a shared port every level is
the dim's own load and no tie-break is added: the schedules are Themis's, chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..collectives import RS, Collective
from ..cost import steps
from .base import PolicyContext
from .inter import MIB, Themis, ThemisTracker


@dataclass
class PortTracker(ThemisTracker):
    """Themis's tracker plus one load per shared port, in MiB at dim 0's bandwidth.

    Attributes:
        endpoint_delay_ns: the run's delay per algorithm step (`config.RunConfig`).
        port_loads: accumulated load per shared port (`topology.Topology.ports`): the bytes the
            stages on its dims move through it, at its rate.
        stage_delays_ns: per dim behind a port, the fixed delay of one of its stages (its steps'
            latency and endpoint delay), the tie-break at the port; 0 for the other dims.
    """

    endpoint_delay_ns: float = 0.0
    port_loads: list[float] = field(init=False)
    stage_delays_ns: list[float] = field(init=False)

    def __post_init__(self):
        super().__post_init__()
        topo = self.topology
        self.port_loads = [0.0] * len(topo.ports)
        self._port = [topo.port_of(d) for d in range(len(topo.dims))]
        self._port_ratios = [p.bandwidth_gbps / topo.dims[0].bandwidth_gbps for p in topo.ports]
        self.stage_delays_ns = [
            0.0
            if self._port[d] is None
            else len(steps(dim, RS, dim.npus, 1)) * (dim.hops * dim.latency_ns + self.endpoint_delay_ns)
            for d, dim in enumerate(topo.dims)
        ]

    def level(self, d: int) -> float:
        """The load of the busiest resource dim d crosses: its own links, or its shared port."""
        p = self._port[d]
        return self.loads[d] if p is None else max(self.loads[d], self.port_loads[p])

    def sort(self) -> int | None:
        """Stable-sort the dims by level, ties by stage delay (else the last arrangement); the first active.

        Dims behind one port share its level when it binds; the one whose stages wait less goes
        first and takes the chunk's larger stage (docs/policies.md, themis-ports).
        """
        self._sorted.sort(key=lambda d: (self.level(d), self.stage_delays_ns[d]))
        return next((d for d in self._sorted if self._is_active[d]), None)

    def gap_bytes(self, first: int, op: str) -> float:
        """Bytes of `first`'s largest stage that bring its busiest resource to the top level.

        Themis's gap (rule 2) taken on each resource `first` crosses, the smallest kept: the stage
        may grow until its own links or its port reaches the most loaded dim's level.
        """
        top = self.level(self._sorted[-1])
        room = (top - self.loads[first]) * self._ratio(first)
        p = self._port[first]
        if p is not None:
            room = min(room, (top - self.port_loads[p]) * self._port_ratios[p])
        gap = room * MIB
        dim = self.topology.dims[first]
        if op == "all_gather" and dim.algorithm != "ina":  # Themis's conversion (`ThemisTracker`)
            return gap / (dim.npus - 1) * dim.npus
        return gap / self._rs_share(first)

    def add(self, op: str, rs_order: list[int], chunk_bytes: int) -> list[int]:
        """Themis's load updates (rule 4), and each port's: the bytes of its dims' stages at its rate."""
        before = list(self.loads)
        order = super().add(op, rs_order, chunk_bytes)
        for d, p in enumerate(self._port):
            if p is not None and self._is_active[d]:
                self.port_loads[p] += (self.loads[d] - before[d]) * self._ratio(d) / self._port_ratios[p]
        return order


class ThemisPorts(Themis):
    """Themis whose loads are per physical resource: a dim's links, or the port several dims share."""

    name = "themis-ports"
    description = "ours: Themis's greedy rule, loads per physical resource (a dim's links or a shared port)"

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """Fresh loads per resource; the nominal chunk size sets the balance threshold."""
        super().begin(context, collective)
        self.tracker = PortTracker(
            context.topology, tuple(collective.dims), endpoint_delay_ns=context.config.endpoint_delay_ns
        )
