"""Recorded ends: one NPU's stage (and message) ends from a run of every NPU, handed back in order.

Under ``mpiexec``, where one NPU's view is not exact (every NPU's links), every rank runs the
same deterministic simulation of every NPU (`world.World`) and its transport takes its own
rank's ends from it while the data still moves rank to rank (docs/design.md#emulator-times).
"""

from __future__ import annotations

from typing import Any

StageKey = tuple[int, int, int]  # (collective, chunk, stage index): the same stage on every NPU


def stage_key(run: Any) -> StageKey:
    """A stage's name on every NPU: (collective, chunk, stage index)."""
    s = run.stage
    return (s.coll, s.chunk, s.index)


class Replay:
    """One NPU's stage (and message) ends from a `world.World`, for an engine that takes the same decisions.

    An engine is deterministic: given the same stage ends at the same times it starts the same
    stages at the same times, so the rank's engine walks the same path as the NPU's did in the
    world, and the ends come back in the order and batches the NPU took them. A start that
    differs is a bug, and raised.

    NPUs may start a dim's stages in different orders here (ASTRA-sim's NPUs do: a stage ends
    at different times on different NPUs), so a stage's start number on its dim is not the same
    on every NPU; `number` is (the stage's place among the dim's stages in sorted order).

    Args:
        rank: the NPU.
        starts: its stages' (and messages') starts by key.
        ends: its batches of ends, ``(time, keys)``, in the order it took them.
        numbers: each stage's number on its dim, common to every NPU.
        link_bytes: what its links carried in the world, where known.
    """

    def __init__(
        self,
        rank: int,
        starts: dict[StageKey, float],
        ends: list[tuple[float, tuple[StageKey, ...]]],
        numbers: dict[StageKey, int],
        link_bytes: list[float] | None = None,
    ):
        self.rank, self.starts, self.ends, self.numbers = rank, starts, ends, numbers
        self.link_bytes = link_bytes
        self._i = 0
        self._started: dict[StageKey, Any] = {}

    def start(self, run: Any) -> None:
        """The stage starts; it must be the world's, at the world's time."""
        key = stage_key(run)
        if self.starts.get(key) != run.start_ns:
            raise RuntimeError(
                f"NPU {self.rank} started stage {key} at {run.start_ns} ns, "
                f"in the run of every NPU at {self.starts.get(key)}"
            )
        self._started[key] = run

    def number(self, run: Any) -> int:
        """The stage's number on its dim, the same on every NPU (the emulator tags its messages with it)."""
        return self.numbers[stage_key(run)]

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """The next batch of ends at or before the horizon, or ``(horizon, [])``."""
        if self._i < len(self.ends):
            t_ns, keys = self.ends[self._i]
            if t_ns <= horizon_ns:
                if any(k not in self._started for k in keys):
                    raise RuntimeError(
                        f"NPU {self.rank} ends stages {keys} at {t_ns} ns that it did not start"
                    )
                self._i += 1
                return t_ns, [self._started.pop(k) for k in keys]
        return horizon_ns, []
