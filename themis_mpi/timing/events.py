"""The one event loop a container and its link rule share: time-ordered events, one instant's in order.

A container (`symmetric.Symmetric`, `world.World`) owns it; its rule schedules its own events
here (a step's delay, a link that frees, a message that arrives) and keeps none of its own. A
rule whose next event moves as rates change (`fair`) says when it falls (`LinkModel.next_ns`)
instead of scheduling it. Events of one instant run in the order they were scheduled, so a run
is deterministic, which is what lets the emulator's ranks replay the model exactly.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Events ``(time, seq, fn, arg)``: `fire` runs what is due, earliest first, then in scheduling order.

    The container passes its rule to `next_ns`, `advance`, `fire` and `idle`, so that the rule's
    own events (`LinkModel.next_ns`) count too (the loop keeps no reference to it: a finished run
    is freed without the garbage collector).

    Attributes:
        now_ns: the time of the last event run (or of the last horizon reached).
        per_event: take one event at a time (`fire` runs one); else every event of the instant.
    """

    def __init__(self) -> None:
        self.now_ns = 0.0
        self.per_event = False
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0

    def at(self, t_ns: float, fn: Callable[[Any], None], arg: Any, seq: int | None = None) -> None:
        """Run ``fn(arg)`` at t_ns (`seq`: a place in the order of its instant taken earlier, `reserve`)."""
        if seq is None:
            seq = self._seq
            self._seq += 1
        heapq.heappush(self._heap, (t_ns, seq, fn, arg))

    def reserve(self) -> int:
        """A place in the order of events, for an event scheduled later (it keeps its rank at a tie)."""
        self._seq += 1
        return self._seq - 1

    def idle(self, rule: Any) -> bool:
        """Nothing is due and nothing moves on the rule's links."""
        return not self._heap and (not rule.moving or rule.idle())

    def next_ns(self, rule: Any) -> float:
        """When the next event is, the rule's own included (inf: none)."""
        t = self._heap[0][0] if self._heap else math.inf
        if rule.moving:
            mine = rule.next_ns()
            if mine < t:
                return mine
        return t

    def advance(self, t_ns: float, rule: Any) -> None:
        """Time moves on to t_ns with nothing due before (a horizon): the rule's transfers progress."""
        if t_ns > self.now_ns:
            if rule.moving:
                rule.advance(t_ns)
            self.now_ns = t_ns

    def fire(self, t_ns: float, rule: Any) -> None:
        """Run what is due at t_ns (`next_ns`): one event (`per_event`), or the rule's, then all of t_ns."""
        if self.per_event:
            t, _, fn, arg = heapq.heappop(self._heap)
            self.now_ns = t
            fn(arg)
            return
        if rule.moving:
            rule.advance(t_ns)
            self.now_ns = t_ns
            rule.fire(t_ns)
        else:
            self.now_ns = t_ns
        heap = self._heap
        while heap and heap[0][0] <= t_ns:
            _, _, fn, arg = heapq.heappop(heap)
            fn(arg)

    def step(self, horizon_ns: float, rule: Any) -> bool:
        """Run what is due next if by the horizon (`fire`), else move on to the horizon: whether it ran."""
        t = self.next_ns(rule)
        if t > horizon_ns:
            self.advance(horizon_ns, rule)
            return False
        if t == math.inf:
            return False
        self.fire(t, rule)
        return True

    def drain(self) -> None:
        """Run every event, in order (the links alone, with nothing else waiting: tools and tests)."""
        while self._heap:
            t, _, fn, arg = heapq.heappop(self._heap)
            self.now_ns = t
            fn(arg)
