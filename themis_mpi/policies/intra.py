"""ASTRA-sim 1.0's intra-dim policies (``Sys::insert_stream``): where a new stage queues on its dim.

Only waiting stages are in the queue a policy sees; a running stage is never pre-empted.

- `fifo`: the tail. Under ``compat="astra-sim-1.0"``, ahead of the waiting stages of earlier
  collectives (ASTRA-sim's LIFO priority between collectives).
- `scf` (SmallestFirst): ahead of the waiting stages that move more data (the key is the larger of
  a stage's input and output bytes; equal keys: the new one first), except a chunk's
  second-to-last stage, which goes to the tail.
- `rg` (RG): as far forward as it may go, but never between two neighbouring waiting stages of
  which one is a reduce-scatter and the other an all-gather (a waiting RS/AG pair), and never
  ahead of the first waiting stage while a stage runs on the dim (ASTRA-sim skips the stream
  behind a running one). Under compat, also never ahead of a later collective's stages.
- `lrpf` (LessRemainingPhaseFirst): ahead of the waiting stages whose chunks have as many or more
  phases left after this one (fewer remaining phases first; ties: the new one first).
"""

from __future__ import annotations

from ..collectives import Stage
from ..cost import AG, RS, is_astra
from .base import IntraPolicy, QueueView


def astra_priority_position(queue: QueueView, stage: Stage) -> int:
    """ASTRA-sim's FIFO with LIFO priority: ahead of the first waiting stage of an earlier collective."""
    pos = 0
    while pos < len(queue.waiting) and queue.waiting[pos].coll >= stage.coll:
        pos += 1
    return pos


class Fifo(IntraPolicy):
    """First in, first out."""

    name = "fifo"
    description = "first in, first out (ASTRA-sim FIFO)"

    def position(self, queue: QueueView, stage: Stage) -> int:
        """The tail (ASTRA-sim's priority between collectives under compat)."""
        if is_astra(queue.compat):
            return astra_priority_position(queue, stage)
        return len(queue.waiting)


class Scf(IntraPolicy):
    """Smallest chunk first, a chunk's second-to-last stage to the tail."""

    name = "scf"
    description = "smallest chunk first; a chunk's second-to-last stage to the tail (ASTRA-sim SCF)"

    def position(self, queue: QueueView, stage: Stage) -> int:
        """Ahead of the first waiting stage with a key at least as large."""
        waiting = queue.waiting
        if stage.index == stage.n_stages - 2:
            return len(waiting)
        key = stage.key_bytes
        for pos, other in enumerate(waiting):
            if other.key_bytes >= key:
                return pos
        return len(waiting)


class Rg(IntraPolicy):
    """ASTRA-sim's RG: a new stage never cuts between a waiting RS/AG pair."""

    name = "rg"
    description = "ASTRA-sim RG: as early as possible, never between a waiting RS/AG pair"

    def position(self, queue: QueueView, stage: Stage) -> int:
        """The first gap that splits no RS/AG pair (behind the stage that follows a running one)."""
        waiting = queue.waiting
        pos = 1 if queue.running and waiting else 0
        while pos < len(waiting):
            ahead, behind = waiting[pos - 1] if pos else None, waiting[pos]
            if is_astra(queue.compat) and behind.coll > stage.coll:
                pos += 1
            elif ahead is not None and {ahead.op, behind.op} == {RS, AG}:
                pos += 1
            else:
                break
        return pos


class Lrpf(IntraPolicy):
    """ASTRA-sim's LessRemainingPhaseFirst."""

    name = "lrpf"
    description = "ASTRA-sim LRPF: the chunk with fewer remaining phases first"

    def position(self, queue: QueueView, stage: Stage) -> int:
        """Ahead of the first waiting stage with as many or more phases left."""
        waiting = queue.waiting
        left = stage.n_stages - stage.index
        pos = 0
        while pos < len(waiting) and waiting[pos].n_stages - waiting[pos].index < left:
            pos += 1
        return pos
