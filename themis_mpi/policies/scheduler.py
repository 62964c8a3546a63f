"""The communication scheduler between collectives: which waiting stage a dim starts next.

The inter-dim policy orders one collective's chunks over the dims and the intra-dim policy places
a newly queued stage in its dim's queue; a training iteration keeps many collectives in flight,
and the scheduler (`CommScheduler`) decides between them. It decides two things, on every NPU
alike from the engine's state alone (so every MPI rank decides the same):

- which waiting stage of which collective a dim starts next: every collective gets a priority when
  it is issued (`CommScheduler.priority`, lower goes first); a dim's queue is kept in priority
  order, and the intra-dim policy orders the stages of equal priority. A free slot takes the head,
  so a higher-priority partition goes ahead at the next chunk boundary (a running stage is never
  pre-empted);
- whether the head may start now (`CommScheduler.may_start`), e.g. a credit of bytes in flight.

The workload says when it needs each collective (`Need`): the place of its first consumer in the
next forward pass, and the compute time before it. Tensors may be sliced into partitions of
``--partition-mib`` (`workloads.training.partitions`), each partition a collective of its own.

Built-ins: `fifo` (no priority: the queue order of the intra-dim policy alone, the default),
`lifo` (the later collective first: ASTRA-sim's rule, which ``--compat astra-sim-1.0`` and
``astra-sim-2`` select), `p3`, `bytescheduler` and `tictac`. Plugins come from the
``themis_mpi.schedulers`` entry-point group (`registry`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..collectives import Collective, Stage
from ..config import RunConfig
from ..cost import is_astra


@dataclass(frozen=True)
class Need:
    """When a workload needs a collective's result (what `p3` and `tictac` rank by).

    Attributes:
        order: the place of its first consumer in the next forward pass (a weight gradient:
            its layer, 0 first); -1 for a collective the running pass waits for (a forward or
            input-gradient collective); ``inf`` when nothing is known.
        need_ns: compute time from the start of the next forward pass until the consumer
            starts (0 when the running pass waits for it; ``inf`` when nothing is known).
    """

    order: float = math.inf
    need_ns: float = math.inf


UNKNOWN: Need = Need()
BLOCKING = Need(-1, 0.0)


class CommScheduler:
    """A communication scheduler: the priority of each collective, and whether a stage may start.

    Subclasses set `name` and `description` and override `priority` (and `may_start` for a
    limit). One instance serves one NPU's engine for a whole run; `setup` is called first.
    A scheduler must decide from what it is given only: every MPI rank runs its own instance.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    slices: ClassVar[bool] = False  # slice tensors into partitions (--partition-mib) by default
    ranked: bool = True  # queues kept in `priority` order (False: the intra-dim policy alone)
    gated: bool = False  # `may_start` is asked before every stage starts

    def setup(self, config: RunConfig) -> None:
        """The run's settings, before the first collective (the default keeps nothing)."""

    def priority(self, coll_id: int, need: Need, collective: Collective) -> float:
        """The collective's priority: lower goes first; equal ones in the intra-dim policy's order.

        Args:
            coll_id: its issue order on this NPU (0 first).
            need: when the workload needs its result.
            collective: what it is (op, size, dims; a partition is a collective of its own).
        """
        return 0.0

    def may_start(self, stage: Stage, running: Sequence[Stage]) -> bool:
        """Whether the head of a dim's queue may start now, beside the stages running there.

        Only asked when `gated`, and only while the dim has a free slot; a dim with nothing
        running always starts its head (a refusal there would stop the run).
        """
        return True


class Fifo(CommScheduler):
    """No priority between collectives: the intra-dim policy's queue order alone (the default)."""

    name = "fifo"
    description = "no priority between collectives: the intra-dim policy's order alone (default)"
    ranked = False


class Lifo(CommScheduler):
    """The later collective first (ASTRA-sim's LIFO priority; what --compat selects).

    Under ``--compat astra-sim-1.0`` or ``astra-sim-2`` the intra-dim policies apply ASTRA-sim's
    own rule (`intra.astra_priority_position`, and RG's variant), so the queue order is theirs.
    """

    name = "lifo"
    description = "the later collective first (ASTRA-sim's LIFO; --compat astra-sim-1.0/2 select it)"

    def setup(self, config: RunConfig) -> None:
        """Under an ASTRA-sim compat the intra-dim policies already rank by collective."""
        self.ranked = not is_astra(config.compat)

    def priority(self, coll_id: int, need: Need, collective: Collective) -> float:
        """The issue order, reversed."""
        return -float(coll_id)


class P3(CommScheduler):
    """P3 (Jayarajan et al., SysML 2019): the layer needed first in the next forward pass first."""

    name = "p3"
    description = "priority by the layer's place in the next forward pass (layer 0 first)"
    slices = True

    def priority(self, coll_id: int, need: Need, collective: Collective) -> float:
        """The consumer's place in the next forward pass."""
        return float(need.order)


class ByteScheduler(P3):
    """ByteScheduler (Peng et al., SOSP 2019): P3's priority with a credit of bytes in flight per dim."""

    name = "bytescheduler"
    description = "p3's priority, at most --credit-mib bytes of stages running per dim"
    gated = True
    credit_bytes = 16 * 2**20

    def setup(self, config: RunConfig) -> None:
        """The credit (`RunConfig.credit_bytes`; 16 MiB when 0)."""
        if config.credit_bytes:
            self.credit_bytes = config.credit_bytes

    def may_start(self, stage: Stage, running: Sequence[Stage]) -> bool:
        """While the stage's bytes fit in the credit beside the running stages' (`Stage.key_bytes`)."""
        return sum(s.key_bytes for s in running) + stage.key_bytes <= self.credit_bytes


class TicTac(CommScheduler):
    """TicTac (Hashemi et al., SysML 2019): the parameter the next iteration needs soonest first.

    It ranks by the compute time until the consumer starts (`Need.need_ns`), not by the layer's
    place, and sends whole tensors (no slicing). For a data-parallel text workload whose layers
    all take forward time the order is P3's; layers without forward time tie (issue order), and a
    tensor is not cut into partitions, so a large late gradient is one collective.
    """

    name = "tictac"
    description = "the parameter the next iteration needs soonest first (by compute time)"

    def priority(self, coll_id: int, need: Need, collective: Collective) -> float:
        """The compute time until the consumer starts."""
        return float(need.need_ns) if need.order >= 0 else -1.0


BUILTIN_SCHEDULERS: tuple[type[CommScheduler], ...] = (Fifo, Lifo, P3, ByteScheduler, TicTac)


def default_scheduler(config: RunConfig) -> str:
    """The run's scheduler: ``config.comm_scheduler``, else lifo under an ASTRA-sim compat, else fifo.

    (Under astra-sim-2 with ``--compat-scheduling FIFO``: fifo.)
    """
    if config.comm_scheduler:
        return config.comm_scheduler
    return "lifo" if is_astra(config.compat) and not config.compat_fifo else "fifo"
